"""The wire contract of the public API and of the gateway <-> GPU host hop.

Every code, message, header name and envelope shape lives here once; the gateway, the GPU
host and the analysis import it and define none of their own (contract.md).
"""

from __future__ import annotations

import re
import uuid
from enum import IntEnum, StrEnum
from typing import Any


class Code(IntEnum):
    """The only codes a client can see (contract.md § Envelope)."""

    OK = 0
    INVALID_PARAMETER = 1001
    UNSUPPORTED_IMAGE = 1002
    TOO_LARGE = 1003
    BAD_RESOLUTION = 1004
    NO_FACE = 1005
    MULTIPLE_FACES = 1006
    SYSTEM_ERROR = 1007
    NOT_FRONTAL = 1008


# Default message per code; producers pass a more specific one where they can.
DEFAULT_MESSAGES: dict[Code, str] = {
    Code.OK: "成功",
    Code.INVALID_PARAMETER: "参数缺失或无效",
    Code.UNSUPPORTED_IMAGE: "图片格式不支持或文件已损坏（支持 JPEG、PNG、WebP）",
    Code.TOO_LARGE: "图片或请求体过大",
    Code.BAD_RESOLUTION: "图片分辨率不在允许范围内",
    Code.NO_FACE: "未检测到人脸",
    Code.MULTIPLE_FACES: "检测到多张人脸，请上传单人正脸照片",
    Code.SYSTEM_ERROR: "系统错误，请稍后重试",
    Code.NOT_FRONTAL: "人脸角度过大，请上传正脸照片",
}


class ErrorType(StrEnum):
    """What went wrong on a GPU host (gateway.md § Failure kinds): named in a 1007's
    `data.error_type` and in `HEADER_ERROR_TYPE`; the gateway acts on it (`edge.pool.failures`)."""

    CUDA_OOM = "cuda_oom"  # the GPU's memory ran out: it frees up by itself, given time
    CUDA_ERROR = "cuda_error"  # context, driver, device-side assert, illegal address: the GPU is suspect
    MODEL_NOT_LOADED = "model_not_loaded"  # the model child is (re)loading
    MODEL_LOAD_FAILED = "model_load_failed"  # the model child could not load: a person must look
    TIMEOUT = "timeout"  # the deadline the host was given (or its own) ran out
    INPUT_REJECTED = "input_rejected"  # the photo itself (its own refusal code, never 1007)
    INTERNAL = "internal"  # anything else (a bug)


class RetryAdvice(StrEnum):
    """`HEADER_RETRY_POLICY`: how a client should space its retries of an answer."""

    EXPONENTIAL_BACKOFF = "exponential_backoff"  # Retry-After, then double the wait each time
    FIXED = "fixed"  # Retry-After, the same each time
    NONE = "none"  # do not retry this request as it is


ERROR_TYPE_KEY = "error_type"  # a host's 1007 `data`: {"error_type": "<ErrorType>"}

