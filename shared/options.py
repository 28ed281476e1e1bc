"""The non-image fields of each business endpoint: parsed and validated into plain Python.

Pure on purpose (no numpy, torch or mediapipe): the gateway (before a queue slot is taken)
and the GPU host's web process (before any work reaches the model process) both call
`parse_options` through `shared.uploads`, so a bad field costs a dict lookup, not a model
call (gpu_host.md: 1001 comes before every image check).

Fields arrive either as JSON values (application/json) or as text (multipart form
fields; JSON-valued fields as JSON text). Both spellings are accepted for every field.
An empty text field counts as absent. Fields an endpoint does not know are ignored, as a
client sending `gender` to `mask` would expect.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from typing import Any

from shared.contract import Code, ContractError

GENDERS = ("male", "female", "unknown")
PLANS = ("conservative", "standard", "aggressive")  # == analysis.types.PLANS (no numpy import here)
STYLES = ("straight", "rounded", "m_shape", "widows_peak")  # == analysis.types.STYLES
MAX_DROP_MM = 40.0
MIN_HAIRLINE_POINTS = 3
MAX_HAIRLINE_POINTS = 1000  # a hand-drawn polyline; more is a bug or abuse, not a hairline
# Longer JSON integers are read as floats (+-inf past ~309 digits): every number here is one.
_MAX_EXACT_INTEGER_DIGITS = 20

# The endpoints whose answers carry grown images (`grown_image_base64` + `generator`).
GENERATING_ENDPOINTS = ("grow", "mark")
# Between the GPU host's web process and its model process only (`parse_options` never
# sets it, so no client can): with ComfyUI configured the host sets this option, and each
# grow result (and the mark answer) then carries its inpainting mask, a base64 PNG, under
# INPAINT_MASK_KEY instead of a preview. The key does not end in `_base64`, so the gateway
# would never publish it; the host removes it before answering (gpu_host.comfyui).
INPAINT_MASK_OPTION = "inpaint_masks"
INPAINT_MASK_KEY = "inpaint_mask_png"


def _invalid(message: str) -> ContractError:
    return ContractError(Code.INVALID_PARAMETER, message)


def _present(fields: dict[str, Any], name: str) -> bool:
    value = fields.get(name)
    return value is not None and not (isinstance(value, str) and not value.strip())


def json_integer(text: str) -> int | float:
    """`parse_int` for every JSON document a client sends: an integer too long for a float
    is +-inf (out of range, a 1001 naming its field), never an OverflowError in `float()`
    or the int-to-str digit limit's ValueError (4300 digits) for the whole body."""
    return int(text) if len(text) <= _MAX_EXACT_INTEGER_DIGITS else float(text)


def _json_text(name: str, value: str) -> Any:
    try:
        return json.loads(value, parse_int=json_integer)
    except ValueError:
        raise _invalid(f"参数 {name} 不是有效的 JSON：{value[:40]!r}") from None
    except RecursionError:  # the decoder's own depth limit: "[[[[…" is abuse, not a value
        raise _invalid(f"参数 {name} 的 JSON 嵌套过深") from None


