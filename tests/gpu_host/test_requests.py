"""Request bodies through the GPU host app: multipart and JSON, the contract's validation
order (1001 before 1003 before 1002 before the child), request ids, and envelopes for errors
outside the handlers. A real spawned fake child answers whatever gets through. The rules
themselves are `shared.contract.uploads`' (tests/shared/test_uploads.py); these show the host applies them."""

from __future__ import annotations

import base64
import threading
from typing import Any

import pytest
import trio

import gpu_host.app
from gpu_host.app import create_app
from gpu_host.auth import TokenGuard
from shared.contract import Code
from tests.gpu_host.conftest import (
    LIMITS,
    MEASURE,
    MODEL_VERSION,
    TOKEN,
    auth,
    fake_model,
    image_file,
    post_image,
    serving,
)
from tests.gpu_host.fake_child import scripted


async def test_multipart_and_json_bodies_reach_the_child_alike() -> None:
    image = scripted(b"fake image bytes \x00\xff")
    encoded = base64.b64encode(image).decode()
    model = fake_model()
    async with serving(model) as client:
        await model.wait_ready()
        multipart = await post_image(client, image, "/api/v1/hair/grow", plans='["standard"]')
        plain = await client.post(
            "/api/v1/hair/grow", headers=auth(), json={"image_base64": encoded, "plans": ["standard"]}
        )
        data_url = await client.post(
            "/api/v1/hair/mark",
            headers=auth(),
            json={"image_base64": "data:image/png;base64," + encoded[:8] + "\n" + encoded[8:], "drop_mm": 5},
        )
    for response in (multipart, plain):
        body = await response.get_json()
        assert body["code"] == 0, body
        assert body["data"]["image_bytes"] == len(image)
        assert body["data"]["options"]["plans"] == ["standard"]
    marked = (await data_url.get_json())["data"]
    assert (marked["endpoint"], marked["image_bytes"], marked["options"]["drop_mm"]) == ("mark", len(image), 5.0)


