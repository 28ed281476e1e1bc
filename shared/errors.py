"""Naming the real reason of a network error in one line."""

from __future__ import annotations


def reason(error: BaseException) -> str:
    """`error`'s message, or that of what caused it when it has none.

    httpcore and httpx raise a `ConnectError` with an empty message for a failed TLS
    handshake; the `ssl.SSLCertVerificationError` that says why sits two links down the
    exception chain, and an operator needs exactly that line.
    """
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        if str(current):
            return f"{type(current).__name__}: {current}"
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return type(error).__name__
