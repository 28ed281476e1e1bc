"""Idempotency rules over the real stores: SQLite files, a real Redis server, a real PostgreSQL 15
alone and with Redis as its cache (gateway.md § Idempotency). PostgreSQL's own cases, and
Redis flushed or killed in front of it: tests/edge/test_idempotency_postgres.py."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import cast

import coredis
import pytest
import trio
import trio.testing

from cluster.launcher import free_port
from edge.admission.idempotency import (
    Idempotency,
    IdempotencyUnavailable,
    Outcome,
    Result,
    RunResult,
    StoredResponse,
    fingerprint,
    open_idempotency,
    validate_key,
)
from edge.admission.idempotency_cache import CachedStore
from edge.admission.idempotency_postgres import PostgresStore
from edge.admission.idempotency_stores import IdempotencyStore, Record, RedisStore, SqliteStore
from edge.shared_state import redis_client
from shared.contract import Code, ContractError
from shared.settings import IdempotencySettings
from tests.fakes.redis_server import RedisServer

TTL = 3600.0
FP = fingerprint("POST", "/api/v1/hair/measure", b'{"image_base64": "AAAA"}')
OTHER_FP = fingerprint("POST", "/api/v1/hair/measure", b'{"image_base64": "BBBB"}')


def answer(request_id: str = "first", code: int = 0) -> StoredResponse:
    body = b'{"code": %d, "message": "\xe6\x88\x90\xe5\x8a\x9f", "request_id": "%s", "data": null}' % (
        code,
        request_id.encode(),
    )
    return StoredResponse(200, (("content-type", "application/json"), ("X-Request-ID", request_id)), body, code)


class Job:
    """A `run` that counts its calls and, when gated, holds until the gate opens."""

    def __init__(self, response: StoredResponse | None = None, storable: bool = True, gated: bool = False) -> None:
        self.response = response or answer()
        self.storable = storable
        self.calls = 0
        self.started = trio.Event()
        self.gate = trio.Event()
        if not gated:
            self.gate.set()

    async def __call__(self) -> RunResult:
        self.calls += 1
        self.started.set()
        await self.gate.wait()
        return RunResult(self.response, self.storable)


def trio_clock() -> float:
    return 1_800_000_000.0 + trio.current_time()


@asynccontextmanager
async def serving(store: IdempotencyStore, **options: float) -> AsyncIterator[Idempotency]:
    """An Idempotency with its background task running, as the gateway runs it."""
    idempotency = Idempotency(store, options.pop("ttl_seconds", TTL), int(options.pop("max_entries", 1000)), **options)
    async with trio.open_nursery() as nursery:
        await nursery.start(idempotency.run)
        yield idempotency
        nursery.cancel_scope.cancel()


@asynccontextmanager
async def redis_store(server: RedisServer) -> AsyncIterator[RedisStore]:
    async with redis_client(server.url) as redis:
        assert redis is not None
        yield RedisStore(redis, TTL)


@asynccontextmanager
async def postgres_store(dsn: str, cache: RedisServer | None = None) -> AsyncIterator[IdempotencyStore]:
    """One gateway's PostgreSQL store; with `cache`, that Redis in front of it (as the gateway composes them)."""
    store = await PostgresStore.open(dsn)
    try:
        if cache is None:
            yield store
        else:
            async with redis_client(cache.url) as redis:
                assert redis is not None
                yield CachedStore(store, RedisStore(redis, TTL), 1000)
    finally:
        await store.aclose()


SHARED_STORES = ["redis", "postgresql", "postgresql+redis"]


def _shared(request: pytest.FixtureRequest, kind: str) -> Callable[[], object]:
    """A factory of stores over one backing store that several gateways may share."""
    if kind == "redis":
        server = request.getfixturevalue("redis_server")
        return lambda: redis_store(server)
    dsn = request.getfixturevalue("postgres_dsn")
    cache = request.getfixturevalue("redis_server") if kind == "postgresql+redis" else None
    return lambda: postgres_store(dsn, cache)


@pytest.fixture(params=["sqlite", *SHARED_STORES])
def open_store(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], object]:
    """A factory of stores over ONE backing store (a file, a server): each call is one gateway."""
    if request.param == "sqlite":

        @asynccontextmanager
        async def sqlite() -> AsyncIterator[SqliteStore]:
            store = await SqliteStore.open(tmp_path / "idempotency.sqlite3", trio_clock)
            try:
                yield store
            finally:
                await store.aclose()

        return sqlite
    return _shared(request, request.param)


