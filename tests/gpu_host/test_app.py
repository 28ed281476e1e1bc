"""The GPU host app over HTTP (Quart test client) with a real spawned fake child behind it:
auth, /health, crashes and timeouts. Request bodies and error envelopes: test_requests.py."""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path
from typing import Any

import pytest
import trio

from shared.contract import (
    BUSY_KEY,
    HEADER_HOST_WANTED,
    HEADER_MODEL_VERSION,
    MSG_BACKEND_UNAVAILABLE,
    MSG_HOST_BUSY,
    WANTED_KEY,
)
from shared.contract.endpoints import AnsweredBy, answered_by
from shared.secrets_file import SecretsSource
from shared.settings import ENV_ACCEPT_PASSWORDS, token_fingerprint
from tests.gpu_host.conftest import (
    MODEL_VERSION,
    OLD_TOKEN,
    TOKEN,
    WAIT_SECONDS,
    Fifos,
    auth,
    fake_model,
    image_file,
    job_running,
    post_image,
    serving,
)

WAIT = WAIT_SECONDS


# -- auth ---------------------------------------------------------------------------------

ROUTES = [("GET", "/health"), ("GET", "/metrics"), ("POST", "/api/v1/hair/unknown")] + [
    ("POST", endpoint.path) for endpoint in answered_by(AnsweredBy.GPU_HOST)
]


