"""The audit trail's write side: hooks on the request's path, a writer task off it (audit.md § Writing).

The request's path touches memory (and the journal, below): `received` (its arrival,
before any check: the execution id), `queued` (waiting for a host), `forwarding` (around
each forward: executing, then the answering host and its time), `executing` (answered by
the gateway itself) and `finished` (its request-log record: code, retries, times). Each
mutates the execution's `Execution` and puts it in `pending` (an ordered dict: one entry
per execution however many changes it had, oldest first); microseconds, no await, no store.

With a journal (`edge.audit.journal`; the gateway always has one), `received` and `finished`
also append the execution to it, one `write()` each, so that a crash loses no row; `run()`
first adopts the journals of dead gateways in its folder.

`run()`, in the serving nursery, writes what is pending every `FLUSH_INTERVAL_SECONDS` in
batches of at most `BATCH_ROWS`, one thread hop per batch. A row whose execution id another
gateway's row already holds is refused by the store: logged, counted (`conflict`), and that
execution is never written again. A batch the store refuses goes back to the front and is
tried again a second later, in order, until the store is back; beyond `max_pending`
executions the oldest pending are dropped and counted. Failures are logged once a minute.
Cancelled (shutdown, after the server drained), it writes what is left, for at most
`SHUTDOWN_FLUSH_SECONDS`: a write still in its thread then is abandoned (the store's own
timeouts end it), and what is still pending stays in the journal for the next start
(without a journal: counted as dropped), logged once. Retention runs beside it, in small
batches.
"""

from __future__ import annotations

import hashlib
import ipaddress
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Iterable, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import trio
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from edge.admission.rate_limit import ClientKeys, scoped_key
from edge.audit.ids import ExecutionIds
from edge.audit.journal import Journal, journal_directory
from edge.audit.rows import COLUMNS, COMPLETED, EXECUTING, FAILED, QUEUED, Execution
from edge.audit.store import AuditStore, AuditStoreError, open_store
from edge.observe.metrics import GatewayMetrics
from edge.observe.request_log import RequestRecord
from shared.contract import HEADER_IDEMPOTENCY_KEY, Code
from shared.logs import FailureLog
from shared.settings import RateLimitSettings, Settings

log = logging.getLogger("edge.audit")
T = TypeVar("T")

FLUSH_INTERVAL_SECONDS = 0.5
RETRY_SECONDS = 1.0  # after a refused batch: the store is down, do not spin
BATCH_ROWS = 500  # a catch-up after an outage goes in hops of this many, the event loop free between them
SHUTDOWN_FLUSH_SECONDS = 10.0
RETENTION_INTERVAL_SECONDS = 3600.0
RETENTION_BATCH_ROWS = 1000
RETENTION_PAUSE_SECONDS = 0.2  # between two deletes: the table stays writable
# The journal is rewritten (to what is pending or under way) once it holds this much, or twice
# what the last rewrite left while the store is down: a rewrite's cost stays proportional
# to the lines appended since the last one.
JOURNAL_REWRITE_BYTES = 1024 * 1024
WRITE_RESULTS = ("written", "failed", "dropped", "conflict")
_KEY = HEADER_IDEMPOTENCY_KEY.lower().encode()
_FORWARDED_FOR = b"x-forwarded-for"
Scope = Mapping[str, Any]


def key_hash(key: str, key_header: str = "", key_header_value: str | None = None) -> str:
    """The `idempotency_key` column: SHA-256 hex of the scoped key."""
    return hashlib.sha256(scoped_key(key, key_header, key_header_value).encode()).hexdigest()


def user_id(key_header_value: str) -> str:
    """The `user_id` column: the first 16 hex of the SHA-256 of the key_header value."""
    return hashlib.sha256(key_header_value.encode()).hexdigest()[:16]