@pytest.fixture(params=SHARED_STORES)
def shared_store(request: pytest.FixtureRequest) -> Callable[[], object]:
    """A factory of stores several gateways share (a SQLite file has one owner)."""
    return _shared(request, request.param)


# --- keys and fingerprints ------------------------------------------------------------------


@pytest.mark.parametrize("key", ["a", "order-1", "k" * 128, "with space and :/?#", "~!@$%^&*()"])
def test_valid_keys(key: str) -> None:
    assert validate_key(key) == key


@pytest.mark.parametrize("key", ["", "k" * 129, "订单-1", "tab\there", "newline\n", "nul\0"])
def test_invalid_keys_are_1001(key: str) -> None:
    with pytest.raises(ContractError) as caught:
        validate_key(key)
    assert caught.value.code is Code.INVALID_PARAMETER


def test_fingerprint_covers_method_path_and_body() -> None:
    base = fingerprint("POST", "/api/v1/hair/measure", b"{}")
    assert len(base) == 64
    assert base == fingerprint("post", "/api/v1/hair/measure", b"{}")
    assert base != fingerprint("PUT", "/api/v1/hair/measure", b"{}")
    assert base != fingerprint("POST", "/api/v1/hair/mark", b"{}")
    assert base != fingerprint("POST", "/api/v1/hair/measure", b"{ }")
    assert fingerprint("POST", "/a", b"bc") != fingerprint("POST", "/ab", b"c")


def test_a_multipart_retry_with_a_new_boundary_has_the_same_fingerprint() -> None:
    # curl and mobile HTTP stacks draw a fresh boundary for every attempt
    def form(boundary: str, photo: bytes) -> tuple[bytes, str]:
        body = (
            f'--{boundary}\r\nContent-Disposition: form-data; name="image"; filename="a.png"\r\n\r\n'.encode()
            + photo
            + f"\r\n--{boundary}--\r\n".encode()
        )
        return body, f"multipart/form-data; boundary={boundary}"

    first = fingerprint("POST", "/api/v1/hair/measure", *form("----a1b2", b"PNGDATA"))
    retry = fingerprint("POST", "/api/v1/hair/measure", *form("----z9y8x7", b"PNGDATA"))
    other = fingerprint("POST", "/api/v1/hair/measure", *form("----z9y8x7", b"OTHER"))
    assert first == retry != other


def _multipart(boundary: str, *parts: tuple[str, str | None, str | None, bytes]) -> tuple[bytes, str]:
    """A multipart/form-data body of (name, filename, content type, bytes) parts."""
    body = b""
    for name, filename, content_type, data in parts:
        disposition = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename else "")
        head = f"--{boundary}\r\nContent-Disposition: {disposition}\r\n"
        if content_type:
            head += f"Content-Type: {content_type}\r\n"
        body += head.encode() + b"\r\n" + data + b"\r\n"
    return body + f"--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


PHOTO_PART = ("image", "a.png", "image/png", b"\x89PNG photo")


def test_a_field_value_that_differs_only_by_the_boundary_differs() -> None:
    """Issue 15: the boundary was cut from the whole body, field values and photo included."""
    female = fingerprint(
        "POST", "/api/v1/hair/measure", *_multipart("fe", ("gender", None, None, b"female"), PHOTO_PART)
    )
    male = fingerprint("POST", "/api/v1/hair/measure", *_multipart("zz", ("gender", None, None, b"male"), PHOTO_PART))
    assert female != male


def test_a_multipart_fingerprint_is_its_parts_in_order() -> None:
    gender = ("gender", None, None, b"female")
    base = fingerprint("POST", "/p", *_multipart("b1", gender, PHOTO_PART))
    assert base == fingerprint("POST", "/p", *_multipart("another-boundary", gender, PHOTO_PART))
    variants = [
        _multipart("b1", PHOTO_PART, gender),  # order
        _multipart("b1", ("sex", None, None, b"female"), PHOTO_PART),  # name
        _multipart("b1", gender, ("image", "b.png", "image/png", PHOTO_PART[3])),  # filename
        _multipart("b1", gender, ("image", "a.png", "image/jpeg", PHOTO_PART[3])),  # content type
        _multipart("b1", gender, ("image", None, "image/png", PHOTO_PART[3])),  # a field, not a file
        _multipart("b1", gender, PHOTO_PART, ("extra", None, None, b"")),  # one more part
    ]
    assert len({base, *(fingerprint("POST", "/p", *variant) for variant in variants)}) == len(variants) + 1


