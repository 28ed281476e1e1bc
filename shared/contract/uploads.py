"""Request bodies of the business endpoints, checked by the contract's rules, from raw bytes.

One module for both sides of the hop: the gateway calls `check_request` before a queue
slot or a GPU host is taken (gateway.md § Parameter checks at the edge), the GPU host calls
`read_request` and checks again. Both see the same body bytes and Content-Type, so both
give the same code and message for the same request.

Two spellings of one request (contract.md § Requests): multipart/form-data with the file in
`image`, or JSON with `image_base64` (standard base64, optional `data:image/...;base64,`
prefix). Checks run in the contract's order and stop at the first failure:
1. the body parses and every field is valid, the image's presence included (1001:
   `shared.contract.bodies`);
2. the image's byte size (1003, read from the base64 length before anything is decoded);
3. the base64 itself (1001: it is a field; the host only, see below);
4. the magic bytes: JPEG, PNG or WebP (1002). Whether the file decodes is the model
   child's check (`analysis.image_input`), with the same message for a foreign format.

`check_request` decodes only the head of a base64 image (enough for the magic bytes):
decoding 2 MB of base64 costs ~10 ms, twice the gateway's budget. A body whose base64 is
broken after its first bytes therefore passes the gateway and gets its 1001 from the host.
"""

from __future__ import annotations

import binascii
import re
from dataclasses import dataclass
from typing import Any

from python_multipart.multipart import MultipartParser
from python_multipart.multipart import parse_options_header as multipart_options
from werkzeug.datastructures import MultiDict
from werkzeug.exceptions import RequestEntityTooLarge
from werkzeug.http import parse_options_header
from werkzeug.sansio.multipart import Data, Epilogue, Field, File, MultipartDecoder, NeedData

from shared.contract.bodies import parse_options, validate_json
from shared.contract.codes import Code, ContractError
from shared.contract.endpoints import endpoint_at
from shared.contract.fields import IMAGE_FIELD, MSG_NO_IMAGE
from shared.contract.messages import MSG_IMAGE_TOO_LARGE, MSG_UNSUPPORTED_IMAGE_FORMAT
from shared.settings import AnalysisSettings

# Room for the non-image fields around the largest allowed image in a body; also the most
# the form fields of one multipart body may hold together.
FIELDS_ALLOWANCE_BYTES = 1024 * 1024
_MAX_FORM_PARTS = 100  # a business request has at most a handful of fields

_DATA_URL_PREFIX = re.compile(r"\s*data:image/[A-Za-z0-9.+-]+;base64,", re.IGNORECASE)
_BASE64_WHITESPACE = (" ", "\n", "\r", "\t")  # line-wrapped base64 (MIME, PEM) and stray spaces
_MAGIC_HEAD_BYTES = 12  # "RIFF" + size + "WEBP" is the longest signature
_MAGIC_HEAD_BASE64_CHARS = 16  # decodes to exactly 12 bytes


@dataclass(frozen=True)
class Upload:
    """What a client sent: its form fields (multipart) and the image, still encoded if it came as JSON."""

    fields: Any  # multipart: a MultiDict of the text fields (a field may repeat); JSON: validated already
    image_file: bytes | None = None  # multipart
    image_base64: str | None = None  # JSON

    @property
    def has_image(self) -> bool:
        return bool(self.image_file) or bool(self.image_base64)  # an empty upload is no image


@dataclass(frozen=True)
class CheckedRequest:
    """A request that passed every check here: its validated options and the image's bytes."""

    options: dict[str, Any]
    image: bytes


def max_body_bytes(max_image_bytes: int) -> int:
    """The largest body worth reading: the largest image as base64, plus the fields."""
    return (max_image_bytes + 2) // 3 * 4 + FIELDS_ALLOWANCE_BYTES


def check_request(path_or_endpoint: str, body: bytes, content_type: str | None, limits: AnalysisSettings) -> None:
    """The gateway's check: ContractError (1001, 1003 or 1002, the first that applies)
    when the GPU host would refuse this request before running the model; else None.

    `path_or_endpoint`: an endpoint's path (`/api/v1/hair/grow`) or name (`grow`,
    `special-points`) in the registry; ValueError for anything else (a programming error).
    Pure CPU, ~0.3-0.7 ms for a 2 MB body (scripts/bench_request_checks.py)."""
    upload, _ = read_fields(endpoint_of(path_or_endpoint), body, content_type)
    if upload.image_file is not None:
        _check_size(len(upload.image_file), limits.max_image_bytes)
        check_image_format(upload.image_file)
    else:
        text = _base64_text(upload)
        _check_size(_decoded_length(text), limits.max_image_bytes)
        check_image_format(_decode_base64(text[:_MAGIC_HEAD_BASE64_CHARS]))


def read_request(endpoint: str, body: bytes, content_type: str | None, limits: AnalysisSettings) -> CheckedRequest:
    """The GPU host's check: the options and the image's bytes, or ContractError as above.
    CPU-bound for megabytes of base64: run it in a worker thread."""
    upload, options = read_fields(endpoint, body, content_type)
    image = image_bytes(upload, limits.max_image_bytes)
    check_image_format(image)
    return CheckedRequest(options, image)