# Infrastructure failures reuse 1007 with these exact messages (contract.md).
MSG_BACKEND_UNAVAILABLE = "后端服务暂不可用，请稍后重试"
MSG_BACKEND_BUSY = "后端服务繁忙，请稍后重试"
# A GPU host's model child timed out or died mid-request (1007); it is being replaced.
MSG_INFERENCE_TIMED_OUT = "推理超时（超过 {seconds:g} 秒），模型进程已重启，请稍后重试"
MSG_MODEL_PROCESS_DIED = "模型进程异常退出，正在重启，请稍后重试"
# A GPU host's deadline (X-Request-Timeout-Ms, gpu_host.md § Deadlines and departures), 1007:
# too little time left to start, or the time ran out (the model child is not restarted for it).
MSG_DEADLINE_TOO_SHORT = "剩余处理时限不足（{ms} 毫秒），未开始处理，请稍后重试"
MSG_DEADLINE_EXCEEDED = "处理超出请求时限（{seconds:g} 秒），请稍后重试"
# A GPU host's model child hit a CUDA failure (1007, `cuda_oom` / `cuda_error`), or is not loaded.
MSG_CUDA_OOM = "GPU 显存不足，请稍后重试"
MSG_CUDA_ERROR = "GPU 运行异常，请稍后重试"
MSG_MODEL_LOAD_FAILED = "模型加载失败，需运维处理，请稍后重试"
# A GPU host's /health while a filesystem it writes to is below gpu_host.min_free_disk_mb.
MSG_DISK_LOW = "磁盘空间不足：剩余 {free_mb} MB，至少需要 {needed_mb} MB"
# A body over the service's limit (1003), from the gateway or a GPU host.
MSG_BODY_TOO_LARGE = "请求体过大：上限 {limit_bytes} 字节"
# An image over analysis.max_image_bytes (1003), whichever check (upload or decode) sees it.
MSG_IMAGE_TOO_LARGE = "图片过大：{size_mb:.1f} MB，最多允许 {limit_mb:.1f} MB，请压缩后上传"
# The pictures one answer would draw exceed analysis.max_answer_megapixels (1004): refused
# before any is drawn, saying how many at which size and what to change.
MSG_ANSWER_TOO_LARGE = (
    "本次请求需生成 {count} 张 {width}×{height} 的图片（共 {megapixels:.1f} 百万像素），"
    "超过上限 {limit:g} 百万像素：请缩小照片，或减少 plans / styles 后重试"
)
# Not a JPEG, PNG or WebP by its magic bytes or its header (1002): gateway, host and child alike.
MSG_UNSUPPORTED_IMAGE_FORMAT = "图片格式不支持：请上传 JPEG、PNG 或 WebP 格式的图片"
# A GPU host already running a job answers any other business request at once with HTTP
# 503 and this 1007 plus `"busy": true` (gateway.md § Several gateways): it never queues.
# Only gateways read it; they send the request elsewhere and never show it to a client.
MSG_HOST_BUSY = "GPU 主机正在处理另一个请求（主机不排队），请改投其他主机"
BUSY_KEY = "busy"
# A GPU host's `/health` (gpu_host.md § Health), read by every gateway's prober: a host still
# loading its models answers 503 with this status; `checks` maps each deep check to its state.
HEALTH_LOADING = "loading"
HEALTH_CHECKS_KEY = "checks"
# Several gateways without shared state (gateway.md § Several gateways): a gateway whose
# request has waited long for a host another one keeps busy says so on its probe
# (`HEADER_HOST_WANTED: 1`); while a job runs, the host's `/health` then says
# `"wanted": true` for `HOST_WANTED_SECONDS`, and the gateway whose job it is lets the host
# go when that job ends. Only the host sees who asks for it.
HEADER_HOST_WANTED = "X-Host-Wanted"
WANTED_KEY = "wanted"
HOST_WANTED_SECONDS = 1.5
CHECK_DISK, CHECK_COMFYUI = "disk", "comfyui"
CHECK_OK, CHECK_LOW, CHECK_DOWN, CHECK_OFF = "ok", "low", "down", "off"
# Gateway answers for /api/ requests it cannot route.
MSG_UNKNOWN_ENDPOINT = "接口不存在：{method} {path}"
MSG_METHOD_NOT_ALLOWED = "接口 {path} 不接受 {method} 请求，只接受 {allowed}"
MSG_WEBSOCKET_NOT_SERVED = "接口不支持 WebSocket：请用 HTTP/1.1 请求调用"  # 1001, both services
# Requests that are not well-formed HTTP/1.1, answered by the server before any app (1001,
# both services; shared.http_server): each says what was malformed.
MSG_HTTP_MALFORMED = "请求不是合法的 HTTP/1.1：{detail}"
MSG_HTTP_CONFLICTING_LENGTHS = "请求格式错误：Content-Length 出现多次且取值不同，只能给一个"
MSG_HTTP_BAD_LENGTH = "请求格式错误：Content-Length 须是一个非负整数"
MSG_HTTP_LENGTH_AND_CHUNKED = "请求格式错误：Content-Length 与 Transfer-Encoding 不能同时出现，只用其一"
MSG_HTTP_TRANSFER_ENCODING = "请求格式错误：Transfer-Encoding 只支持 chunked（只能出现一次）"
MSG_HTTP_NO_HOST = "请求格式错误：缺少 Host 请求头"
MSG_HTTP_TWO_HOSTS = "请求格式错误：Host 请求头只能有一个"
MSG_HTTP_BAD_CHUNK = "请求格式错误：chunked 请求体的分块无效（每块以十六进制长度加 CRLF 开头，以 CRLF 结尾）"
MSG_HTTP_UNDECLARED_BODY = (
    "请求格式错误：请求体没有声明长度（HTTP/1.0 或 Connection: close 的请求带请求体时须有 Content-Length）"
)
MSG_HTTP_REQUEST_LINE = "请求格式错误：请求行须为「方法 路径 HTTP/1.1」"
# Requests the gateway refuses before reading or forwarding them (1001).
MSG_HEADERS_TOO_LARGE = "请求头过大：上限 {limit_bytes} 字节（含查询字符串）"
MSG_BODY_TOO_SLOW = "请求体接收超时：{seconds:g} 秒内未收完，请检查网络后重试"
# A GPU host refused the request itself (a 4xx other than 401): about the request, not the host.
MSG_REFUSED_BY_HOST = "后端拒绝了该请求（HTTP {status}），请检查请求头与参数"
# Admission at the gateway (gateway.md § Rate limiting, § Idempotency).
MSG_RATE_LIMITED = "请求过于频繁，请稍后重试"  # 1007, with Retry-After
MSG_IDEMPOTENCY_KEY_REUSED = "Idempotency-Key 已用于不同的请求"  # 1001
MSG_IDEMPOTENCY_KEY_INVALID = "Idempotency-Key 无效：须为 1–128 个可打印 ASCII 字符"  # 1001
# 1001 from mark: `drop_mm` needs a hairline to lower (no_hairline, occluded: the client draws one)
MSG_NO_HAIRLINE_TO_LOWER = (
    "未检测到可下移的发际线（状态：{status}），无法使用 drop_mm；请改用 hairline_points 标记发际线"
)