class AuditTrail:
    """One per gateway. Without a store (`edge.audit.enabled = false`) it still names every
    execution (the X-Execution-ID header) and records nothing."""

    def __init__(
        self,
        ids: ExecutionIds,
        store: AuditStore | None,
        client_keys: ClientKeys,
        *,
        reader: AuditStore | None = None,
        max_pending: int = 100_000,
        retention_days: float = 30,
        gpu_second_usd: float = 0.0,
        journal_dir: Path | None = None,
    ) -> None:
        self._ids = ids
        self.node = ids.node  # every row this trail creates carries it: only this trail changes them
        self._journal_dir = journal_dir if store is not None else None
        self.journal: Journal | None = None  # opened by `open_journal` (run() does)
        self.store = store
        self.reader = reader  # its own connection: a slow read never holds up the writer
        self._client_keys = client_keys  # who a request is (its IP, its API key), as admission says
        self._max_pending = max_pending
        self._retention_days = retention_days
        self._gpu_ms_usd = gpu_second_usd / 1000
        self._live: dict[str, Execution] = {}  # received, not yet finished
        self._pending: OrderedDict[str, Execution] = OrderedDict()
        self._has_pending = trio.Event()
        self._writer = trio.CapacityLimiter(1)
        # since start: written and failed count row write attempts (a refused batch counts
        # again at each retry), dropped counts rows given up (beyond max_pending, or at shutdown),
        # conflict counts executions refused because another gateway's row holds their id
        self.writes = dict.fromkeys(WRITE_RESULTS, 0)
        self._failures = FailureLog(log, f"审计日志写入失败，变更暂存内存（{store.where if store else '-'}）")
        self._dropped_log = FailureLog(log, "审计日志待写变更超过 edge.audit.max_pending，最旧的已丢弃")
        self._conflicts = FailureLog(log, "审计日志执行 ID 已被另一网关的记录占用，本条不写入、不合并")
        self._journal_failures = FailureLog(log, "审计日志文件写入失败，崩溃时这些请求的记录可能丢失")

    @property
    def pending(self) -> int:
        return len(self._pending)

    def reconfigure(self, rate_limit: RateLimitSettings) -> None:
        """Reloaded rate-limit settings: who the requests that arrive from now on are
        (trusted proxies, `key_header`)."""
        self._client_keys = ClientKeys(rate_limit)

    # --- the request's path ------------------------------------------------------------------

    def received(self, request_id: str, path: str, scope: Scope) -> str:
        """A new `/api/` request: its execution id (and its row, when recording)."""
        execution_id = self._ids.next()
        if self.store is None:
            return execution_id
        keys = self._client_keys
        key_name = keys.key_header_name if keys.key_header else None
        forwarded = key = api_key = None
        for name, value in scope["headers"]:
            if name == _FORWARDED_FOR:
                forwarded = value if forwarded is None else forwarded + b", " + value
            elif name == _KEY:
                key = value.decode("latin-1")
            elif name == key_name:
                api_key = value.decode("latin-1")
        client = scope.get("client")
        peer = client[0] if client else ""
        client_ip = peer if forwarded is None else keys.client_ip(peer, forwarded.decode("latin-1"))
        now = time.time()
        execution = Execution(
            execution_id, request_id, path,
            None if key is None else key_hash(key, keys.key_header, api_key), client_ip,
            user_id(api_key) if api_key else None, now, now, node=self.node,
        )  # fmt: skip
        self._live[execution_id] = execution
        self._changed(execution)
        self._journaled(execution)  # before any answer can leave: a crash from now on keeps the row
        return execution_id

    def queued(self, execution_id: str) -> None:
        execution = self._live.get(execution_id)
        if execution is not None:
            self._move(execution, QUEUED)

    def executing(self, execution_id: str) -> None:
        """Answered by the gateway itself (endpoints 4 and 99)."""
        execution = self._live.get(execution_id)
        if execution is not None:
            self._move(execution, EXECUTING)

    async def forwarding(self, execution_id: str, worker: int, forward: Awaitable[T]) -> T:
        """`await forward` (one forward to `worker`), recording it: executing, then — if
        the host answered — that host and the time it took (`gpu_ms`)."""
        execution = self._live.get(execution_id)
        if execution is None:
            return await forward
        execution.worker = execution.gpu_ms = None  # an earlier forward's host did not give the answer
        self._move(execution, EXECUTING)
        started = time.perf_counter()
        answer = await forward
        execution.worker, execution.gpu_ms = worker, round((time.perf_counter() - started) * 1000)
        return answer

    def finished(self, execution_id: str, entry: RequestRecord) -> None:
        """The request's final state, from its request-log record (taken after the answer)."""
        execution = self._live.pop(execution_id, None)
        if execution is None:
            return
        execution.code = entry.code
        execution.retry_count = max(entry.attempts - 1, 0)
        execution.replayed = entry.idempotent_replay
        execution.queue_ms = round(entry.queue_ms)
        execution.duration_ms = round(entry.duration_ms)
        execution.error_type = entry.error_type
        execution.model_version = entry.model_version
        if execution.gpu_ms is None or entry.idempotent_replay:  # no host answered it
            execution.worker, execution.gpu_ms = None, 0
        execution.cost_usd = round(execution.gpu_ms * self._gpu_ms_usd, 6)
        self._move(execution, COMPLETED if entry.code == Code.OK else FAILED)
        self._journaled(execution)

    def _journaled(self, execution: Execution) -> None:
        """Only arrival and end go to the journal: the states between add nothing a restart
        would keep (an unfinished execution is closed as failed either way), and each line
        costs a `write()` on the request's path."""
        if self.journal is None or execution.refused:
            return
        try:
            self.journal.append(execution)
        except OSError as error:  # a full disk: the request goes on, the row waits in memory as before
            self._journal_failures.report(error)

    def _move(self, execution: Execution, status: str) -> None:
        execution.status = status
        execution.updated_at = time.time()
        self._changed(execution)

    def _changed(self, execution: Execution) -> None:
        if execution.refused:  # another gateway's row holds its id: never written, never merged
            return
        pending = self._pending
        if execution.execution_id not in pending:
            pending[execution.execution_id] = execution
            if len(pending) > self._max_pending:
                pending.popitem(last=False)
                self._dropped(1)
        self._has_pending.set()

    def _dropped(self, count: int) -> None:
        self.writes["dropped"] += count
        self._dropped_log.report(f"共丢弃 {self.writes['dropped']} 条")

    # --- the writer task -----------------------------------------------------------------------

    def open_journal(self) -> list[Execution]:
        """Blocking (a worker thread, at start): this process's journal, and the executions of the
        dead gateways' journals beside it (unfinished ones closed as failed: "gateway restarted"),
        already in the new journal; `run()` puts them in `pending`."""
        assert self._journal_dir is not None and self.journal is None
        self.journal = Journal.create(self._journal_dir, self.node)
        now = time.time()
        return self.journal.adopt_dead(lambda execution: execution.close_as_restarted(now))

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Adopt what dead gateways left, then write batches until cancelled, then what is left;
        retention beside it. Started (`task_status.started()`) once the journal is open: before
        the gateway listens, so that every request is journaled."""
        if self.store is not None and self._journal_dir is not None:
            try:
                self._adopt(await trio.to_thread.run_sync(self.open_journal))
            except OSError as error:  # a folder it may not write: the gateway serves, as before the journal
                log.error("审计日志文件无法打开（%s），崩溃时最近的记录可能丢失：%s", self._journal_dir, error)
        task_status.started()
        if self.store is None:
            return
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._retention)
                while True:
                    await self._has_pending.wait()
                    await trio.sleep(FLUSH_INTERVAL_SECONDS)  # let a batch gather
                    if not await self.flush():
                        await trio.sleep(RETRY_SECONDS)
        finally:
            with trio.CancelScope(shield=True, deadline=trio.current_time() + SHUTDOWN_FLUSH_SECONDS):
                await self.flush()
            self._left_at_shutdown()
            self.store.close()
            if self.reader is not None:
                self.reader.close()

    def _adopt(self, executions: list[Execution]) -> None:
        """Dead gateways' executions (with their own node: their rows stay theirs) to be written."""
        for execution in executions:
            self._changed(execution)
        if executions:
            restarted = sum(execution.reason is not None for execution in executions)
            log.warning(
                "已接管已退出网关的审计日志文件：%d 条记录待写入，其中 %d 条未完成的已记为失败（gateway restarted）",
                len(executions),
                restarted,
            )

    def _left_at_shutdown(self) -> None:
        """What the shutdown flush could not write: left in the journal for the next start when
        there is one, else dropped and counted. Logged once either way."""
        assert self.store is not None
        left = len(self._pending)
        journal = self._close_journal()
        if left and journal is not None:
            log.error("退出时审计日志仍有 %d 条变更未能写入，留在 %s，下次启动时写入", left, journal)
        elif left:
            log.error("退出时审计日志仍有 %d 条变更未能写入，已丢弃（%s）", left, self.store.where)
            self.writes["dropped"] += left
        self._pending.clear()

    def _close_journal(self) -> Path | None:
        """The journal closed: removed when the store has everything, else rewritten to what it
        lacks and left for the next start (its path returned)."""
        journal, self.journal = self.journal, None
        if journal is None:
            return None
        unwritten = {**self._pending, **self._live}
        try:
            if unwritten:
                journal.rewrite(unwritten.values())
        except OSError as error:  # the journal as it was still holds all of it (and more)
            self._journal_failures.report(error)
        journal.close(keep=bool(unwritten))
        return journal.path if unwritten else None

    async def flush(self) -> bool:
        """Write everything pending, batch by batch; False when the store refused (the rest waits)."""
        assert self.store is not None
        try:
            while self._pending:
                batch = [self._pending.popitem(last=False)[1] for _ in range(min(BATCH_ROWS, len(self._pending)))]
                rows = [_checked(execution.values()) for execution in batch]
                try:
                    # abandoned when cancelled: the shutdown flush's deadline holds even while
                    # the store blocks (the thread ends by the store's timeouts, in the background)
                    refused = await trio.to_thread.run_sync(
                        self.store.write, rows, limiter=self._writer, abandon_on_cancel=True
                    )
                except AuditStoreError as error:
                    self.writes["failed"] += len(rows)
                    self._failures.report(error)
                    self._put_back(batch)
                    return False
                except BaseException:  # cancelled (a shutdown): not known written, still to be written
                    self._put_back(batch)
                    raise
                self.writes["written"] += len(rows) - len(refused)
                if refused:
                    self._refuse(batch, refused)
            self._has_pending = trio.Event()
            return True
        finally:
            self._rewrite_journal_if_due()

    def _refuse(self, batch: list[Execution], refused: list[str]) -> None:
        """Another gateway's row holds these ids: ours are never written (nor merged into theirs)."""
        ids = set(refused)
        for execution in batch:
            if execution.execution_id in ids:
                execution.refused = True
        self.writes["conflict"] += len(ids)
        self._conflicts.report(f"{len(ids)} 条，例如 {refused[0]}；累计 {self.writes['conflict']} 条")

    def _rewrite_journal_if_due(self) -> None:
        """Keep the journal to what the store may lack: the executions pending or under way.
        Called when no batch is in a thread: `flush` has one caller at a time (the writer task,
        then the shutdown flush once it has been cancelled)."""
        journal = self.journal
        if journal is None or journal.size_bytes < max(JOURNAL_REWRITE_BYTES, 2 * journal.rewritten_bytes):
            return
        try:
            journal.rewrite({**self._pending, **self._live}.values())
        except OSError as error:
            self._journal_failures.report(error)

    def _put_back(self, batch: list[Execution]) -> None:
        """A refused batch goes back in front of what came since, in its order."""
        for execution in reversed(batch):
            self._pending[execution.execution_id] = execution
            self._pending.move_to_end(execution.execution_id, last=False)
        excess = len(self._pending) - self._max_pending
        for _ in range(max(excess, 0)):
            self._pending.popitem(last=False)
        if excess > 0:
            self._dropped(excess)

    async def _retention(self) -> None:
        assert self.store is not None
        while True:
            cutoff = datetime.now(UTC) - timedelta(days=self._retention_days)
            try:
                while (
                    await trio.to_thread.run_sync(
                        self.store.delete_older,
                        cutoff,
                        RETENTION_BATCH_ROWS,
                        limiter=self._writer,
                        abandon_on_cancel=True,
                    )
                    >= RETENTION_BATCH_ROWS
                ):
                    await trio.sleep(RETENTION_PAUSE_SECONDS)
            except AuditStoreError as error:
                self._failures.report(error)
            await trio.sleep(RETENTION_INTERVAL_SECONDS)

    # --- metrics -------------------------------------------------------------------------------

    def collect(self) -> Iterable[Metric]:
        """`hairgate_audit_writes_total{result}` and `hairgate_audit_pending`, read at scrape time."""
        writes = CounterMetricFamily(
            "hairgate_audit_writes",
            "Audit row write attempts by result (failed: refused, counted again at each retry), "
            "rows dropped unwritten (beyond max_pending, or left at shutdown), "
            "and executions refused because another gateway's row holds their id (conflict)",
            labels=["result"],
        )
        for result in WRITE_RESULTS:
            writes.add_metric([result], self.writes[result])
        yield writes
        yield GaugeMetricFamily("hairgate_audit_pending", "Audit rows waiting to be written", value=len(self._pending))


