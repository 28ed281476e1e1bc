"""The headers of the public API and of the gateway <-> GPU host hop, and the ids they carry."""

from __future__ import annotations

import re
import uuid

HEADER_TOKEN = "X-Internal-Token"
HEADER_REQUEST_ID = "X-Request-ID"
HEADER_FORWARDED_FOR = "X-Forwarded-For"
HEADER_RETRY_AFTER = "Retry-After"
HEADER_IDEMPOTENCY_KEY = "Idempotency-Key"
HEADER_IDEMPOTENCY_REPLAYED = "Idempotency-Replayed"
# Every /api/ answer's execution id (audit.md), also sent to the GPU host with each forward.
HEADER_EXECUTION_ID = "X-Execution-ID"
# The time the gateway gives a forwarded attempt, in ms: the host caps its own work by it.
HEADER_REQUEST_TIMEOUT_MS = "X-Request-Timeout-Ms"
# Retry guidance (gateway.md § Failure kinds): a host's answer names its failure's kind
# (`ErrorType`), passed on to the client; a 1007 says how to retry (`RetryAdvice`); every
# /api/ answer says how loaded the pool is (busy online hosts / online hosts, "0.00"-"1.00");
# a 1007 may name another entrance (`edge.failures.alternative_endpoint`).
HEADER_ERROR_TYPE = "X-Error-Type"
HEADER_RETRY_POLICY = "X-Retry-Policy"
HEADER_CURRENT_LOAD = "X-Current-Load"
HEADER_ALTERNATIVE_ENDPOINT = "X-Alternative-Endpoint"
# The model version (seed 002 §6.2): what produced an answer, "<package version>+<12 hex>"
# (`shared.model_version`). A GPU host reports its own in `/health` (`MODEL_VERSION_KEY`) and
# on every `/api/` answer; the gateway passes it on (its own for the endpoints it answers
# itself), stores it with the audit row and with a stored idempotent answer. A value that is
# not 1-64 of [A-Za-z0-9._+-] is treated as none (it becomes a header, a label, a column).
HEADER_MODEL_VERSION = "X-Model-Version"
# A gateway's probe: its request has waited long for this host (`shared.contract.hop.WANTED_KEY`).
HEADER_HOST_WANTED = "X-Host-Wanted"

_REQUEST_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")
MODEL_VERSION_PATTERN = r"[A-Za-z0-9._+-]{1,64}"  # also the document's (edge/web/openapi.py)
_MODEL_VERSION = re.compile(MODEL_VERSION_PATTERN)


def is_valid_request_id(value: str | None) -> bool:
    return value is not None and _REQUEST_ID.fullmatch(value) is not None


def model_version_or_none(value: object) -> str | None:
    """`value` when it is a model version a gateway can pass on, store and label with; else None."""
    return value if isinstance(value, str) and _MODEL_VERSION.fullmatch(value) is not None else None


def new_request_id() -> str:
    return uuid.uuid4().hex


def request_id_from_header(value: str | None) -> str:
    """The client's id when it is well-formed, else a fresh one."""
    return value if is_valid_request_id(value) else new_request_id()  # type: ignore[return-value]
