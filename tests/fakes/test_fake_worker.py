"""The fake worker's own promises, in-process: the gateway tests are only as honest as its counters."""

from __future__ import annotations

import base64
from functools import partial

import httpx
import trio
import trio.testing

from shared.contract import is_envelope
from tests.fakes.fake_worker import FAKE_MODEL_VERSION, PNG_BYTES, FakeWorker, create_app
from tests.fakes.serve import serve_on_loopback

TOKEN = "fake-token"
AUTH = {"X-Internal-Token": TOKEN}


async def test_health_requires_the_token_and_reports_busy_and_loading() -> None:
    worker = FakeWorker(TOKEN)
    client = create_app(worker).test_client()
    unauthorized = await client.get("/health")
    assert (unauthorized.status_code, await unauthorized.get_json()) == (401, {"status": "unauthorized"})
    ok = await client.get("/health", headers=AUTH)
    ready = {"status": "ok", "device": "cpu", "segmenter": "fallback", "busy": False, "wanted": False}
    assert await ok.get_json() == {**ready, "model_version": FAKE_MODEL_VERSION}
    worker.knobs.update({"health_busy": True})
    assert (await (await client.get("/health", headers=AUTH)).get_json())["busy"] is True
    worker.knobs.update({"not_ready": True})
    loading = await client.get("/health", headers=AUTH)
    assert (loading.status_code, await loading.get_json()) == (
        503,
        {"status": "loading", "model_version": FAKE_MODEL_VERSION},
    )
    worker.knobs.update({"not_ready": False, "model_version": ""})  # a host of before: names none
    assert "model_version" not in await (await client.get("/health", headers=AUTH)).get_json()


async def test_overlapping_jobs_are_counted() -> None:
    worker = FakeWorker(TOKEN)
    worker.knobs.update({"hold": True})
    client = create_app(worker).test_client()
    async with trio.open_nursery() as nursery:
        for request_id in ("first", "second"):
            headers = {**AUTH, "X-Request-ID": request_id}
            nursery.start_soon(partial(client.post, "/api/v1/hair/measure", headers=headers))
            await trio.testing.wait_all_tasks_blocked()  # "first" is held before "second" starts
        assert worker.stats.in_flight == 2
        worker.release()
    assert (worker.stats.overlaps, worker.stats.max_concurrent, worker.stats.in_flight) == (1, 2, 0)
    assert [job["request_id"] for job in worker.stats.jobs] == ["first", "second"]


async def test_answers_an_envelope_with_a_real_png_and_fails_on_demand() -> None:
    worker = FakeWorker(TOKEN)
    client = create_app(worker).test_client()
    response = await client.post("/api/v1/hair/measure", headers={**AUTH, "X-Request-ID": "r1"}, json={})
    body = await response.get_json()
    assert is_envelope(body) and body["request_id"] == "r1"
    assert response.headers["X-Model-Version"] == FAKE_MODEL_VERSION
    assert base64.b64decode(body["data"]["annotated_image_base64"]) == PNG_BYTES
    assert PNG_BYTES.startswith(b"\x89PNG\r\n\x1a\n")
    worker.knobs.update({"fail_next": 1, "fail_status": 503})
    assert (await client.post("/api/v1/hair/measure", headers=AUTH)).status_code == 503
    assert (await client.post("/api/v1/hair/measure", headers=AUTH)).status_code == 200
    forged = await client.post("/api/v1/hair/measure", headers={"X-Internal-Token": "other"})
    assert forged.status_code == 401 and worker.stats.unauthorized == 1


async def test_refuse_when_busy_answers_a_second_job_503_busy_without_running_it() -> None:
    worker = FakeWorker(TOKEN)
    worker.knobs.update({"hold": True, "refuse_when_busy": True})
    client = create_app(worker).test_client()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(partial(client.post, "/api/v1/hair/measure", headers=AUTH))
        await trio.testing.wait_all_tasks_blocked()  # the first job is held
        second = await client.post("/api/v1/hair/measure", headers={**AUTH, "X-Request-ID": "second"})
        worker.release()
    body = await second.get_json()
    assert second.status_code == 503
    assert (body["code"], body["busy"], body["request_id"]) == (1007, True, "second")
    assert (worker.stats.busy_refused, worker.stats.overlaps, len(worker.stats.jobs)) == (1, 0, 1)
    worker.knobs.update({"hold": False})
    assert (await client.post("/api/v1/hair/measure", headers=AUTH)).status_code == 200  # idle again


async def test_health_reports_checks_and_a_closed_connection_is_a_departure(nursery) -> None:
    """Over real sockets: Quart cancels a job whose client closed the connection."""
    worker = FakeWorker(TOKEN)
    worker.knobs.update(
        {"latency_ms_by_path": {"/api/v1/hair/grow": 3000}, "checks": {"disk": "ok", "comfyui": "down"},
         "inference_timeout_seconds": 50}
    )  # fmt: skip
    url = await nursery.start(serve_on_loopback, create_app(worker))
    async with httpx.AsyncClient(base_url=url, headers=AUTH) as client:
        health = (await client.get("/health")).json()
        assert (health["checks"], health["inference_timeout_seconds"]) == ({"disk": "ok", "comfyui": "down"}, 50)
        assert (await client.post("/api/v1/hair/measure", json={})).status_code == 200  # no latency for it
        with trio.move_on_after(0.3):
            await client.post("/api/v1/hair/grow", json={}, headers={"X-Request-ID": "leaves"})
    with trio.fail_after(2):
        while not worker.stats.departures:
            await trio.sleep(0.01)
    (departure,) = worker.stats.departures
    assert departure["request_id"] == "leaves" and departure["after_s"] < 1
    assert worker.stats.in_flight == 0
