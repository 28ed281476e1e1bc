"""parse_options: every non-image field of every GPU endpoint, as JSON values and as form text."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from shared.contract import Code, ContractError
from shared.contract.bodies import parse_options


def _rejects(endpoint: str, fields: dict[str, Any], field_name: str) -> ContractError:
    with pytest.raises(ContractError) as caught:
        parse_options(endpoint, fields)
    assert caught.value.code == Code.INVALID_PARAMETER
    assert field_name in caught.value.message, caught.value.message
    return caught.value


def test_defaults_when_fields_absent() -> None:
    assert parse_options("measure", {}) == {"gender": "unknown"}
    assert parse_options("grow", {}) == {"plans": ["conservative", "standard", "aggressive"], "gender": "unknown"}
    assert parse_options("hairline", {})["styles"] == ["straight", "rounded", "m_shape", "widows_peak"]
    assert parse_options("mask", {"gender": "nonsense"}) == {}  # fields an endpoint does not know are ignored
    assert parse_options("special-points", {}) == {}


@pytest.mark.parametrize(
    "value, expected", [("male", "male"), (" Female ", "female"), ("", "unknown"), (None, "unknown")]
)
def test_gender_accepted(value: Any, expected: str) -> None:
    assert parse_options("measure", {"gender": value}) == {"gender": expected}


@pytest.mark.parametrize("value", ["man", 1, ["male"], True])
def test_gender_rejected(value: Any) -> None:
    _rejects("measure", {"gender": value}, "gender")


@pytest.mark.parametrize(
    "value, expected",
    [
        (["standard"], ["standard"]),
        ("aggressive,conservative", ["aggressive", "conservative"]),  # multipart: comma-separated, order kept
        (' ["standard", "aggressive"] ', ["standard", "aggressive"]),  # multipart: JSON text
        ("standard , aggressive", ["standard", "aggressive"]),
    ],
)
def test_plans_accepted(value: Any, expected: list[str]) -> None:
    assert parse_options("grow", {"plans": value})["plans"] == expected


@pytest.mark.parametrize(
    "value", [[], ["standard", "standard"], ["bold"], "standard,,aggressive", "[standard", [1], {"a": 1}, 3]
)
def test_plans_rejected(value: Any) -> None:
    _rejects("grow", {"plans": value}, "plans")


def test_styles_validated_like_plans() -> None:
    assert parse_options("hairline", {"styles": "m_shape"})["styles"] == ["m_shape"]
    error = _rejects("hairline", {"styles": ["receding"]}, "styles")
    assert "widows_peak" in error.message  # the message lists what is allowed


@pytest.mark.parametrize(
    "fields, expected",
    [
        ({"drop_mm": 12}, {"hairline_points": None, "drop_mm": 12.0}),
        ({"drop_mm": "0"}, {"hairline_points": None, "drop_mm": 0.0}),
        ({"drop_mm": 40.0, "hairline_points": ""}, {"hairline_points": None, "drop_mm": 40.0}),
        (
            {"hairline_points": [[1, 2], [3.5, 4], [5, 6]]},
            {"hairline_points": [[1, 2], [3.5, 4], [5, 6]], "drop_mm": None},
        ),
        (
            {"hairline_points": "[[1,2],[3,4],[5,6]]", "drop_mm": None},
            {"hairline_points": [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], "drop_mm": None},
        ),
    ],
)
def test_mark_accepted(fields: dict[str, Any], expected: dict[str, Any]) -> None:
    assert parse_options("mark", fields) == expected


@pytest.mark.parametrize(
    "fields, named",
    [
        ({}, "hairline_points"),
        ({"drop_mm": 5, "hairline_points": [[1, 2], [3, 4], [5, 6]]}, "drop_mm"),
        ({"drop_mm": -0.5}, "drop_mm"),
        ({"drop_mm": 40.01}, "drop_mm"),
        ({"drop_mm": "five"}, "drop_mm"),
        ({"drop_mm": "nan"}, "drop_mm"),
        ({"drop_mm": True}, "drop_mm"),
        ({"hairline_points": [[1, 2], [3, 4]]}, "hairline_points"),
        ({"hairline_points": [[1, 2], [3, 4], [5]]}, "hairline_points"),
        ({"hairline_points": [[1, 2], [3, 4], [5, "x"]]}, "hairline_points"),
        ({"hairline_points": [[1, 2], [3, 4], [5, None]]}, "hairline_points"),
        ({"hairline_points": "[[1,2],[3,4],[5,6]"}, "hairline_points"),
        ({"hairline_points": {"x": 1}}, "hairline_points"),
        ({"hairline_points": [[0, 0]] * 1001}, "hairline_points"),
    ],
)
def test_mark_rejected(fields: dict[str, Any], named: str) -> None:
    _rejects("mark", fields, named)


HUGE = 10**400  # a 400-digit integer: float() of it overflows


@pytest.mark.parametrize(
    "fields, named",
    [
        ({"drop_mm": HUGE}, "drop_mm"),
        ({"drop_mm": -HUGE}, "drop_mm"),
        ({"drop_mm": str(HUGE)}, "drop_mm"),  # a multipart field
        ({"drop_mm": "1e400"}, "drop_mm"),
        ({"hairline_points": [[1, 2], [3, HUGE], [5, 6]]}, "hairline_points[1]"),
        ({"hairline_points": f"[[1,2],[3,4],[{HUGE},6]]"}, "hairline_points[2]"),  # JSON text in a form field
        ({"hairline_points": f"[[1,2],[3,4],[{'9' * 5000},6]]"}, "hairline_points[2]"),  # past int's digit limit
    ],
)
def test_a_number_of_any_length_is_out_of_range_not_a_crash(fields: dict[str, Any], named: str) -> None:
    error = _rejects("mark", fields, named)
    assert "超出范围" in error.message, error.message


def test_unknown_endpoint_is_a_programming_error() -> None:
    with pytest.raises(ValueError):
        parse_options("nothing", {})


def test_importing_options_loads_no_heavy_library() -> None:
    """The gateway and the GPU host's web process import this module: it must not pull numpy/torch/mediapipe."""
    code = (
        "import sys, shared.contract.uploads;"
        " print(sorted(m for m in ('numpy', 'torch', 'mediapipe', 'cv2') if m in sys.modules))"
    )
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert loaded == "[]"


def test_choices_match_the_analysis_types() -> None:
    from typing import get_args

    from analysis import types
    from shared.contract import fields

    assert fields.PLANS == types.PLANS and fields.STYLES == types.STYLES
    assert get_args(types.Gender) == fields.GENDERS
