"""Schemathesis hooks of tests/edge/e2e/test_e2e_openapi.py (loaded by SCHEMATHESIS_HOOKS).

Two of Schemathesis' checks assume refusals are HTTP 4xx (`negative_data_rejection`,
`unsupported_method`); every `/api/` answer here is HTTP 200 with an envelope, so they are
replaced by checks of the envelope (contract.md § The contract as a document):
- a negative case never gets code 0;
- a positive case carrying a real photo never gets 1001–1004 (one in FACE_EVERY carries a
  real face and is answered code 0 — its data checked against the schema — the others a
  photo without one: 1005);
- another method than POST gets 1001 with `Allow: POST`.

A positive case is made valid in what the schema cannot say: the photo is a real one (the
schema knows "a binary file" / "a string"), `hairline_points` lie inside it ("inside the
photo" is prose; in a list or its JSON text, each coordinate a number or its text), a
`drop_mm` given as text is in 0–40 (a pattern has no range) and `plans` / `styles` given as
text name each value once, and an `Idempotency-Key` is fresh (a key reused with another body
is a 1001 by design, and generated keys repeat).
"""

from __future__ import annotations

import base64
import json
import math
import os
import re
import uuid
from dataclasses import dataclass
from typing import Any

import requests
import schemathesis
from schemathesis.generation.meta import CoverageScenario
from schemathesis.generation.modes import GenerationMode

from shared.contract import MSG_NO_HAIRLINE_TO_LOWER

PHOTO = open(os.environ["HAIRGATE_OPENAPI_PHOTO"], "rb").read()  # noqa: SIM115 (read once, at import)
# A valid photo without a face (1005 in milliseconds): what most positive cases carry, so that
# the real analysis (~1 s on a CPU) runs for every FACE_EVERY-th positive case of an operation.
FACELESS = open(os.environ["HAIRGATE_OPENAPI_FACELESS"], "rb").read()  # noqa: SIM115
FACE_EVERY = 4
WIDTH, HEIGHT = (int(side) for side in os.environ["HAIRGATE_OPENAPI_PHOTO_SIZE"].split("x"))
ABOUT_THE_REQUEST = {1001, 1002, 1003, 1004}
MEDIA_TYPES = ("multipart/form-data", "application/json")
# CoverageScenario lists its positive scenarios first, up to DEFAULT_POSITIVE_TEST
_SCENARIOS = list(CoverageScenario)
_POSITIVE_SCENARIOS = frozenset(_SCENARIOS[: _SCENARIOS.index(CoverageScenario.DEFAULT_POSITIVE_TEST) + 1])
METHODS = ("GET", "PUT", "PATCH", "DELETE", "OPTIONS")
_METHODS_CHECKED: set[str] = set()
_POSITIVES: dict[str, int] = {}  # positive cases given a photo, per operation


@dataclass(frozen=True)
class _Generated:
    mode: GenerationMode
    negative_in: frozenset[str]  # the parts (body, header, …) generated against the schema


# Read before `map_case` edits a case: Schemathesis re-judges an edited case against the
# schema, and takes any body that holds a file for negative (it cannot check bytes).
_GENERATED: dict[int, tuple[Any, _Generated]] = {}


def _generated(case: Any) -> _Generated:
    known = _GENERATED.get(id(case))
    return known[1] if known is not None and known[0] is case else _as_generated(case)


def _as_generated(case: Any) -> _Generated:
    meta = case.meta
    if meta is None:
        return _Generated(GenerationMode.POSITIVE, frozenset())
    negative = frozenset(
        str(location.value) for location, info in meta.components.items() if info.mode == GenerationMode.NEGATIVE
    )
    scenario = getattr(meta.phase.data, "scenario", None)
    if scenario is not None and scenario not in _POSITIVE_SCENARIOS:
        # the coverage phase labels some of its schema violations positive (an unsupported
        # Content-Type, an item of the wrong type): its scenario says what the case is
        location = meta.phase.data.parameter_location
        return _Generated(GenerationMode.NEGATIVE, negative | {str(location.value) if location else "body"})
    return _Generated(meta.generation.mode, negative)


def _positive(case: Any) -> bool:
    """Valid by the schema in every part, sent as one of its media types."""
    generated = _generated(case)
    return generated.mode == GenerationMode.POSITIVE and not generated.negative_in and case.media_type in MEDIA_TYPES


def _within(value: Any, side: float) -> Any:
    """A coordinate (a number or its text, as the schema allows) moved into [0, side)."""
    try:
        number = float(value) if isinstance(value, str) else value
    except ValueError:
        return value
    if not isinstance(number, (int, float)) or isinstance(number, bool):
        return value
    inside = abs(number) % side if math.isfinite(number) else 0.0  # "1e400" is text that matches
    return str(inside) if isinstance(value, str) else inside