# Endpoint 4 (the gateway's vision LLM), 1007 with Retry-After.
MSG_FEATURES_NOT_CONFIGURED = "面部特征分析未配置"
MSG_FEATURES_UNAVAILABLE = "面部特征分析暂不可用，请稍后重试"

HEADER_TOKEN = "X-Internal-Token"
HEADER_REQUEST_ID = "X-Request-ID"
HEADER_FORWARDED_FOR = "X-Forwarded-For"
HEADER_RETRY_AFTER = "Retry-After"
HEADER_IDEMPOTENCY_KEY = "Idempotency-Key"
HEADER_IDEMPOTENCY_REPLAYED = "Idempotency-Replayed"
# Every /api/ answer's execution id (audit.md), also sent to the GPU host with each forward.
HEADER_EXECUTION_ID = "X-Execution-ID"
# The time the gateway gives a forwarded attempt, in ms: the host caps its own work by it.
HEADER_REQUEST_TIMEOUT_MS = "X-Request-Timeout-Ms"
# Retry guidance (gateway.md § Failure kinds): a host's answer names its failure's kind
# (`ErrorType`), passed on to the client; a 1007 says how to retry (`RetryAdvice`); every
# /api/ answer says how loaded the pool is (busy online hosts / online hosts, "0.00"-"1.00");
# a 1007 may name another entrance (`edge.failures.alternative_endpoint`).
HEADER_ERROR_TYPE = "X-Error-Type"
HEADER_RETRY_POLICY = "X-Retry-Policy"
HEADER_CURRENT_LOAD = "X-Current-Load"
HEADER_ALTERNATIVE_ENDPOINT = "X-Alternative-Endpoint"
# The model version (seed 002 §6.2): what produced an answer, "<package version>+<12 hex>"
# (`shared.model_version`). A GPU host reports its own in `/health` (`MODEL_VERSION_KEY`) and
# on every `/api/` answer; the gateway passes it on (its own for the endpoints it answers
# itself), stores it with the audit row and with a stored idempotent answer. A value that is
# not 1-64 of [A-Za-z0-9._+-] is treated as none (it becomes a header, a label, a column).
HEADER_MODEL_VERSION = "X-Model-Version"
MODEL_VERSION_KEY = "model_version"

API_PREFIX = "/api/"
BASE64_SUFFIX = "_base64"
URL_SUFFIX = "_url"

# Who drew a `grown_image_*` (contract.md endpoints 2 and 3); None when nobody did.
GENERATOR_COMFYUI = "comfyui"
GENERATOR_PREVIEW = "preview"

_REQUEST_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")
_MODEL_VERSION = re.compile(r"[A-Za-z0-9._+-]{1,64}")


