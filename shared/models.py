"""The public contract as pydantic models: each endpoint's fields, each endpoint's `data`, the envelope.

One source for three readers: the gateway checks a request with these models before a queue
slot is taken, the GPU host checks it again before its model process sees it (both through
`shared.uploads`), and the gateway's `/openapi.json` is generated from them
(`edge.web.openapi`). No field rule lives anywhere else.

Two media types, one rule set (contract.md § Requests; the old parser's "both spellings are
accepted for every field", which clients rely on):
- A value is a JSON value or its text, for every field and both media types (`Fields`'
  `_spellings_then_presence`, the one place text is decoded): `null` and blank text are
  absent (the default); `gender` in any case, spaces around it ignored; `plans` and `styles`
  a list, JSON text or comma-separated text; `hairline_points` the list or its JSON text,
  each coordinate a number or its text; `drop_mm` a number or its text (`NUMBER_TEXT`);
  `null` text for either of the two is absent too. The JSON body is validated straight from
  its bytes (`pydantic_core`'s parser: ~0.2 ms for 2 MB, json.loads ~1.7 ms).
- multipart/form-data (`form_values`): every value is text; `plans` and `styles` may also be
  repeated fields. A field given twice that takes one value is refused, never cut to its first.
The JSON body's schema (`_legacy_spellings`) lists the text spellings beside the preferred
JSON values, so that the document says what is accepted.

A refusal is `ContractError(1001)` with the Chinese message that names the field (`refusal`
translates pydantic's error; the first one in the contract's order: the image, then the
fields' presence, then each field in its order). Fields an endpoint does not know are ignored.
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Annotated, Any, ClassVar, Literal, get_args

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    RootModel,
    Strict,
    ValidationError,
    WithJsonSchema,
    model_validator,
)
from pydantic_core import ErrorDetails, PydanticCustomError

from shared.contract import Code, ContractError, ErrorType

Gender = Literal["male", "female", "unknown"]
Plan = Literal["conservative", "standard", "aggressive"]  # == analysis.types.Plan (no numpy import here)
Style = Literal["straight", "rounded", "m_shape", "widows_peak"]  # == analysis.types.Style
GENDERS: tuple[str, ...] = get_args(Gender)
PLANS: tuple[str, ...] = get_args(Plan)
STYLES: tuple[str, ...] = get_args(Style)
MAX_DROP_MM = 40.0
MIN_HAIRLINE_POINTS = 3
MAX_HAIRLINE_POINTS = 1000  # a hand-drawn polyline; more is a bug or abuse, not a hairline
# Longer JSON integers are read as floats (+-inf past ~309 digits): every number here is one.
_MAX_EXACT_INTEGER_DIGITS = 20

IMAGE_FIELD = "image"  # multipart: the photo as a file
IMAGE_BASE64_FIELD = "image_base64"  # JSON: the photo as base64 text
MSG_NO_IMAGE = "缺少图片：multipart 请上传文件字段 image，JSON 请提供 image_base64"
MSG_IMAGE_NOT_TEXT = "参数 image_base64 必须是字符串（base64 编码的图片）"
_POINTS_SHAPE = "格式应为 [[x, y], [x, y], …]"
# What a refusal of a number out of range says is allowed (`_number_message`).
_DROP_MM_RANGE = f"应在 0–{MAX_DROP_MM:g} 毫米之间"
_COORDINATE_RANGE = "应在图片范围内：x 在 0 到图片宽度之间，y 在 0 到高度之间（像素）"


def json_integer(text: str) -> int | float:
    """`parse_int` for every JSON document a client sends: an integer too long for a float
    is +-inf (out of range, a 1001 naming its field), never an OverflowError in `float()`
    or the int-to-str digit limit's ValueError (4300 digits) for the whole body."""
    return int(text) if len(text) <= _MAX_EXACT_INTEGER_DIGITS else float(text)


def _invalid(message: str) -> ContractError:
    return ContractError(Code.INVALID_PARAMETER, message)