def _inside(point: Any) -> Any:
    if not (isinstance(point, list) and len(point) == 2):
        return point
    return [_within(point[0], WIDTH), _within(point[1], HEIGHT)]


def _points_inside(points: Any) -> Any:
    if isinstance(points, str) and points.strip().startswith("["):  # the legacy JSON text
        # stripped as the models strip it: the pattern's \s is Unicode's, wider than JSON's
        return json.dumps(_points_inside(json.loads(points.strip())))
    return [_inside(point) for point in points] if isinstance(points, list) else points


def _distinct_text(text: Any) -> Any:
    """`plans` / `styles` as text (comma-separated or JSON): each value once, in its order."""
    if not isinstance(text, str) or not text.strip():
        return text
    values = re.findall(r"[a-z_]+", text)
    return ",".join(dict.fromkeys(values))


@schemathesis.hook
def map_case(context: Any, case: Any) -> Any:
    _GENERATED[id(case)] = (case, _as_generated(case))  # the case itself: ids are reused
    if not _positive(case):
        return case
    if isinstance(case.body, dict):
        body = dict(case.body)
        served = _POSITIVES[case.operation.label] = _POSITIVES.get(case.operation.label, 0) + 1
        photo = PHOTO if served % FACE_EVERY == 1 else FACELESS
        if "image" in body:
            body["image"] = photo
        if "image_base64" in body:
            body["image_base64"] = base64.b64encode(photo).decode()
        if "hairline_points" in body:
            body["hairline_points"] = _points_inside(body["hairline_points"])
        if isinstance(body.get("drop_mm"), str) and body["drop_mm"].strip() not in ("", "null"):
            body["drop_mm"] = _within(body["drop_mm"], 40)  # text of a number: 0–40, as the number
        for name in ("plans", "styles"):
            if name in body:
                body[name] = _distinct_text(body[name])
        case.body = body
    if case.headers and "idempotency-key" in {name.lower() for name in case.headers}:
        case.headers = {
            name: (str(uuid.uuid4()) if name.lower() == "idempotency-key" else value)
            for name, value in case.headers.items()
        }
    return case


def _has_photo(case: Any) -> bool:
    return isinstance(case.body, dict) and bool({"image", "image_base64"} & set(case.body))


def _envelope(response: Any) -> dict[str, Any]:
    body = response.json()
    assert isinstance(body, dict) and set(body) == {"code", "message", "request_id", "data"}, f"not an envelope: {body}"
    return body


@schemathesis.check
def negative_case_never_succeeds(ctx: Any, response: Any, case: Any) -> bool | None:
    """A request the schema refuses never gets code 0."""
    generated = _generated(case)
    if generated.mode != GenerationMode.NEGATIVE or not generated.negative_in:
        return None
    body = _envelope(response)
    assert body["code"] != 0, (
        f"negative in {sorted(generated.negative_in)}, answered code 0: "
        f"headers {case.headers!r}, body {str(case.body)[:300]}"
    )
    return True


@schemathesis.check
def real_photo_is_never_refused_as_a_bad_request(ctx: Any, response: Any, case: Any) -> bool | None:
    """A valid case with a real photo never gets 1001–1004, but for the one refusal the photo
    itself causes: `drop_mm` where no hairline shows (the astronaut's fringe hides hers)."""
    if not _positive(case) or case.method.upper() != "POST" or not _has_photo(case):
        return None  # another method (unsupported_method's cases), or no body (a header's scenario)
    body = _envelope(response)
    if body["message"] == MSG_NO_HAIRLINE_TO_LOWER.format(status="occluded") and "drop_mm" in case.body:
        return True
    assert body["code"] not in ABOUT_THE_REQUEST, f"valid request refused: {body['code']} {body['message']}"
    return True


@schemathesis.check
def other_methods_get_1001_with_allow(ctx: Any, response: Any, case: Any) -> bool | None:
    """Every other method on a business path: 1001 naming it, and `Allow: POST`."""
    url = response.request.url
    if case.method.upper() != "POST" or url in _METHODS_CHECKED:
        return None
    _METHODS_CHECKED.add(url)  # once per path: the answer depends on nothing else
    for method in METHODS:
        answer = requests.request(method, url, timeout=10)
        assert answer.status_code == 200, f"{method}: HTTP {answer.status_code}"
        assert answer.headers.get("Allow") == "POST", f"{method}: Allow {answer.headers.get('Allow')!r}"
        body = answer.json() if method != "HEAD" else {"code": 1001}
        assert body["code"] == 1001 and method in body["message"], f"{method}: {body}"
    return True
