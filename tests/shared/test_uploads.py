"""shared.contract.uploads: one set of request checks for the gateway (`check_request`) and the GPU
host (`read_request`), on raw body bytes and a Content-Type."""

from __future__ import annotations

import base64
import io
import json
from typing import Any

import pytest
from werkzeug.test import encode_multipart

from shared.contract import MSG_UNSUPPORTED_IMAGE_FORMAT, Code, ContractError
from shared.contract.uploads import check_request, max_body_bytes, read_request
from shared.settings import AnalysisSettings

LIMITS = AnalysisSettings(max_image_bytes=64 * 1024)
JPEG = b"\xff\xd8\xff\xe0\x00\x10JFIF\x00" + b"j" * 100
PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + b"p" * 100
WEBP = b"RIFF\x10\x00\x00\x00WEBPVP8 " + b"w" * 100
GROW = "/api/v1/hair/grow"


def multipart(fields: dict[str, str], image: bytes | None = JPEG, field: str = "image") -> tuple[bytes, str]:
    values: dict[str, Any] = dict(fields)
    if image is not None:
        values[field] = (io.BytesIO(image), "photo.jpg", "image/jpeg")
    boundary, body = encode_multipart(_multidict(values))
    return body, f"multipart/form-data; boundary={boundary}"


def _multidict(values: dict[str, Any]) -> Any:
    from werkzeug.datastructures import FileStorage, MultiDict

    items = []
    for name, value in values.items():
        if isinstance(value, tuple):
            stream, filename, content_type = value
            value = FileStorage(stream, filename=filename, content_type=content_type)
        items.append((name, value))
    return MultiDict(items)


def as_json(document: Any) -> tuple[bytes, str]:
    return json.dumps(document).encode(), "application/json"


def b64(image: bytes) -> str:
    return base64.b64encode(image).decode()


def outcome(path: str, body: bytes, content_type: str | None) -> tuple[int, str]:
    """The gateway's and the host's verdict; they must agree on every request."""
    verdicts = []
    for check in (
        lambda: check_request(path, body, content_type, LIMITS),
        lambda: read_request(path.rsplit("/", 1)[-1], body, content_type, LIMITS),
    ):
        try:
            check()
            verdicts.append((0, ""))
        except ContractError as error:
            verdicts.append((int(error.code), error.message))
    assert verdicts[0] == verdicts[1]
    return verdicts[0]


@pytest.mark.parametrize("image", [JPEG, PNG, WEBP], ids=["jpeg", "png", "webp"])
def test_accepted_formats_pass_as_multipart_and_json(image: bytes) -> None:
    assert outcome(GROW, *multipart({"plans": "standard"}, image)) == (0, "")
    assert outcome(GROW, *as_json({"image_base64": b64(image), "plans": ["standard"]})) == (0, "")


def test_read_request_gives_the_options_and_the_decoded_image() -> None:
    wrapped = "data:image/png;base64," + "\n".join(b64(PNG)[i : i + 76] for i in range(0, len(b64(PNG)), 76))
    checked = read_request("mark", *as_json({"image_base64": wrapped, "drop_mm": 5}), LIMITS)
    assert checked.image == PNG
    assert checked.options == {"hairline_points": None, "drop_mm": 5.0}
    from_form = read_request("grow", *multipart({"plans": "aggressive,standard", "gender": "male"}, WEBP), LIMITS)
    assert (from_form.image, from_form.options) == (WEBP, {"plans": ["aggressive", "standard"], "gender": "male"})


OVERSIZE = b"\xff\xd8\xff" + b"x" * LIMITS.max_image_bytes


