"""Retry guidance on every `/api/` answer (gateway.md § Failure kinds), as ASGI middleware in
the slot Quart documents for one (`edge.app` installs it): the one place every `/api/` answer
passes, whoever made it (a forward, a refusal, admission, a replay, the gateway's own endpoints).

- `X-Current-Load`: busy online GPU hosts over online ones, two decimals (`Pool.load`), so a
  client can degrade (a smaller photo, later) before it is refused;
- `X-Alternative-Endpoint` (`edge.failures.alternative_endpoint`, when set) on an answer that
  asks the client to retry (it carries `Retry-After`): another entrance to try meanwhile.

`Retry-After` and `X-Retry-Policy` come with the answer itself (`ApiResponse.of_envelope`):
they depend on what failed, which only its maker knows.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import trio
from hypercorn.typing import ASGIReceiveCallable, ASGISendCallable, ASGISendEvent, Scope

from shared.contract import API_PREFIX, HEADER_ALTERNATIVE_ENDPOINT, HEADER_CURRENT_LOAD, HEADER_RETRY_AFTER

if TYPE_CHECKING:
    from edge.gateway import Gateway

ASGIApp = Callable[[Scope, ASGIReceiveCallable, ASGISendCallable], Awaitable[None]]
_CURRENT_LOAD = HEADER_CURRENT_LOAD.lower().encode()
_ALTERNATIVE = HEADER_ALTERNATIVE_ENDPOINT.lower().encode()
_RETRY_AFTER = HEADER_RETRY_AFTER.lower().encode()


def load_text(load: float) -> str:
    """The header's value: 0.00-1.00, two decimals."""
    return f"{min(max(load, 0.0), 1.0):.2f}"


class RetryGuidance:
    """ASGI middleware: adds the pool's load to each `/api/` answer's head, and the
    alternative entrance to those that ask for a retry, as the last reload left it
    (`Gateway.entrance`)."""

    def __init__(self, app: ASGIApp, gateway: Gateway) -> None:
        self._app = app
        self._gateway = gateway

    async def __call__(self, scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(API_PREFIX):
            await self._app(scope, receive, send)
            return

        async def guided(message: ASGISendEvent) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers.append((_CURRENT_LOAD, load_text(self._gateway.pool.load(trio.current_time())).encode()))
                alternative = self._gateway.entrance.alternative_endpoint
                if alternative and any(name.lower() == _RETRY_AFTER for name, _ in headers):
                    headers.append((_ALTERNATIVE, alternative.encode()))
                message = {**message, "headers": headers}
            await send(message)

        await self._app(scope, receive, guided)
