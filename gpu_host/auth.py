"""The GPU host's only guard: `X-Internal-Token` must match one of `accept_passwords`.

Every accepted token is compared, always, with `hmac.compare_digest`: neither the time nor
the result reveals which one matched or how close a guess came. Tokens never reach a log;
a token is named only by its fingerprint, and only at debug level.
"""

from __future__ import annotations

import hmac
import logging

from shared.settings import token_fingerprint

log = logging.getLogger("gpu_host.auth")


class TokenGuard:
    """The set of accepted tokens; `replace()` swaps it at once (SIGHUP rotation)."""

    def __init__(self, accepted: tuple[str, ...]) -> None:
        self._accepted = self._encode(accepted)

    def replace(self, accepted: tuple[str, ...]) -> None:
        self._accepted = self._encode(accepted)
        log.info(
            "accept_passwords reloaded | count=%d fingerprints=%s",
            len(accepted),
            ",".join(token_fingerprint(token) for token in accepted),
        )

    def is_accepted(self, presented: str | None) -> bool:
        if not presented:
            return False
        candidate = presented.encode()
        matched = False
        for token in self._accepted:  # no early exit: every token costs the same
            matched |= hmac.compare_digest(candidate, token)
        if matched and log.isEnabledFor(logging.DEBUG):
            log.debug("request authenticated | token=%s", token_fingerprint(presented))
        return matched

    @staticmethod
    def _encode(accepted: tuple[str, ...]) -> tuple[bytes, ...]:
        if not accepted:
            raise ValueError("auth.accept_passwords is empty: a GPU host needs at least one token")
        return tuple(token.encode() for token in accepted)
