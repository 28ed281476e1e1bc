"""The app factory: the gateway's one Quart app (quart-trio) for one `Gateway`.

Where to add a route: in the blueprint of its kind — `edge.web.api_routes` (business
endpoints under `/api/`), `edge.web.pages` (status pages, the drill, annotation files),
`edge.web.admin` (token-protected admin). What every request goes through before and
instead of a view (header block, rate limit, token, body limit and timeouts, the
envelope of every refusal under `/api/`) is in `edge.web.refusals`; the request log is
ASGI middleware around the app (`edge.web.request_logging`).
"""

from __future__ import annotations

from quart_trio import QuartTrio

from edge.gateway import Gateway
from edge.web.admin import admin_blueprint
from edge.web.api_routes import api_blueprint
from edge.web.http import BODY_IDLE_TIMEOUT, GatewayRequest
from edge.web.openapi import openapi_blueprint
from edge.web.pages import pages_blueprint
from edge.web.refusals import register_refusals
from edge.web.request_logging import RequestLogging
from edge.web.retry_guidance import RetryGuidance
from shared.settings import Settings


def create_app(gateway: Gateway) -> QuartTrio:
    app = QuartTrio("edge", static_folder=None, template_folder=None)
    app.request_class = GatewayRequest  # a body limit a view can lower, an idle bound on the body
    # the request id of each request, the execution id, audit row and log line of each `/api/` one
    # … and, inside it, the cap on concurrent static downloads, held until each answer ends
    limited = gateway.static_downloads.limit(app.asgi_app)
    app.asgi_app = RequestLogging(limited, gateway.request_log.record, gateway.audit)  # type: ignore[method-assign]
    # X-Current-Load on every /api/ answer, X-Alternative-Endpoint on those that ask for a retry
    app.asgi_app = RetryGuidance(app.asgi_app, gateway)  # type: ignore[method-assign]
    app.config.update(
        PROVIDE_AUTOMATIC_OPTIONS=False,  # OPTIONS is a method like any other: 405 (an envelope under /api/)
        RESPONSE_TIMEOUT=None,  # a slow reader of a large answer is the client's business
    )
    configure_limits(app, gateway.settings)
    app.url_map.merge_slashes = False  # "/static/annotations//etc/passwd" is a 404, not a redirect
    register_refusals(app, gateway)
    app.register_blueprint(api_blueprint(gateway))
    app.register_blueprint(openapi_blueprint(app, gateway))  # documents the /api/ routes: after them
    app.register_blueprint(pages_blueprint(gateway))
    app.register_blueprint(admin_blueprint(gateway))
    return app


def configure_limits(app: QuartTrio, settings: Settings) -> None:
    """The body bounds from `edge` settings; a reload calls it again (requests that start
    from then on see the new values)."""
    edge = settings.edge
    app.config.update(
        MAX_CONTENT_LENGTH=edge.max_body_bytes,  # views with a smaller body lower it per request
        BODY_TIMEOUT=edge.body_timeout_seconds,
        **{BODY_IDLE_TIMEOUT: edge.body_idle_timeout_seconds},
    )