def _unique(values: list[str]) -> list[str]:
    if len(set(values)) != len(values):
        raise PydanticCustomError("unique_items", "duplicate items")
    return values


# The text spellings (the patterns are Python's and ECMA's both: the document carries them).
# A number's text: what `float()` reads of a finite decimal, ASCII digits (`_` between digits
# allowed), spaces around it ignored; "1e400" matches and is out of range.
_DIGITS = "[0-9](_?[0-9])*"
NUMBER_TEXT = rf"^\s*[+-]?({_DIGITS}(\.({_DIGITS})?)?|\.{_DIGITS})([eE][+-]?{_DIGITS})?\s*$"
BLANK_TEXT = r"^\s*$"
NULL_TEXT = r"^\s*(null)?\s*$"  # blank, or JSON's null as text: absent for drop_mm, hairline_points
_NUMBER_TEXT = re.compile(NUMBER_TEXT)
_JSON_SPACE = r"[ \t\n\r]*"  # json.loads' whitespace
_JSON_NUMBER = r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?"


def _any_case(word: str) -> str:
    """`word` in any case, as a pattern (`str.lower` maps the Kelvin sign to k)."""
    return "".join(f"[{letter}{letter.upper()}{chr(0x212A) if letter == 'k' else ''}]" for letter in word)


def _number_text(name: str, text: str) -> Any:
    stripped = text.strip()
    if stripped == "null":
        return None
    if _NUMBER_TEXT.match(text):
        return float(stripped)  # "1e400" and 400 digits are inf: out of range
    try:
        number = float(stripped)
    except ValueError:
        return text  # refused as what it is, text
    # "nan", "inf": refused as not finite; `float`'s other spellings ("٥") as text
    return text if math.isfinite(number) else number


def _coordinate(value: Any) -> Any:
    return _number_text("", value) if isinstance(value, str) else value


# A JSON number (ints included) or its text, never a boolean, NaN or an infinity.
Number = Annotated[float, Strict(), Field(allow_inf_nan=False)]
# A coordinate lies inside the photo (the analysis refuses one outside it), and no photo's
# side is longer than the setting `analysis.max_long_side_px` (1004): the document says
# 0 to that. The number is a setting, so the schema holds a mark where it goes, and the
# gateway's document puts the configured value there (`bound_coordinates`).
_MAX_SIDE_MARK = "x-maximum-is-max-long-side-px"
Coordinate = Annotated[
    Number,
    BeforeValidator(_coordinate),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "number", "minimum": 0, _MAX_SIDE_MARK: True},
                {"type": "string", "pattern": NUMBER_TEXT, "description": "the number as text, within the same bounds"},
            ]
        }
    ),
]


def bound_coordinates(schema: Any, max_long_side_px: int) -> None:
    """Every coordinate in `schema` (a JSON Schema or a document holding some, changed in
    place) bounded to 0–`max_long_side_px`, the largest photo side the service takes."""
    if isinstance(schema, dict):
        if schema.pop(_MAX_SIDE_MARK, False):
            schema["maximum"] = max_long_side_px
        for value in schema.values():
            bound_coordinates(value, max_long_side_px)
    elif isinstance(schema, list):
        for value in schema:
            bound_coordinates(value, max_long_side_px)


Point = Annotated[
    tuple[Coordinate, Coordinate], Field(description="[x, y]: pixels of the upright photo, origin top-left")
]


def _choices(kind: Any, allowed: tuple[str, ...], what: str) -> Any:
    """A non-empty list of distinct `allowed` values (the annotation of `plans`, `styles`)."""
    return Annotated[
        list[kind],
        AfterValidator(_unique),
        Field(
            min_length=1,
            json_schema_extra={"uniqueItems": True},
            description=f"a subset of {', '.join(allowed)}, in the order wanted (default: all); {what}; "
            "also as JSON text or comma-separated text, and in multipart as repeated fields",
        ),
    ]


Plans = _choices(Plan, PLANS, "the results come in this order")
Styles = _choices(Style, STYLES, "one image per style")


