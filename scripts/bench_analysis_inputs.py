#!/usr/bin/env python3
"""Time the analysis front end on this machine: decode, landmarks, pose, calibration, BiSeNet.

    .venv/bin/python scripts/bench_analysis_inputs.py [--repeat N] [--device cpu|cuda:0]

Inputs are the real faces shipped with the installed packages (the 512×512 astronaut and
matplotlib's 600×512 Grace Hopper) and a 30000×30000 PNG decompression bomb. BiSeNet runs
with random weights (speed does not depend on them). Prints the median and the worst of N
runs per stage, after one warm-up run, plus the pose and interpupillary distance per face.
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from matplotlib import cbook
from PIL import Image
from skimage import data

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from analysis.calibration import calibrate  # noqa: E402
from analysis.image_input import decode_image  # noqa: E402
from analysis.landmarks import FaceMeshDetector  # noqa: E402
from analysis.pose import estimate_pose  # noqa: E402
from shared.contract import ContractError  # noqa: E402
from shared.settings import AnalysisSettings  # noqa: E402
from tests.analysis.images import huge_blank_png  # noqa: E402


def timed(label: str, run: Callable[[], object], repeat: int) -> None:
    run()  # warm-up: first calls build graphs and caches
    seconds = []
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        seconds.append(time.perf_counter() - start)
    print(f"{label:<44} median {statistics.median(seconds) * 1000:8.2f} ms   max {max(seconds) * 1000:8.2f} ms")


def refused(data_: bytes, limits: AnalysisSettings) -> None:
    try:
        decode_image(data_, limits)
    except ContractError:
        return
    raise AssertionError("the bomb was accepted")


def faces() -> dict[str, np.ndarray]:
    with cbook.get_sample_data("grace_hopper.jpg") as file:
        grace = np.asarray(Image.open(file).convert("RGB"))
    return {"astronaut": data.astronaut(), "grace_hopper": grace}


def jpeg(rgb: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(rgb).save(buffer, format="JPEG", quality=92)
    return buffer.getvalue()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    limits = AnalysisSettings()
    detector = FaceMeshDetector()
    for name, rgb in faces().items():
        upload = jpeg(rgb)
        face = detector.detect(rgb)
        pose = estimate_pose(face)
        calibration = calibrate(face)
        left, right = face.points[[468, 473]]
        print(
            f"{name}: yaw {pose.yaw_degrees:+.1f}° pitch {pose.pitch_degrees:+.1f}° roll {pose.roll_degrees:+.1f}°, "
            f"iris {calibration.left_iris_px:.1f}/{calibration.right_iris_px:.1f} px, "
            f"{calibration.mm_per_px:.3f} mm/px ±{calibration.relative_uncertainty:.1%}, "
            f"IPD {np.hypot(*(left - right)) * calibration.mm_per_px:.1f} mm"
        )
        timed(f"decode {name} JPEG ({len(upload) // 1024} KB)", lambda: decode_image(upload, limits), args.repeat)
        timed(f"landmarks {name}", lambda: detector.detect(rgb), args.repeat)
        timed(f"pose {name}", lambda: estimate_pose(face), args.repeat)
        timed(f"calibration {name}", lambda: calibrate(face), args.repeat)
    bomb = huge_blank_png(30000, 30000)
    timed(f"refuse 30000×30000 PNG bomb ({len(bomb) // 1024} KB)", lambda: refused(bomb, limits), args.repeat)
    detector.close()

    import torch

    from analysis.bisenet import BiSeNet, BisenetSegmenter

    segmenter = BisenetSegmenter.from_network(BiSeNet(), args.device)
    astronaut = data.astronaut()
    label = f"BiSeNet parse 512×512 on {args.device} ({torch.get_num_threads()} threads)"
    timed(label, lambda: segmenter.parse(astronaut), max(3, args.repeat // 4))
    return 0


if __name__ == "__main__":
    sys.exit(main())
