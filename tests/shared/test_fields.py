"""shared.contract.fields, refusals, schema and bodies: the contract's fields as models — every
field's refusal in both spellings, the message it names, repeated multipart fields, and the
JSON Schema agreeing with the models."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest
from werkzeug.datastructures import MultiDict

from shared.contract import Code, ContractError, bodies, refusals
from shared.contract.endpoints import ENDPOINTS
from shared.contract.fields import IMAGE_BASE64_FIELD, MarkFields, _number_text

IMAGE = "/9j/4AAQSkZJRg=="  # any non-empty text: its content is shared.contract.uploads' check

# (endpoint, field, bad JSON value, bad form text, the message: today's, naming the field)
REFUSALS = [
    ("measure", "gender", "robot", "robot", "参数 gender 无效：只能是 male / female / unknown"),
    ("grow", "plans", ["bald"], "bald", "参数 plans 含未知取值 'bald'，可选值：conservative, standard, aggressive"),
    (
        "hairline",
        "styles",
        ["receding"],
        "receding",
        "参数 styles 含未知取值 'receding'，可选值：straight, rounded, m_shape, widows_peak",
    ),
    ("mark", "hairline_points", [[1, 2]], "[[1, 2]]", "参数 hairline_points 需要 3–1000 个点，收到 1 个"),
    ("mark", "drop_mm", 1000, "1000", "参数 drop_mm 超出范围：1000，应在 0–40 毫米之间"),
]


def _json(endpoint: str, document: Any) -> dict[str, Any]:
    return bodies.validate_json(endpoint, json.dumps(document).encode())[0]


def _refused(call: Any) -> str:
    with pytest.raises(ContractError) as caught:
        call()
    assert caught.value.code == Code.INVALID_PARAMETER
    return caught.value.message


def test_every_field_of_every_model_has_a_refusal_here_and_a_message() -> None:
    names = {name for entry in ENDPOINTS.values() for name in entry.fields.model_fields}
    assert names == {field for _, field, *_ in REFUSALS}
    assert names | {IMAGE_BASE64_FIELD} == set(refusals._FIELD_MESSAGES)


@pytest.mark.parametrize(
    ("endpoint", "field", "json_value", "form_text", "message"), REFUSALS, ids=[r[1] for r in REFUSALS]
)
def test_a_bad_field_is_the_same_1001_as_json_and_as_form_text(
    endpoint: str, field: str, json_value: Any, form_text: str, message: str
) -> None:
    assert _refused(lambda: _json(endpoint, {"image_base64": IMAGE, field: json_value})) == message
    assert _refused(lambda: bodies.parse_options(endpoint, MultiDict([(field, form_text)]))) == message


@pytest.mark.parametrize(
    ("document", "fragment"),
    [
        ({}, "缺少图片"),
        ({"image_base64": "", "gender": "robot"}, "缺少图片"),  # the image before the fields
        ({"image_base64": None}, "缺少图片"),
        ({"image_base64": 42, "gender": "robot"}, "image_base64 必须是字符串"),
        ({"image_base64": 42, "gender": "[oops"}, "image_base64 必须是字符串"),
    ],
)
def test_the_image_comes_first(document: dict[str, Any], fragment: str) -> None:
    assert fragment in _refused(lambda: _json("measure", document))


def test_a_body_that_is_no_object_or_no_json_is_refused_as_such() -> None:
    assert _refused(lambda: bodies.validate_json("mask", b"[1]")) == "请求体必须是 JSON 对象"
    assert _refused(lambda: bodies.validate_json("mask", b"{oops")) == "请求体不是有效的 JSON"
    assert _refused(lambda: bodies.validate_json("mask", b"[" * 100_000)) == "请求体的 JSON 嵌套过深"


POINTS = [[1, 2], [3, 4], [5, 6]]
# (endpoint, a spelling the old parser took in JSON, the canonical fields it means): clients
# rely on them (an empty gender picker sends ""), so JSON takes every field's text too
OLD_SPELLINGS = [
    ("measure", {"gender": "Male"}, {"gender": "male"}),
    ("measure", {"gender": " female "}, {"gender": "female"}),
    ("measure", {"gender": ""}, {}),
    ("measure", {"gender": "   "}, {}),
    ("measure", {"gender": None}, {}),
    ("grow", {"plans": "standard,aggressive"}, {"plans": ["standard", "aggressive"]}),
    ("grow", {"plans": " standard , aggressive "}, {"plans": ["standard", "aggressive"]}),
    ("grow", {"plans": '["standard"]', "gender": "MALE"}, {"plans": ["standard"], "gender": "male"}),
    ("grow", {"plans": "", "gender": None}, {}),
    ("grow", {"plans": None}, {}),
    ("hairline", {"styles": "m_shape,straight"}, {"styles": ["m_shape", "straight"]}),
    ("hairline", {"styles": ' ["rounded"] '}, {"styles": ["rounded"]}),
    ("mark", {"drop_mm": "5"}, {"drop_mm": 5}),
    ("mark", {"drop_mm": " 7.5 ", "hairline_points": ""}, {"drop_mm": 7.5}),
    ("mark", {"drop_mm": "4e1", "hairline_points": None}, {"drop_mm": 40}),
    ("mark", {"drop_mm": 5, "hairline_points": "null"}, {"drop_mm": 5}),
    ("mark", {"hairline_points": "[[1,2],[3,4],[5,6]]"}, {"hairline_points": POINTS}),
    ("mark", {"hairline_points": " [[1, 2], [3, 4], [5, 6]] ", "drop_mm": " "}, {"hairline_points": POINTS}),
    ("mark", {"hairline_points": [["1", " 2"], [3, "4.0"], [5, 6]]}, {"hairline_points": POINTS}),
]


@pytest.mark.parametrize(("endpoint", "spelt", "canonical"), OLD_SPELLINGS, ids=[str(s[1]) for s in OLD_SPELLINGS])
def test_json_takes_the_old_spellings_as_the_form_does(
    endpoint: str, spelt: dict[str, Any], canonical: dict[str, Any]
) -> None:
    expected = _json(endpoint, {"image_base64": IMAGE, **canonical})
    assert _json(endpoint, {"image_base64": IMAGE, **spelt}) == expected
    form = {name: value for name, value in spelt.items() if isinstance(value, str)}
    if len(form) == len(spelt):  # the same text as multipart fields: one rule set
        assert bodies.parse_options(endpoint, MultiDict(list(form.items()))) == expected
    schema = bodies.json_body(ENDPOINTS[endpoint].fields).model_json_schema()
    assert jsonschema.Draft202012Validator(schema).is_valid({"image_base64": IMAGE, **spelt}), (
        "the document says so too"
    )


# (endpoint, fields, the message's fragment): what the old parser refused still is, in JSON
STILL_REFUSED = [
    ("mark", {"drop_mm": True}, "参数 drop_mm 必须是数字"),
    ("mark", {"drop_mm": "five"}, "参数 drop_mm 必须是数字，收到 'five'"),
    ("mark", {"drop_mm": "nan"}, "参数 drop_mm 必须是有限的数字"),
    ("mark", {"drop_mm": "-inf"}, "参数 drop_mm 超出范围：数值过大"),
    ("mark", {"drop_mm": "9" * 400}, "参数 drop_mm 超出范围：数值过大"),
    ("mark", {"drop_mm": "41"}, "参数 drop_mm 超出范围：41"),
    ("mark", {"drop_mm": "5", "hairline_points": "[[1,2],[3,4],[5,6]]"}, "必须且只能提供其中一个"),
    ("mark", {"drop_mm": "", "hairline_points": None}, "必须且只能提供其中一个"),
    ("mark", {"hairline_points": "[[1,2],[3,4]]"}, "需要 3–1000 个点，收到 2 个"),
    ("mark", {"hairline_points": [[1, 2], [3, 4], [True, 6]]}, "hairline_points[2] 必须是数字"),
    ("mark", {"hairline_points": [[1, 2], [3, 4], ["x", 6]]}, "hairline_points[2] 必须是数字，收到 'x'"),
    ("measure", {"gender": "robot"}, "参数 gender 无效"),
    ("measure", {"gender": 1}, "参数 gender 无效"),
    ("measure", {"gender": ["male"]}, "参数 gender 无效"),
    ("grow", {"plans": "[]"}, "参数 plans 必须是非空列表"),
    ("grow", {"plans": "standard,standard"}, "参数 plans 含重复取值"),
    ("grow", {"plans": "standard,"}, "参数 plans 含未知取值 ''"),
    ("grow", {"plans": "Standard"}, "参数 plans 含未知取值 'Standard'"),
    ("grow", {"plans": "[oops"}, "参数 plans 不是有效的 JSON"),
    ("grow", {"plans": 3}, "参数 plans 必须是非空列表"),
]

SCHEMA_CANNOT_SAY = [{"drop_mm": "9" * 400}, {"drop_mm": "41"}, {"plans": "standard,standard"}]


@pytest.mark.parametrize(("endpoint", "fields", "fragment"), STILL_REFUSED, ids=[str(s[1])[:40] for s in STILL_REFUSED])
def test_what_the_old_parser_refused_is_still_refused_and_the_document_says_so(
    endpoint: str, fields: dict[str, Any], fragment: str
) -> None:
    assert fragment in _refused(lambda: _json(endpoint, {"image_base64": IMAGE, **fields}))
    schema = bodies.json_body(ENDPOINTS[endpoint].fields).model_json_schema()
    prose = fields in SCHEMA_CANNOT_SAY  # a text's range or distinct values: its description says them
    assert jsonschema.Draft202012Validator(schema).is_valid({"image_base64": IMAGE, **fields}) == prose


def test_a_number_text_is_refused_as_text_unless_the_pattern_takes_it() -> None:
    # `float` also reads "1_0" and Arabic-Indic digits; the pattern (the document's) decides
    assert _number_text("drop_mm", "1_0") == 10
    assert _number_text("drop_mm", "\u0665") == "\u0665"


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
    assert named in _refused(lambda: bodies.parse_options("mark", fields))


DROP_RANGE = "应在 0–40 毫米之间"
INSIDE_THE_PHOTO = "应在图片范围内：x 在 0 到图片宽度之间，y 在 0 到高度之间（像素）"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        # issue 39: `:g` showed 40.0000001 as "40", a value that reads as inside 0–40
        ({"drop_mm": 40.0000001}, f"参数 drop_mm 超出范围：40.0000001，{DROP_RANGE}"),
        ({"drop_mm": "40.0000001"}, f"参数 drop_mm 超出范围：40.0000001，{DROP_RANGE}"),
        ({"drop_mm": "41.0"}, f"参数 drop_mm 超出范围：41，{DROP_RANGE}"),
        ({"drop_mm": 123456789.125}, f"参数 drop_mm 超出范围：123456789.125，{DROP_RANGE}"),
        # past float's range the value has no digits to show; the range is still said
        ({"drop_mm": "1e400"}, f"参数 drop_mm 超出范围：数值过大，{DROP_RANGE}"),
        ({"drop_mm": 10**400}, f"参数 drop_mm 超出范围：数值过大，{DROP_RANGE}"),
        (
            {"hairline_points": [[1, 2], [3, 4], ["1e400", 6]]},
            f"参数 hairline_points[2] 超出范围：数值过大，{INSIDE_THE_PHOTO}",
        ),
    ],
)
def test_a_number_out_of_range_is_refused_with_the_range_and_the_value_given(
    fields: dict[str, Any], message: str
) -> None:
    assert _refused(lambda: bodies.parse_options("mark", fields)) == message


def test_form_text_spellings_map_onto_the_same_values() -> None:
    assert bodies.parse_options("grow", MultiDict([("plans", "standard"), ("plans", "aggressive")]))["plans"] == [
        "standard",
        "aggressive",
    ]  # repeated fields: all of them, in order
    assert bodies.parse_options("grow", {"plans": '["aggressive"]', "gender": " Female "}) == {
        "plans": ["aggressive"],
        "gender": "female",
    }
    assert bodies.parse_options("mark", {"drop_mm": "7.5", "hairline_points": ""}) == {
        "hairline_points": None,
        "drop_mm": 7.5,
    }  # an empty form field is absent
    assert (
        bodies.parse_options("mark", {"drop_mm": "null", "hairline_points": "[[1,2],[3,4],[5,6]]"})["drop_mm"] is None
    ), "null text is a JSON null, absent (Schemathesis' spelling of a nullable field in a form)"
    assert _json("grow", {"image_base64": IMAGE, "plans": ["aggressive"]}) == {
        "plans": ["aggressive"],
        "gender": "unknown",
    }


def test_a_single_valued_form_field_given_twice_is_refused_not_cut_to_its_first() -> None:
    twice = MultiDict([("gender", "male"), ("gender", "female")])
    assert _refused(lambda: bodies.parse_options("measure", twice)) == "参数 gender 只能提供一次，收到 2 个"
    assert "drop_mm" in _refused(lambda: bodies.parse_options("mark", MultiDict([("drop_mm", "1"), ("drop_mm", "2")])))


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
    {"drop_mm": "5", "hairline_points": " "},
    {"drop_mm": "null", "hairline_points": "[[1,2],[3,4],[5,6]]"},
    {"drop_mm": "", "hairline_points": "null"},
    {"drop_mm": "5", "hairline_points": "[[1,2],[3,4],[5,6]]"},
]


@pytest.mark.parametrize("fields", MARK_CASES)
def test_the_json_schema_of_mark_accepts_exactly_what_the_model_accepts(fields: dict[str, Any]) -> None:
    model = bodies.json_body(MarkFields)
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

    code = (
        "import sys, shared.contract.bodies;"
        " print(sorted(m for m in ('numpy', 'torch', 'mediapipe', 'cv2') if m in sys.modules))"
    )
    assert (
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "[]"
    )
