"""The answer of an endpoint the gateway serves itself (4 and 99): an envelope and its Retry-After.

Every 1007 the gateway makes carries `Retry-After` (contract.md § Envelope); refusals of
the photo (1001–1006, 1008) do not.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from shared.contract import Code, ContractError, failure, success


@dataclass(frozen=True)
class LocalAnswer:
    envelope: dict[str, Any]
    retry_after: int | None = None  # seconds, for the Retry-After header

    @property
    def code(self) -> int:
        return int(self.envelope["code"])


def answered(request_id: str, data: dict[str, Any]) -> LocalAnswer:
    return LocalAnswer(success(request_id, data))


def refused(error: ContractError, request_id: str, retry_after_seconds: int) -> LocalAnswer:
    """`error` as an envelope; `retry_after_seconds` is sent only with a 1007."""
    retry_after = retry_after_seconds if error.code is Code.SYSTEM_ERROR else None
    return LocalAnswer(failure(error, request_id), retry_after)