class Fields(BaseModel):
    """The non-image fields of one endpoint; subclasses declare them."""

    model_config = ConfigDict(extra="ignore", frozen=True)
    # (field, field): exactly one of the two must be present (mark).
    exactly_one_of: ClassVar[tuple[str, str] | None] = None

    @model_validator(mode="before")
    @classmethod
    def _spellings_then_presence(cls, data: Any) -> Any:
        """The image first; then each field's text decoded in the fields' order (`null` and
        blank text dropped: absent), then "exactly one of"; the values' checks come after."""
        if not isinstance(data, dict):
            return data
        if IMAGE_BASE64_FIELD in cls.model_fields:
            image = data.get(IMAGE_BASE64_FIELD)
            if image in (None, ""):
                raise PydanticCustomError("missing_image", MSG_NO_IMAGE)
            if not isinstance(image, str):
                raise PydanticCustomError("image_not_text", MSG_IMAGE_NOT_TEXT)
        values = {IMAGE_BASE64_FIELD: data[IMAGE_BASE64_FIELD]} if IMAGE_BASE64_FIELD in cls.model_fields else {}
        for name in cls.model_fields:
            value = data.get(name)
            if name == IMAGE_BASE64_FIELD or value is None:
                continue
            if isinstance(value, str):
                value = _TEXT_SPELLINGS[name](name, value) if value.strip() else None
            if value is not None:
                values[name] = value
        if cls.exactly_one_of is not None:
            first, second = cls.exactly_one_of
            if (first in values) == (second in values):
                raise PydanticCustomError("exactly_one", f"参数 {first} 与 {second} 必须且只能提供其中一个")
        return values

    def options(self) -> dict[str, Any]:
        """The validated values as the analysis takes them (points as lists)."""
        return self.model_dump(exclude={IMAGE_BASE64_FIELD})


GenderField = Annotated[Gender, Field(description="sets the reference ranges and the planned heights")]


class MeasureFields(Fields):
    gender: GenderField = "unknown"


class GrowFields(Fields):
    plans: Plans = Field(default_factory=lambda: list(PLANS))  # type: ignore[valid-type]
    gender: GenderField = "unknown"


class MarkFields(Fields):
    """Exactly one of `hairline_points` and `drop_mm`."""

    model_config = ConfigDict(
        json_schema_extra={
            "oneOf": [
                {
                    "required": ["hairline_points"],
                    "properties": {"hairline_points": {"type": "array"}, "drop_mm": {"type": "null"}},
                },
                {
                    "required": ["drop_mm"],
                    "properties": {"drop_mm": {"type": "number"}, "hairline_points": {"type": "null"}},
                },
            ]
        }
    )
    exactly_one_of = ("hairline_points", "drop_mm")
    hairline_points: (
        Annotated[
            list[Point],
            Field(
                min_length=MIN_HAIRLINE_POINTS,
                max_length=MAX_HAIRLINE_POINTS,
                description="the hairline as a polyline from left to right (multipart: JSON text); inside the photo",
            ),
        ]
        | None
    ) = None
    drop_mm: (
        Annotated[Number, Field(ge=0, le=MAX_DROP_MM, description="lower the detected hairline by this many mm")] | None
    ) = None

    def options(self) -> dict[str, Any]:
        points = None if self.hairline_points is None else [list(point) for point in self.hairline_points]
        return {"hairline_points": points, "drop_mm": self.drop_mm}


class HairlineFields(Fields):
    styles: Styles = Field(default_factory=lambda: list(STYLES))  # type: ignore[valid-type]
    gender: GenderField = "unknown"


class ImageOnlyFields(Fields):
    """mask, special-points, features: the photo only."""


FIELDS: dict[str, type[Fields]] = {
    "measure": MeasureFields,
    "grow": GrowFields,
    "mark": MarkFields,
    "hairline": HairlineFields,
    "mask": ImageOnlyFields,
    "special-points": ImageOnlyFields,
    "features": ImageOnlyFields,
}
ENDPOINTS = tuple(FIELDS)


