"""The wire contract: envelope shape (built and modelled), request ids, the image-key naming
rule, the analysis' refusal kinds."""

import pytest

from shared.contract import (
    ENVELOPE_KEYS,
    Code,
    ContractError,
    ErrorType,
    RefusalKind,
    envelope,
    failure,
    is_envelope,
    request_id_from_header,
    success,
    url_key_for,
)
from shared.contract.envelope import envelope_errors


def test_success_envelope_shape():
    body = success("abc", {"x": 1})
    assert body == {"code": 0, "message": "成功", "request_id": "abc", "data": {"x": 1}}
    assert is_envelope(body)


def test_error_envelope_drops_data_and_keeps_message():
    body = failure(ContractError(Code.BAD_RESOLUTION, "图片分辨率过低：最短边 320px，要求至少 480px"), "r1")
    assert body["code"] == 1004 and body["data"] is None
    assert body["message"].startswith("图片分辨率过低")
    assert envelope(Code.SYSTEM_ERROR, "r", data={"leak": 1})["data"] is None


@pytest.mark.parametrize(
    "body",
    [
        [],
        {"code": 0},
        {"code": 999, "message": "", "request_id": "", "data": None},
        {"code": True, "message": "", "request_id": "", "data": None},
        {"code": 0, "message": "", "request_id": "", "data": None, "extra": 1},
    ],
)
def test_not_an_envelope(body):
    assert not is_envelope(body)


@pytest.mark.parametrize("value", ["a", "A-b_c.9", "x" * 64])
def test_client_request_id_kept(value):
    assert request_id_from_header(value) == value


@pytest.mark.parametrize("value", [None, "", "x" * 65, "a b", "é", "a/b"])
def test_bad_client_request_id_replaced(value):
    generated = request_id_from_header(value)
    assert generated != value and len(generated) == 32


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ("annotated_image_base64", "annotated_image_url"),
        ("image_base64", "image_url"),
        ("_base64", None),
        ("image", None),
        ("base64_image", None),
    ],
)
def test_url_key_rule(key, expected):
    assert url_key_for(key) == expected


@pytest.mark.parametrize("code", list(Code))
def test_the_envelope_built_is_the_envelope_modelled(code: Code) -> None:
    """`envelope()`'s dicts and `answer_model`'s models are one shape: every code the builder
    makes (a named 1007 included) is an answer the document allows."""
    data = {"mask_image_url": "https://gateway.test/static/annotations/m.png", "hair_area_ratio": 0.2}
    built = (
        success("r", data)
        if code is Code.OK
        else failure(ContractError(code, error_type=ErrorType.CUDA_OOM if code is Code.SYSTEM_ERROR else None), "r")
    )
    assert set(built) == ENVELOPE_KEYS
    assert envelope_errors("mask", built) is None


@pytest.mark.parametrize("kind", list(RefusalKind))
def test_every_refusal_of_the_analysis_has_its_code(kind: RefusalKind) -> None:
    error = ContractError.refusing(kind, "说明")
    assert error.code is not Code.SYSTEM_ERROR and error.code is not Code.OK and error.message == "说明"
