"""A fake GPU host: the real worker HTTP API, no models, knobs for every failure the gateway must survive.

It speaks what `gpu_host/` speaks to the gateway (gpu_host.md): `GET /health` and the
`POST /api/v1/hair/*` endpoints, both behind `X-Internal-Token`, answering envelopes whose
images are `*_base64` PNGs. A test-only control API under `/_fake/` turns the knobs and
reads what the fake saw: the order of the jobs it received and how often two of them
overlapped — the gateway promises that never happens on one worker. Service times can
differ per path (`latency_ms_by_path`: a 2 s generation beside a 50 ms measurement); a
job whose connection the gateway closes is counted in `departures` (with how long after
its start the close came) and stops at once, like an interrupted ComfyUI prompt — or,
with `finish_after_departure`, keeps the host busy until its service time is up, like a
model inference that is left to finish. `/health` reports `checks` and
`inference_timeout_seconds` when those knobs are set, as a real host does, and its
`model_version` (a knob: an upgrade changes it), which every answer names too. With `refuse_when_busy`
it answers a job that arrives while another runs as a real GPU host does (503, 1007,
`"busy": true`) and counts it in `busy_refused`; off by default, so that a gateway that
sends one worker two jobs shows up in `overlaps` instead of being saved by the refusal.

Run as a real process (the gateway under test must cross a process boundary):

    python -m tests.fakes.fake_worker --port 0 --token T [--latency-ms N]

Once listening it prints one JSON line on stdout, `{"event": "ready", "url": ...}`, so a
launcher learns the bound port (port 0 picks a free one) without polling.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import dataclasses
import hashlib
import hmac
import io
import json
import os
import sys
import time
from typing import Any, Literal, cast

import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve
from PIL import Image
from quart import Response, request
from quart.json.provider import DefaultJSONProvider
from quart_trio import QuartTrio

from gpu_host.wanted import HostWanted
from shared.contract import (
    HEADER_FORWARDED_FOR,
    HEADER_HOST_WANTED,
    HEADER_MODEL_VERSION,
    HEADER_REQUEST_ID,
    HEADER_REQUEST_TIMEOUT_MS,
    HEADER_TOKEN,
    MODEL_VERSION_KEY,
    Code,
    busy_envelope,
    envelope,
    success,
)

ImageMode = Literal["png", "none", "bad_base64", "not_png"]
Shape = Literal["flat", "nested"]


def _tiny_png() -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (8, 6), (200, 120, 40)).save(buffer, format="PNG")
    return buffer.getvalue()


PNG_BYTES = _tiny_png()
PNG_BASE64 = base64.b64encode(PNG_BYTES).decode()
NOT_BASE64 = "!!not*base64@@"
NOT_PNG_BASE64 = base64.b64encode(b"GIF89a this is not a PNG").decode()
FAKE_MODEL_VERSION = "0.0.0+fake00000000"  # the shape gpu_host.version gives, never a real one


@dataclasses.dataclass
class Knobs:
    """What the fake does; changed at run time through `POST /_fake/config`."""

    latency_ms: float = 0.0
    latency_ms_by_path: dict[str, float] = dataclasses.field(default_factory=dict)  # overrides latency_ms
    finish_after_departure: bool = False  # a closed connection does not end the job early
    checks: dict[str, str] | None = None  # /health "checks", e.g. {"disk": "ok", "comfyui": "down"}
    inference_timeout_seconds: float | None = None  # /health reports it when set
    fail_next: int = 0  # answer the next N jobs with HTTP `fail_status`
    fail_status: int = 500
    fail_all: bool = False  # answer every job with HTTP `fail_status`
    not_ready: bool = False  # /health 503 {"status": "loading"}
    health_busy: bool = False  # /health says busy although no job runs
    hold: bool = False  # jobs wait for `POST /_fake/release`
    hold_paths: list[str] = dataclasses.field(default_factory=list)  # … only the jobs on these paths
    crash: bool = False  # the next job kills the process mid-request (os._exit)
    refuse_when_busy: bool = False  # a job while another runs: 503 busy, like a real host
    image: ImageMode = "png"  # "none": a small envelope without images (benchmarks)
    shape: Shape = "flat"  # "nested": images in objects in arrays, and nulls
    answer_code: int = 0  # not 0: every job gets this envelope code (e.g. a host's own 1007)
    # what /health and every answer name as the host's model version (an upgrade changes it);
    # "": the host of before seed 002 §6.2, which names none
    model_version: str = FAKE_MODEL_VERSION

    def update(self, changes: dict[str, Any]) -> None:
        names = {field.name for field in dataclasses.fields(self)}
        unknown = set(changes) - names
        if unknown:
            raise ValueError(f"unknown knobs: {sorted(unknown)}")
        for name, value in changes.items():
            setattr(self, name, value)


@dataclasses.dataclass
class Stats:
    """What the fake saw. `overlaps` counts jobs that started while another was running."""

    jobs: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    in_flight: int = 0
    max_concurrent: int = 0
    overlaps: int = 0
    busy_refused: int = 0  # jobs answered 503 busy (`refuse_when_busy`): they never ran
    completed: int = 0
    health_checks: int = 0
    probes_before_first_job: int | None = None
    unauthorized: int = 0
    # jobs whose connection closed before their answer: request_id, seconds after its start
    departures: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    def snapshot(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class FakeWorker:
    """The state behind one fake worker process."""

    def __init__(self, token: str, latency_ms: float = 0.0) -> None:
        self.token = token
        self.knobs = Knobs(latency_ms=latency_ms)
        self.stats = Stats()
        self.released = trio.Event()
        self.wanted = HostWanted()  # as a real host hears its probes (gpu_host.wanted)

    def authorized(self) -> bool:
        values = request.headers.getlist(HEADER_TOKEN)
        # Exactly one token: a gateway that forwards a client's token beside its own fails here.
        ok = len(values) == 1 and hmac.compare_digest(values[0].encode(), self.token.encode())
        if not ok:
            self.stats.unauthorized += 1
        return ok

    def begin_job(self, path: str, body: bytes) -> None:
        stats = self.stats
        if stats.probes_before_first_job is None:
            stats.probes_before_first_job = stats.health_checks
        stats.in_flight += 1
        if stats.in_flight > 1:
            stats.overlaps += 1
        stats.max_concurrent = max(stats.max_concurrent, stats.in_flight)
        stats.jobs.append(
            {
                "request_id": request.headers.get(HEADER_REQUEST_ID),
                "path": path,
                "forwarded_for": request.headers.get(HEADER_FORWARDED_FOR),
                "content_type": request.headers.get("Content-Type"),
                "bytes": len(body),
                "sha256": hashlib.sha256(body).hexdigest(),
                "query": request.query_string.decode(),
                "request_timeout_ms": request.headers.get(HEADER_REQUEST_TIMEOUT_MS),
                "at": time.monotonic(),
            }
        )

    async def wait_service_time(self, path: str) -> None:
        started = time.monotonic()
        latency_ms = self.knobs.latency_ms_by_path.get(path, self.knobs.latency_ms)
        try:
            if self.knobs.hold or path in self.knobs.hold_paths:
                await self.released.wait()
            if latency_ms > 0:
                await trio.sleep(latency_ms / 1000)
        except trio.Cancelled:  # Quart cancels the handler: the gateway closed the connection
            self.stats.departures.append(
                {
                    "request_id": request.headers.get(HEADER_REQUEST_ID),
                    "after_s": time.monotonic() - started,
                    "at": time.monotonic(),
                }
            )
            if self.knobs.finish_after_departure:
                with trio.CancelScope(shield=True):
                    await trio.sleep_until(
                        trio.current_time() + max(0.0, latency_ms / 1000 - (time.monotonic() - started))
                    )
            raise

    def failure_status(self) -> int | None:
        if self.knobs.fail_all:
            return self.knobs.fail_status
        if self.knobs.fail_next > 0:
            self.knobs.fail_next -= 1
            return self.knobs.fail_status
        return None

    def release(self) -> None:
        self.released.set()
        self.released = trio.Event()


def _images(mode: ImageMode, count: int) -> list[str]:
    """`count` image values; in a bad mode only the last is bad, so good ones come first."""
    bad = {"bad_base64": NOT_BASE64, "not_png": NOT_PNG_BASE64}.get(mode)
    values = [PNG_BASE64] * count
    if bad is not None and values:
        values[-1] = bad
    return values


def job_data(path: str, knobs: Knobs) -> dict[str, Any]:
    """The `data` of a successful answer, shaped like the real endpoints' (contract.md)."""
    data: dict[str, Any] = {"segmenter": "fallback", "endpoint": path.rsplit("/", 1)[-1]}
    if knobs.image == "none":
        data["measurements"] = {"forehead_height_mm": 61.5, "thirds_ratio": [0.32, 0.33, 0.35]}
        return data
    if knobs.shape == "flat":
        (annotated,) = _images(knobs.image, 1)
        data["annotated_image_base64"] = annotated
        return data
    a, b, c, d, e, f = _images(knobs.image, 6)
    data.update(
        {
            "annotated_image_base64": a,
            "results": [
                {"plan": "conservative", "hairline_drop_mm": 3.0, "image_base64": b, "grown_image_base64": None},
                {"plan": "standard", "hairline_drop_mm": 5.0, "image_base64": c, "grown_image_base64": d},
            ],
            "hairline_images": [{"style": "straight", "image_base64": e}],
            "extra": {"grid": [[{"deep_base64": f}], [None, 1, "text_base64"]], "mask_image_base64": None},
            "hair_area_ratio": 0.25,
        }
    )
    return data


