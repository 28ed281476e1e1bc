#!/usr/bin/env python3
"""What the request checks cost (seed 002 §5.4: a bad field refused within 5 ms), before and
after a change, in one run.

    scripts/bench_request_checks.py [--runs 300] [--body-mb 2] [--client-requests 200] [--before REV]

(1) In-process, `shared.contract.uploads.check_request` (the gateway's check) on bodies of about
    `--body-mb` MB: a valid multipart JPEG upload, the same as JSON base64, and refusals (a
    bad field with a large image; a non-image; an image over a lowered limit); and
    `read_request` (the host's, which decodes the whole base64).
(2) Client-side, through a real gateway (`hairgate edge` in front of one fake worker) over
    loopback: `--client-requests` requests one at a time, from sending to the answer — a bad
    field (`drop_mm: 1000` on mark, 1001) in a 1.9 MB body as JSON and as multipart, and in a
    small JSON body; `GET /openapi.json` where the revision serves it, and `GET /health` (what
    any answer costs on this machine, the floor under the others).
Each section runs twice: on this checkout, and on `--before REV` (default: the commit before
the request models) extracted with `git archive` and run by this same script from that tree.
p50 / p99 / max in ms, side by side. Compare numbers of one run only: the machine is shared.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# `--tree DIR` (internal): measure the code of DIR (an extracted older revision) instead
TREE = Path(sys.argv[sys.argv.index("--tree") + 1]) if "--tree" in sys.argv else Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TREE))
BEFORE_DEFAULT = "d2e4e66"  # the last commit before shared/models.py (issue 24)

from werkzeug.datastructures import FileStorage, MultiDict  # noqa: E402
from werkzeug.test import encode_multipart  # noqa: E402

from shared.contract import ContractError  # noqa: E402
from shared.contract.uploads import check_request, read_request  # noqa: E402
from shared.percentiles import percentile  # noqa: E402
from shared.settings import AnalysisSettings  # noqa: E402

GROW = "/api/v1/hair/grow"
LIMITS = AnalysisSettings()


def multipart(image: bytes, **fields: str) -> tuple[bytes, str]:
    import io

    values = MultiDict([*fields.items(), ("image", FileStorage(io.BytesIO(image), "photo.jpg", "image", "image/jpeg"))])
    boundary, body = encode_multipart(values)
    return body, f"multipart/form-data; boundary={boundary}"


def as_json(image: bytes, **fields: object) -> tuple[bytes, str]:
    return json.dumps({"image_base64": base64.b64encode(image).decode(), **fields}).encode(), "application/json"


def timings(call: Callable[[], object], runs: int) -> list[float]:
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        with contextlib.suppress(ContractError):
            call()
        samples.append((time.perf_counter() - started) * 1000)
    return sorted(samples)


def in_process(runs: int, size: int) -> dict[str, list[float]]:
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
        "multipart small, bad field (1001)": (GROW, *multipart(jpeg[:20_000], plans="bald"), LIMITS),
        "JSON small, bad field (1001)": (GROW, *as_json(jpeg[:15_000], plans=["bald"]), LIMITS),
    }
    results = {
        name: timings(lambda: check_request(path, body, content_type, limits), runs)  # noqa: B023  timed here, in this iteration
        for name, (path, body, content_type, limits) in cases.items()
    }
    _, body, content_type, _ = cases["JSON base64 JPEG, valid"]
    results["read_request (host), JSON valid"] = timings(
        lambda: read_request("grow", body, content_type, LIMITS), max(runs // 3, 10)
    )
    return results


async def client_side(requests: int) -> dict[str, list[float]]:
    import tempfile

    import httpx

    from tests.fakes.launch import FakeCluster

    big = b"\x89PNG\r\n\x1a\n" + os.urandom(int(1.9 * 1024 * 1024 * 3 / 4) - 300)
    mark = "/api/v1/hair/mark"
    bodies: dict[str, dict[str, Any]] = {
        "client: JSON bad field, 1.9 MB": dict(
            content=as_json(big, drop_mm=1000)[0], headers={"Content-Type": "application/json"}
        ),
        "client: multipart bad field, 1.9 MB": dict(
            files={"image": ("a.png", big[: int(1.85 * 2**20)], "image/png")}, data={"drop_mm": "1000"}
        ),
        "client: JSON bad field, small": dict(
            content=as_json(big[:20_000], drop_mm=1000)[0], headers={"Content-Type": "application/json"}
        ),
    }
    with tempfile.TemporaryDirectory() as directory:
        cluster = FakeCluster(Path(directory))
        try:
            fakes = await cluster.fakes(1)
            gateway, _ = cluster.gateway("gateway", fakes, {})
            results: dict[str, list[float]] = {}
            async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as client:
                for name, kwargs in bodies.items():
                    request = client.build_request("POST", mark, **kwargs)  # encoded once, outside the timing
                    await client.send(request)  # warm-up: the connection, the first parse
                    samples = []
                    for _ in range(requests):
                        started = time.perf_counter()
                        answer = await client.send(request)
                        samples.append((time.perf_counter() - started) * 1000)
                        assert answer.json()["code"] == 1001, answer.text
                    results[name] = sorted(samples)
                # the document (issue 24: < 5 ms) where the revision serves it; /health: the floor
                for path in ("/openapi.json", "/health"):
                    if (await client.get(path)).status_code != 200:
                        continue
                    samples = []
                    for _ in range(requests):
                        started = time.perf_counter()
                        (await client.get(path)).raise_for_status()
                        samples.append((time.perf_counter() - started) * 1000)
                    results[f"client: GET {path}"] = sorted(samples)
            return results
        finally:
            cluster.stop()


def measure(args: argparse.Namespace) -> dict[str, list[float]]:
    import trio

    return {**in_process(args.runs, int(args.body_mb * 1024 * 1024)), **trio.run(client_side, args.client_requests)}


def measure_before(args: argparse.Namespace) -> dict[str, list[float]]:
    """This script, run on the code of `--before` (its shared/, edge/, tests/fakes …)."""
    import subprocess
    import tempfile

    root = Path(__file__).resolve().parents[1]
    with tempfile.TemporaryDirectory() as tree:
        archive = subprocess.run(
            ["git", "-C", str(root), "archive", args.before], check=True, capture_output=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", tree], input=archive, check=True)
        argv = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--tree",
            tree,
            "--json",
            "--runs",
            str(args.runs),
            "--body-mb",
            str(args.body_mb),
            "--client-requests",
            str(args.client_requests),
        ]
        return json.loads(subprocess.run(argv, check=True, capture_output=True, text=True, cwd=tree).stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--body-mb", type=float, default=2.0)
    parser.add_argument("--client-requests", type=int, default=200)
    parser.add_argument("--before", default=BEFORE_DEFAULT, help="the revision to compare with (default: %(default)s)")
    parser.add_argument("--tree", help=argparse.SUPPRESS)
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.json:  # the child of measure_before
        print(json.dumps(measure(args)))
        return
    before = measure_before(args)
    after = measure(args)
    print(f"p50 / p99 / max in ms; before = {args.before}, after = this checkout")
    print(f"{'case':<40} {'before p50':>10} {'p99':>7} {'max':>7} | {'after p50':>9} {'p99':>7} {'max':>7}")
    for name, samples in after.items():
        old = before.get(name)
        left = (
            f"{percentile(old, 0.5):10.2f} {percentile(old, 0.99):7.2f} {old[-1]:7.2f}"
            if old
            else f"{'-':>10} {'-':>7} {'-':>7}"
        )
        print(
            f"{name:<40} {left} | {percentile(samples, 0.5):9.2f} {percentile(samples, 0.99):7.2f} {samples[-1]:7.2f}"
        )


if __name__ == "__main__":
    main()
