"""The app factory: the ASGI application Hypercorn serves for one `Gateway`."""

from __future__ import annotations

from edge.gateway import Gateway, router_limits
from edge.web.http import Router
from edge.web.routes import not_found, routes


def create_app(gateway: Gateway) -> Router:
    return Router(
        routes(gateway),
        not_found,
        gateway.request_log.record,
        router_limits(gateway.settings),
        token=lambda: gateway.settings.auth.shared_password,
    )
