"""`GET /admin/audit` (audit.md § Reading): the rows of one execution, request or idempotency key.

`?execution_id=…`, `?request_id=…` or `?idempotency_key=<the key>` (hashed and scoped as
the gateway stores it: with `key_header` set, the admin request sends that header as the
client did); newest first, at most 100. The route and its token check are
`edge.web.admin`'s; this is what it answers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import trio

from edge.admission.rate_limit import ClientKeys
from edge.audit import queries
from edge.audit.store import AuditStoreError
from edge.audit.trail import AuditTrail, key_hash

MSG_ONE_LOOKUP = "需要且只能给一个查询参数：execution_id、request_id 或 idempotency_key"
MSG_DISABLED = "审计日志未启用（edge.audit.enabled = false）"


async def audit_answer(
    trail: AuditTrail, arguments: Mapping[str, str], header: Callable[[str], str | None], client_keys: ClientKeys
) -> tuple[int, dict[str, Any]]:
    """(HTTP status, JSON document) for the admin route."""
    given = [(column, arguments[column]) for column in queries.LOOKUP_COLUMNS if arguments.get(column)]
    if len(given) != 1:
        return 400, {"status": "error", "message": MSG_ONE_LOOKUP}
    if trail.reader is None:
        return 404, {"status": "error", "message": MSG_DISABLED}
    column, value = given[0]
    if column == "idempotency_key":
        api_key = header(client_keys.key_header) if client_keys.key_header else None
        value = key_hash(value, client_keys.key_header, api_key)
    try:
        rows = await trio.to_thread.run_sync(queries.rows, trail.reader, column, value)
    except AuditStoreError as error:
        return 503, {"status": "error", "message": f"审计存储不可用：{error}"}
    return 200, {"rows": rows, "pending": trail.pending}
