"""Stage 2, the hairline: from a hair mask to a judged `Hairline` and the face's measurements.

Is there a hairline at all (`hair_evidence`, bare `scalp`, `headwear`), the edge traced
(`trace`, `edge_profile`), judged (`checks`), the stage's entry (`frontal`) and the
lengths read off it (`measurements`). Reads masks as `types.HairSegmentation`, never a
segmenter: it sits below `segmentation`, which reuses its trace and scalp tests.
"""
