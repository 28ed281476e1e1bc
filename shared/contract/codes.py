"""The codes a client can see, the kinds of failure a host names, and the contract's error.

`RefusalKind` is how the analysis says why it refuses a request (`analysis.errors`) without
knowing the envelope: the contract answers each kind with its code (`REFUSAL_CODES`).
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import IntEnum, StrEnum


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


class RefusalKind(StrEnum):
    """Why the analysis refuses a request (`analysis.errors.AnalysisError`): about the photo
    or its options, never the host. Each kind is answered with its code (`REFUSAL_CODES`)."""

    INVALID_OPTION = "invalid_option"  # an option the photo contradicts (a point outside it, no hairline to lower)
    UNSUPPORTED_IMAGE = "unsupported_image"  # not a JPEG, PNG or WebP, or a file that does not decode
    IMAGE_TOO_LARGE = "image_too_large"
    BAD_RESOLUTION = "bad_resolution"  # the photo's sides or pixels, or the pictures its answer would draw
    NO_FACE = "no_face"
    MULTIPLE_FACES = "multiple_faces"
    NOT_FRONTAL = "not_frontal"


REFUSAL_CODES: Mapping[RefusalKind, Code] = {
    RefusalKind.INVALID_OPTION: Code.INVALID_PARAMETER,
    RefusalKind.UNSUPPORTED_IMAGE: Code.UNSUPPORTED_IMAGE,
    RefusalKind.IMAGE_TOO_LARGE: Code.TOO_LARGE,
    RefusalKind.BAD_RESOLUTION: Code.BAD_RESOLUTION,
    RefusalKind.NO_FACE: Code.NO_FACE,
    RefusalKind.MULTIPLE_FACES: Code.MULTIPLE_FACES,
    RefusalKind.NOT_FRONTAL: Code.NOT_FRONTAL,
}


class ContractError(Exception):
    """A failure the client is told about as an envelope: a code and an actionable message,
    and the kind of failure when it is known (`error_type`, gateway.md § Failure kinds)."""

    def __init__(self, code: Code, message: str | None = None, error_type: ErrorType | None = None) -> None:
        self.code = Code(code)
        self.message = message or DEFAULT_MESSAGES[self.code]
        self.error_type = error_type
        super().__init__(f"{int(self.code)}: {self.message}")

    @classmethod
    def refusing(cls, kind: RefusalKind, message: str) -> ContractError:
        """The answer to the analysis' refusal of `kind`, in its own words."""
        return cls(REFUSAL_CODES[kind], message)
