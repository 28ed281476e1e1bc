"""The GPU host's Quart app (app factory): auth, `/health`, `/metrics`, admin, the business endpoints.

Handlers reach the model process, the token guard, ComfyUI and the metrics through the
factory's arguments, never module globals. The app does not start the model supervisor:
the host's one nursery (`gpu_host.main.serve`) does, beside Hypercorn, so the port opens
at once and `/health` says `loading` meanwhile.

A business request runs: its deadline (`X-Request-Timeout-Ms` minus
`DEADLINE_MARGIN_SECONDS`; under `MIN_REQUEST_TIMEOUT_MS` given: 1007 at once) -> read the
body -> `shared.contract.uploads.read_request` (1001 -> 1003 -> 1002, the gateway's own checks
again) -> the model process, without waiting: a host already running a job answers 503
busy at once -> for grow and mark with ComfyUI configured, ComfyUI draws the grown images
from the child's inpainting masks. The model call and the ComfyUI wait end by the deadline.

A request whose connection closes (the gateway's client left) is cancelled by quart-trio:
a ComfyUI prompt is interrupted and dropped (`gpu_host.comfyui`), an inference finishes in
the model process with its answer dropped (`gpu_host.model_process`), one line is logged.
`/health` reads the deep checks' last results (`gpu_host.checks`), never measures.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from functools import partial
from typing import Any

import trio
from quart import Blueprint, Request, Response, jsonify, request
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException, MethodNotAllowed, RequestEntityTooLarge

from gpu_host import admin
from gpu_host.auth import TokenGuard
from gpu_host.checks import HostChecks, no_checks
from gpu_host.comfyui import ComfyUIClient, draw_grown, grown_targets
from gpu_host.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from gpu_host.metrics import GENERATION_FAILED, GENERATION_NO_HAIR, HostMetrics
from gpu_host.model_process import ModelBusy, ModelProcess, ModelUnavailable
from gpu_host.supervisor import Phase
from gpu_host.wanted import HostWanted
from shared.contract import (
    API_PREFIX,
    BUSY_KEY,
    HEADER_ERROR_TYPE,
    HEADER_EXECUTION_ID,
    HEADER_HOST_WANTED,
    HEADER_MODEL_VERSION,
    HEADER_REQUEST_ID,
    HEADER_REQUEST_TIMEOUT_MS,
    HEADER_TOKEN,
    HEALTH_LOADING,
    MODEL_VERSION_KEY,
    MSG_BACKEND_UNAVAILABLE,
    MSG_BODY_TOO_LARGE,
    MSG_DEADLINE_EXCEEDED,
    MSG_DEADLINE_TOO_SHORT,
    MSG_METHOD_NOT_ALLOWED,
    MSG_MODEL_LOAD_FAILED,
    MSG_UNKNOWN_ENDPOINT,
    WANTED_KEY,
    Code,
    ContractError,
    ErrorType,
    answer_error_type,
    busy_envelope,
    envelope,
    failure,
    request_id_from_header,
    success,
)
from shared.contract.endpoints import ENDPOINTS, AnsweredBy, answered_by
from shared.contract.hop import INPAINT_MASK_KEY, INPAINT_MASK_OPTION
from shared.contract.uploads import max_body_bytes, read_request
from shared.settings import AnalysisSettings

log = logging.getLogger("gpu_host.app")

METRICS_PATH = "/metrics"
_BEARER = "bearer "
# X-Request-Timeout-Ms: the host's work ends this much before the gateway stops waiting (the
# answer still has to be encoded and sent); less than MIN_REQUEST_TIMEOUT_MS given: refused.
DEADLINE_MARGIN_SECONDS = 0.5
MIN_REQUEST_TIMEOUT_MS = 1000


@dataclass(frozen=True)
class _Host:
    """What the business handlers need, in one argument."""

    model: ModelProcess
    limits: AnalysisSettings
    metrics: HostMetrics
    comfyui: ComfyUIClient | None
    checks: HostChecks
    wanted: HostWanted
    model_version: str  # what this host's answers come from (`gpu_host.version`)


def create_app(
    model: ModelProcess,
    guard: TokenGuard,
    limits: AnalysisSettings,
    *,
    model_version: str,
    comfyui: ComfyUIClient | None = None,
    tokens: admin.HostTokens | None = None,
    checks: HostChecks | None = None,
) -> QuartTrio:
    """The app; `model.run` must be running in a nursery of the caller's while it serves.
    `comfyui`: draw grown images there (else the model process's built-in preview does);
    `tokens`: mount `/admin/tokens` and record each token's last use; `checks`: the deep
    checks `/health` reports (their tasks run in the caller's nursery; None: none fail);
    `model_version`: reported in `/health` and on every `/api/` answer (`gpu_host.version`)."""
    app = QuartTrio(__name__)
    app.config["MAX_CONTENT_LENGTH"] = max_body_bytes(limits.max_image_bytes)
    app.json.ensure_ascii = False  # type: ignore[attr-defined]
    app.json.sort_keys = False  # type: ignore[attr-defined]
    checks = checks or no_checks()
    host = _Host(model, limits, HostMetrics(model.statistics, checks), comfyui, checks, HostWanted(), model_version)

    @app.before_request
    async def require_token() -> Any:
        # Runs before routing: an unknown path without a token is 401 too.
        presented = _presented_token(request)
        if not guard.is_accepted(presented):
            return jsonify(status="unauthorized"), 401
        if tokens is not None:
            tokens.authenticated(presented)  # type: ignore[arg-type]
        return None

    app.register_blueprint(_status_blueprint(host))
    app.register_blueprint(_api_blueprint(host))
    if tokens is not None:
        app.register_blueprint(admin.admin_blueprint(tokens))

    @app.after_request
    async def name_the_model(response: Response) -> Response:
        # every /api/ answer, the error handlers' and a busy refusal included: the gateway
        # takes the version of the answer it passes on from here, never from a probe
        if request.path.startswith(API_PREFIX):
            response.headers[HEADER_MODEL_VERSION] = model_version
        return response

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


def _status_blueprint(host: _Host) -> Blueprint:
    """`GET /health` (the gateway's probe) and `GET /metrics` (Prometheus)."""
    status = Blueprint("status", __name__)

    @status.get("/health")
    async def health() -> Any:
        return _health_response(host, asked=request.headers.get(HEADER_HOST_WANTED) == "1")

    @status.get(METRICS_PATH)
    async def metrics() -> Any:
        return Response(host.metrics.exposition(), content_type=METRICS_CONTENT_TYPE)

    return status


def _api_blueprint(host: _Host) -> Blueprint:
    """A `POST` route per endpoint the registry gives a GPU host (`shared.contract.endpoints`)."""
    api = Blueprint("api", __name__)
    for endpoint in answered_by(AnsweredBy.GPU_HOST):
        view = partial(_business, endpoint.name, host)
        api.add_url_rule(endpoint.path, endpoint=endpoint.name, view_func=view, methods=["POST"])
    return api


def _presented_token(incoming: Request) -> str | None:
    """`X-Internal-Token`; on `/metrics` also `Authorization: Bearer` (what Prometheus sends)."""
    token = incoming.headers.get(HEADER_TOKEN)
    if token is None and incoming.path == METRICS_PATH:
        authorization = incoming.headers.get("Authorization", "")
        if authorization[: len(_BEARER)].lower() == _BEARER:
            token = authorization[len(_BEARER) :].strip()
    return token


def _http_error_as_contract(error: HTTPException, failed: Request) -> tuple[Code, str | None]:
    if error.code == 413:
        return Code.TOO_LARGE, MSG_BODY_TOO_LARGE.format(limit_bytes=failed.max_content_length)
    if isinstance(error, MethodNotAllowed):
        allowed = ", ".join(sorted(error.valid_methods or ()))
        return Code.INVALID_PARAMETER, MSG_METHOD_NOT_ALLOWED.format(
            path=failed.path, method=failed.method, allowed=allowed
        )
    if error.code == 404:
        return Code.INVALID_PARAMETER, MSG_UNKNOWN_ENDPOINT.format(method=failed.method, path=failed.path)
    if error.code is not None and error.code >= 500:  # an exception outside the handlers (logged by Quart)
        return Code.SYSTEM_ERROR, None
    return Code.INVALID_PARAMETER, None


def _health_response(host: _Host, *, asked: bool) -> Any:
    """200 only when the model is ready and no deep check takes the host out (gpu_host.md § /health).
    `asked`: the probe says its gateway waits for this host (`wanted`). The model version is
    in every answer, loading too: it is known from the start, and a gateway shows it meanwhile."""
    model, checks, wanted = host.model, host.checks, host.wanted
    stats, now = model.statistics(), trio.current_time()
    if asked:
        wanted.heard(now, busy=stats.busy)
    common = {
        "inference_timeout_seconds": model.inference_timeout_seconds,
        MODEL_VERSION_KEY: host.model_version,
        **checks.health_fields(),
    }
    disk_problem = checks.disk_message()
    if stats.state is Phase.READY and disk_problem is None:
        body = {
            "status": "ok",
            "device": stats.device,
            "segmenter": stats.segmenter,
            BUSY_KEY: stats.busy,
            WANTED_KEY: wanted.wanted(now, busy=stats.busy),
            **common,
        }
        return jsonify(body), 200
    if disk_problem is not None and stats.state is not Phase.FAILED:
        body = {"status": "error", "message": disk_problem}  # the model serves or loads: the disk is what to fix
    else:
        body = {"status": "error" if stats.state is Phase.FAILED else HEALTH_LOADING}
        if stats.message:
            body["message"] = stats.message
    return jsonify({**body, **common}), 503


async def _business(endpoint: str, host: _Host) -> Any:
    """One business request -> one envelope; HTTP 503 only when the model could not take it."""
    request_id = _request_id()
    started = trio.current_time()
    try:
        return await _answer(endpoint, host, request_id, started)
    except BaseException:  # nothing but a cancellation gets here: the connection closed, or the host stops
        log.info(
            "request departed: connection closed before the answer | request_id=%s endpoint=%s ms=%.0f",
            request_id,
            endpoint,
            (trio.current_time() - started) * 1000,
        )
        raise


async def _answer(endpoint: str, host: _Host, request_id: str, started: float) -> Response:
    status = 200
    try:
        body = success(request_id, await _run(endpoint, host, request_id, _deadline(started)))
    except ContractError as error:
        body = failure(_named(error), request_id)
    except ModelBusy:
        # Another gateway's job runs here; this gateway sends the request elsewhere.
        body, status = busy_envelope(request_id), 503
    except ModelUnavailable as error:
        # Not an answer about the photo: 503 lets the gateway retry on another host.
        log.warning("request refused, model not ready | request_id=%s reason=%s", request_id, error)
        message = MSG_MODEL_LOAD_FAILED if error.error_type is ErrorType.MODEL_LOAD_FAILED else MSG_BACKEND_UNAVAILABLE
        body, status = failure(ContractError(Code.SYSTEM_ERROR, message, error.error_type), request_id), 503
    except Exception:
        log.exception("internal error | request_id=%s endpoint=%s", request_id, endpoint)
        body = failure(ContractError(Code.SYSTEM_ERROR, error_type=ErrorType.INTERNAL), request_id)
    body, payload = await _encoded(body, endpoint)
    kind = answer_error_type(body)
    log.info(
        "request | request_id=%s execution_id=%s endpoint=%s status=%d code=%d ms=%.0f bytes_out=%d error_type=%s",
        request_id,
        _execution_id(),
        endpoint,
        status,
        body["code"],
        (trio.current_time() - started) * 1000,
        len(payload),
        kind or "-",
    )
    response = Response(payload, status=status, content_type="application/json")
    if kind is not None:
        response.headers[HEADER_ERROR_TYPE] = kind.value
    return _with_request_id(response, request_id)


def _named(error: ContractError) -> ContractError:
    """`error` with a kind: a 1007 that names none is `internal` (gateway.md § Failure kinds)."""
    if error.code is Code.SYSTEM_ERROR and error.error_type is None:
        return ContractError(error.code, error.message, ErrorType.INTERNAL)
    return error


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
        replacement = failure(ContractError(Code.SYSTEM_ERROR, error_type=ErrorType.INTERNAL), body["request_id"])
        return replacement, _encode_json(replacement)


def _encode_json(body: dict) -> bytes:
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()


# 12 digits of milliseconds are 31 years: a longer value sets no deadline of its own.
MAX_REQUEST_TIMEOUT_DIGITS = 12


def _deadline(arrived: float) -> float:
    """When this request's work must end (trio clock): `X-Request-Timeout-Ms` after `arrived`,
    less the margin; inf without the header (or with a value that is no whole number of ms:
    the host's own timeouts apply). Too little time given: a 1007 without running anything."""
    given = request.headers.get(HEADER_REQUEST_TIMEOUT_MS, "").strip()
    if not (given.isascii() and given.isdigit()):  # "²²²²" is a digit to str.isdigit, not to int()
        return math.inf
    if len(given) > MAX_REQUEST_TIMEOUT_DIGITS:  # longer than any deadline: int / 1000 overflows
        return math.inf
    if int(given) < MIN_REQUEST_TIMEOUT_MS:
        raise ContractError(Code.SYSTEM_ERROR, MSG_DEADLINE_TOO_SHORT.format(ms=int(given)), ErrorType.TIMEOUT)
    return arrived + int(given) / 1000 - DEADLINE_MARGIN_SECONDS


def _seconds_left(deadline: float) -> float:
    """Time left before `deadline`; a 1007 when none is (nothing more is started)."""
    left = deadline - trio.current_time()
    if left <= 0:
        raise ContractError(Code.SYSTEM_ERROR, MSG_DEADLINE_EXCEEDED.format(seconds=0), ErrorType.TIMEOUT)
    return left


async def _run(endpoint: str, host: _Host, request_id: str, deadline: float) -> dict:
    """Validate (1001 -> 1003 -> 1002), run the child, and draw with ComfyUI where configured,
    all by `deadline`."""
    try:
        body = await request.get_data(cache=True, as_text=False, parse_form_data=False)
    except RequestEntityTooLarge:
        raise ContractError(Code.TOO_LARGE, MSG_BODY_TOO_LARGE.format(limit_bytes=request.max_content_length)) from None
    # In a thread: megabytes of base64 take ~10 ms to decode, and /health must keep answering.
    checked = await trio.to_thread.run_sync(
        read_request, endpoint, body, request.headers.get("Content-Type"), host.limits
    )
    # A thread is waited for through a cancellation: a gateway that left during the check
    # is seen here, before the model's slot is taken for nobody.
    await trio.lowlevel.checkpoint()
    generates = ENDPOINTS[endpoint].slow  # the slow endpoints are those that grow hair
    options = checked.options
    if generates and host.comfyui is not None:
        options = {**options, INPAINT_MASK_OPTION: True}  # masks for ComfyUI instead of previews
    data = await _infer(host, request_id, endpoint, checked.image, options, _seconds_left(deadline))
    if not generates:
        return data
    masked = [bool(target.get(INPAINT_MASK_KEY)) for target in grown_targets(data)]
    if host.comfyui is not None:
        left = deadline - trio.current_time()  # none left: the ComfyUI wait ends at once (generator null)
        data = await draw_grown(
            host.comfyui, checked.image, data, timeout_seconds=None if math.isinf(left) else max(left, 0)
        )
    for target, had_mask in zip(grown_targets(data), masked, strict=True):
        host.metrics.count_generation(target["generator"] or (GENERATION_FAILED if had_mask else GENERATION_NO_HAIR))
    return data


async def _infer(
    host: _Host, request_id: str, endpoint: str, image: bytes, options: dict[str, Any], wait_seconds: float
) -> dict:
    """`model.infer`, timed for `/metrics` when the child ran it (busy or unavailable: it did not)."""
    started = trio.current_time()
    try:
        data = await host.model.infer(request_id, endpoint, image, options, wait_seconds=wait_seconds)
    except ContractError:  # the child's answer, or its timeout or death
        host.metrics.observe_inference(endpoint, trio.current_time() - started)
        raise
    host.metrics.observe_inference(endpoint, trio.current_time() - started)
    return data


def _execution_id() -> str:
    """The gateway's execution id of this request (its audit row), for the log line."""
    return request.headers.get(HEADER_EXECUTION_ID, "-")[:64]


def _request_id() -> str:
    return request_id_from_header(request.headers.get(HEADER_REQUEST_ID))


def _with_request_id(response: Response, request_id: str) -> Response:
    response.headers[HEADER_REQUEST_ID] = request_id
    return response
