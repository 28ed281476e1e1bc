"""The GPU host app over HTTP (Quart test client) with a real spawned fake child behind it."""

from __future__ import annotations

import base64
import io
import logging
import os
import signal
from typing import Any

import pytest
import trio
from werkzeug.datastructures import FileStorage

from shared.contract import GPU_ENDPOINT_PATHS, MSG_BACKEND_UNAVAILABLE, Code
from tests.gpu_host.conftest import LIMITS, OLD_TOKEN, TOKEN, Fifos, auth, fake_model, serving

WAIT = 30
MEASURE = "/api/v1/hair/measure"


def _file(content: bytes, name: str = "photo.jpg") -> dict[str, FileStorage]:
    return {"image": FileStorage(io.BytesIO(content), filename=name, content_type="image/jpeg")}


async def _json(response: Any) -> dict:
    return await response.get_json()


async def _post_image(client: Any, content: bytes, path: str = MEASURE, **form: str) -> Any:
    return await client.post(path, headers=auth(), files=_file(content), form=form)


# -- auth ---------------------------------------------------------------------------------

ROUTES = [("GET", "/health"), ("GET", "/metrics"), ("POST", "/api/v1/hair/unknown")] + [
    ("POST", path) for path in GPU_ENDPOINT_PATHS
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
            response = await client.open(path, method=method, headers=headers, files=_file(b"crash"))
            assert (response.status_code, await _json(response)) == (401, {"status": "unauthorized"}), path
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
    from shared.settings import token_fingerprint

    assert token_fingerprint(OLD_TOKEN) in caplog.text


# -- /health ------------------------------------------------------------------------------


async def test_health_is_503_loading_until_the_child_is_ready(tmp_path: Any) -> None:
    gate = tmp_path / "gate"
    os.mkfifo(gate)
    model = fake_model(load_gate=str(gate))
    async with serving(model) as client:
        loading = await client.get("/health", headers=auth())
        refused = await _post_image(client, b"ok")

        def open_gate() -> None:
            with open(gate, "w") as pipe:
                pipe.write("go\n")

        await trio.to_thread.run_sync(open_gate)
        with trio.fail_after(WAIT):
            await model.wait_ready()
        ready = await client.get("/health", headers=auth())
        assert (loading.status_code, await _json(loading)) == (503, {"status": "loading"})
        # a request that reaches a host that is not ready is not an answer about the photo:
        # 503 lets the gateway send it elsewhere
        assert refused.status_code == 503
        assert {k: (await _json(refused))[k] for k in ("code", "message")} == {
            "code": 1007,
            "message": MSG_BACKEND_UNAVAILABLE,
        }
        assert (ready.status_code, await _json(ready)) == (
            200,
            {"status": "ok", "device": "cpu", "segmenter": "fake", "busy": False},
        )


async def test_health_answers_while_an_inference_runs(fifos: Fifos) -> None:
    model = fake_model()
    async with serving(model) as client:
        await model.wait_ready()
        answers: list[Any] = []
        done = trio.Event()

        async def slow_request() -> None:
            answers.append(await _post_image(client, fifos.command))
            done.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(slow_request)
            with trio.fail_after(WAIT):
                await fifos.wait_entered()  # the child is inside the inference now
            with trio.fail_after(WAIT):  # a health check that waited for the inference would hang here
                during = await client.get("/health", headers=auth())
            assert answers == []  # ... and the inference is still running: health did not wait for it
            await fifos.release_child()
            with trio.fail_after(WAIT):
                await done.wait()
        after = await client.get("/health", headers=auth())
    assert (during.status_code, (await _json(during))["busy"]) == (200, True)
    assert (await _json(answers[0]))["code"] == 0
    assert (await _json(after))["busy"] is False


async def test_health_says_why_when_the_models_cannot_load() -> None:
    model = fake_model(load="fail")
    async with serving(model) as client:
        with trio.fail_after(WAIT):
            await model.wait_transition()  # spawned -> failed
            if model.statistics().state.value == "loading":
                await model.wait_transition()
        response = await client.get("/health", headers=auth())
    body = await _json(response)
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
                answers.append(await _post_image(client, fifos.command))

            nursery.start_soon(doomed)
            with trio.fail_after(WAIT):
                os.kill(await fifos.wait_entered(), signal.SIGKILL)
        crashed = await client.get("/health", headers=auth())
        with trio.fail_after(WAIT):
            await model.wait_ready()
        recovered = await client.get("/health", headers=auth())
        following = await _post_image(client, b"ok", **{"gender": "female"})
    doomed_body = await _json(answers[0])
    assert (answers[0].status_code, doomed_body["code"], doomed_body["data"]) == (200, 1007, None)
    assert crashed.status_code == 503
    assert "died" in (await _json(crashed))["message"]
    assert recovered.status_code == 200
    assert (await _json(following))["code"] == 0
    assert (await _json(following))["data"]["options"]["gender"] == "female"


async def test_inference_over_the_timeout_gives_1007_then_the_next_request_works() -> None:
    model = fake_model(timeout=1.0)
    async with serving(model) as client:
        await model.wait_ready()
        hung = await _post_image(client, b"hang")
        with trio.fail_after(WAIT):
            await model.wait_ready()
        following = await _post_image(client, b"ok")
    assert (await _json(hung))["code"] == 1007
    assert (await _json(following))["code"] == 0


async def test_child_failures_pass_through_as_envelopes() -> None:
    model = fake_model()
    async with serving(model) as client:
        await model.wait_ready()
        no_face = await _post_image(client, b"fail:1005")
        bug = await _post_image(client, b"raise")
    assert {k: (await _json(no_face))[k] for k in ("code", "message", "data")} == {
        "code": 1005,
        "message": "scripted failure",
        "data": None,
    }
    assert (bug.status_code, (await _json(bug))["code"]) == (200, 1007)


# -- bodies and validation order ----------------------------------------------------------


async def test_multipart_and_json_bodies_reach_the_child_alike() -> None:
    image = b"\x89PNG fake image bytes \x00\xff"
    encoded = base64.b64encode(image).decode()
    model = fake_model()
    async with serving(model) as client:
        await model.wait_ready()
        multipart = await _post_image(client, image, "/api/v1/hair/grow", plans='["standard"]')
        plain = await client.post("/api/v1/hair/grow", headers=auth(), json={"image_base64": encoded, "plans": ["standard"]})
        data_url = await client.post(
            "/api/v1/hair/mark",
            headers=auth(),
            json={"image_base64": "data:image/png;base64," + encoded[:8] + "\n" + encoded[8:], "drop_mm": 5},
        )
    for response in (multipart, plain):
        body = await _json(response)
        assert body["code"] == 0, body
        assert body["data"]["image_bytes"] == len(image)
        assert body["data"]["options"]["plans"] == ["standard"]
    marked = (await _json(data_url))["data"]
    assert (marked["endpoint"], marked["image_bytes"], marked["options"]["drop_mm"]) == ("mark", len(image), 5.0)


@pytest.mark.parametrize(
    ("kwargs", "code", "fragment"),
    [
        ({"json": {"gender": "male"}}, 1001, "缺少图片"),
        ({"form": {"gender": "male"}, "files": {}}, 1001, "缺少图片"),
        ({"files": _file(b"")}, 1001, "缺少图片"),
        ({"form": {"image": "not a file"}, "files": {"other": _file(b"x")["image"]}}, 1001, "以文件方式上传"),
        ({"json": {"image_base64": "not base64 at all!"}}, 1001, "image_base64 不是有效的 base64"),
        ({"json": {"image_base64": 42}}, 1001, "image_base64"),
        ({"json": ["a list"]}, 1001, "JSON 对象"),
        ({"data": b"{not json", "headers": {"Content-Type": "application/json"}}, 1001, "JSON"),
        ({"data": b"raw", "headers": {"Content-Type": "image/jpeg"}}, 1001, "Content-Type"),
        ({"files": _file(b"ok"), "form": {"gender": "robot"}}, 1001, "gender"),
        # fields before bytes: a bad field wins over an oversize image
        ({"files": _file(b"x" * (LIMITS.max_image_bytes + 1)), "form": {"gender": "robot"}}, 1001, "gender"),
        ({"files": _file(b"x" * (LIMITS.max_image_bytes + 1))}, 1003, "图片过大"),
        ({"json": {"image_base64": base64.b64encode(b"x" * (LIMITS.max_image_bytes + 1)).decode()}}, 1003, "图片过大"),
        # the size comes from the base64 length, before decoding: oversize garbage is 1003, not 1001
        ({"json": {"image_base64": "!" * (LIMITS.max_image_bytes * 2)}}, 1003, "图片过大"),
    ],
)
async def test_bad_requests_get_the_right_code_before_the_child_is_asked(
    kwargs: dict, code: int, fragment: str
) -> None:
    model = fake_model()
    async with serving(model) as client:
        await model.wait_ready()
        headers = {**auth(), **kwargs.pop("headers", {})}
        response = await client.post(MEASURE, headers=headers, **kwargs)
        body = await _json(response)
    assert (response.status_code, body["code"], body["data"]) == (200, code, None)
    assert fragment in body["message"]


async def test_body_over_the_limit_is_1003() -> None:
    model = fake_model()
    async with serving(model) as client:
        oversize = b"x" * (8 * LIMITS.max_image_bytes + 2 * 1024 * 1024)
        response = await client.post(MEASURE, headers={**auth(), "Content-Type": "application/json"}, data=oversize)
        body = await _json(response)
    assert (response.status_code, body["code"], body["data"]) == (200, 1003, None)
    assert "请求体过大" in body["message"]


async def test_request_id_is_echoed_when_valid_and_generated_otherwise() -> None:
    model = fake_model()
    async with serving(model) as client:
        await model.wait_ready()
        given = await client.post(MEASURE, headers=auth(**{"X-Request-ID": "req.42-a_b"}), json={})
        bad = await client.post(MEASURE, headers=auth(**{"X-Request-ID": "no spaces allowed"}), json={})
        ok = await client.post(
            MEASURE,
            headers=auth(**{"X-Request-ID": "req-43"}),
            json={"image_base64": base64.b64encode(b"ok").decode()},
        )
    assert (await _json(given))["request_id"] == "req.42-a_b" == given.headers["X-Request-ID"]
    generated = (await _json(bad))["request_id"]
    assert generated != "no spaces allowed" and generated == bad.headers["X-Request-ID"]
    assert (await _json(ok))["data"]["request_id"] == "req-43"  # the child got it too


async def test_unknown_api_path_and_wrong_method_are_envelopes() -> None:
    model = fake_model()
    async with serving(model) as client:
        unknown = await client.post("/api/v1/hair/nope", headers=auth(), json={})
        wrong_method = await client.get(MEASURE, headers=auth())
        elsewhere = await client.get("/nope", headers=auth())
    # contract answers are HTTP 200 (the gateway counts any other status as a broken host)
    assert (unknown.status_code, (await _json(unknown))["code"]) == (200, Code.INVALID_PARAMETER)
    assert "/api/v1/hair/nope" in (await _json(unknown))["message"]
    assert (wrong_method.status_code, (await _json(wrong_method))["code"]) == (200, Code.INVALID_PARAMETER)
    assert "POST" in (await _json(wrong_method))["message"]
    assert (elsewhere.status_code, await _json(elsewhere)) == (404, {"status": "not_found"})


async def test_a_failure_outside_the_handlers_is_a_1007_envelope_without_a_traceback() -> None:
    from gpu_host.app import create_app
    from gpu_host.auth import TokenGuard

    class BrokenGuard(TokenGuard):
        def is_accepted(self, presented: str | None) -> bool:
            raise RuntimeError("a bug in a hook")

    app = create_app(fake_model(), BrokenGuard((TOKEN,)), LIMITS)
    async with app.test_app() as test_app:
        response = await test_app.test_client().post(MEASURE, headers=auth(**{"X-Request-ID": "r-500"}), json={})
        text = await response.get_data(as_text=True)
    body = await _json(response)
    assert response.status_code == 500
    assert (body["code"], body["request_id"], body["data"]) == (1007, "r-500", None)
    assert "Traceback" not in text and "a bug in a hook" not in text
