"""The GPU host's Quart app (app factory): auth, `/health`, the business endpoints.

Handlers reach the model process and the token guard through the factory's arguments,
never module globals. The app does not start the model supervisor: the host's one nursery
(`gpu_host.main.serve`) does, beside Hypercorn, so the port opens at once and `/health`
says `loading` meanwhile.
"""

from __future__ import annotations

import json
import logging
from functools import partial
from typing import Any

import trio
from quart import Request, Response, jsonify, request
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from analysis.options import parse_options
from gpu_host.auth import TokenGuard
from gpu_host.model_process import ModelProcess, ModelUnavailable
from gpu_host.supervisor import Phase
from gpu_host.uploads import image_bytes, max_body_bytes, read_upload, require_image
from shared.contract import (
    API_PREFIX,
    GPU_ENDPOINT_PATHS,
    HEADER_REQUEST_ID,
    HEADER_TOKEN,
    MSG_BACKEND_UNAVAILABLE,
    MSG_BODY_TOO_LARGE,
    MSG_UNKNOWN_ENDPOINT,
    Code,
    ContractError,
    envelope,
    failure,
    request_id_from_header,
    success,
)
from shared.settings import AnalysisSettings

log = logging.getLogger("gpu_host.app")


def create_app(model: ModelProcess, guard: TokenGuard, limits: AnalysisSettings) -> QuartTrio:
    """The app; `model.run` must be running in a nursery of the caller's while it serves."""
    app = QuartTrio(__name__)
    app.config["MAX_CONTENT_LENGTH"] = max_body_bytes(limits.max_image_bytes)
    app.json.ensure_ascii = False  # type: ignore[attr-defined]
    app.json.sort_keys = False  # type: ignore[attr-defined]

    @app.before_request
    async def require_token() -> Any:
        # Runs before routing: an unknown path without a token is 401 too.
        if not guard.is_accepted(request.headers.get(HEADER_TOKEN)):
            return jsonify(status="unauthorized"), 401
        return None

    @app.get("/health")
    async def health() -> Any:
        return _health_response(model)

    for path, endpoint in GPU_ENDPOINT_PATHS.items():
        app.add_url_rule(
            path,
            endpoint=endpoint,
            view_func=partial(_business, endpoint, model, limits),
            methods=["POST"],
        )

    @app.errorhandler(HTTPException)
    async def http_error(error: HTTPException) -> Any:
        # Under /api/ every answer is an envelope, never a traceback. Answers about the request
        # (unknown path, wrong method, body too large) are HTTP 200 like any contract answer:
        # the gateway counts other statuses as a broken host. A failure outside the handlers
        # keeps its 5xx, so the gateway does try another host.
        if request.path.startswith(API_PREFIX):
            code, message = _http_error_as_contract(error, request)
            body = envelope(code, _request_id(), message=message)
            status = 200 if code is not Code.SYSTEM_ERROR else error.code
            return _with_request_id(jsonify(body), body["request_id"]), status
        return jsonify(status=error.name.lower().replace(" ", "_")), error.code

    return app


def _http_error_as_contract(error: HTTPException, failed: Request) -> tuple[Code, str | None]:
    if error.code == 413:
        return Code.TOO_LARGE, MSG_BODY_TOO_LARGE.format(limit_bytes=failed.max_content_length)
    if error.code in (404, 405):
        return Code.INVALID_PARAMETER, MSG_UNKNOWN_ENDPOINT.format(method=failed.method, path=failed.path)
    if error.code is not None and error.code >= 500:  # an exception outside the handlers (logged by Quart)
        return Code.SYSTEM_ERROR, None
    return Code.INVALID_PARAMETER, None


def _health_response(model: ModelProcess) -> Any:
    stats = model.statistics()
    if stats.state is Phase.READY:
        body = {"status": "ok", "device": stats.device, "segmenter": stats.segmenter, "busy": stats.busy}
        return jsonify(body), 200
    body = {"status": "error" if stats.state is Phase.FAILED else "loading"}
    if stats.message:
        body["message"] = stats.message
    return jsonify(body), 503


async def _business(endpoint: str, model: ModelProcess, limits: AnalysisSettings) -> Any:
    """One business request -> one envelope; HTTP 503 only when no model could take it."""
    request_id = _request_id()
    started = trio.current_time()
    status = 200
    try:
        body = success(request_id, await _run(endpoint, model, limits, request_id))
    except ContractError as error:
        body = failure(error, request_id)
    except ModelUnavailable as error:
        # Not an answer about the photo: 503 lets the gateway retry on another host.
        log.warning("request refused, model not ready | request_id=%s reason=%s", request_id, error)
        body, status = envelope(Code.SYSTEM_ERROR, request_id, message=MSG_BACKEND_UNAVAILABLE), 503
    except Exception:
        log.exception("internal error | request_id=%s endpoint=%s", request_id, endpoint)
        body = envelope(Code.SYSTEM_ERROR, request_id)
    body, payload = await _encoded(body, endpoint)
    log.info(
        "request | request_id=%s endpoint=%s code=%d ms=%.0f bytes_out=%d",
        request_id,
        endpoint,
        body["code"],
        (trio.current_time() - started) * 1000,
        len(payload),
    )
    response = Response(payload, status=status, content_type="application/json")
    return _with_request_id(response, request_id)


async def _encoded(body: dict, endpoint: str) -> tuple[dict, bytes]:
    """The body as JSON, or a 1007 in its place when it cannot be encoded (an analysis bug:
    an answer about this request, HTTP 200, so the gateway ejects no host for it)."""
    try:
        # In a thread: an answer with several full-size PNGs can be tens of MB of JSON, and
        # /health must keep answering meanwhile.
        return body, await trio.to_thread.run_sync(_encode_json, body)
    except Exception:
        log.exception(
            "internal error: answer not JSON-encodable | request_id=%s endpoint=%s", body["request_id"], endpoint
        )
        replacement = envelope(Code.SYSTEM_ERROR, body["request_id"])
        return replacement, _encode_json(replacement)


def _encode_json(body: dict) -> bytes:
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()


async def _run(endpoint: str, model: ModelProcess, limits: AnalysisSettings, request_id: str) -> dict:
    """Validate in the contract's order (1001 -> 1003), then the child does the rest."""
    upload = await read_upload(request)
    require_image(upload)
    options = parse_options(endpoint, upload.fields)
    image = await trio.to_thread.run_sync(image_bytes, upload, limits.max_image_bytes)  # base64: megabytes
    return await model.infer(request_id, endpoint, image, options)


def _request_id() -> str:
    return request_id_from_header(request.headers.get(HEADER_REQUEST_ID))


def _with_request_id(response: Response, request_id: str) -> Response:
    response.headers[HEADER_REQUEST_ID] = request_id
    return response
