"""The gateway acts by the kind a host names (gateway.md § Failure kinds): the table
(`edge.pool.failures`), what `judge` makes of a host's answer, and — inside one process, in
virtual time — the whole path: who is ejected, who rests and for how long (seen in when the
host gets its next job), who is retried, and the headers the client gets.

The fake hosts answer exactly what a GPU host sends (`shared.contract.failure` of a
`ContractError` with its kind) and their answers go through the real `judge`."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
import trio
import trio.testing
from prometheus_client import generate_latest

from edge.app import create_app
from edge.audit import queries
from edge.gateway import Gateway, build_gateway
from edge.pool.errors import BadStatus, HostFailed
from edge.pool.failures import (
    ACTED_ON,
    KIND_RULES,
    FailureNumbers,
    HostAction,
    RetryPolicy,
    WorkerAnswer,
    judge,
)
from edge.pool.pool import ProbeResult
from edge.pool.upstream import ForwardRequest, RawAnswer
from shared.contract import (
    Code,
    ContractError,
    ErrorType,
    RetryAdvice,
    envelope,
    failure,
)
from tests.edge.conftest import PHOTO, WORKERS, bring_online, make_settings

MEASURE, GROW = "/api/v1/hair/measure", "/api/v1/hair/grow"
COOLDOWN_SECONDS = 60.0

# -- the table ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "in_a_row", "seconds"),
    [
        (ErrorType.CUDA_OOM, 1, 2.0),
        (ErrorType.CUDA_OOM, 2, 4.0),
        (ErrorType.CUDA_OOM, 3, 8.0),
        (ErrorType.CUDA_OOM, 7, 60.0),  # capped (backoff_max_seconds)
        (ErrorType.CUDA_OOM, 10_000, 60.0),  # no overflow however long it fails
        (ErrorType.TIMEOUT, 1, 1.0),
        (ErrorType.TIMEOUT, 2, 2.0),
        (ErrorType.TIMEOUT, 3, 4.0),
        (ErrorType.CUDA_ERROR, 1, COOLDOWN_SECONDS),
        (ErrorType.CUDA_ERROR, 5, COOLDOWN_SECONDS),  # the cooldown, whatever the count
        (ErrorType.MODEL_LOAD_FAILED, 1, 10.0),
        (ErrorType.MODEL_LOAD_FAILED, 4, 10.0),  # fixed
        (ErrorType.MODEL_NOT_LOADED, 1, 10.0),
        (ErrorType.INPUT_REJECTED, 3, 0.0),
        (ErrorType.INTERNAL, 3, 0.0),
    ],
)
def test_each_kind_holds_its_host_this_long(kind: ErrorType, in_a_row: int, seconds: float) -> None:
    assert FailureNumbers(cooldown_seconds=COOLDOWN_SECONDS).hold_seconds(kind, in_a_row) == seconds


def test_the_table_names_every_kind_once_with_its_action_and_advice() -> None:
    rows = {kind.value: (rule.action, rule.retry_elsewhere, rule.advice) for kind, rule in KIND_RULES.items()}
    assert rows == {
        "cuda_error": (HostAction.EJECT, True, RetryAdvice.FIXED),
        "cuda_oom": (HostAction.BACK_OFF, True, RetryAdvice.EXPONENTIAL_BACKOFF),
        "model_load_failed": (HostAction.OUT_FIXED, True, RetryAdvice.FIXED),
        "model_not_loaded": (HostAction.OUT_FIXED, True, RetryAdvice.FIXED),
        "timeout": (HostAction.BACK_OFF, True, RetryAdvice.EXPONENTIAL_BACKOFF),
        "input_rejected": (HostAction.NONE, False, RetryAdvice.NONE),
        "internal": (HostAction.NONE, False, RetryAdvice.FIXED),
    }


@pytest.mark.parametrize(
    ("kind", "path", "attempts", "retried"),
    [
        (ErrorType.CUDA_OOM, MEASURE, 1, True),
        (ErrorType.CUDA_OOM, MEASURE, 2, False),  # max_retries 1: spent
        (ErrorType.CUDA_ERROR, GROW, 1, True),
        (ErrorType.TIMEOUT, MEASURE, 1, True),
        (ErrorType.TIMEOUT, GROW, 1, False),  # a generation may still run on its GPU
        (ErrorType.MODEL_NOT_LOADED, GROW, 1, True),
    ],
)
def test_a_named_failure_is_retried_by_its_kind(kind: ErrorType, path: str, attempts: int, retried: bool) -> None:
    policy = RetryPolicy(retry_on_failure=True, max_retries=1, slow_paths=frozenset({GROW}))
    answer = WorkerAnswer(b"{}", {})
    assert policy.allows_retry(HostFailed(kind, answer), path, attempts) is retried


# -- judge: what a host's answer means ----------------------------------------------------------


def host_answer(kind: ErrorType, request_id: str = "r1", code: Code = Code.SYSTEM_ERROR) -> bytes:
    """What a GPU host sends for a failure of `kind` (gpu_host.app)."""
    return json.dumps(failure(ContractError(code, error_type=kind), request_id)).encode()


@pytest.mark.parametrize("kind", sorted(ACTED_ON))
async def test_a_1007_naming_a_kind_acted_on_is_a_host_failure(kind: ErrorType) -> None:
    with pytest.raises(HostFailed) as raised:
        await judge("r1", RawAnswer(200, (), host_answer(kind)))
    assert raised.value.kind is kind
    assert raised.value.answer.envelope["data"] == {"error_type": kind.value}


async def test_a_host_not_ready_names_its_kind_on_its_503() -> None:
    with pytest.raises(HostFailed) as raised:
        await judge("r1", RawAnswer(503, (), host_answer(ErrorType.MODEL_LOAD_FAILED)))
    assert raised.value.kind is ErrorType.MODEL_LOAD_FAILED
    with pytest.raises(BadStatus):  # a 503 naming no kind: a broken host, as before
        await judge("r1", RawAnswer(503, (), json.dumps(envelope(Code.SYSTEM_ERROR, "r1")).encode()))


@pytest.mark.parametrize(
    "raw",
    [
        host_answer(ErrorType.INTERNAL),
        json.dumps({**envelope(Code.SYSTEM_ERROR, "r1"), "data": {"error_type": "quantum_flux"}}).encode(),
        json.dumps(envelope(Code.SYSTEM_ERROR, "r1")).encode(),  # a host from before kinds
    ],
)
async def test_internal_unknown_or_no_kind_is_passed_on_as_before(raw: bytes) -> None:
    answer = await judge("r1", RawAnswer(200, (), raw))
    assert answer.raw == raw


# -- the whole path, in one process -------------------------------------------------------------


class KindHosts:
    """Fake hosts by URL: each answers its scripted kinds in turn, then successes; every
    forward is recorded with its (virtual) time; the gateway judges its answer (the real `judge`)."""

    def __init__(self) -> None:
        self.scripts: dict[str, list[ErrorType]] = {url: [] for url in WORKERS}
        self.jobs: list[tuple[str, float]] = []

    def jobs_of(self, index: int) -> list[float]:
        return [at for url, at in self.jobs if url == WORKERS[index]]

    @asynccontextmanager
    async def forward(self, url: str, request: ForwardRequest, timeout: float) -> AsyncIterator[RawAnswer]:
        self.jobs.append((url, trio.current_time()))
        await trio.sleep(0.1)  # a model run
        script = self.scripts[url]
        if script:
            kind = script.pop(0)
            not_ready = kind in (ErrorType.MODEL_LOAD_FAILED, ErrorType.MODEL_NOT_LOADED)
            code = Code.UNSUPPORTED_IMAGE if kind is ErrorType.INPUT_REJECTED else Code.SYSTEM_ERROR
            yield RawAnswer(503 if not_ready else 200, (), host_answer(kind, request.request_id, code))
        else:
            yield RawAnswer(200, (), json.dumps(envelope(Code.OK, request.request_id, {"worker": url})).encode())


@pytest.fixture
def hosts() -> KindHosts:
    return KindHosts()


@pytest.fixture
async def gateway(tmp_path: Path, hosts: KindHosts) -> Gateway:
    settings = make_settings(
        tmp_path,
        pool={"workers": WORKERS[:3], "primary_workers": []},
        health_check={"cooldown_seconds": COOLDOWN_SECONDS},
        dispatch={"queue_wait_seconds": 30, "request_timeout_seconds": 10},
        failures={"alternative_endpoint": "https://lowres.example.com"},
    )
    gateway = build_gateway(settings, upstream=hosts)  # type: ignore[arg-type]
    bring_online(gateway, 0, 1, 2)
    return gateway


@pytest.fixture
def client(gateway: Gateway) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=create_app(gateway), client=("203.0.113.7", 5555))
    return httpx.AsyncClient(transport=transport, base_url="http://gateway.test")


async def measure(client: httpx.AsyncClient) -> httpx.Response:
    return await client.post(MEASURE, json=PHOTO)


async def test_out_of_memory_rests_its_host_two_seconds_and_retries_elsewhere(
    autojump_clock: trio.testing.MockClock, client: httpx.AsyncClient, hosts: KindHosts, gateway: Gateway
) -> None:
    hosts.scripts[WORKERS[0]] = [ErrorType.CUDA_OOM]
    first = await measure(client)  # host 0 (idle longest, lowest index): OOM, then host 1
    oom_at = hosts.jobs_of(0)[0]
    while not hosts.jobs_of(0)[1:]:  # one request after another, until host 0 gets its next job
        await measure(client)
    rested = hosts.jobs_of(0)[1] - oom_at
    assert (first.json()["code"], first.json()["data"]["worker"]) == (0, WORKERS[1])
    assert [url for url, _ in hosts.jobs[:2]] == [WORKERS[0], WORKERS[1]]  # two attempts, the retry elsewhere
    assert gateway.pool.workers[0].online  # stayed in
    # its next job came at the first request after its 2 s rest: not before, and not much after
    assert 2.0 <= rested < 2.0 + 0.3, rested
    assert first.headers["X-Current-Load"] == "0.33"  # host 0 resting: one of three can take no job
    assert "X-Error-Type" not in first.headers  # the client got the retry's answer


async def test_out_of_memory_in_a_row_doubles_the_rest(
    autojump_clock: trio.testing.MockClock, client: httpx.AsyncClient, hosts: KindHosts, gateway: Gateway
) -> None:
    hosts.scripts[WORKERS[0]] = [ErrorType.CUDA_OOM, ErrorType.CUDA_OOM]
    gateway.dispatcher.eject(2, "not in this test")
    while len(hosts.jobs_of(0)) < 3:
        await measure(client)
        await trio.sleep(0.5)
    first, second, third = hosts.jobs_of(0)[:3]
    assert 2.0 <= second - first < 2.7 and 4.0 <= third - second < 4.7, (first, second, third)
    assert gateway.pool.workers[0].failures_in_a_row == {}  # the third answered well: counted from none again


async def test_a_cuda_error_ejects_its_host_for_the_cooldown_and_retries_elsewhere(
    autojump_clock: trio.testing.MockClock, client: httpx.AsyncClient, hosts: KindHosts, gateway: Gateway
) -> None:
    hosts.scripts[WORKERS[0]] = [ErrorType.CUDA_ERROR]
    answer = await measure(client)
    worker = gateway.pool.workers[0]
    assert answer.json()["code"] == 0 and len(hosts.jobs) == 2
    assert not worker.online and worker.cooldown_until - trio.current_time() > COOLDOWN_SECONDS - 1


async def test_a_model_that_failed_to_load_is_out_ten_seconds_with_one_error_line(
    autojump_clock: trio.testing.MockClock,
    client: httpx.AsyncClient,
    hosts: KindHosts,
    gateway: Gateway,
    caplog: pytest.LogCaptureFixture,
) -> None:
    hosts.scripts[WORKERS[0]] = [ErrorType.MODEL_LOAD_FAILED]
    answer = await measure(client)
    worker = gateway.pool.workers[0]
    out_for = worker.cooldown_until - trio.current_time()
    assert answer.json()["code"] == 0 and len(hosts.jobs) == 2
    assert not worker.online and 9.5 < out_for <= 10.0
    assert len([r for r in caplog.records if r.levelname == "ERROR" and "model_load_failed" in r.getMessage()]) == 1
    scraped = generate_latest(gateway.metrics.registry).decode()
    assert 'hairgate_host_failures_total{error_type="model_load_failed",worker="0"} 1.0' in scraped


async def test_the_request_log_and_the_audit_row_carry_the_kind(
    autojump_clock: trio.testing.MockClock, client: httpx.AsyncClient, hosts: KindHosts, gateway: Gateway
) -> None:
    hosts.scripts[WORKERS[0]] = [ErrorType.TIMEOUT]
    answer = await measure(client)
    await gateway.request_log.flush()
    (line,) = [json.loads(text) for text in gateway.request_log.path.read_text().splitlines()]
    assert await gateway.audit.flush()
    assert gateway.audit.store is not None
    rows = gateway.audit.store.query("SELECT error_type, retry_count, code FROM audit_log", ())
    assert answer.json()["code"] == 0
    assert (line["error_type"], line["attempts"], line["failed_workers"]) == ("timeout", 2, [0])
    assert rows == [("timeout", 1, 0)]
    # `hairgate audit failures` groups by the kind too (served after the retry: not a failure)
    by_kind = queries.failures(gateway.audit.store, timedelta(hours=1))["error_type"]
    assert by_kind == [{"error_type": "timeout", "executions": 1, "failed": 0, "share": 0.0}]


async def test_a_rejected_photo_is_the_clients_refusal_never_retried_nobody_ejected(
    autojump_clock: trio.testing.MockClock, client: httpx.AsyncClient, hosts: KindHosts, gateway: Gateway
) -> None:
    hosts.scripts[WORKERS[0]] = [ErrorType.INPUT_REJECTED]
    answer = await measure(client)
    assert answer.json()["code"] == Code.UNSUPPORTED_IMAGE and len(hosts.jobs) == 1
    assert (answer.headers["X-Error-Type"], answer.headers["X-Retry-Policy"]) == ("input_rejected", "none")
    assert "Retry-After" not in answer.headers and "X-Alternative-Endpoint" not in answer.headers
    assert all(w.online and w.resting_until is None for w in gateway.pool.workers[:3])


async def test_with_no_retry_left_the_client_gets_the_kind_and_when_to_retry(
    autojump_clock: trio.testing.MockClock, client: httpx.AsyncClient, hosts: KindHosts, gateway: Gateway
) -> None:
    gateway.dispatcher.eject(2, "not in this test")
    hosts.scripts[WORKERS[0]] = [ErrorType.CUDA_OOM]
    hosts.scripts[WORKERS[1]] = [ErrorType.CUDA_OOM]
    refused = await measure(client)  # host 0 OOM (rests 2 s), retried on host 1: OOM too, no retry left
    # the last host's own answer, byte for byte
    assert refused.content == host_answer(ErrorType.CUDA_OOM, refused.json()["request_id"])
    assert refused.json()["data"] == {"error_type": "cuda_oom"}
    assert refused.headers["X-Error-Type"] == "cuda_oom"
    assert refused.headers["X-Retry-Policy"] == "exponential_backoff"
    assert refused.headers["Retry-After"] == "2"  # the soonest a host may take a job: host 0's rest
    assert refused.headers["X-Current-Load"] == "1.00"  # both online hosts rest
    assert refused.headers["X-Alternative-Endpoint"] == "https://lowres.example.com"
    assert [url for url, _ in hosts.jobs] == WORKERS[:2]


async def test_a_host_past_its_deadline_rests_and_is_held_until_a_probe_says_its_job_ended(
    autojump_clock: trio.testing.MockClock, client: httpx.AsyncClient, hosts: KindHosts, gateway: Gateway
) -> None:
    hosts.scripts[WORKERS[0]] = [ErrorType.TIMEOUT]
    answer = await measure(client)
    worker = gateway.pool.workers[0]
    held = (worker.online, worker.draining_until is not None, worker.resting_until is not None)
    gateway.dispatcher.record_probe(0, ProbeResult(trio.current_time(), ok=True, busy=False))  # its child is done
    drained_but_resting = (worker.draining_until is None, worker.idle)
    await trio.sleep(1.0)  # 0.5 x 2¹
    gateway.dispatcher.expire_holds()
    assert answer.json()["code"] == 0 and len(hosts.jobs) == 2  # retried elsewhere
    assert held == (True, True, True)  # online, drained as after a departure, and resting
    assert drained_but_resting == (True, False)
    assert worker.idle
