"""Malformed and hostile requests on raw sockets against the host as `hairgate gpu-host` serves
it (`running_host`: the real Hypercorn and app, a fake child), over TLS too (issue 23).
"""

from __future__ import annotations

import json
import ssl
from pathlib import Path

import httpx
import trio

from shared import http_server
from shared.contract import Code
from tests.fakes.tls import tls_files
from tests.gpu_host.conftest import MEASURE, TOKEN, WAIT_SECONDS, auth
from tests.gpu_host.fake_child import scripted
from tests.gpu_host.inprocess import host_settings, running_host
from tests.shared.http_attacks import (
    ATTACKS,
    PREFACE,
    SETTINGS_FRAME,
    exchange,
    hypercorns_own_classes,
    installed_by_serve,
    read_answer,
    with_token,
)

HEALTH = f"GET /health HTTP/1.1\r\nHost: h\r\nX-Internal-Token: {TOKEN}\r\n\r\n".encode()


async def test_every_attack_is_answered_as_the_table_says_and_the_host_serves_on(tmp_path: Path, caplog) -> None:
    async with running_host(tmp_path) as host:
        wrong = {}
        for attack in ATTACKS:
            answer = await exchange(host.port, with_token(attack.request, TOKEN))
            if answer.status not in attack.answers or (answer.status is not None and answer.closed != attack.closes):
                wrong[attack.name] = answer
            assert (await exchange(host.port, HEALTH)).status == 200, f"no /health after {attack.name!r}"
        assert not host.stopped.is_set()
    assert wrong == {}
    assert not [r for r in caplog.records if r.exc_info or r.levelname == "ERROR"]


async def test_the_hosts_serve_installs_the_http_1_1_only_server_itself(tmp_path: Path, monkeypatch) -> None:
    # as in a process that imported nothing that could install it: serve() must (gpu_host.main)
    hypercorns_own_classes(monkeypatch)
    async with running_host(tmp_path) as host:
        assert installed_by_serve(), "gpu_host.main.serve did not call shared.http_server.install()"
        preface = await exchange(host.port, PREFACE + SETTINGS_FRAME)
        upgrade = await exchange(host.port, with_token(ATTACKS[1].request, TOKEN))  # h2c, good settings
    assert (preface.status, preface.closed) == (505, True)
    assert (upgrade.status, upgrade.informational) == (200, ())  # served in HTTP/1.1, no 101


async def test_tls_offers_only_http_1_1_and_refuses_the_http_2_preface(tmp_path: Path) -> None:
    files = tls_files(tmp_path / "tls")
    settings = host_settings(certfile=str(files.certfile), keyfile=str(files.keyfile))
    async with running_host(tmp_path, settings, ca_file=files.ca_file) as host:
        selected = {}
        for offered in (["h2"], ["h2", "http/1.1"]):
            context = ssl.create_default_context(cafile=str(files.ca_file))
            context.set_alpn_protocols(offered)
            stream = trio.SSLStream(
                await trio.open_tcp_stream("127.0.0.1", host.port), context, server_hostname="127.0.0.1"
            )
            async with stream:
                await stream.do_handshake()
                selected[offered[0] if len(offered) == 1 else "both"] = stream.selected_alpn_protocol()
        h2_only = ssl.create_default_context(cafile=str(files.ca_file))
        h2_only.set_alpn_protocols(["h2"])
        preface = await exchange(host.port, PREFACE + SETTINGS_FRAME, ssl_context=h2_only)
        served = await exchange(host.port, HEALTH, ssl_context=h2_only)
        assert not host.stopped.is_set()
    assert selected == {"h2": None, "both": "http/1.1"}
    assert (preface.status, preface.closed) == (505, True)
    assert served.status == 200


async def test_a_request_timeout_of_unicode_digits_is_no_number_not_a_system_error(tmp_path: Path) -> None:
    # "²²²²".isdigit() is true and int() of it fails: it was a 1007 (an error the gateway
    # retries on another host); it is now what any other non-number is: no deadline of its own
    upload = {"image": ("p.png", scripted(b"ok"), "image/png")}
    async with (
        running_host(tmp_path) as host,
        httpx.AsyncClient(base_url=host.url, headers=auth(), timeout=30) as client,
    ):
        codes = {}
        for value in (b"\xb2\xb2\xb2\xb2", b"abc", b"120000"):
            answer = await client.post(MEASURE, files=upload, headers={b"X-Request-Timeout-Ms": value})
            codes[value] = answer.json()["code"]
    assert codes == {b"\xb2\xb2\xb2\xb2": 0, b"abc": 0, b"120000": 0}


async def test_a_chunked_body_told_to_continue_and_over_the_limit_is_drained_and_answered_1003(tmp_path: Path) -> None:
    # issue 23: told `100 Continue`, a chunked body over the limit was read to the limit,
    # answered and closed on: a client that writes its whole body before reading got a
    # broken pipe (40 MB against the default settings' ~21 MB) instead of its 1003
    head = (
        f"POST {MEASURE} HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nTransfer-Encoding: chunked\r\n"
        f"Content-Type: multipart/form-data; boundary=b\r\nX-Internal-Token: {TOKEN}\r\n\r\n"
    ).encode()
    chunk = b"100000\r\n" + b"a" * (1 << 20) + b"\r\n"
    async with running_host(tmp_path) as host:
        stream = await trio.open_tcp_stream("127.0.0.1", host.port)
        async with stream:
            await stream.send_all(head)
            told_to_continue = await stream.receive_some(999)
            for _ in range(40):  # raises BrokenResourceError where the host closes under it
                await stream.send_all(chunk)
            await stream.send_all(b"0\r\n\r\n")
            answer = await read_answer(stream)
            await stream.send_all(HEALTH)  # the body was read to its end: the connection serves on
            next_answer = await read_answer(stream)
    assert told_to_continue.startswith(b"HTTP/1.1 100 ")
    assert answer.status == 200 and json.loads(answer.body)["code"] == Code.TOO_LARGE
    assert (next_answer.status, next_answer.closed) == (200, False)


async def test_a_drain_that_stalls_is_closed_at_its_time_bound_and_the_host_serves_on(
    tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setattr(http_server, "DRAIN_LIMIT_SECONDS", 0.5)
    head = (
        f"POST {MEASURE} HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\nX-Internal-Token: {TOKEN}\r\n\r\n"
    ).encode()
    chunk = b"10000\r\n" + b"a" * (1 << 16) + b"\r\n"
    async with running_host(tmp_path) as host:
        stalled = await trio.open_tcp_stream("127.0.0.1", host.port)
        async with stalled:  # over the limit, then no more: answered, then closed at the time bound
            await stalled.send_all(head + chunk * 20)  # 1.3 MB: the limit is 1.1 MB here
            answer = await read_answer(stalled, wait_s=WAIT_SECONDS)
            with trio.fail_after(WAIT_SECONDS):  # no idle watcher runs mid-body: only the drain bound ends it
                closed = await stalled.receive_some(999) == b""
        served_after = await exchange(host.port, HEALTH)
    assert (answer.status, json.loads(answer.body)["code"], closed) == (200, Code.TOO_LARGE, True)
    assert served_after.status == 200
