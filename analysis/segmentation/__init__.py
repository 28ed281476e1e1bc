"""Stage 3, segmentation: the hair segmenters behind `types.HairSegmenter`.

The hair network (`hairnet`: the policy; `hairnet_graph`: its TFLite graph run in torch,
read by `tflite_reader`; `network_crop`: the square it sees; `subject_hair`: its
probability to the subject's scalp hair), BiSeNet (`bisenet`) and the GrabCut fallback
(`fallback`). Above `hairline`: the scalp-ring and bald-head tests reuse its trace and
scalp modules, so a bald head reads the same to both.
"""
