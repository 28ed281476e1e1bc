#!/usr/bin/env python3
"""What the edge's parameter checks cost (gateway.md § Parameter checks at the edge: < 5 ms p99
for a 2 MB body), measured in-process on `shared.uploads.check_request`.

    scripts/bench_request_checks.py [--runs 300] [--body-mb 2]

Bodies of about `--body-mb` MB: a valid multipart JPEG upload, the same as JSON base64, and
refusals (a bad field with a large image; a non-image; an image over a lowered limit).
Prints p50 / p99 / max per case in ms. Also `read_request` (the host's check, which decodes
the whole base64) for comparison. Single process on this machine: compare runs on the same one.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from werkzeug.datastructures import FileStorage, MultiDict  # noqa: E402
from werkzeug.test import encode_multipart  # noqa: E402

from shared.contract import ContractError  # noqa: E402
from shared.settings import AnalysisSettings  # noqa: E402
from shared.uploads import check_request, read_request  # noqa: E402
from shared.percentiles import percentile  # noqa: E402

GROW = "/api/v1/hair/grow"
LIMITS = AnalysisSettings()


def multipart(image: bytes, **fields: str) -> tuple[bytes, str]:
    import io

    values = MultiDict([*fields.items(), ("image", FileStorage(io.BytesIO(image), "photo.jpg", "image", "image/jpeg"))])
    boundary, body = encode_multipart(values)
    return body, f"multipart/form-data; boundary={boundary}"


def as_json(image: bytes, **fields: object) -> tuple[bytes, str]:
    return json.dumps({"image_base64": base64.b64encode(image).decode(), **fields}).encode(), "application/json"


def timings(call: Callable[[], None], runs: int) -> list[float]:
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        try:
            call()
        except ContractError:
            pass
        samples.append((time.perf_counter() - started) * 1000)
    return sorted(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--body-mb", type=float, default=2.0)
    args = parser.parse_args()
    size = int(args.body_mb * 1024 * 1024)
    jpeg = b"\xff\xd8\xff\xe0" + os.urandom(size - 4 - 512)
    jpeg_for_json = jpeg[: size * 3 // 4 - 512]  # the same body size once base64-encoded
    small_limit = AnalysisSettings(max_image_bytes=size // 2)
    cases = {
        "multipart JPEG, valid": (GROW, *multipart(jpeg, plans="standard"), LIMITS),
        "JSON base64 JPEG, valid": (GROW, *as_json(jpeg_for_json, plans=["standard"]), LIMITS),
        "multipart, bad field (1001)": (GROW, *multipart(jpeg, plans="bald"), LIMITS),
        "JSON, bad field (1001)": (GROW, *as_json(jpeg_for_json, plans=["bald"]), LIMITS),
        "multipart, image too large (1003)": (GROW, *multipart(jpeg), small_limit),
        "multipart, not an image (1002)": (GROW, *multipart(b"%PDF" + jpeg[4:]), LIMITS),
        "JSON, not an image (1002)": (GROW, *as_json(b"%PDF" + jpeg_for_json[4:]), LIMITS),
    }
    print(f"check_request, {args.runs} runs per case; body sizes in MB")
    print(f"{'case':<36} {'body':>6} {'p50':>7} {'p99':>7} {'max':>7}")
    for name, (path, body, content_type, limits) in cases.items():
        samples = timings(lambda: check_request(path, body, content_type, limits), args.runs)
        print(f"{name:<36} {len(body) / 2**20:6.2f} {percentile(samples, 0.5):7.2f} "
              f"{percentile(samples, 0.99):7.2f} {samples[-1]:7.2f}")
    _, body, content_type, _ = cases["JSON base64 JPEG, valid"]
    samples = timings(lambda: read_request("grow", body, content_type, LIMITS), max(args.runs // 3, 10))
    print(f"{'read_request (host), JSON valid':<36} {len(body) / 2**20:6.2f} {percentile(samples, 0.5):7.2f} "
          f"{percentile(samples, 0.99):7.2f} {samples[-1]:7.2f}")


if __name__ == "__main__":
    main()
