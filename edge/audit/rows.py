"""One execution as the audit trail holds it in memory, and its row's columns (audit.md § The table)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

RECEIVED, QUEUED, EXECUTING, COMPLETED, FAILED = "received", "queued", "executing", "completed", "failed"
STATES = (RECEIVED, QUEUED, EXECUTING, COMPLETED, FAILED)  # seed 002 §4.2.3, in this order
FINAL_STATES = (COMPLETED, FAILED)
RESTARTED = "gateway restarted"  # `reason` of a row its gateway died under (closed by the next start)

# Every column but `id` (the store's), in the order `Execution.values()` gives them.
COLUMNS = (
    "execution_id",
    "request_id",
    "endpoint",
    "idempotency_key",
    "client_ip",
    "user_id",
    "status",
    "code",
    "worker",
    "retry_count",
    "replayed",
    "queue_ms",
    "gpu_ms",
    "duration_ms",
    "cost_usd",
    "created_at",
    "updated_at",
    "node",  # the node part of the creating gateway's ids: only that gateway may change the row
    "reason",  # why a row failed without an answer of its own (RESTARTED); NULL otherwise
    "error_type",  # the failure kind a GPU host named (gateway.md § Failure kinds); NULL otherwise
    "model_version",  # what produced the answer (X-Model-Version; a replay: the original's); NULL: nothing did
)


@dataclass(slots=True, eq=False)
class Execution:
    """Mutated by the request's hooks, snapshotted (`values()`) by the writer task."""

    execution_id: str
    request_id: str
    endpoint: str
    idempotency_key: str | None  # SHA-256 hex of the key as stored; never the key
    client_ip: str
    user_id: str | None  # first 16 hex of SHA-256 of the key_header value; never the value
    created_at: float  # wall-clock seconds at arrival
    updated_at: float
    status: str = RECEIVED
    code: int | None = None
    worker: int | None = None
    retry_count: int = 0
    replayed: bool = False
    queue_ms: int | None = None
    gpu_ms: int | None = None
    duration_ms: int | None = None
    cost_usd: float | None = None
    node: str = ""  # the creating process's (`ExecutionIds.node`): a replayed row keeps its own
    reason: str | None = None
    error_type: str | None = None  # the last failure kind a host named for this request
    model_version: str | None = None  # the answer's X-Model-Version (seed 002 §6.2)
    refused: bool = False  # another gateway holds this execution id: never written again (not a column)

    def snapshot(self) -> tuple[Any, ...]:
        """Every field but `refused`, in declaration order: `Execution(*snapshot)` is this execution
        again (the journal's line); times stay epoch seconds."""
        return (
            self.execution_id, self.request_id, self.endpoint, self.idempotency_key, self.client_ip, self.user_id,
            self.created_at, self.updated_at, self.status, self.code, self.worker, self.retry_count, self.replayed,
            self.queue_ms, self.gpu_ms, self.duration_ms, self.cost_usd, self.node, self.reason, self.error_type,
            self.model_version,
        )  # fmt: skip

    def close_as_restarted(self, now: float) -> None:
        """An execution its gateway died under, unfinished: failed, no code (the client's answer is
        unknown), the reason said."""
        if self.status not in FINAL_STATES:
            self.status, self.reason, self.updated_at = FAILED, RESTARTED, now

    def values(self) -> tuple[Any, ...]:
        return (
            self.execution_id, self.request_id, self.endpoint[:64], self.idempotency_key, self.client_ip or "0.0.0.0",
            self.user_id, self.status, self.code, self.worker, self.retry_count, self.replayed, self.queue_ms,
            self.gpu_ms, self.duration_ms, self.cost_usd, _utc(self.created_at), _utc(self.updated_at), self.node,
            self.reason, self.error_type, self.model_version,
        )  # fmt: skip


def _utc(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)