class ContractError(Exception):
    """A failure the client is told about as an envelope: a code and an actionable message,
    and the kind of failure when it is known (`error_type`, gateway.md § Failure kinds)."""

    def __init__(self, code: Code, message: str | None = None, error_type: ErrorType | None = None) -> None:
        self.code = Code(code)
        self.message = message or DEFAULT_MESSAGES[self.code]
        self.error_type = error_type
        super().__init__(f"{int(self.code)}: {self.message}")


def is_valid_request_id(value: str | None) -> bool:
    return value is not None and _REQUEST_ID.fullmatch(value) is not None


def model_version_or_none(value: object) -> str | None:
    """`value` when it is a model version a gateway can pass on, store and label with; else None."""
    return value if isinstance(value, str) and _MODEL_VERSION.fullmatch(value) is not None else None


def new_request_id() -> str:
    return uuid.uuid4().hex


def request_id_from_header(value: str | None) -> str:
    """The client's id when it is well-formed, else a fresh one."""
    return value if is_valid_request_id(value) else new_request_id()  # type: ignore[return-value]


def envelope(code: Code, request_id: str, data: Any = None, message: str | None = None) -> dict:
    """The one response shape of every /api/ endpoint; `data` is null unless code is 0."""
    code = Code(code)
    return {
        "code": int(code),
        "message": message or DEFAULT_MESSAGES[code],
        "request_id": request_id,
        "data": data if code is Code.OK else None,
    }


def success(request_id: str, data: Any) -> dict:
    return envelope(Code.OK, request_id, data)


def failure(error: ContractError, request_id: str) -> dict:
    """`error`'s envelope; a 1007 of a known kind says it in `data` (`{"error_type": …}`)."""
    body = envelope(error.code, request_id, None, error.message)
    if error.code is Code.SYSTEM_ERROR and error.error_type is not None:
        body["data"] = {ERROR_TYPE_KEY: error.error_type.value}
    return body


def answer_error_type(body: dict) -> ErrorType | None:
    """The kind an answer names (its `X-Error-Type`, host and gateway alike): a 1007's own;
    any other refusal is about the photo (`input_rejected`); a success or a host's busy
    answer names none."""
    code = body.get("code")
    if code == Code.OK or body.get(BUSY_KEY) is True:
        return None
    if code != Code.SYSTEM_ERROR:
        return ErrorType.INPUT_REJECTED
    return error_type_of(body)


def error_type_of(body: dict) -> ErrorType | None:
    """The kind a 1007 envelope names in its `data`; None for any other answer (or a kind
    this gateway does not know: it is treated as before kinds existed)."""
    data = body.get("data")
    if body.get("code") != Code.SYSTEM_ERROR or not isinstance(data, dict):
        return None
    name = data.get(ERROR_TYPE_KEY)
    return ErrorType(name) if isinstance(name, str) and name in ErrorType._value2member_map_ else None


def busy_envelope(request_id: str) -> dict:
    """A GPU host's answer (HTTP 503) to a job arriving while another runs: "busy elsewhere"."""
    return {**envelope(Code.SYSTEM_ERROR, request_id, message=MSG_HOST_BUSY), BUSY_KEY: True}


def is_envelope(body: Any) -> bool:
    """True for a JSON object shaped like an envelope with a known code."""
    if not isinstance(body, dict) or set(body) != {"code", "message", "request_id", "data"}:
        return False
    code = body["code"]
    return isinstance(code, int) and not isinstance(code, bool) and code in Code._value2member_map_


def url_key_for(key: str) -> str | None:
    """`annotated_image_base64` -> `annotated_image_url`; None for keys that carry no image."""
    if key.endswith(BASE64_SUFFIX) and len(key) > len(BASE64_SUFFIX):
        return key[: -len(BASE64_SUFFIX)] + URL_SUFFIX
    return None


# Public path -> endpoint name, for the endpoints a GPU host serves (contract.md § Endpoints).
GPU_ENDPOINT_PATHS: dict[str, str] = {
    "/api/v1/hair/measure": "measure",
    "/api/v1/hair/grow": "grow",
    "/api/v1/hair/mark": "mark",
    "/api/v1/hair/hairline": "hairline",
    "/api/v1/hair/mask": "mask",
}
# A hairline note (measure, `hairline` status `uncertain`): the photo's top edge cuts the
# head, so what lies above the frame (hair or scalp) cannot be judged (analysis.md § Statuses and claims).
NOTE_TOP_OF_HEAD_CUT = "照片上边缘截去了头顶，看不到完整的发际线，位置不确定：请拍摄完整的头部"