def fields_of(endpoint: str) -> type[Fields]:
    try:
        return FIELDS[endpoint]
    except KeyError:
        raise ValueError(f"unknown endpoint {endpoint!r}; known: {', '.join(ENDPOINTS)}") from None


# -- the text spellings in a JSON body's schema ----------------------------------------------
# A multipart body's schema shows the JSON values its text stands for; a JSON body's shows
# both, the JSON value first (preferred), so that a generated client or fuzzer knows what
# the service accepts (Schemathesis' negative cases are then truly refused).

_LEGACY = "legacy spelling, accepted for old clients; prefer the JSON value. "


def _choice_text_pattern(allowed: Sequence[str]) -> str:
    word = f"({'|'.join(allowed)})"
    quoted = f'"{word}"'
    return (
        rf"^\s*({word}(\s*,\s*{word})*"
        rf"|\[{_JSON_SPACE}{quoted}({_JSON_SPACE},{_JSON_SPACE}{quoted})*{_JSON_SPACE}\])\s*$"
    )


_POINT_TEXT = rf"\[{_JSON_SPACE}{_JSON_NUMBER}{_JSON_SPACE},{_JSON_SPACE}{_JSON_NUMBER}{_JSON_SPACE}\]"
_BLANK = {"type": "string", "pattern": BLANK_TEXT, "description": "blank: absent (the default)"}
_ABSENT = [{"type": "null"}, {"type": "string", "pattern": NULL_TEXT, "description": "blank or null: absent"}]
_TEXT_SCHEMAS: dict[str, list[dict[str, Any]]] = {
    "gender": [
        {
            "type": "string",
            "pattern": rf"^\s*({'|'.join(_any_case(gender) for gender in GENDERS)})\s*$",
            "description": _LEGACY + "any case, spaces around it ignored",
        },
        _BLANK,
        {"type": "null"},
    ],
    **{
        name: [
            {
                "type": "string",
                "pattern": _choice_text_pattern(allowed),
                "description": _LEGACY + "comma-separated or JSON text of the list, its values distinct",
            },
            _BLANK,
            {"type": "null"},
        ]
        for name, allowed in (("plans", PLANS), ("styles", STYLES))
    },
    "hairline_points": [
        {
            "type": "string",
            "pattern": (
                rf"^\s*\[{_JSON_SPACE}{_POINT_TEXT}({_JSON_SPACE},{_JSON_SPACE}{_POINT_TEXT})"
                rf"{{{MIN_HAIRLINE_POINTS - 1},{MAX_HAIRLINE_POINTS - 1}}}{_JSON_SPACE}\]\s*$"
            ),
            "contentMediaType": "application/json",
            "description": _LEGACY + "the list as JSON text",
        },
        *_ABSENT,
    ],
    "drop_mm": [
        {
            "type": "string",
            "pattern": NUMBER_TEXT,
            "description": _LEGACY + f"the number as text, 0–{MAX_DROP_MM:g} too",
        },
        *_ABSENT,
    ],
}


def _legacy_spellings(schema: dict[str, Any], model: type[Any]) -> None:
    """A JSON body's `json_schema_extra`: each field's text spellings beside its JSON value,
    and "exactly one of" with absent meaning absent, null, or blank or null text."""
    for name, texts in _TEXT_SCHEMAS.items():
        field = schema["properties"].get(name)
        if field is None:
            continue
        kept = {key: field.pop(key) for key in ("title", "description", "default") if key in field}
        values = [value for value in field.pop("anyOf", None) or [field] if value != {"type": "null"}]
        schema["properties"][name] = {**kept, "anyOf": [*values, *texts]}
    pair = model.exactly_one_of
    if pair is not None:
        absent = {"anyOf": _ABSENT}
        schema["oneOf"] = [
            {"required": [given], "properties": {given: {"not": absent}, other: absent}}
            for given, other in (pair, pair[::-1])
        ]


