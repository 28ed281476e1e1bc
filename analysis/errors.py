"""The analysis' own error: it refuses a photo or its options, by kind, in the client's words.

The analysis knows nothing of envelopes or codes: the contract answers each kind with its
code (`shared.contract.codes.REFUSAL_CODES`, through `ContractError.refusing`), where a
service turns the refusal into its answer (the GPU host's model process, the gateway's face
workers, `hairgate analyze`).
"""

from __future__ import annotations

from shared.contract.codes import RefusalKind


class AnalysisError(Exception):
    """The analysis refuses this request: `kind` says why, `message` says it to the client
    (Chinese, specific enough to act on)."""

    def __init__(self, kind: RefusalKind, message: str) -> None:
        self.kind = kind
        self.message = message
        super().__init__(f"{kind}: {message}")