def create_app(worker: FakeWorker) -> QuartTrio:
    app = QuartTrio(__name__)
    app.config["MAX_CONTENT_LENGTH"] = None
    cast(
        DefaultJSONProvider, app.json
    ).sort_keys = False  # keep document order: in a bad image mode the bad image comes last

    def unauthorized() -> tuple[dict, int]:
        return {"status": "unauthorized"}, 401

    @app.get("/health")
    async def health() -> Any:
        if not worker.authorized():
            return unauthorized()
        worker.stats.health_checks += 1
        # a real host names its version in every /health, loading too (gpu_host.app)
        version = {MODEL_VERSION_KEY: worker.knobs.model_version} if worker.knobs.model_version else {}
        if worker.knobs.not_ready:
            return {"status": "loading", **version}, 503
        busy = worker.knobs.health_busy or worker.stats.in_flight > 0
        now = trio.current_time()
        if request.headers.get(HEADER_HOST_WANTED) == "1":
            worker.wanted.heard(now, busy=busy)
        answer: dict[str, Any] = {"status": "ok", "device": "cpu", "segmenter": "fallback", "busy": busy}
        answer["wanted"] = worker.wanted.wanted(now, busy=busy)
        if worker.knobs.inference_timeout_seconds is not None:
            answer["inference_timeout_seconds"] = worker.knobs.inference_timeout_seconds
        if worker.knobs.checks is not None:
            answer["checks"] = worker.knobs.checks
        return {**answer, **version}

    @app.after_request
    async def name_the_model(response: Response) -> Response:
        # a real host names its version on every /api/ answer (gpu_host.app)
        if request.path.startswith("/api/") and worker.knobs.model_version:
            response.headers[HEADER_MODEL_VERSION] = worker.knobs.model_version
        return response

    @app.post("/api/v1/hair/<name>")
    async def job(name: str) -> Any:
        if not worker.authorized():
            return unauthorized()
        body = await request.get_data(True, False, False)  # (cache, as_text, parse_form_data): bytes
        if worker.knobs.refuse_when_busy and worker.stats.in_flight > 0:
            worker.stats.busy_refused += 1
            request_id = request.headers.get(HEADER_REQUEST_ID) or "fake-without-request-id"
            return busy_envelope(request_id), 503
        worker.begin_job(request.path, body)
        try:
            if worker.knobs.crash:
                os._exit(1)  # the GPU host died with the request half-done
            await worker.wait_service_time(request.path)
            status = worker.failure_status()
            if status is not None:
                return {"error": "fake failure"}, status
            request_id = request.headers.get(HEADER_REQUEST_ID) or "fake-without-request-id"
            if worker.knobs.answer_code:
                return envelope(Code(worker.knobs.answer_code), request_id)
            return success(request_id, job_data(request.path, worker.knobs))
        finally:
            worker.stats.in_flight -= 1
            worker.stats.completed += 1

    @app.post("/_fake/config")
    async def configure() -> Any:
        try:
            worker.knobs.update(await request.get_json(force=True))
        except (ValueError, TypeError) as error:
            return {"error": str(error)}, 400
        return dataclasses.asdict(worker.knobs)

    @app.get("/_fake/stats")
    async def stats() -> Any:
        return worker.stats.snapshot()

    @app.post("/_fake/release")
    async def release() -> Any:
        worker.release()
        return {"released": True}

    @app.post("/_fake/reset")
    async def reset() -> Any:
        worker.stats = Stats(in_flight=worker.stats.in_flight)
        return {"reset": True}

    @app.errorhandler(404)
    async def not_found(_: Exception) -> Response:
        return Response(json.dumps({"status": "not found"}), status=404, content_type="application/json")

    return app


async def serve_fake(host: str, port: int, worker: FakeWorker) -> None:
    config = HypercornConfig()
    config.bind = [f"{host}:{port}"]
    config.accesslog = None
    config.errorlog = None  # its "Running on" line would go to stdout's neighbour; we print our own
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(serve, create_app(worker), config)
        print(json.dumps({"event": "ready", "url": binds[0]}), flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="a fake GPU host for gateway tests")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0: pick a free port")
    parser.add_argument("--token", required=True, help="the X-Internal-Token it accepts")
    parser.add_argument("--latency-ms", type=float, default=0.0)
    args = parser.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        trio.run(serve_fake, args.host, args.port, FakeWorker(args.token, args.latency_ms))
    return 0


if __name__ == "__main__":
    sys.exit(main())
