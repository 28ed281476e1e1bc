"""Request bodies of the business endpoints -> (fields, image bytes), or the 1001/1003 that says why.

Two spellings of one request (contract.md § Requests): multipart/form-data with the file in
`image`, or JSON with `image_base64` (standard base64, optional `data:image/...;base64,`
prefix). Checks run in the contract's order: field presence and values first (1001: the
caller runs `parse_options` on `fields`), then the image's byte size (1003, read from the
base64 length before anything is decoded), then the base64 itself (1001: it is a field).
The image format is not looked at here; the model child does that (1002).
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from dataclasses import dataclass
from typing import Any

import trio
from quart import Request
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge

from shared.contract import MSG_BODY_TOO_LARGE, MSG_IMAGE_TOO_LARGE, Code, ContractError

IMAGE_FIELD = "image"
IMAGE_BASE64_FIELD = "image_base64"
# Room for the non-image fields around the largest allowed image in a JSON body.
FIELDS_ALLOWANCE_BYTES = 1024 * 1024

_DATA_URL_PREFIX = re.compile(r"\s*data:image/[A-Za-z0-9.+-]+;base64,", re.IGNORECASE)
_WHITESPACE = re.compile(r"\s+")


@dataclass(frozen=True)
class Upload:
    """What a client sent: the non-image fields and the image, still encoded if it came as JSON."""

    fields: dict[str, Any]
    image_file: bytes | None = None  # multipart
    image_base64: str | None = None  # JSON

    @property
    def has_image(self) -> bool:
        return bool(self.image_file) or bool(self.image_base64)  # an empty upload is no image


def max_body_bytes(max_image_bytes: int) -> int:
    """The largest body worth reading: the largest image as base64, plus the fields."""
    return (max_image_bytes + 2) // 3 * 4 + FIELDS_ALLOWANCE_BYTES


async def read_upload(request: Request) -> Upload:
    """Parse the body by its Content-Type; 1001 for what cannot be parsed, 1003 when too large."""
    try:
        if request.mimetype == "multipart/form-data":
            return await _read_multipart(request)
        if request.mimetype == "application/json" or request.mimetype.endswith("+json"):
            # megabytes of JSON: parsed in a thread so the event loop (and /health) stay free
            return await trio.to_thread.run_sync(_parse_json, await request.get_data(as_text=False))
    except RequestEntityTooLarge:
        message = MSG_BODY_TOO_LARGE.format(limit_bytes=request.max_content_length)
        raise ContractError(Code.TOO_LARGE, message) from None
    except (HTTPException, ValueError):  # a malformed multipart body
        raise ContractError(Code.INVALID_PARAMETER, "请求体无法解析：multipart/form-data 格式错误") from None
    raise ContractError(
        Code.INVALID_PARAMETER,
        f"不支持的 Content-Type {request.mimetype or '（空）'}：请使用 multipart/form-data 或 application/json",
    )


async def _read_multipart(request: Request) -> Upload:
    files = await request.files
    form = await request.form
    fields: dict[str, Any] = {name: form[name] for name in form if name != IMAGE_FIELD}
    upload = files.get(IMAGE_FIELD)
    if upload is None:
        if IMAGE_FIELD in form:
            raise ContractError(Code.INVALID_PARAMETER, "参数 image 必须以文件方式上传（multipart 文件字段）")
        return Upload(fields=fields)
    return Upload(fields=fields, image_file=upload.read())


def _parse_json(body: bytes) -> Upload:
    try:
        document = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise ContractError(Code.INVALID_PARAMETER, "请求体不是有效的 JSON") from None
    except RecursionError:  # the decoder's own depth limit
        raise ContractError(Code.INVALID_PARAMETER, "请求体的 JSON 嵌套过深") from None
    if not isinstance(document, dict):
        raise ContractError(Code.INVALID_PARAMETER, "请求体必须是 JSON 对象")
    encoded = document.pop(IMAGE_BASE64_FIELD, None)
    if encoded is not None and not isinstance(encoded, str):
        raise ContractError(Code.INVALID_PARAMETER, "参数 image_base64 必须是字符串（base64 编码的图片）")
    return Upload(fields=document, image_base64=encoded)


def require_image(upload: Upload) -> None:
    """1001 when no image came; part of the field checks."""
    if not upload.has_image:
        raise ContractError(
            Code.INVALID_PARAMETER, "缺少图片：multipart 请上传文件字段 image，JSON 请提供 image_base64"
        )


def image_bytes(upload: Upload, max_image_bytes: int) -> bytes:
    """The image's bytes: 1003 over `max_image_bytes` (before decoding), 1001 for bad base64."""
    if upload.image_file is not None:
        _check_size(len(upload.image_file), max_image_bytes)
        return upload.image_file
    text = upload.image_base64 or ""
    prefix = _DATA_URL_PREFIX.match(text)
    text = _WHITESPACE.sub("", text[prefix.end() :] if prefix else text)
    _check_size(_decoded_length(text), max_image_bytes)
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ContractError(Code.INVALID_PARAMETER, "image_base64 不是有效的 base64") from None


def _decoded_length(text: str) -> int:
    return len(text) * 3 // 4 - text[-2:].count("=")


def _check_size(size: int, max_image_bytes: int) -> None:
    if size > max_image_bytes:
        message = MSG_IMAGE_TOO_LARGE.format(size_mb=size / 2**20, limit_mb=max_image_bytes / 2**20)
        raise ContractError(Code.TOO_LARGE, message)
