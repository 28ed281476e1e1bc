"""Stage 1, the face: landmarks and face counting, pose, upright, iris calibration, and the
head's geometry and colour samples (`head_samples`, the working-frame `head_crop`) that the
later stages read. Imports only analysis' top-level shared modules (`types`, `frame`).
"""