def _finite_number(name: str, value: Any) -> float:
    """A JSON number or its text; booleans, NaN and infinities are not numbers here."""
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            raise _invalid(f"参数 {name} 必须是数字，收到 {value[:40]!r}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _invalid(f"参数 {name} 必须是数字")
    try:
        number = float(value)  # an int past float's range (a caller's own dict) overflows here
    except OverflowError:
        number = math.inf if value > 0 else -math.inf
    if math.isnan(number):
        raise _invalid(f"参数 {name} 必须是有限的数字")
    if math.isinf(number):  # "1e400", or a 400-digit integer as text or JSON
        raise _invalid(f"参数 {name} 超出范围：数值过大")
    return number


def _gender(fields: dict[str, Any]) -> str:
    if not _present(fields, "gender"):
        return "unknown"
    value = fields["gender"]
    if not isinstance(value, str) or value.strip().lower() not in GENDERS:
        raise _invalid(f"参数 gender 无效：只能是 {' / '.join(GENDERS)}")
    return value.strip().lower()


def _choice_list(fields: dict[str, Any], name: str, allowed: Sequence[str]) -> list[str]:
    """A subset of `allowed`, in the client's order: a list, JSON text or comma-separated text."""
    if not _present(fields, name):
        return list(allowed)
    value = fields[name]
    if isinstance(value, str):
        text = value.strip()
        value = _json_text(name, text) if text.startswith("[") else [part.strip() for part in text.split(",")]
    if not isinstance(value, list) or not value:
        raise _invalid(f"参数 {name} 必须是非空列表，可选值：{', '.join(allowed)}")
    unknown = [item for item in value if not isinstance(item, str) or item not in allowed]
    if unknown:
        raise _invalid(f"参数 {name} 含未知取值 {unknown[0]!r}，可选值：{', '.join(allowed)}")
    if len(set(value)) != len(value):
        raise _invalid(f"参数 {name} 含重复取值")
    return list(value)


def _hairline_points(value: Any) -> list[list[float]]:
    if isinstance(value, str):
        value = _json_text("hairline_points", value.strip())
    shape_hint = "格式应为 [[x, y], [x, y], …]"
    if not isinstance(value, list):
        raise _invalid(f"参数 hairline_points 必须是点的列表，{shape_hint}")
    if not MIN_HAIRLINE_POINTS <= len(value) <= MAX_HAIRLINE_POINTS:
        raise _invalid(
            f"参数 hairline_points 需要 {MIN_HAIRLINE_POINTS}–{MAX_HAIRLINE_POINTS} 个点，收到 {len(value)} 个"
        )
    points = []
    for index, point in enumerate(value):
        if not isinstance(point, list) or len(point) != 2:
            raise _invalid(f"参数 hairline_points 第 {index + 1} 个点无效，{shape_hint}")
        points.append([_finite_number(f"hairline_points[{index}]", coordinate) for coordinate in point])
    return points


def _mark(fields: dict[str, Any]) -> dict[str, Any]:
    has_points, has_drop = _present(fields, "hairline_points"), _present(fields, "drop_mm")
    if has_points == has_drop:
        raise _invalid("参数 hairline_points 与 drop_mm 必须且只能提供其中一个")
    if has_points:
        return {"hairline_points": _hairline_points(fields["hairline_points"]), "drop_mm": None}
    drop_mm = _finite_number("drop_mm", fields["drop_mm"])
    if not 0 <= drop_mm <= MAX_DROP_MM:
        raise _invalid(f"参数 drop_mm 超出范围：{drop_mm:g}，应在 0–{MAX_DROP_MM:g} 毫米之间")
    return {"hairline_points": None, "drop_mm": drop_mm}


_PARSERS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "measure": lambda fields: {"gender": _gender(fields)},
    "grow": lambda fields: {"plans": _choice_list(fields, "plans", PLANS), "gender": _gender(fields)},
    "mark": _mark,
    "hairline": lambda fields: {"styles": _choice_list(fields, "styles", STYLES), "gender": _gender(fields)},
    "mask": lambda fields: {},
    "special-points": lambda fields: {},
}

ENDPOINTS = tuple(_PARSERS)


def parse_options(endpoint: str, fields: dict[str, Any]) -> dict[str, Any]:
    """The validated options of `endpoint`; raises ContractError(1001) naming the bad field.

    measure -> {"gender"}; grow -> {"plans", "gender"}; mark -> {"hairline_points",
    "drop_mm"} (one of them None); hairline -> {"styles", "gender"}; mask,
    special-points -> {}. `gender` on grow and hairline is an optional extension of
    contract.md: the design heights depend on it (analysis.md § Designs).
    """
    try:
        parser = _PARSERS[endpoint]
    except KeyError:
        raise ValueError(f"unknown endpoint {endpoint!r}; known: {', '.join(ENDPOINTS)}") from None
    return parser(fields)