@pytest.mark.parametrize(
    ("kwargs", "code", "fragment"),
    [
        ({"json": {"gender": "male"}}, 1001, "缺少图片"),
        ({"form": {"gender": "male"}, "files": {}}, 1001, "缺少图片"),
        ({"files": image_file(b"")}, 1001, "缺少图片"),
        ({"form": {"image": "not a file"}, "files": {"other": image_file(b"x")["image"]}}, 1001, "以文件方式上传"),
        ({"json": {"image_base64": "not base64 at all!"}}, 1001, "image_base64 不是有效的 base64"),
        ({"json": {"image_base64": 42}}, 1001, "image_base64"),
        ({"json": ["a list"]}, 1001, "JSON 对象"),
        ({"data": b"{not json", "headers": {"Content-Type": "application/json"}}, 1001, "JSON"),
        ({"data": b"raw", "headers": {"Content-Type": "image/jpeg"}}, 1001, "Content-Type"),
        ({"files": image_file(b"ok"), "form": {"gender": "robot"}}, 1001, "gender"),
        # the magic bytes come last: not a JPEG, PNG or WebP
        ({"files": image_file(b"%PDF-1.4 not a photo")}, 1002, "图片格式不支持"),
        ({"json": {"image_base64": base64.b64encode(b"GIF89a....").decode()}}, 1002, "图片格式不支持"),
        # fields before bytes: a bad field wins over an oversize image
        ({"files": image_file(b"x" * (LIMITS.max_image_bytes + 1)), "form": {"gender": "robot"}}, 1001, "gender"),
        ({"files": image_file(b"x" * (LIMITS.max_image_bytes + 1))}, 1003, "图片过大"),
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
        body = await response.get_json()
    assert (response.status_code, body["code"], body["data"]) == (200, code, None)
    assert fragment in body["message"]


async def test_body_over_the_limit_is_1003() -> None:
    model = fake_model()
    async with serving(model) as client:
        oversize = b"x" * (8 * LIMITS.max_image_bytes + 2 * 1024 * 1024)
        response = await client.post(MEASURE, headers={**auth(), "Content-Type": "application/json"}, data=oversize)
        body = await response.get_json()
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
            json={"image_base64": base64.b64encode(scripted(b"ok")).decode()},
        )
    assert (await given.get_json())["request_id"] == "req.42-a_b" == given.headers["X-Request-ID"]
    generated = (await bad.get_json())["request_id"]
    assert generated != "no spaces allowed" and generated == bad.headers["X-Request-ID"]
    assert (await ok.get_json())["data"]["request_id"] == "req-43"  # the child got it too


async def test_unknown_api_path_and_wrong_method_are_envelopes() -> None:
    model = fake_model()
    async with serving(model) as client:
        unknown = await client.post("/api/v1/hair/nope", headers=auth(), json={})
        wrong_method = await client.get(MEASURE, headers=auth())
        elsewhere = await client.get("/nope", headers=auth())
    # contract answers are HTTP 200 (the gateway counts any other status as a broken host)
    assert (unknown.status_code, (await unknown.get_json())["code"]) == (200, Code.INVALID_PARAMETER)
    assert "/api/v1/hair/nope" in (await unknown.get_json())["message"]
    assert (wrong_method.status_code, (await wrong_method.get_json())["code"]) == (200, Code.INVALID_PARAMETER)
    assert "POST" in (await wrong_method.get_json())["message"]
    assert (elsewhere.status_code, await elsewhere.get_json()) == (404, {"status": "not_found"})


async def test_a_failure_outside_the_handlers_is_a_1007_envelope_without_a_traceback() -> None:
    class BrokenGuard(TokenGuard):
        def is_accepted(self, presented: str | None) -> bool:
            raise RuntimeError("a bug in a hook")

    app = create_app(fake_model(), BrokenGuard((TOKEN,)), LIMITS, model_version=MODEL_VERSION)
    async with app.test_app() as test_app:
        response = await test_app.test_client().post(MEASURE, headers=auth(**{"X-Request-ID": "r-500"}), json={})
        text = await response.get_data(as_text=True)
    body = await response.get_json()
    assert response.status_code == 500
    assert (body["code"], body["request_id"], body["data"]) == (1007, "r-500", None)
    assert "Traceback" not in text and "a bug in a hook" not in text


DEEP = "[" * 100_000 + "]" * 100_000


@pytest.mark.parametrize(
    ("path", "kwargs", "fragment"),
    [
        ("/api/v1/hair/grow", {"files": image_file(b"ok"), "form": {"plans": DEEP}}, "plans"),
        ("/api/v1/hair/mark", {"files": image_file(b"ok"), "form": {"hairline_points": DEEP}}, "hairline_points"),
        ("/api/v1/hair/mark", {"json": {"image_base64": "b2s=", "hairline_points": DEEP}}, "hairline_points"),
        (
            "/api/v1/hair/mark",
            {
                "data": f'{{"image_base64": "b2s=", "hairline_points": {DEEP}}}'.encode(),
                "headers": {"Content-Type": "application/json"},
            },
            "嵌套",
        ),
        (MEASURE, {"data": f'{{"gender": {DEEP}}}'.encode(), "headers": {"Content-Type": "application/json"}}, "嵌套"),
    ],
)
async def test_deeply_nested_json_is_1001_not_an_internal_error(path: str, kwargs: dict, fragment: str) -> None:
    model = fake_model()
    async with serving(model) as client:
        await model.wait_ready()
        headers = {**auth(), **kwargs.pop("headers", {})}
        response = await client.post(path, headers=headers, **kwargs)
        body = await response.get_json()
    assert (response.status_code, body["code"], body["data"]) == (200, 1001, None)
    assert fragment in body["message"] and "嵌套过深" in body["message"]


async def test_a_gateway_that_left_during_the_body_check_starts_no_job(monkeypatch: pytest.MonkeyPatch) -> None:
    # the body check runs in a thread, which a cancellation waits for; nothing checked for
    # the departure between it and the model's slot, so the job started for nobody
    checking, release = threading.Event(), threading.Event()
    real_read_request = gpu_host.app.read_request

    def slow_check(*args: Any) -> Any:
        checking.set()
        release.wait(10)
        return real_read_request(*args)

    monkeypatch.setattr(gpu_host.app, "read_request", slow_check)
    model = fake_model()
    started_jobs: list[str] = []
    real_infer = model.infer

    async def counted_infer(request_id: str, *args: Any, **kwargs: Any) -> dict:
        started_jobs.append(request_id)
        return await real_infer(request_id, *args, **kwargs)

    monkeypatch.setattr(model, "infer", counted_infer)
    async with serving(model) as client:
        await model.wait_ready()
        with trio.CancelScope() as leaving:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(post_image, client, scripted(b"ok"), MEASURE)
                await trio.to_thread.run_sync(checking.wait)
                leaving.cancel()  # the gateway closed the connection: quart-trio cancels the handler
                release.set()
        after = await post_image(client, scripted(b"ok"), MEASURE)
    assert (await after.get_json())["code"] == Code.OK
    assert len(started_jobs) == 1, "only the request that stayed ran"