def test_a_multipart_body_that_does_not_parse_is_its_bytes() -> None:
    body, content_type = _multipart("b1", PHOTO_PART)
    truncated = body[:-8]
    assert fingerprint("POST", "/p", truncated, content_type) == fingerprint("POST", "/p", truncated)
    assert fingerprint("POST", "/p", truncated, content_type) != fingerprint("POST", "/p", body[:-9], content_type)


# --- one gateway ----------------------------------------------------------------------------


async def test_completed_request_is_replayed_byte_for_byte(open_store) -> None:
    job = Job()
    async with open_store() as store, serving(store) as idempotency:
        first = await idempotency.execute("order-1", FP, job)
        again = await idempotency.execute("order-1", FP, Job(answer("second")))
        assert await idempotency.lookup("order-1", FP) == job.response
        assert await idempotency.lookup("order-1", OTHER_FP) is None
    assert first == Outcome(Result.STORED, job.response) and not first.replayed
    assert again == Outcome(Result.REPLAYED, job.response) and again.replayed
    assert again.response.body == job.response.body and again.response.headers == job.response.headers


async def test_same_key_other_request_is_a_mismatch(open_store) -> None:
    job = Job()
    async with open_store() as store, serving(store) as idempotency:
        await idempotency.execute("order-2", FP, job)
        other = await idempotency.execute("order-2", OTHER_FP, job)
    assert other == Outcome(Result.MISMATCH, None)
    assert job.calls == 1


async def test_twenty_concurrent_identical_requests_run_once(open_store) -> None:
    job = Job(gated=True)
    outcomes: list[Outcome] = []
    async with open_store() as store, serving(store) as idempotency, trio.open_nursery() as nursery:

        async def one() -> None:
            outcomes.append(await idempotency.execute("order-3", FP, job))

        for _ in range(20):
            nursery.start_soon(one)
        await job.started.wait()
        await trio.testing.wait_all_tasks_blocked()
        mismatch = await idempotency.execute("order-3", OTHER_FP, Job())  # while it runs
        job.gate.set()
    assert job.calls == 1
    assert sorted(o.result.value for o in outcomes) == ["stored"] + ["waited"] * 19
    assert all(o.response == job.response for o in outcomes)
    assert mismatch.result is Result.MISMATCH


async def test_gateway_made_answer_is_given_to_waiters_but_not_stored(open_store) -> None:
    busy = Job(answer("busy", code=1007), storable=False, gated=True)
    outcomes: list[Outcome] = []
    async with open_store() as store, serving(store) as idempotency:
        async with trio.open_nursery() as nursery:

            async def one() -> None:
                outcomes.append(await idempotency.execute("order-4", FP, busy))

            for _ in range(3):
                nursery.start_soon(one)
            await busy.started.wait()
            await trio.testing.wait_all_tasks_blocked()
            busy.gate.set()
        served = Job(answer("served"))
        retried = await idempotency.execute("order-4", FP, served)
    assert busy.calls == 1
    assert sorted(o.result.value for o in outcomes) == ["unstored", "waited", "waited"]
    assert all(o.response == busy.response for o in outcomes)
    assert retried == Outcome(Result.STORED, served.response), "the client may retry a gateway-made 1007"


async def test_a_cancelled_runner_hands_the_key_to_a_waiter(open_store) -> None:
    stuck = Job(gated=True)
    second = Job(answer("second"))
    async with open_store() as store, serving(store) as idempotency, trio.open_nursery() as nursery:
        leader = trio.CancelScope()

        async def abandoned() -> None:
            with leader:
                await idempotency.execute("order-5", FP, stuck)

        waited: list[Outcome] = []

        async def waiter() -> None:
            waited.append(await idempotency.execute("order-5", FP, second))

        nursery.start_soon(abandoned)
        await stuck.started.wait()
        nursery.start_soon(waiter)
        await trio.testing.wait_all_tasks_blocked()
        leader.cancel()  # the client went away
    assert waited == [Outcome(Result.STORED, second.response)]
    assert (stuck.calls, second.calls) == (1, 1)