@pytest.mark.parametrize(
    ("request_body", "code", "fragment"),
    [
        (as_json({"gender": "male"}), 1001, "缺少图片"),
        (multipart({"gender": "male"}, None), 1001, "缺少图片"),
        (multipart({}, b""), 1001, "缺少图片"),
        (multipart({"image": "text, not a file"}, None), 1001, "以文件方式上传"),
        (as_json({"image_base64": 42}), 1001, "image_base64"),
        (as_json(["a list"]), 1001, "JSON 对象"),
        ((b"{not json", "application/json"), 1001, "JSON"),
        ((JPEG, "image/jpeg"), 1001, "Content-Type"),
        ((JPEG, None), 1001, "Content-Type"),
        ((b"--x\r\nbroken", "multipart/form-data"), 1001, "multipart"),  # no boundary
        (multipart({"gender": "robot"}, b"not an image"), 1001, "gender"),  # fields before format
        (multipart({"gender": "robot"}, OVERSIZE), 1001, "gender"),  # ... and before size
        (multipart({}, OVERSIZE), 1003, "图片过大"),
        (as_json({"image_base64": b64(OVERSIZE)}), 1003, "图片过大"),
        # size from the base64 length, before decoding: oversize garbage is 1003, not 1001
        (as_json({"image_base64": "!" * (LIMITS.max_image_bytes * 2)}), 1003, "图片过大"),
        (as_json({"image_base64": "!!!! not base64"}), 1001, "base64"),
        (as_json({"image_base64": "ü" * 16}), 1001, "base64"),
        (multipart({}, b"%PDF-1.4 not a photo"), 1002, MSG_UNSUPPORTED_IMAGE_FORMAT),
        (multipart({}, b"GIF89a" + b"g" * 50), 1002, MSG_UNSUPPORTED_IMAGE_FORMAT),
        (as_json({"image_base64": b64(b"RIFF\x10\x00\x00\x00AVI LIST")}), 1002, MSG_UNSUPPORTED_IMAGE_FORMAT),
        (as_json({"image_base64": b64(b"\x89PNG")}), 1002, MSG_UNSUPPORTED_IMAGE_FORMAT),  # truncated signature
    ],
)
def test_bad_requests_get_the_same_first_failure_at_the_gateway_and_the_host(
    request_body: tuple[bytes, str | None], code: int, fragment: str
) -> None:
    got_code, message = outcome("/api/v1/hair/measure", *request_body)
    assert got_code == code and fragment in message, message


@pytest.mark.parametrize("digits", [400, 5000])  # 5000: past the int-to-str limit (4300) of json.loads
def test_a_long_number_in_a_body_is_out_of_range_at_the_gateway_and_the_host(digits: int) -> None:
    number = "9" * digits
    image = json.dumps(b64(JPEG))
    bodies = {
        "drop_mm": f'{{"image_base64": {image}, "drop_mm": {number}}}'.encode(),
        "hairline_points[0]": (
            f'{{"image_base64": {image}, "hairline_points": [[{number}, 1], [2, 3], [4, 5]]}}'.encode()
        ),
    }
    for field, body in bodies.items():
        code, message = outcome("/api/v1/hair/mark", body, "application/json")
        assert code == 1001 and field in message and "超出范围" in message, message
    code, message = outcome("/api/v1/hair/mark", *multipart({"drop_mm": number}))
    assert code == 1001 and "drop_mm" in message and "超出范围" in message, message


def test_too_many_form_parts_are_refused_without_parsing_them_all() -> None:
    body, content_type = multipart({f"f{i}": "x" for i in range(500)})
    assert outcome(GROW, body, content_type)[0] == Code.INVALID_PARAMETER


def test_the_gateway_decodes_only_the_head_of_a_base64_image() -> None:
    """Documented limit: base64 broken after the magic bytes passes the gateway; the host says 1001."""
    text = b64(JPEG)[:-8] + "!!!!!!!!"
    body = as_json({"image_base64": text})
    check_request(GROW, *body, LIMITS)
    with pytest.raises(ContractError) as refused:
        read_request("grow", *body, LIMITS)
    assert refused.value.code is Code.INVALID_PARAMETER


def test_endpoint_names_and_paths_are_both_accepted_and_anything_else_is_a_bug() -> None:
    body = as_json({"image_base64": b64(PNG)})
    check_request("special-points", *body, LIMITS)
    check_request("mask", *body, LIMITS)
    check_request("/api/v1/face/features", *body, LIMITS)  # every path of the registry
    for unknown in ("/api/v1/hair/nothing", "nothing"):
        with pytest.raises(ValueError):
            check_request(unknown, *body, LIMITS)


def test_the_largest_image_fits_the_body_limit_as_base64() -> None:
    body = as_json({"image_base64": b64(b"\xff\xd8\xff" + b"x" * (LIMITS.max_image_bytes - 3)), "plans": ["standard"]})
    assert len(body[0]) <= max_body_bytes(LIMITS.max_image_bytes)
    check_request(GROW, *body, LIMITS)
