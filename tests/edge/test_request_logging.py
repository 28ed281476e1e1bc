"""The request log's ASGI middleware on its own, around a small ASGI app: what it names on
arrival, what each line says, and that the end of an answer is sent whole."""

from __future__ import annotations

from typing import Any

import trio
import trio.testing

from edge.exchange import Exchange, LogFacts
from edge.observe.request_log import RequestRecord
from edge.web.request_logging import CLIENT_CLOSED, NOTES, RequestLogging, RequestNotes

API_PATH = "/api/v1/hair/measure"
ANSWER = b'{"code":0}'


class Audit:
    """The audit trail's two calls the middleware makes, recorded."""

    def __init__(self) -> None:
        self.arrivals: list[tuple[str, str]] = []
        self.ends: list[tuple[str, RequestRecord]] = []

    def received(self, request_id: str, path: str, scope: Any) -> str:
        self.arrivals.append((request_id, path))
        return f"e-{len(self.arrivals)}"

    def finished(self, execution_id: str, entry: RequestRecord) -> None:
        self.ends.append((execution_id, entry))


def middleware(app: Any, records: list[RequestRecord], audit: Audit) -> Any:
    return RequestLogging(app, records.append, audit)  # the trail as far as the middleware uses it


def http_scope(path: str = API_PATH, headers: tuple[tuple[bytes, bytes], ...] = ()) -> dict[str, Any]:
    return {
        "type": "http",
        "method": "POST",
        "path": path,
        "query_string": b"",
        "headers": list(headers),
        "client": ("203.0.113.7", 5000),
    }


async def answering(scope: Any, receive: Any, send: Any) -> None:
    notes: RequestNotes = scope[NOTES]
    notes.exchange = Exchange("POST", API_PATH, "", {}, "203.0.113.7", notes.request_id, body=b"12345")
    notes.log_facts = LogFacts(0, worker=1, attempts=2, queue_seconds=0.25)
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": ANSWER})


async def nothing_to_receive() -> dict[str, Any]:
    await trio.sleep_forever()
    raise AssertionError


async def discard(message: Any) -> None:
    pass


async def test_an_answered_api_request_is_one_line_with_its_ids_and_what_the_app_noted() -> None:
    records: list[RequestRecord] = []
    audit = Audit()
    scope = http_scope(headers=((b"x-request-id", b"client-id-1"),))
    await middleware(answering, records, audit)(scope, nothing_to_receive, discard)
    (entry,) = records
    assert audit.arrivals == [("client-id-1", API_PATH)]
    assert audit.ends == [("e-1", entry)] and scope[NOTES].execution_id == "e-1"
    assert (entry.request_id, entry.method, entry.path, entry.client_ip) == (
        "client-id-1",
        "POST",
        API_PATH,
        "203.0.113.7",
    )
    assert (entry.http_status, entry.code, entry.bytes_in, entry.bytes_out) == (200, 0, 5, len(ANSWER))
    assert (entry.worker, entry.attempts, entry.queue_ms) == (1, 2, 250.0)


async def test_a_client_that_leaves_before_its_answer_is_logged_499() -> None:
    async def waits_for_the_body(scope: Any, receive: Any, send: Any) -> None:
        assert (await receive())["type"] == "http.disconnect"

    async def gone() -> dict[str, Any]:
        return {"type": "http.disconnect"}

    records: list[RequestRecord] = []
    await middleware(waits_for_the_body, records, Audit())(http_scope(), gone, discard)
    (entry,) = records
    assert (entry.http_status, entry.code, entry.bytes_out, entry.bytes_in) == (CLIENT_CLOSED, None, 0, 0)


async def test_other_paths_are_named_but_neither_logged_nor_audited() -> None:
    records: list[RequestRecord] = []
    audit = Audit()
    scope = http_scope("/monitor", headers=((b"x-request-id", b"not a valid id!"),))
    await middleware(answering_plainly, records, audit)(scope, nothing_to_receive, discard)
    assert records == [] and audit.arrivals == [] and audit.ends == []
    notes = scope[NOTES]
    assert notes.request_id != "not a valid id!" and len(notes.request_id) == 32 and notes.execution_id == ""


async def answering_plainly(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


async def test_an_absolute_form_target_counts_by_its_path() -> None:
    records: list[RequestRecord] = []
    await middleware(answering, records, Audit())(
        http_scope("http://gateway.test" + API_PATH), nothing_to_receive, discard
    )
    assert [entry.path for entry in records] == [API_PATH]


async def test_lifespan_passes_through_untouched() -> None:
    seen: list[dict[str, Any]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append(scope)

    records: list[RequestRecord] = []
    await middleware(app, records, Audit())({"type": "lifespan"}, nothing_to_receive, discard)
    assert seen == [{"type": "lifespan"}] and records == []


async def test_the_end_of_an_answer_is_sent_whole_though_the_handler_is_cancelled_meanwhile() -> None:
    # Hypercorn ends the exchange inside the last send and may close the connection there;
    # the disconnect that causes cancels the handler (quart-trio): the end must still go out
    release = trio.Event()
    delivered: list[bytes] = []

    async def slow_server(message: Any) -> None:
        if message["type"] == "http.response.body":
            await release.wait()
            delivered.append(message["body"])

    logged = middleware(answering_plainly, [], Audit())
    handler = trio.CancelScope()

    async def handle() -> None:
        with handler:
            await logged(http_scope("/health"), nothing_to_receive, slow_server)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(handle)
        await trio.testing.wait_all_tasks_blocked()
        handler.cancel()
        await trio.testing.wait_all_tasks_blocked()
        assert delivered == []  # still in the server's hands, not cancelled
        release.set()
    assert delivered == [b"ok"]