def _with_image(fields: type[Fields], name: str, image: Any, annotation: Any) -> type[Fields]:
    """`fields` plus the photo's field: one model per endpoint and spelling, built once."""
    namespace = {"__annotations__": {name: annotation}, name: image, "__module__": __name__, "__doc__": fields.__doc__}
    if name == IMAGE_BASE64_FIELD:
        namespace["model_config"] = ConfigDict(json_schema_extra=_legacy_spellings)
    return type(
        f"{fields.__name__.removesuffix('Fields')}{'Json' if name == IMAGE_BASE64_FIELD else 'Form'}",
        (fields,),
        namespace,
    )


_Base64 = Annotated[
    str,
    Field(
        min_length=1,
        description="the photo (JPEG, PNG or WebP) as standard base64; a data:image/…;base64, prefix is allowed",
    ),
]
_File = Annotated[
    bytes,
    Field(
        json_schema_extra={"format": "binary", "contentMediaType": "application/octet-stream"},
        description="the photo: a JPEG, PNG or WebP file",
    ),
]
# The request body of each endpoint per media type (the document's `requestBody`); the JSON
# one also validates JSON bodies (its image checked for presence and type only: its size and
# format are `shared.uploads`').
JSON_BODIES: dict[type[Fields], type[Fields]] = {
    model: _with_image(model, IMAGE_BASE64_FIELD, ..., _Base64) for model in set(FIELDS.values())
}
FORM_BODIES: dict[type[Fields], type[Fields]] = {
    model: _with_image(model, IMAGE_FIELD, ..., _File) for model in set(FIELDS.values())
}


# -- validation ---------------------------------------------------------------------------


def validate_json(endpoint: str, body: bytes) -> tuple[dict[str, Any], str]:
    """A JSON body's options and its `image_base64`; ContractError(1001) as described above."""
    model = JSON_BODIES[fields_of(endpoint)]
    try:
        checked = model.model_validate_json(body)
    except ValidationError as error:
        if error.errors()[0]["type"] != "json_invalid":
            raise refusal(error) from None
        # pydantic's parser refuses integers past ~4300 digits and deep nesting for the whole
        # body: Python's (integers as floats, `json_integer`) names the field, or says why not
        checked = _validate_python(model, _json_document(body))
    return checked.options(), getattr(checked, IMAGE_BASE64_FIELD)


def _json_document(body: bytes) -> Any:
    try:
        document = json.loads(body, parse_int=json_integer)
    except (ValueError, UnicodeDecodeError):
        raise _invalid("请求体不是有效的 JSON") from None
    except RecursionError:  # the decoder's own depth limit
        raise _invalid("请求体的 JSON 嵌套过深") from None
    return document


def validate_form(endpoint: str, form: Any) -> dict[str, Any]:
    """The options of multipart text fields (`form`: a werkzeug MultiDict or a plain dict whose
    values are text, or already JSON values); ContractError(1001) as described above."""
    model = fields_of(endpoint)
    return _validate_python(model, form_values(model, form)).options()


def _validate_python(model: type[Fields], values: Any) -> Fields:
    if not isinstance(values, dict):
        raise _invalid("请求体必须是 JSON 对象")
    try:
        return model.model_validate(values)
    except ValidationError as error:
        raise refusal(error) from None


# -- text spellings -----------------------------------------------------------------------


def form_values(model: type[Fields], form: Any) -> dict[str, Any]:
    """The values `model` validates, from multipart fields: only its own, a repeated `plans` or
    `styles` as the list; values that are not text pass as they are. Their text is decoded
    by the model, as a JSON body's is."""
    values: dict[str, Any] = {}
    for name in model.model_fields:
        given = [value for value in _all_of(form, name) if not (isinstance(value, str) and not value.strip())]
        if len(given) > 1 and name not in _REPEATABLE:
            raise _invalid(f"参数 {name} 只能提供一次，收到 {len(given)} 个")
        if len(given) > 1:  # `-F plans=a -F plans=b`
            values[name] = [value.strip() if isinstance(value, str) else value for value in given]
        elif given:
            values[name] = given[0]
    return values