async def test_run_raising_frees_the_key(open_store) -> None:
    async def broken() -> RunResult:
        raise RuntimeError("bug")

    async with open_store() as store, serving(store) as idempotency:
        with pytest.raises(RuntimeError):
            await idempotency.execute("order-6", FP, broken)
        outcome = await idempotency.execute("order-6", FP, Job())
    assert outcome.result is Result.STORED


DEPARTED = StoredResponse(499, (), b"", None)  # what the router produces for a client that left


async def test_a_departed_clients_answer_is_neither_stored_nor_given_to_waiters(open_store) -> None:
    departed = Job(DEPARTED, gated=True)
    outcomes: list[Outcome] = []
    async with open_store() as store, serving(store) as idempotency:
        async with trio.open_nursery() as nursery:

            async def one(job: Job) -> None:
                outcomes.append(await idempotency.execute("order-16", FP, job))

            nursery.start_soon(one, departed)
            await departed.started.wait()
            waiter = Job(answer("waiter"))
            nursery.start_soon(one, waiter)
            await trio.testing.wait_all_tasks_blocked()
            departed.gate.set()
        retried = await idempotency.execute("order-16", FP, Job(answer("retry")))
    assert outcomes[0] == Outcome(Result.UNSTORED, DEPARTED)
    assert outcomes[1] == Outcome(Result.STORED, waiter.response), "the waiter ran it itself"
    assert retried == Outcome(Result.REPLAYED, waiter.response)


@pytest.mark.parametrize(
    "poison",
    [DEPARTED, StoredResponse(500, (), b"", None), StoredResponse(200, (), b"not json", None)],
    ids=["499-empty", "500-empty", "not-an-envelope"],
)
async def test_a_poisoned_record_is_never_replayed_and_the_request_runs(open_store, poison: StoredResponse) -> None:
    async with open_store() as store, serving(store) as idempotency:
        # as an older version stored a departed client's "answer"
        assert await store.claim("order-17", FP, "e" * 32, 10) is None
        await store.complete("order-17", "e" * 32, FP, poison, TTL, 1000)
        assert await idempotency.lookup("order-17", FP) is None, "not even to a rate-limited client"
        job = Job()
        ran = await idempotency.execute("order-17", FP, job)
        again = await idempotency.execute("order-17", FP, Job(answer("again")))
    assert ran == Outcome(Result.STORED, job.response)
    assert again == Outcome(Result.REPLAYED, job.response)


class StuckDiscard:
    """Delegates to a store whose `discard` does nothing (a bug, a read-only replica)."""

    def __init__(self, store: IdempotencyStore) -> None:
        self._store = store

    def __getattr__(self, name: str) -> object:
        return getattr(self._store, name)

    async def discard(self, key: str, fingerprint: str) -> None:
        return None


async def test_a_poisoned_record_that_cannot_be_discarded_is_refused_not_looped_on(tmp_path: Path) -> None:
    store = await SqliteStore.open(tmp_path / "i.sqlite3")
    assert await store.claim("order-19", FP, "e" * 32, 10) is None
    await store.complete("order-19", "e" * 32, FP, DEPARTED, TTL, 1000)
    idempotency = Idempotency(StuckDiscard(store), TTL, 1000)  # type: ignore[arg-type]
    job = Job()
    with trio.fail_after(5), pytest.raises(IdempotencyUnavailable):
        await idempotency.execute("order-19", FP, job)
    await store.aclose()
    assert job.calls == 0


# --- two gateways on one store --------------------------------------------------------------


class ReadSpy:
    """Delegates to a store; `polled` is set once a caller reads (i.e. waits for a runner elsewhere)."""

    def __init__(self, store: IdempotencyStore) -> None:
        self._store = store
        self.polled = trio.Event()

    def __getattr__(self, name: str) -> object:
        return getattr(self._store, name)

    async def read(self, key: str) -> Record | None:
        self.polled.set()
        return await self._store.read(key)