_CLIENT_IP = COLUMNS.index("client_ip")


def _checked(values: tuple[Any, ...]) -> tuple[Any, ...]:
    """A client address that is no IP (a proxy forwarded garbage) would refuse the whole
    batch in PostgreSQL (INET): it is stored as 0.0.0.0."""
    try:
        ipaddress.ip_address(values[_CLIENT_IP])
    except ValueError:
        return (*values[:_CLIENT_IP], "0.0.0.0", *values[_CLIENT_IP + 1 :])
    return values


def build_audit(settings: Settings, metrics: GatewayMetrics) -> AuditTrail:
    """The gateway's trail (nothing opened yet: `AuditTrail.run` connects), its metrics registered."""
    audit = settings.edge.audit
    store = open_store(audit.path, settings.audit.postgres_dsn) if audit.enabled else None
    reader = open_store(audit.path, settings.audit.postgres_dsn, readers=True) if audit.enabled else None
    trail = AuditTrail(
        ExecutionIds(audit.gateway_id),
        store,
        ClientKeys(settings.edge.rate_limit),
        reader=reader,
        max_pending=audit.max_pending,
        retention_days=audit.retention_days,
        gpu_second_usd=audit.gpu_second_usd,
        journal_dir=journal_directory(audit.path, settings.audit.postgres_dsn),
    )
    metrics.registry.register(trail)
    return trail
