"""/health, /gateway-health, /monitor and the drill switch, through the gateway's whole ASGI app."""

from __future__ import annotations

import logging

import pytest

from edge.gateway import Gateway
from tests.edge.conftest import TOKEN, bring_online

COUNTS = ("workers_total", "workers_healthy", "workers_primary_total", "workers_primary_healthy")


async def test_health_is_always_ok(client) -> None:
    response = await client.get("/health")
    assert (response.status_code, response.json()) == (200, {"status": "ok", "service": "gateway"})


async def test_gateway_health_is_200_with_counts_even_when_nothing_is_online(client, gateway: Gateway) -> None:
    response = await client.get("/gateway-health")
    body = response.json()
    assert response.status_code == 200
    assert body == {
        "status": "ok",
        "service": "gateway",
        "workers_total": 3,
        "workers_healthy": 0,
        "workers_primary_total": 2,
        "workers_primary_healthy": 0,
        "workers_busy": 0,
        "workers_generation_ready": 0,
        "model_versions": {},  # online hosts by model version: none online
    }


async def test_monitor_200_shape_has_no_message_nor_simulated(client, gateway: Gateway) -> None:
    bring_online(gateway, 0, 2)
    response = await client.get("/monitor")
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    assert response.json() == {
        "status": "ok",
        "service": "gateway",
        "workers_total": 3,
        "workers_healthy": 2,
        "workers_primary_total": 2,
        "workers_primary_healthy": 1,
    }


async def test_monitor_503_when_no_worker_is_online(client) -> None:
    response = await client.get("/monitor")
    assert response.status_code == 503
    assert response.json() == {
        "status": "unhealthy",
        "service": "gateway",
        "workers_total": 3,
        "workers_healthy": 0,
        "workers_primary_total": 2,
        "workers_primary_healthy": 0,
        "message": "没有可用的 worker",
    }


async def test_monitor_reveals_no_address_nor_token(client, gateway: Gateway) -> None:
    bring_online(gateway, 0)
    for path in ("/monitor", "/gateway-health"):
        text = (await client.get(path)).text
        assert "127.0.0.1" not in text and TOKEN not in text


async def post_fault(client, body, token: str | None = TOKEN):
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["X-Internal-Token"] = token
    data = body if isinstance(body, (bytes, str)) else None
    kwargs = {"content": data} if data is not None else {"json": body}
    return await client.post("/monitor/fault", headers=headers, **kwargs)


async def test_drill_on_then_off(client, gateway: Gateway, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="edge.monitor")
    bring_online(gateway, 0, 1, 2)
    on = await post_fault(client, {"enabled": True})
    assert (on.status_code, on.json()) == (
        200,
        {"status": "ok", "simulated": True, "message": "已开启模拟故障,GET /monitor 将返回 503"},
    )
    during = await client.get("/monitor")
    body = during.json()
    assert during.status_code == 503
    assert body["status"] == "unhealthy" and body["simulated"] is True
    assert body["message"].startswith("模拟故障") and "没有可用" not in body["message"]
    assert {k: body[k] for k in COUNTS} == {
        "workers_total": 3,
        "workers_healthy": 3,
        "workers_primary_total": 2,
        "workers_primary_healthy": 2,
    }
    off = await post_fault(client, {"enabled": False})
    assert off.json()["simulated"] is False
    assert off.json()["message"] == "已关闭模拟故障,GET /monitor 恢复真实状态"
    assert (await client.get("/monitor")).status_code == 200
    assert [r.levelname for r in caplog.records] == ["WARNING", "WARNING"]
    assert all(TOKEN not in r.getMessage() for r in caplog.records)


async def test_drill_with_no_worker_online_says_so(client, gateway: Gateway) -> None:
    await post_fault(client, {"enabled": True})
    body = (await client.get("/monitor")).json()
    assert body["simulated"] is True
    assert body["message"].startswith("模拟故障") and "没有可用的 worker" in body["message"]


@pytest.mark.parametrize("token", [None, "", "wrong", TOKEN + "x", TOKEN.upper()])
async def test_fault_without_the_right_token_is_401_and_changes_nothing(client, gateway: Gateway, token) -> None:
    bring_online(gateway, 0)
    response = await post_fault(client, {"enabled": True}, token=token)
    assert response.status_code == 401
    assert (response.json())["status"] == "error"
    assert (await client.get("/monitor")).status_code == 200


async def test_token_is_checked_before_the_body(client) -> None:
    assert (await post_fault(client, b"{not json", token="wrong")).status_code == 401


async def test_token_is_checked_before_the_body_size(client) -> None:
    # a large body without a token is refused for the token, without reading the body
    assert (await post_fault(client, b"x" * (1024 * 1024), token=None)).status_code == 401


async def test_a_large_body_with_the_token_is_413(client) -> None:
    assert (await post_fault(client, b"x" * (1024 * 1024))).status_code == 413


@pytest.mark.parametrize(
    "body",
    [
        {"enabled": "true"},
        {"enabled": 1},
        {"enabled": None},
        {},
        {"enabled": True, "extra": 1},
        [True],
        True,
        b"{not json",
        b"",
        b'{"enabled": tru}',
        b'{"enabled": false, "enabled": true}',  # duplicate keys: not "whichever came last"
        b"[" * 20_000 + b"]" * 20_000,  # deeper than the JSON parser goes
        b'{"enabled": true, "x": ' + b"[" * 20_000 + b"]" * 20_000 + b"}",
    ],
)
async def test_fault_body_must_be_exactly_a_boolean_enabled(client, gateway: Gateway, body) -> None:
    bring_online(gateway, 0)
    response = await post_fault(client, body)
    assert response.status_code == 400
    assert (response.json())["status"] == "error"
    assert (await client.get("/monitor")).status_code == 200, "a rejected request must not flip the switch"


async def test_fault_needs_post(client) -> None:
    assert (await client.get("/monitor/fault")).status_code == 405


@pytest.mark.parametrize("path", ["/health", "/gateway-health", "/monitor"])
async def test_status_pages_answer_head_and_refuse_other_methods(client, path: str) -> None:
    head = await client.head(path)
    assert (head.status_code, head.content) == (200 if path != "/monitor" else 503, b"")
    assert int(head.headers["content-length"]) > 0, "HEAD announces the GET body's length"
    refused = await client.post(path, content=b"{}")
    assert (refused.status_code, refused.headers["allow"]) == (405, "GET, HEAD")