def _all_of(form: Any, name: str) -> list[Any]:
    if hasattr(form, "getlist"):
        return list(form.getlist(name))
    return [form[name]] if form.get(name) is not None else []


def _json_text(name: str, text: str) -> Any:
    try:
        return json.loads(text.strip(), parse_int=json_integer)
    except ValueError:
        raise _invalid(f"参数 {name} 不是有效的 JSON：{text[:40]!r}") from None
    except RecursionError:  # the decoder's own depth limit: "[[[[…" is abuse, not a value
        raise _invalid(f"参数 {name} 的 JSON 嵌套过深") from None


def _choice_text(name: str, text: str) -> Any:
    """JSON text of the list, or comma-separated text."""
    stripped = text.strip()
    return _json_text(name, stripped) if stripped.startswith("[") else [part.strip() for part in stripped.split(",")]


def _word_text(name: str, text: str) -> str:
    return text.strip().lower()  # " Female ", "Male"


# field -> its text's decoder (blank text never reaches one: it is absent)
_TEXT_SPELLINGS: dict[str, Callable[[str, str], Any]] = {
    "gender": _word_text,
    "plans": _choice_text,
    "styles": _choice_text,
    "hairline_points": _json_text,
    "drop_mm": _number_text,
}
_REPEATABLE = frozenset({"plans", "styles"})


# -- pydantic's errors -> the contract's messages ------------------------------------------


def refusal(error: ValidationError) -> ContractError:
    """The 1001 for the first of `error`'s failures in the contract's order."""
    details = error.errors(include_url=False)
    first = min(details, key=lambda detail: 0 if detail["loc"][:1] == (IMAGE_BASE64_FIELD,) else 1)
    return _invalid(_message(first))


def _message(detail: ErrorDetails) -> str:
    loc, kind, given = detail["loc"], detail["type"], detail.get("input")
    if kind in ("missing_image", "image_not_text", "exactly_one"):
        return detail["msg"]
    if not loc:
        return "请求体必须是 JSON 对象" if kind in ("model_type", "dict_type") else detail["msg"]
    name = str(loc[0])
    explain = _FIELD_MESSAGES.get(name)
    if explain is None:  # a field added to a model without its message is a bug
        raise AssertionError(f"no message for field {name!r} ({kind})")
    return explain(loc[1:], kind, given)


def _image_message(rest: tuple[int | str, ...], kind: str, given: Any) -> str:
    if kind == "missing" or given is None or given == "":
        return MSG_NO_IMAGE
    return MSG_IMAGE_NOT_TEXT


def _gender_message(rest: tuple[int | str, ...], kind: str, given: Any) -> str:
    return f"参数 gender 无效：只能是 {' / '.join(GENDERS)}"


def _choices_message(name: str, allowed: Sequence[str]) -> Callable[[tuple[int | str, ...], str, Any], str]:
    listed = ", ".join(allowed)

    def message(rest: tuple[int | str, ...], kind: str, given: Any) -> str:
        if rest:  # one item
            return f"参数 {name} 含未知取值 {given!r}，可选值：{listed}"
        if kind == "unique_items":
            return f"参数 {name} 含重复取值"
        return f"参数 {name} 必须是非空列表，可选值：{listed}"

    return message


def _number_message(name: str, kind: str, given: Any, allowed: str) -> str:
    """A number's refusal; one out of range says the range (`allowed`) and the value given."""
    if kind == "finite_number":
        if isinstance(given, float) and math.isnan(given):
            return f"参数 {name} 必须是有限的数字"
        return f"参数 {name} 超出范围：数值过大，{allowed}"  # inf: "1e400", or a 400-digit integer
    if kind == "float_type" and isinstance(given, int) and not isinstance(given, bool):
        return f"参数 {name} 超出范围：数值过大，{allowed}"  # an int past float's range (a caller's own dict)
    if kind in ("greater_than_equal", "less_than_equal", "greater_than", "less_than"):
        return f"参数 {name} 超出范围：{shown_number(given)}，{allowed}"
    if isinstance(given, str):
        return f"参数 {name} 必须是数字，收到 {given[:40]!r}"
    return f"参数 {name} 必须是数字"


