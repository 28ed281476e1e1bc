"""pydantic's errors -> the contract's messages: each field's refusal, in Chinese, naming it.

A refusal is the first of pydantic's failures in the contract's order: the image, then the
fields' presence, then each field in its order (`refusal`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pydantic import ValidationError
from pydantic_core import ErrorDetails

from shared.contract.codes import ContractError
from shared.contract.fields import (
    GENDERS,
    IMAGE_BASE64_FIELD,
    MAX_DROP_MM,
    MAX_HAIRLINE_POINTS,
    MIN_HAIRLINE_POINTS,
    MSG_IMAGE_NOT_TEXT,
    MSG_NO_IMAGE,
    PLANS,
    STYLES,
    invalid,
)

_POINTS_SHAPE = "格式应为 [[x, y], [x, y], …]"
# What a refusal of a number out of range says is allowed (`_number_message`).
_DROP_MM_RANGE = f"应在 0–{MAX_DROP_MM:g} 毫米之间"
_COORDINATE_RANGE = "应在图片范围内：x 在 0 到图片宽度之间，y 在 0 到高度之间（像素）"


def refusal(error: ValidationError) -> ContractError:
    """The 1001 for the first of `error`'s failures in the contract's order."""
    details = error.errors(include_url=False)
    first = min(details, key=lambda detail: 0 if detail["loc"][:1] == (IMAGE_BASE64_FIELD,) else 1)
    return invalid(_message(first))


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
