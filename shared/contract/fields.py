"""The non-image fields of each business endpoint as pydantic models, and their text spellings.

One source for three readers: the gateway checks a request with these models before a queue
slot is taken, the GPU host checks it again before its model process sees it (both through
`shared.contract.uploads`), and the gateway's `/openapi.json` is generated from them
(`edge.web.openapi`, with `shared.contract.schema`'s additions). No field rule lives anywhere else.

Two media types, one rule set (contract.md § Requests; the old parser's "both spellings are
accepted for every field", which clients rely on):
- A value is a JSON value or its text, for every field and both media types (`Fields`'
  `_spellings_then_presence`, the one place text is decoded): `null` and blank text are
  absent (the default); `gender` in any case, spaces around it ignored; `plans` and `styles`
  a list, JSON text or comma-separated text; `hairline_points` the list or its JSON text,
  each coordinate a number or its text; `drop_mm` a number or its text (`NUMBER_TEXT`);
  `null` text for either of the two is absent too.
- multipart/form-data (`form_values`): every value is text; `plans` and `styles` may also be
  repeated fields. A field given twice that takes one value is refused, never cut to its first.

A refusal is `ContractError(1001)` with the Chinese message that names the field
(`shared.contract.refusals`). Fields an endpoint does not know are ignored.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from typing import Annotated, Any, ClassVar, Literal, get_args

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    Strict,
    WithJsonSchema,
    model_validator,
)
from pydantic_core import PydanticCustomError

from shared.contract.codes import Code, ContractError

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


def json_integer(text: str) -> int | float:
    """`parse_int` for every JSON document a client sends: an integer too long for a float
    is +-inf (out of range, a 1001 naming its field), never an OverflowError in `float()`
    or the int-to-str digit limit's ValueError (4300 digits) for the whole body."""
    return int(text) if len(text) <= _MAX_EXACT_INTEGER_DIGITS else float(text)


def invalid(message: str) -> ContractError:
    """A 1001 saying `message`."""
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
# gateway's document puts the configured value there (`shared.contract.schema.bound_coordinates`).
MAX_SIDE_MARK = "x-maximum-is-max-long-side-px"
Coordinate = Annotated[
    Number,
    BeforeValidator(_coordinate),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "number", "minimum": 0, MAX_SIDE_MARK: True},
                {"type": "string", "pattern": NUMBER_TEXT, "description": "the number as text, within the same bounds"},
            ]
        }
    ),
]


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


# -- text spellings -----------------------------------------------------------------------


def form_values(model: type[Fields], form: Any) -> dict[str, Any]:
    """The values `model` validates, from multipart fields: only its own, a repeated `plans` or
    `styles` as the list; values that are not text pass as they are. Their text is decoded
    by the model, as a JSON body's is."""
    values: dict[str, Any] = {}
    for name in model.model_fields:
        given = [value for value in _all_of(form, name) if not (isinstance(value, str) and not value.strip())]
        if len(given) > 1 and name not in _REPEATABLE:
            raise invalid(f"参数 {name} 只能提供一次，收到 {len(given)} 个")
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
        raise invalid(f"参数 {name} 不是有效的 JSON：{text[:40]!r}") from None
    except RecursionError:  # the decoder's own depth limit: "[[[[…" is abuse, not a value
        raise invalid(f"参数 {name} 的 JSON 嵌套过深") from None


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