def shown_number(number: float) -> str:
    """`number` with every digit it has, as a refusal shows it: `:g` showed 40.0000001 as
    "40", a value that reads as inside 0–40 (issue 39); a whole float without its ".0"."""
    if isinstance(number, float) and number.is_integer() and abs(number) < 1e16:
        return str(int(number))
    return repr(number)


def _points_message(rest: tuple[int | str, ...], kind: str, given: Any) -> str:
    if not rest:
        if kind in ("too_short", "too_long"):
            return f"参数 hairline_points 需要 {MIN_HAIRLINE_POINTS}–{MAX_HAIRLINE_POINTS} 个点，收到 {len(given)} 个"
        return f"参数 hairline_points 必须是点的列表，{_POINTS_SHAPE}"
    index = int(rest[0])
    if len(rest) == 1 or kind == "missing":  # the point itself, or a coordinate short
        return f"参数 hairline_points 第 {index + 1} 个点无效，{_POINTS_SHAPE}"
    return _number_message(f"hairline_points[{index}]", kind, given, _COORDINATE_RANGE)


_FIELD_MESSAGES: Mapping[str, Callable[[tuple[int | str, ...], str, Any], str]] = {
    IMAGE_BASE64_FIELD: _image_message,
    "gender": _gender_message,
    "plans": _choices_message("plans", PLANS),
    "styles": _choices_message("styles", STYLES),
    "hairline_points": _points_message,
    "drop_mm": lambda rest, kind, given: _number_message("drop_mm", kind, given, _DROP_MM_RANGE),
}


# -- answers ------------------------------------------------------------------------------
# What the gateway answers (image keys as the `_url` it rewrote them to, contract.md § Images
# in responses). Numbers are JSON numbers; a key that may be null says so.

Url = Annotated[str, Field(description="an absolute URL of a PNG served by the gateway (/static/annotations/…)")]
Generator = Annotated[
    Literal["comfyui", "preview"] | None,
    Field(description="who drew grown_image_url: comfyui, the built-in preview, or null with grown_image_url null"),
]
Pixel = Annotated[tuple[float, float], Field(description="[x, y] in pixels of the upright photo")]


class _Answer(BaseModel):
    model_config = ConfigDict(frozen=True)


class ImageSize(_Answer):
    width: int
    height: int


class Pose(_Answer):
    yaw: float
    pitch: float
    roll: float


class Face(_Answer):
    bbox: Annotated[list[float], Field(min_length=4, max_length=4, description="[x, y, width, height]")]
    pose: Pose


class Calibration(_Answer):
    method: Literal["iris"]
    iris_diameter_px: float
    mm_per_px: float


class Hairline(_Answer):
    status: Literal["ok", "uncertain", "no_hairline", "occluded"]
    points: list[Pixel] | None
    trichion: Pixel | None
    shape: Literal["straight", "rounded", "m_shape", "widows_peak", "receding"] | None
    uncertainty_mm: float | None


class TempleRecession(_Answer):
    left: float | None
    right: float | None


class Measurements(_Answer):
    forehead_height_mm: float | None
    upper_third_mm: float | None
    middle_third_mm: float | None
    lower_third_mm: float | None
    thirds_ratio: Annotated[list[float], Field(min_length=3, max_length=3)] | None
    hairline_width_mm: float | None
    temple_recession_mm: TempleRecession | None


class Assessment(_Answer):
    forehead: Literal["normal", "high", "low"] | None
    notes: list[str]


class MeasureData(_Answer):
    """Endpoint 1: the hairline, the forehead and the facial thirds, measured."""

    image: ImageSize
    face: Face
    calibration: Calibration
    hairline: Hairline
    measurements: Measurements
    assessment: Assessment
    segmenter: Literal["bisenet", "hairnet", "fallback"]
    annotated_image_url: Url


