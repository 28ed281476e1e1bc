"""A GPU host's admin surface without models: the real guard and `gpu_host.admin`, mounted as
`gpu_host.app` mounts them (the token check first, then the usage record)."""

from __future__ import annotations

from typing import Any

from quart import jsonify, request
from quart_trio import QuartTrio

from gpu_host.admin import HostTokens, admin_blueprint
from gpu_host.auth import TokenGuard
from shared.contract import HEADER_TOKEN


def host_app(guard: TokenGuard, tokens: HostTokens) -> QuartTrio:
    app = QuartTrio(__name__)

    @app.before_request
    async def require_token() -> Any:
        presented = request.headers.get(HEADER_TOKEN)
        if not guard.is_accepted(presented):
            return jsonify(status="unauthorized"), 401
        tokens.authenticated(presented)  # type: ignore[arg-type]
        return None

    app.register_blueprint(admin_blueprint(tokens))
    return app
