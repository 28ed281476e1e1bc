"""The hair network as a `HairSegmenter`: its answer turned into the subject's scalp hair.

The network itself (`hairnet_graph`) sees a face-centred upright square (`network_crop`);
MediaPipe's selfie segmentation gives the person mask and head outline on the fallback's
working head crop; a bare scalp (`hairline.scalp`) or the network's scalp ring
(`subject_hair.is_scalp_ring`) gives an empty mask, else `subject_hair` keeps the
subject's own hair. analysis.md § Hair segmentation.

This module imports torch at module level: only the model process imports it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Literal

import numpy as np
import torch

from ..face.head_crop import HeadCrop
from ..face.head_samples import to_lab
from ..hairline.scalp import may_be_a_ring, top_of_head
from ..native_logs import quiet_native_logs
from ..types import Face, HairSegmentation
from .fallback import PERSON_THRESHOLD
from .hairnet_graph import INPUT_SIZE, HairNetwork, hair_probability
from .network_crop import NetworkCrop
from .subject_hair import is_scalp_ring, subject_hair

# torch's intra-op threads on the CPU: the network is small (~80 ms on one core); with two
# threads on a busy 2-core machine the OpenMP hand-offs made it ~10x slower (830 ms measured)
CPU_THREADS = 1


class HairNetSegmenter:
    """`HairSegmenter` on the hair network (torch, `device`) and MediaPipe's selfie
    segmentation (the person mask and the head outline, on the same working head crop as
    the fallback's, so the bare-scalp test reads the same pixels); `subject_hair` turns the
    network's probability into the subject's scalp hair; a bare scalp or the network's
    scalp ring (`is_scalp_ring`) gives an empty mask."""

    name: Literal["hairnet"] = "hairnet"

    def __init__(self, device: str = "cpu", network: HairNetwork | None = None) -> None:
        quiet_native_logs()  # before mediapipe loads its native libraries
        import mediapipe as mp  # heavy: only the model process builds a segmenter

        self.device = device
        if device == "cpu":
            torch.set_num_threads(CPU_THREADS)  # process-wide: the model child runs one segmenter
        self.network = (network or HairNetwork.from_file()).to(device).eval()
        self._selfie = mp.solutions.selfie_segmentation.SelfieSegmentation(model_selection=0)

    def warm_up(self) -> None:
        """One run on a blank input (`load_models`: the first run's cost is the load's)."""
        hair_probability(self.network, np.zeros((INPUT_SIZE, INPUT_SIZE, 3), np.uint8), self.device)

    def close(self) -> None:
        self._selfie.close()

    def segment(self, rgb: np.ndarray, face: Face) -> HairSegmentation:
        head = HeadCrop.around(face)
        work = head.cut(rgb)
        work_face = head.face_in_work(face)
        person = self._selfie.process(np.ascontiguousarray(work)).segmentation_mask >= PERSON_THRESHOLD
        shape = rgb.shape[:2]
        lab = to_lab(work)
        square = NetworkCrop.around(face, INPUT_SIZE)
        probability = hair_probability(self.network, square.cut(rgb), self.device)
        in_work = square.warp_into(probability, head.to_image_matrix, lab.shape[:2])
        bald = HairSegmentation(
            "hairnet",
            np.zeros(shape, bool),
            head.paste(person, shape),
            work=(head.key, work),
            probability=(head.key, in_work),
        )
        top = top_of_head(lab, person, work_face, head.at_photo_top, in_work)
        if top.bare_scalp:
            return replace(bald, scalp_seen=True)
        hair = square.paste(subject_hair(probability, square.face_in_square(face)), shape)
        if may_be_a_ring(top) and is_scalp_ring(head.mask_in_work(hair), person, lab, work_face):
            return replace(bald, scalp_seen=True)
        return replace(bald, hair=hair)
