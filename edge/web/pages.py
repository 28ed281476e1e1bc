"""The `pages` blueprint: status pages, the alert drill switch, annotation files.

| path                            | methods   | token | what                           |
|---------------------------------|-----------|-------|--------------------------------|
| /health, /gateway-health        | GET, HEAD | no    | liveness, pool counts          |
| /monitor                        | GET, HEAD | no    | external alerting (seed 001)   |
| /monitor/fault                  | POST      | yes   | the alert drill switch (64 KiB body) |
| /static/annotations/<uuid>.png  | GET, HEAD | no    | annotation PNGs, streamed      |

Pages read memory only (never a worker) and are not in the request log.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from quart import Blueprint, request
from quart import Response as QuartResponse

from edge.annotations.static_files import AnnotationBody, check_annotation
from edge.web import monitor
from edge.web.http import current_gateway_request, json_page
from edge.web.refusals import requires_token

if TYPE_CHECKING:
    from edge.gateway import Gateway

FAULT_BODY_LIMIT_BYTES = 64 * 1024
# Annotation names are random and the files never change; they are someone's face.
_PNG_HEADERS = {"Cache-Control": "private, max-age=86400", "X-Content-Type-Options": "nosniff"}


def pages_blueprint(gateway: Gateway) -> Blueprint:
    pages = Blueprint("pages", __name__)
    pool = gateway.pool
    static_dir = gateway.settings.edge.static_dir  # restart-only (edge.reload): read once, here

    @pages.get("/health")
    async def health() -> QuartResponse:
        return json_page(200, monitor.health())

    @pages.get("/gateway-health")
    async def gateway_health() -> QuartResponse:
        return json_page(200, monitor.gateway_health(pool.statistics()))

    @pages.get("/monitor")
    async def monitor_page() -> QuartResponse:
        return json_page(*monitor.monitor(pool.statistics()))

    @pages.post("/monitor/fault")
    @requires_token(gateway)
    async def monitor_fault() -> QuartResponse:
        request.max_content_length = FAULT_BODY_LIMIT_BYTES
        try:
            enabled = monitor.parse_fault_request(await current_gateway_request().read_body())
        except monitor.FaultRequestError:
            return json_page(400, monitor.error_answer(monitor.MSG_BAD_FAULT_BODY))
        if pool.set_drill(enabled):
            logging.getLogger("edge.monitor").warning(
                "模拟故障%s | 来源=%s", "已开启" if enabled else "已关闭", request.remote_addr
            )
        return json_page(200, monitor.fault_answer(enabled))

    @pages.get("/static/<path:subpath>")
    async def static(subpath: str) -> QuartResponse:
        # streamed in pieces; the cap and the stall bound: `edge.annotations.downloads`
        checked = await check_annotation(static_dir, subpath, gateway.file_threads)
        if checked is None:
            return QuartResponse(b"not found", status=404, content_type="text/plain")
        # Quart hands a HEAD's body over too (the server drops it): a HEAD reads no file
        body = b"" if request.method == "HEAD" else AnnotationBody(checked)
        response = QuartResponse(body, status=200, content_type="image/png", headers=_PNG_HEADERS)
        response.content_length = checked.size
        return response

    return pages