class GrowResult(_Answer):
    plan: Plan
    hairline_drop_mm: float | None
    image_url: Url
    grown_image_url: Url | None
    generator: Generator


class GrowData(_Answer):
    """Endpoint 2: one result per requested plan, in the order asked."""

    results: list[GrowResult]


class MarkData(_Answer):
    """Endpoint 3: the hairline marked, and the photo grown down to it."""

    marked_image_url: Url
    grown_image_url: Url | None
    generator: Generator


class HairlineImage(_Answer):
    style: Style
    image_url: Url


class HairlineData(_Answer):
    """Endpoint 5: one design per requested style."""

    hairline_images: list[HairlineImage]


class MaskData(_Answer):
    """Endpoint 6: the hair mask (255 hair, 0 else; the photo's size)."""

    mask_image_url: Url
    hair_area_ratio: Annotated[float, Field(ge=0, le=1)]


class SpecialPoints(_Answer):
    trichion: Pixel
    glabella: Pixel
    nasion: Pixel
    subnasale: Pixel
    menton: Pixel
    left_temple: Pixel
    right_temple: Pixel
    left_iris_center: Pixel
    right_iris_center: Pixel


class SpecialPointsData(_Answer):
    """Endpoint 99: named key points of the face mesh (trichion: the mesh's top, not the hairline)."""

    image: ImageSize
    points: SpecialPoints


# endpoint -> its `data` on code 0 (endpoint 4's is the gateway's own: edge.local.features)
DATA: dict[str, type[BaseModel]] = {
    "measure": MeasureData,
    "grow": GrowData,
    "mark": MarkData,
    "hairline": HairlineData,
    "mask": MaskData,
    "special-points": SpecialPointsData,
}

RequestId = Annotated[
    str, Field(description="the client's X-Request-ID when it is 1–64 of A-Z a-z 0-9 . _ -, else the gateway's")
]


class FailureData(BaseModel):
    """A 1007's `data` when a GPU host named what went wrong (gateway.md § Failure kinds)."""

    model_config = ConfigDict(extra="forbid")
    error_type: ErrorType = Field(description="the kind of failure; X-Error-Type says it too")


class Refusal(_Answer):
    """Any other code: `message` says why, in Chinese (contract.md § Envelope); `data` is null,
    or on a GPU host's 1007 `{"error_type": …}` (gateway.md § Failure kinds)."""

    code: Annotated[
        Literal[tuple(int(code) for code in Code if code is not Code.OK)],  # type: ignore[valid-type]
        Field(
            description="1001 parameter, 1002 format, 1003 too large, 1004 resolution, 1005 no face, "
            "1006 several faces, 1007 system (retry later), 1008 not frontal"
        ),
    ]
    message: str
    request_id: RequestId
    data: FailureData | None


@functools.cache
def answer_model(data: type[BaseModel]) -> type[BaseModel]:
    """The envelope of an endpoint whose `data` is `data`: success (code 0) or a refusal."""
    success = type(
        f"{data.__name__.removesuffix('Data')}Success",
        (_Answer,),
        {
            "__annotations__": {"code": Literal[0], "message": str, "request_id": RequestId, "data": data},
            "__module__": __name__,
            "__doc__": "code 0: `data` is the endpoint's answer.",
        },
    )
    return type(  # the class's name is the document's name for it
        f"{data.__name__.removesuffix('Data')}Answer",
        (RootModel[Annotated[success | Refusal, Field(discriminator=None)]],),  # type: ignore[valid-type]
        {"__module__": __name__, "__doc__": "The envelope: HTTP 200 whatever the code; read `code`."},
    )


def envelope_errors(endpoint: str, answer: Any, data: type[BaseModel] | None = None) -> str | None:
    """None when `answer` (a parsed JSON envelope) is what `endpoint` may answer, else why
    not: the end-to-end tests check every real answer with it."""
    model = answer_model(data or DATA[endpoint])
    try:
        model.model_validate(answer)
    except ValidationError as error:
        return str(error)
    return None