async def test_two_gateways_split_twenty_identical_requests_and_run_once(shared_store) -> None:
    job = Job(gated=True)
    outcomes: list[Outcome] = []
    async with shared_store() as store_a, shared_store() as store_b:
        spy_b = ReadSpy(store_b)
        async with serving(store_a) as gateway_a, serving(spy_b) as gateway_b, trio.open_nursery() as nursery:

            async def one(gateway: Idempotency) -> None:
                outcomes.append(await gateway.execute("order-7", FP, job))

            nursery.start_soon(one, gateway_a)
            await job.started.wait()
            for index in range(19):
                nursery.start_soon(one, (gateway_a, gateway_b)[index % 2])
            await spy_b.polled.wait()
            with trio.fail_after(5):  # refused at once, not after the run it does not match
                mismatch_on_b = await gateway_b.execute("order-7", OTHER_FP, Job())
            job.gate.set()
        replayed_on_b = await gateway_b.execute("order-7", FP, Job(answer("late")))
    assert job.calls == 1
    assert sorted(o.result.value for o in outcomes) == ["stored"] + ["waited"] * 19
    assert all(o.response == job.response for o in outcomes)
    assert replayed_on_b == Outcome(Result.REPLAYED, job.response), "first seen on A, replayed by B"
    assert mismatch_on_b.result is Result.MISMATCH


async def test_a_runner_that_died_elsewhere_frees_the_key_when_its_lease_ends(open_store) -> None:
    lease = 0.3  # real seconds: Redis expires it itself (no mock clock: coredis' timeouts run on trio's)
    async with open_store() as store, serving(store, lease_seconds=lease) as idempotency:
        assert await store.claim("order-8", FP, "d" * 32, lease) is None  # a gateway that then died
        taken_over = Job()
        outcome = await idempotency.execute("order-8", FP, taken_over)
    assert outcome.result is Result.STORED and taken_over.calls == 1


async def test_a_run_longer_than_the_lease_keeps_its_key(shared_store) -> None:
    """The lease is renewed while the run lasts: nobody elsewhere takes the key over.

    Real time (a mock clock runs ahead of the store's threads and of Redis' own expiry).
    """
    lease = 0.2
    started = trio.Event()

    async def slow() -> RunResult:
        started.set()
        await trio.sleep(3 * lease)  # the job's own duration, not a synchronisation
        return RunResult(answer("slow"), storable=True)

    second = Job(answer("second"))
    outcomes: list[Outcome] = []
    async with (
        shared_store() as store_a,
        shared_store() as store_b,
        serving(store_a, lease_seconds=lease) as gateway_a,
        serving(store_b, lease_seconds=lease) as gateway_b,
        trio.open_nursery() as nursery,
    ):
        nursery.start_soon(lambda: _collect(gateway_a.execute("order-15", FP, slow), outcomes, []))
        await started.wait()
        nursery.start_soon(lambda: _collect(gateway_b.execute("order-15", FP, second), outcomes, []))
    assert second.calls == 0
    assert [o.result for o in outcomes] == [Result.STORED, Result.WAITED]


# --- SQLite specifics -----------------------------------------------------------------------


async def test_sqlite_records_survive_a_restart(tmp_path: Path) -> None:
    settings = IdempotencySettings(path=str(tmp_path / "var" / "idempotency.sqlite3"))
    job = Job()
    before = await open_idempotency(settings, None)
    await before.execute("order-9", FP, job)
    await before.aclose()
    after = await open_idempotency(settings, None)
    outcome = await after.execute("order-9", FP, Job(answer("after")))
    await after.aclose()
    assert outcome == Outcome(Result.REPLAYED, job.response)


class _PurgeRounds:
    """A store whose finished purge rounds the test can wait for (each purge runs in a thread)."""

    def __init__(self, store: SqliteStore) -> None:
        self._store = store
        self.finished = 0
        self._changed = trio.Event()

    def __getattr__(self, name: str) -> object:
        return getattr(self._store, name)

    async def purge(self, max_entries: int) -> None:
        await self._store.purge(max_entries)
        self.finished += 1
        self._changed.set()
        self._changed = trio.Event()

    async def wait_rounds(self, count: int) -> None:
        target = self.finished + count
        while self.finished < target:
            await self._changed.wait()


