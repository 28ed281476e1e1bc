"""shared.models: the contract's fields as models — every field's refusal in both spellings,
the message it names, repeated multipart fields, and the JSON Schema agreeing with the models."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest
from werkzeug.datastructures import MultiDict

from shared import models
from shared.contract import Code, ContractError

IMAGE = "/9j/4AAQSkZJRg=="  # any non-empty text: its content is shared.uploads' check

# (endpoint, field, bad JSON value, bad form text, the message: today's, naming the field)
REFUSALS = [
    ("measure", "gender", "robot", "robot", "参数 gender 无效：只能是 male / female / unknown"),
    ("grow", "plans", ["bald"], "bald", "参数 plans 含未知取值 'bald'，可选值：conservative, standard, aggressive"),
    ("hairline", "styles", ["receding"], "receding", "参数 styles 含未知取值 'receding'，可选值：straight, rounded, m_shape, widows_peak"),
    ("mark", "hairline_points", [[1, 2]], "[[1, 2]]", "参数 hairline_points 需要 3–1000 个点，收到 1 个"),
    ("mark", "drop_mm", 1000, "1000", "参数 drop_mm 超出范围：1000，应在 0–40 毫米之间"),
]


def _json(endpoint: str, document: Any) -> dict[str, Any]:
    return models.validate_json(endpoint, json.dumps(document).encode())[0]


def _refused(call: Any) -> str:
    with pytest.raises(ContractError) as caught:
        call()
    assert caught.value.code == Code.INVALID_PARAMETER
    return caught.value.message


def test_every_field_of_every_model_has_a_refusal_here_and_a_message() -> None:
    fields = {name for model in models.FIELDS.values() for name in model.model_fields}
    assert fields == {field for _, field, *_ in REFUSALS}
    assert fields | {models.IMAGE_BASE64_FIELD} == set(models._FIELD_MESSAGES)


@pytest.mark.parametrize(("endpoint", "field", "json_value", "form_text", "message"), REFUSALS, ids=[r[1] for r in REFUSALS])
def test_a_bad_field_is_the_same_1001_as_json_and_as_form_text(
    endpoint: str, field: str, json_value: Any, form_text: str, message: str
) -> None:
    assert _refused(lambda: _json(endpoint, {"image_base64": IMAGE, field: json_value})) == message
    assert _refused(lambda: models.validate_form(endpoint, MultiDict([(field, form_text)]))) == message


@pytest.mark.parametrize(
    ("document", "fragment"),
    [
        ({}, "缺少图片"),
        ({"image_base64": "", "gender": "robot"}, "缺少图片"),  # the image before the fields
        ({"image_base64": None}, "缺少图片"),
        ({"image_base64": 42, "gender": "robot"}, "image_base64 必须是字符串"),
        ({"image_base64": IMAGE, "gender": ""}, "gender"),  # JSON: a value, not an absence
        ({"image_base64": IMAGE, "gender": None}, "gender"),
        ({"image_base64": IMAGE, "gender": "Male"}, "gender"),
    ],
)
def test_json_values_are_strict_and_the_image_comes_first(document: dict[str, Any], fragment: str) -> None:
    assert fragment in _refused(lambda: _json("measure", document))


def test_a_body_that_is_no_object_or_no_json_is_refused_as_such() -> None:
    assert _refused(lambda: models.validate_json("mask", b"[1]")) == "请求体必须是 JSON 对象"
    assert _refused(lambda: models.validate_json("mask", b"{oops")) == "请求体不是有效的 JSON"
    assert _refused(lambda: models.validate_json("mask", b"[" * 100_000)) == "请求体的 JSON 嵌套过深"


@pytest.mark.parametrize(
    ("field", "json_value"),
    [("drop_mm", "5"), ("drop_mm", True), ("hairline_points", "[[1,2],[3,4],[5,6]]"), ("plans", "standard")],
)
def test_json_takes_no_text_for_numbers_and_lists(field: str, json_value: Any) -> None:
    endpoint = "grow" if field == "plans" else "mark"
    assert field in _refused(lambda: _json(endpoint, {"image_base64": IMAGE, field: json_value}))


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"hairline_points": [[1, 2], [3, 4], [5]]}, "第 3 个点无效"),
        ({"hairline_points": [[1, 2], [3, 4], [5, 6, 7]]}, "第 3 个点无效"),
        ({"hairline_points": [[1, 2], [3, 4], [5, None]]}, "hairline_points[2] 必须是数字"),
        ({"hairline_points": [[1, 2], [3, 4], [float("nan"), 6]]}, "hairline_points[2] 必须是有限的数字"),
        ({"hairline_points": "oops"}, "参数 hairline_points 不是有效的 JSON"),
        ({"drop_mm": "five"}, "参数 drop_mm 必须是数字，收到 'five'"),
        ({"drop_mm": "1e400"}, "参数 drop_mm 超出范围：数值过大"),
        ({"drop_mm": 3, "hairline_points": [[1, 2], [3, 4], [5, 6]]}, "必须且只能提供其中一个"),
    ],
)
def test_mark_messages(fields: dict[str, Any], named: str) -> None:
    assert named in _refused(lambda: models.validate_form("mark", fields))


def test_form_text_spellings_map_onto_the_same_values() -> None:
    assert models.validate_form("grow", MultiDict([("plans", "standard"), ("plans", "aggressive")]))["plans"] == [
        "standard", "aggressive"]  # repeated fields: all of them, in order
    assert models.validate_form("grow", {"plans": '["aggressive"]', "gender": " Female "}) == {
        "plans": ["aggressive"], "gender": "female"}
    assert models.validate_form("mark", {"drop_mm": "7.5", "hairline_points": ""}) == {
        "hairline_points": None, "drop_mm": 7.5}  # an empty form field is absent
    assert models.validate_form("mark", {"drop_mm": "null", "hairline_points": "[[1,2],[3,4],[5,6]]"})["drop_mm"] is None, (
        "null text is a JSON null, absent (Schemathesis' spelling of a nullable field in a form)")
    assert _json("grow", {"image_base64": IMAGE, "plans": ["aggressive"]}) == {"plans": ["aggressive"], "gender": "unknown"}


def test_a_single_valued_form_field_given_twice_is_refused_not_cut_to_its_first() -> None:
    twice = MultiDict([("gender", "male"), ("gender", "female")])
    assert _refused(lambda: models.validate_form("measure", twice)) == "参数 gender 只能提供一次，收到 2 个"
    assert "drop_mm" in _refused(lambda: models.validate_form("mark", MultiDict([("drop_mm", "1"), ("drop_mm", "2")])))


MARK_CASES = [
    {"drop_mm": 5},
    {"hairline_points": [[1, 2], [3, 4], [5, 6]]},
    {"hairline_points": [[1, 2], [3, 4], [5, 6]], "drop_mm": None},
    {"drop_mm": 5, "hairline_points": None},
    {"drop_mm": None, "hairline_points": None},
    {},
    {"drop_mm": 5, "hairline_points": [[1, 2], [3, 4], [5, 6]]},
    {"drop_mm": 41},
    {"hairline_points": [[1, 2], [3, 4]]},
    {"hairline_points": [[1, 2], [3, 4], [5, 6, 7]]},
]


@pytest.mark.parametrize("fields", MARK_CASES)
def test_the_json_schema_of_mark_accepts_exactly_what_the_model_accepts(fields: dict[str, Any]) -> None:
    model = models.JSON_BODIES[models.MarkFields]
    document = {"image_base64": IMAGE, **fields}
    schema_says = jsonschema.Draft202012Validator(model.model_json_schema()).is_valid(document)
    try:
        _json("mark", document)
        model_says = True
    except ContractError:
        model_says = False
    assert schema_says == model_says


def test_importing_the_models_loads_no_heavy_library() -> None:
    import subprocess
    import sys

    code = "import sys, shared.models; print(sorted(m for m in ('numpy', 'torch', 'mediapipe', 'cv2') if m in sys.modules))"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "[]"