def endpoint_of(path_or_endpoint: str) -> str:
    found = endpoint_at(path_or_endpoint)
    return path_or_endpoint if found is None else found.name


def read_fields(endpoint: str, body: bytes, content_type: str | None) -> tuple[Upload, dict[str, Any]]:
    """Step 1 of every check: the body by its Content-Type, the image's presence and the
    endpoint's options (`shared.contract.bodies`); 1001 for the first thing wrong."""
    mimetype, parameters = parse_options_header(content_type or "")
    mimetype = mimetype.lower()
    if mimetype == "multipart/form-data":
        upload = _parse_multipart(body, parameters.get("boundary", ""))
        if not upload.has_image:
            raise ContractError(Code.INVALID_PARAMETER, MSG_NO_IMAGE)
        return upload, parse_options(endpoint, upload.fields)
    if mimetype == "application/json" or mimetype.endswith("+json"):
        options, encoded = validate_json(endpoint, body)
        return Upload(fields={}, image_base64=encoded), options
    raise ContractError(
        Code.INVALID_PARAMETER,
        f"不支持的 Content-Type {mimetype or '（空）'}：请使用 multipart/form-data 或 application/json",
    )


def image_bytes(upload: Upload, max_image_bytes: int) -> bytes:
    """The image's bytes: 1003 over `max_image_bytes` (before decoding), 1001 for bad base64."""
    if upload.image_file is not None:
        _check_size(len(upload.image_file), max_image_bytes)
        return upload.image_file
    text = _base64_text(upload)
    _check_size(_decoded_length(text), max_image_bytes)
    return _decode_base64(text)


def check_image_format(image: bytes) -> None:
    """1002 unless the bytes start like a JPEG, PNG or WebP file."""
    head = image[:_MAGIC_HEAD_BYTES]
    if not (
        head.startswith(b"\xff\xd8\xff")
        or head.startswith(b"\x89PNG\r\n\x1a\n")
        or (head.startswith(b"RIFF") and head[8:12] == b"WEBP")
    ):
        raise ContractError(Code.UNSUPPORTED_IMAGE, MSG_UNSUPPORTED_IMAGE_FORMAT)


# -- parsing ------------------------------------------------------------------------------