async def test_sqlite_records_expire_and_are_purged(tmp_path: Path, autojump_clock) -> None:
    # The records' clock is the test's; the mock clock only paces the purge rounds, so a round
    # that runs in a thread while the mock clock jumps cannot race the records' expiry.
    now = [0.0]
    store = await SqliteStore.open(tmp_path / "i.sqlite3", lambda: now[0])
    rounds = _PurgeRounds(store)
    async with serving(cast(IdempotencyStore, rounds), ttl_seconds=3600, purge_interval_seconds=600) as idempotency:
        await idempotency.execute("order-10", FP, Job())
        now[0] = 3000.0
        await rounds.wait_rounds(2)  # the first may have read the clock before it moved
        kept = await trio.to_thread.run_sync(_row_count, store)
        assert (await idempotency.execute("order-10", FP, Job())).result is Result.REPLAYED
        now[0] = 3700.0  # past the TTL
        await rounds.wait_rounds(2)
        purged = await trio.to_thread.run_sync(_row_count, store)
        again = Job(answer("again"))
        assert await idempotency.execute("order-10", FP, again) == Outcome(Result.STORED, again.response)
    await store.aclose()
    assert (kept, purged) == (1, 0)


async def test_sqlite_keeps_max_entries_on_insert_before_any_purge(tmp_path: Path) -> None:
    store = await SqliteStore.open(tmp_path / "i.sqlite3")
    idempotency = Idempotency(store, TTL, 3)  # its purge task never runs here
    for number in range(5):
        await idempotency.execute(f"order-{number}", FP, Job())
    rows = await trio.to_thread.run_sync(_row_count, store)
    kept = [await idempotency.lookup(f"order-{n}", FP) is not None for n in range(5)]
    await idempotency.aclose()
    assert rows == 3
    assert kept == [False, False, True, True, True]


def _row_count(store: SqliteStore) -> int:
    """Rows through the store's own connection (the file has one owner)."""
    return store._connection.execute("SELECT COUNT(*) FROM idempotency").fetchone()[0]


async def test_the_sqlite_file_has_one_owner_and_no_shared_memory_file(tmp_path: Path) -> None:
    path = tmp_path / "i.sqlite3"
    store = await SqliteStore.open(path)
    idempotency = Idempotency(store, TTL, 1000)
    await idempotency.execute("order-18", FP, Job())
    siblings = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(IdempotencyUnavailable, match="locked"):
        await SqliteStore.open(path)  # a second gateway naming the same file
    await idempotency.aclose()
    assert "i.sqlite3-shm" not in siblings, f"WAL with exclusive locking maps no -shm: {siblings}"


async def test_a_full_sqlite_store_refuses_then_recovers(tmp_path: Path) -> None:
    """SQLITE_FULL (here: a page limit; a real full disk is in tests/edge/e2e/test_e2e_store_faults.py)."""
    store = await SqliteStore.open(tmp_path / "i.sqlite3")
    idempotency = Idempotency(store, TTL, 100_000)
    big = Job(answer("x" * 20_000))
    (pages,) = await trio.to_thread.run_sync(lambda: store._connection.execute("PRAGMA page_count").fetchone())
    await trio.to_thread.run_sync(store._connection.execute, f"PRAGMA max_page_count = {pages + 8}")
    full = 0  # refused before the run (the claim failed), or answered but not stored
    for number in range(20):
        try:
            full += (await idempotency.execute(f"order-{number}", FP, big)).result is Result.UNSTORED
        except IdempotencyUnavailable:
            full += 1
    await trio.to_thread.run_sync(store._connection.execute, "PRAGMA max_page_count = 1000000")
    after = await idempotency.execute("order-after", FP, Job())
    await idempotency.aclose()
    assert full > 0
    assert after.result is Result.STORED, "space again: the store works again"