@pytest.mark.parametrize("presented", [None, "", "wrong-token", TOKEN.upper(), TOKEN + " "])
async def test_every_route_refuses_a_missing_or_wrong_token_and_runs_nothing(
    presented: str | None, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    model = fake_model()
    async with serving(model) as client:
        await model.wait_ready()
        pid = model.statistics().pid
        headers = {} if presented is None else {"X-Internal-Token": presented}
        for method, path in ROUTES:
            # b"crash" would kill the child if any business logic ran
            response = await client.open(path, method=method, headers=headers, files=image_file(b"crash"))
            assert (response.status_code, await response.get_json()) == (401, {"status": "unauthorized"}), path
        stats = model.statistics()
    assert (stats.pid, stats.restarts) == (pid, 0)
    for secret in (TOKEN, OLD_TOKEN, "wrong-token"):
        assert secret.lower() not in caplog.text.lower()


async def test_every_accepted_token_works_and_only_its_fingerprint_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    model = fake_model()
    async with serving(model) as client:
        await model.wait_ready()
        for token in (TOKEN, OLD_TOKEN):
            response = await client.get("/health", headers={"X-Internal-Token": token})
            assert response.status_code == 200
    assert TOKEN not in caplog.text and OLD_TOKEN not in caplog.text
    assert token_fingerprint(OLD_TOKEN) in caplog.text


# -- /health ------------------------------------------------------------------------------


async def test_health_is_503_loading_until_the_child_is_ready(tmp_path: Any) -> None:
    gate = tmp_path / "gate"
    os.mkfifo(gate)
    model = fake_model(load_gate=str(gate))
    async with serving(model) as client:
        loading = await client.get("/health", headers=auth())
        refused = await post_image(client, b"ok")

        def open_gate() -> None:
            with open(gate, "w") as pipe:
                pipe.write("go\n")

        await trio.to_thread.run_sync(open_gate)
        with trio.fail_after(WAIT):
            await model.wait_ready()
        ready = await client.get("/health", headers=auth())
        no_problem = {
            "inference_timeout_seconds": 30.0,
            "model_version": MODEL_VERSION,  # known from the start: also while loading
            "checks": {"disk": "ok", "comfyui": "off"},
            "disk_age_seconds": None,
        }
        assert (loading.status_code, await loading.get_json()) == (503, {"status": "loading", **no_problem})
        # a request that reaches a host that is not ready is not an answer about the photo:
        # 503 lets the gateway send it elsewhere
        assert (refused.status_code, refused.headers[HEADER_MODEL_VERSION]) == (503, MODEL_VERSION)
        assert {k: (await refused.get_json())[k] for k in ("code", "message")} == {
            "code": 1007,
            "message": MSG_BACKEND_UNAVAILABLE,
        }
        assert (ready.status_code, await ready.get_json()) == (
            200,
            {"status": "ok", "device": "cpu", "segmenter": "fake", "busy": False, "wanted": False, **no_problem},
        )


async def test_every_api_answer_names_the_model_version_health_reports() -> None:
    model = fake_model()
    async with serving(model) as client:
        await model.wait_ready()
        health = await client.get("/health", headers=auth())
        answers = [
            await post_image(client, b"ok"),
            await post_image(client, b"fail:1005"),  # the photo refused
            await post_image(client, b"raise"),  # a 1007
            await client.post("/api/v1/hair/nowhere", headers=auth()),  # the error handler's envelope
        ]
    assert (await health.get_json())["model_version"] == MODEL_VERSION
    assert MODEL_VERSION.startswith("0.") and "+" in MODEL_VERSION  # "<package version>+<12 hex>"
    assert [answer.headers.get(HEADER_MODEL_VERSION) for answer in answers] == [MODEL_VERSION] * 4
    assert [(await answer.get_json())["code"] for answer in answers] == [0, 1005, 1007, 1001]


async def test_health_answers_while_an_inference_runs(fifos: Fifos) -> None:
    model = fake_model()
    async with serving(model) as client:
        await model.wait_ready()
        async with job_running(client, fifos) as answers:
            with trio.fail_after(WAIT):  # a health check that waited for the inference would hang here
                during = await client.get("/health", headers=auth())
            assert answers == []  # ... and the inference is still running: health did not wait for it
        after = await client.get("/health", headers=auth())
    assert (during.status_code, (await during.get_json())["busy"]) == (200, True)
    assert (await answers[0].get_json())["code"] == 0
    assert (await after.get_json())["busy"] is False


async def test_a_probe_that_wants_the_host_while_a_job_runs_is_told_to_the_other_probes(fifos: Fifos) -> None:
    # gateway.md § Several gateways: the gateway whose job runs reads "wanted" on its own
    # probes and lets the host go when the job ends; a host asked while free is simply free
    model = fake_model()
    wants = {**auth(), HEADER_HOST_WANTED: "1"}
    async with serving(model) as client:
        await model.wait_ready()
        idle_asked = await (await client.get("/health", headers=wants)).get_json()
        async with job_running(client, fifos):
            before = await (await client.get("/health", headers=auth())).get_json()
            await client.get("/health", headers=wants)
            during = await (await client.get("/health", headers=auth())).get_json()
        after = await (await client.get("/health", headers=auth())).get_json()
    assert [idle_asked[WANTED_KEY], before[WANTED_KEY], during[WANTED_KEY]] == [False, False, True]
    assert (after[BUSY_KEY], after[WANTED_KEY]) == (False, False), "a free host is not wanted: it is free"


async def test_a_request_while_a_job_runs_is_answered_503_busy_at_once(fifos: Fifos) -> None:
    model = fake_model()
    async with serving(model) as client:
        await model.wait_ready()
        async with job_running(client, fifos) as answers:
            with trio.fail_after(5):  # at once: a host that queued would wait until the job is released
                second = await post_image(client, b"ok")
        after = await post_image(client, b"ok")
    busy = await second.get_json()
    assert second.status_code == 503
    assert (busy["code"], busy["message"], busy["busy"], busy["data"]) == (1007, MSG_HOST_BUSY, True, None)
    assert busy["request_id"] == second.headers["X-Request-ID"]
    assert (await answers[0].get_json())["code"] == 0  # the job that ran was not disturbed
    assert (after.status_code, (await after.get_json())["code"]) == (200, 0)


async def test_health_says_why_when_the_models_cannot_load() -> None:
    model = fake_model(load="fail")
    async with serving(model) as client:
        with trio.fail_after(WAIT):
            await model.wait_transition()  # spawned -> failed
            if model.statistics().state.value == "loading":
                await model.wait_transition()
        response = await client.get("/health", headers=auth())
    body = await response.get_json()
    assert response.status_code == 503
    assert body["status"] == "error"
    assert "weights file not found" in body["message"]


# -- crashes and timeouts -----------------------------------------------------------------


async def test_sigkilled_child_mid_request_gives_1007_then_health_recovers(fifos: Fifos) -> None:
    model = fake_model()
    async with serving(model) as client:
        await model.wait_ready()
        answers: list[Any] = []
        async with trio.open_nursery() as nursery:

            async def doomed() -> None:
                answers.append(await post_image(client, fifos.command))

            nursery.start_soon(doomed)
            with trio.fail_after(WAIT):
                os.kill(await fifos.wait_entered(), signal.SIGKILL)
        crashed = await client.get("/health", headers=auth())
        with trio.fail_after(WAIT):
            await model.wait_ready()
        recovered = await client.get("/health", headers=auth())
        following = await post_image(client, b"ok", **{"gender": "female"})
    doomed_body = await answers[0].get_json()
    # a crash names no cause: `internal` (gateway.md § Failure kinds)
    assert (answers[0].status_code, doomed_body["code"], doomed_body["data"]) == (200, 1007, {"error_type": "internal"})
    assert crashed.status_code == 503
    assert "died" in (await crashed.get_json())["message"]
    assert recovered.status_code == 200
    assert (await following.get_json())["code"] == 0
    assert (await following.get_json())["data"]["options"]["gender"] == "female"


async def test_inference_over_the_timeout_gives_1007_then_the_next_request_works() -> None:
    model = fake_model(timeout=1.0)
    async with serving(model) as client:
        await model.wait_ready()
        hung = await post_image(client, b"hang")
        with trio.fail_after(WAIT):
            await model.wait_ready()
        following = await post_image(client, b"ok")
    assert (await hung.get_json())["code"] == 1007
    assert (await following.get_json())["code"] == 0


async def test_child_failures_pass_through_as_envelopes() -> None:
    model = fake_model()
    async with serving(model) as client:
        await model.wait_ready()
        no_face = await post_image(client, b"fail:1005")
        bug = await post_image(client, b"raise")
    assert {k: (await no_face.get_json())[k] for k in ("code", "message", "data")} == {
        "code": 1005,
        "message": "scripted failure",
        "data": None,
    }
    assert (bug.status_code, (await bug.get_json())["code"]) == (200, 1007)


async def test_a_result_that_cannot_be_json_encoded_is_a_1007_answer_that_ejects_nobody(
    caplog: pytest.LogCaptureFixture,
) -> None:
    model = fake_model()
    async with serving(model) as client:
        await model.wait_ready()
        response = await post_image(client, b"unencodable")
        following = await post_image(client, b"ok")
    body = await response.get_json()
    # HTTP 200: an answer about this request, not a broken host (the gateway ejects on 5xx)
    assert (response.status_code, body["code"], body["data"]) == (200, 1007, {"error_type": "internal"})
    assert body["request_id"] == response.headers["X-Request-ID"]
    assert "internal error" in caplog.text and body["request_id"] in caplog.text
    assert (await following.get_json())["code"] == 0


# -- admin --------------------------------------------------------------------------------


async def test_admin_tokens_are_mounted_behind_the_token_and_see_business_requests(tmp_path: Path) -> None:
    secrets = SecretsSource(tmp_path / "secrets.toml", ENV_ACCEPT_PASSWORDS, from_environment=False)
    secrets.path.write_text(f'[auth]\naccept_passwords = ["{TOKEN}", "{OLD_TOKEN}"]\n')
    new_token = "tok-next-0123456789abcdef"
    model = fake_model()
    async with serving(model, secrets=secrets) as client:
        await model.wait_ready()
        refused = await client.get("/admin/tokens", headers={"X-Internal-Token": "wrong"})
        await post_image(client, b"ok")  # authenticated with TOKEN
        listing = await (await client.get("/admin/tokens", headers=auth())).get_json()
        added = await client.post("/admin/tokens", headers=auth(), json={"add": new_token})
        with_new = await client.get("/health", headers={"X-Internal-Token": new_token})
    assert refused.status_code == 401
    used = {entry["fingerprint"]: entry["last_used_seconds_ago"] for entry in listing["tokens"]}
    assert used[token_fingerprint(TOKEN)] is not None and used[token_fingerprint(OLD_TOKEN)] is None
    assert (added.status_code, with_new.status_code) == (200, 200)
    assert new_token in secrets.path.read_text()


async def test_without_a_secrets_source_there_is_no_admin_route() -> None:
    model = fake_model()
    async with serving(model) as client:
        response = await client.get("/admin/tokens", headers=auth())
    assert response.status_code == 404