class _MultipartError(Exception):
    """The body is no multipart/form-data we read: `message` says why (1001)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


_MSG_MALFORMED = "请求体无法解析：multipart/form-data 格式错误"
_MSG_TOO_MANY_FIELDS = "表单字段过多或过大：只需上传 image 与接口定义的参数"


def _parse_multipart(body: bytes, boundary: str) -> Upload:
    try:
        parts = _parts(body, boundary)
    except _MultipartError as error:
        raise ContractError(Code.INVALID_PARAMETER, error.message) from None
    form = MultiDict(
        (part.name, part.data.decode("utf-8", "replace"))
        for part in parts
        if part.filename is None and part.name != IMAGE_FIELD
    )
    images = [part for part in parts if part.name == IMAGE_FIELD]
    if not any(part.filename is not None for part in images):
        if images:
            raise ContractError(Code.INVALID_PARAMETER, "参数 image 必须以文件方式上传（multipart 文件字段）")
        return Upload(fields=form)
    if len(images) > 1:  # which one would be the photo?
        raise ContractError(Code.INVALID_PARAMETER, f"参数 image 只能提供一次，收到 {len(images)} 个")
    return Upload(fields=form, image_file=images[0].data)


@dataclass(frozen=True)
class FormPart:
    """One part of a multipart/form-data body, as sent."""

    name: str
    filename: str | None  # None: a form field, not a file
    content_type: str | None
    data: bytes


def multipart_parts(body: bytes, content_type: str | None) -> list[FormPart] | None:
    """The parts of a multipart/form-data body in their order, or None when the body is not
    one or does not parse (the same parser and limits as the checks above).

    What a request means regardless of its boundary: the gateway fingerprints these for
    Idempotency-Key, so that a retry with a new boundary matches and a changed value does not.
    """
    mimetype, parameters = parse_options_header(content_type or "")
    if mimetype.lower() != "multipart/form-data":
        return None
    try:
        return _parts(body, parameters.get("boundary", ""))
    except _MultipartError:
        return None


def _parts(body: bytes, boundary: str) -> list[FormPart]:
    """Every part of `body`, by python-multipart: its boundary search is one `bytes.find` per
    part (0.2 ms for 2 MB; werkzeug's parser took 3.6 ms, most of the gateway's check). The
    text fields may hold FIELDS_ALLOWANCE_BYTES together, and at most _MAX_FORM_PARTS parts."""
    if not boundary:
        raise _MultipartError(_MSG_MALFORMED)
    parts: list[FormPart] = []
    headers: dict[bytes, bytes] = {}
    header = [b"", b""]  # the field and value being read
    chunks: list[bytes] = []
    fields_bytes = 0
    ended = False

    def on_header_field(data: bytes, start: int, end: int) -> None:
        header[0] += data[start:end]

    def on_header_value(data: bytes, start: int, end: int) -> None:
        header[1] += data[start:end]

    def on_header_end() -> None:
        headers[header[0].strip().lower()] = header[1].strip()
        header[0] = header[1] = b""

    def on_part_begin() -> None:
        if len(parts) >= _MAX_FORM_PARTS:
            raise _MultipartError(_MSG_TOO_MANY_FIELDS)
        headers.clear()
        chunks.clear()

    def on_part_data(data: bytes, start: int, end: int) -> None:
        chunks.append(data[start:end])

    def on_part_end() -> None:
        nonlocal fields_bytes
        disposition, options = multipart_options(headers.get(b"content-disposition"))
        if disposition != b"form-data" or b"name" not in options:
            raise _MultipartError(_MSG_MALFORMED)
        filename = options.get(b"filename")
        data = b"".join(chunks)
        if filename is None:
            fields_bytes += len(data)
            if fields_bytes > FIELDS_ALLOWANCE_BYTES:
                raise _MultipartError(_MSG_TOO_MANY_FIELDS)
        content_type = headers.get(b"content-type")
        parts.append(
            FormPart(
                options[b"name"].decode("utf-8", "replace"),
                None if filename is None else filename.decode("utf-8", "replace"),
                None if content_type is None else content_type.decode("latin-1"),
                data,
            )
        )

    def on_end() -> None:
        nonlocal ended
        ended = True

    callbacks = {
        "on_header_field": on_header_field,
        "on_header_value": on_header_value,
        "on_header_end": on_header_end,
        "on_part_begin": on_part_begin,
        "on_part_data": on_part_data,
        "on_part_end": on_part_end,
        "on_end": on_end,
    }
    try:
        parser = MultipartParser(boundary.encode("latin-1"), callbacks)  # type: ignore[arg-type]
        parser.write(body)
        parser.finalize()
    except (ValueError, UnicodeEncodeError):  # python-multipart's errors are ValueErrors
        return _parts_by_werkzeug(body, boundary)
    if not ended:
        # the body stopped before its closing boundary, or an empty part has no blank line
        # before the next boundary (RFC 2046 allows it; werkzeug's test client writes it)
        return _parts_by_werkzeug(body, boundary)
    return parts


def _parts_by_werkzeug(body: bytes, boundary: str) -> list[FormPart]:
    """The second opinion on a body python-multipart could not finish: werkzeug's decoder
    (slower, stricter about RFC 2046's optional parts)."""
    parts: list[FormPart] = []
    current: Field | File | None = None
    chunks: list[bytes] = []
    try:
        decoder = MultipartDecoder(
            boundary.encode("latin-1"), max_form_memory_size=FIELDS_ALLOWANCE_BYTES, max_parts=_MAX_FORM_PARTS
        )
        decoder.receive_data(body)
        decoder.receive_data(None)
        while not isinstance(event := decoder.next_event(), NeedData):
            if isinstance(event, Epilogue):
                return parts
            if isinstance(event, (Field, File)):
                current, chunks = event, []
            elif isinstance(event, Data) and current is not None:
                chunks.append(event.data)
                if not event.more_data:
                    filename = current.filename if isinstance(current, File) else None
                    parts.append(
                        FormPart(current.name, filename, current.headers.get("content-type"), b"".join(chunks))
                    )
    except RequestEntityTooLarge:
        raise _MultipartError(_MSG_TOO_MANY_FIELDS) from None
    except (ValueError, UnicodeEncodeError):
        raise _MultipartError(_MSG_MALFORMED) from None
    raise _MultipartError(_MSG_MALFORMED)  # the body ended before its closing boundary


# -- the image ----------------------------------------------------------------------------


def _base64_text(upload: Upload) -> str:
    """`image_base64` without its data-URL prefix and whitespace (line-wrapped base64)."""
    text = upload.image_base64 or ""
    prefix = _DATA_URL_PREFIX.match(text)
    if prefix:
        text = text[prefix.end() :]
    # Copies megabytes only when there is whitespace; each `in` is a memchr. (A regex
    # substitution costs ~30 ms on 2 MB.)
    if any(space in text for space in _BASE64_WHITESPACE):
        text = "".join(text.split())
    return text


def _decoded_length(text: str) -> int:
    return len(text) * 3 // 4 - text[-2:].count("=")


def _decode_base64(text: str) -> bytes:
    try:
        return binascii.a2b_base64(text, strict_mode=True)
    except (binascii.Error, ValueError):  # ValueError: characters beyond ASCII
        raise ContractError(Code.INVALID_PARAMETER, "image_base64 不是有效的 base64") from None


def _check_size(size: int, max_image_bytes: int) -> None:
    if size > max_image_bytes:
        message = MSG_IMAGE_TOO_LARGE.format(size_mb=size / 2**20, limit_mb=max_image_bytes / 2**20)
        raise ContractError(Code.TOO_LARGE, message)
