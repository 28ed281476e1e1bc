"""What the OpenAPI document adds to the fields' own JSON Schema.

A multipart body's schema shows the JSON values its text stands for; a JSON body's shows
both, the JSON value first (preferred), so that a generated client or fuzzer knows what the
service accepts (Schemathesis' negative cases are then truly refused). The patterns are
Python's and ECMA's both: the document carries them, the fields match with them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from shared.contract.fields import (
    BLANK_TEXT,
    GENDERS,
    MAX_DROP_MM,
    MAX_HAIRLINE_POINTS,
    MAX_SIDE_MARK,
    MIN_HAIRLINE_POINTS,
    NULL_TEXT,
    NUMBER_TEXT,
    PLANS,
    STYLES,
)

_JSON_SPACE = r"[ \t\n\r]*"  # json.loads' whitespace
_JSON_NUMBER = r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?"


def _any_case(word: str) -> str:
    """`word` in any case, as a pattern (`str.lower` maps the Kelvin sign to k)."""
    return "".join(f"[{letter}{letter.upper()}{chr(0x212A) if letter == 'k' else ''}]" for letter in word)


def bound_coordinates(schema: Any, max_long_side_px: int) -> None:
    """Every coordinate in `schema` (a JSON Schema or a document holding some, changed in
    place) bounded to 0–`max_long_side_px`, the largest photo side the service takes."""
    if isinstance(schema, dict):
        if schema.pop(MAX_SIDE_MARK, False):
            schema["maximum"] = max_long_side_px
        for value in schema.values():
            bound_coordinates(value, max_long_side_px)
    elif isinstance(schema, list):
        for value in schema:
            bound_coordinates(value, max_long_side_px)


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


def legacy_spellings(schema: dict[str, Any], model: type[Any]) -> None:
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