async def test_a_failing_store_refuses_keyed_requests_without_running_them(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = await SqliteStore.open(tmp_path / "i.sqlite3")
    idempotency = Idempotency(store, TTL, 1000)
    await idempotency.execute("fits", FP, Job())
    # The file turns unwritable under the gateway (as with a full disk): every write fails.
    await trio.to_thread.run_sync(store._connection.execute, "PRAGMA query_only = 1")
    job = Job()
    with caplog.at_level(logging.ERROR, logger="edge.idempotency"):
        for _ in range(3):
            with pytest.raises(IdempotencyUnavailable):
                await idempotency.execute("new-key", FP, job)
    await idempotency.aclose()
    assert job.calls == 0, "never run unprotected"
    assert len(caplog.records) == 1, "logged once a minute, not per request"


async def test_an_unopenable_sqlite_path_is_store_unavailable(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    with pytest.raises(IdempotencyUnavailable):
        await open_idempotency(IdempotencySettings(path=str(tmp_path / "a-file" / "x.sqlite3")), None)


# --- Redis specifics ------------------------------------------------------------------------


async def test_redis_is_chosen_when_configured_and_records_carry_the_ttl(redis_server: RedisServer) -> None:
    async with redis_client(redis_server.url) as redis:
        idempotency = await open_idempotency(IdempotencySettings(ttl_hours=2), redis)
        await idempotency.execute("order-11", FP, Job())
        ttl_ms = await redis.pttl(RedisStore.PREFIX + "order-11")
    assert 2 * 3600 * 1000 - 60_000 < ttl_ms <= 2 * 3600 * 1000


async def test_redis_keeps_at_most_max_entries(redis_server: RedisServer) -> None:
    async with redis_client(redis_server.url) as redis:
        assert redis is not None
        idempotency = Idempotency(RedisStore(redis, TTL), TTL, 3)
        for number in range(5):
            await idempotency.execute(f"order-{number}", FP, Job())
        kept = [await idempotency.lookup(f"order-{n}", FP) is not None for n in range(5)]
        keys = await redis.keys(RedisStore.PREFIX + "*")
    assert kept == [False, False, True, True, True]
    assert len(keys) == 3


async def test_redis_killed_mid_run_answers_that_run_and_refuses_the_next(redis_server: RedisServer) -> None:
    job = Job(gated=True)
    async with redis_client(redis_server.url) as redis_a, redis_client(redis_server.url) as redis_b:
        assert redis_a is not None and redis_b is not None
        spy_b = ReadSpy(RedisStore(redis_b, TTL))
        async with serving(RedisStore(redis_a, TTL)) as gateway_a, serving(spy_b) as gateway_b:
            outcomes: list[Outcome] = []
            refused: list[BaseException] = []
            async with trio.open_nursery() as nursery:
                nursery.start_soon(lambda: _collect(gateway_a.execute("order-12", FP, job), outcomes, refused))
                await job.started.wait()
                nursery.start_soon(lambda: _collect(gateway_b.execute("order-12", FP, job), outcomes, refused))
                await spy_b.polled.wait()
                redis_server.kill()
                job.gate.set()
            late = Job()
            with pytest.raises(IdempotencyUnavailable):
                await gateway_a.execute("order-13", FP, late)
    assert outcomes == [Outcome(Result.UNSTORED, job.response)], "the job ran once; its answer is not lost"
    assert [type(e) for e in refused] == [IdempotencyUnavailable], "the waiter on B cannot be answered"
    assert job.calls == 1 and late.calls == 0


async def test_a_dead_redis_is_logged_once_and_coredis_does_not_flood_the_log(
    redis_server: RedisServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Issue 15: 70 coredis INFO lines (a retry each) for 20 requests, and a stray "NoneType: None"."""
    async with redis_client(redis_server.url) as redis:
        assert redis is not None
        idempotency = Idempotency(RedisStore(redis, TTL), TTL, 1000)
        await idempotency.execute("before", FP, Job())  # a live connection, then Redis dies under it
        redis_server.kill()
        with caplog.at_level(logging.INFO):
            for number in range(20):
                with pytest.raises(IdempotencyUnavailable):
                    await idempotency.execute(f"order-{number}", FP, Job())
    ours = [r for r in caplog.records if r.name == "edge.idempotency"]
    theirs = [r for r in caplog.records if r.name.startswith("coredis") and r.levelno < logging.WARNING]
    assert len(ours) == 1, "once a minute"
    assert theirs == [], [r.getMessage() for r in theirs]


async def _collect(operation, outcomes: list[Outcome], errors: list[BaseException]) -> None:  # type: ignore[no-untyped-def]
    try:
        outcomes.append(await operation)
    except IdempotencyUnavailable as error:
        errors.append(error)


async def test_a_dead_redis_at_start_fails_keyed_requests_only_when_they_come(tmp_path: Path) -> None:
    async with redis_client(f"redis://127.0.0.1:{free_port()}/0") as redis:
        assert isinstance(redis, coredis.Redis)
        idempotency = await open_idempotency(IdempotencySettings(), redis)
        job = Job()
        with pytest.raises(IdempotencyUnavailable):
            await idempotency.execute("order-14", FP, job)
    assert job.calls == 0
