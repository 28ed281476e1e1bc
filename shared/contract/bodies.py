"""Each endpoint's request body per media type, and the validation of its fields.

The JSON body is validated straight from its bytes (`pydantic_core`'s parser: ~0.2 ms for
2 MB, json.loads ~1.7 ms); its image is checked for presence and type only here (its size
and format are `shared.contract.uploads`'). multipart's text fields are validated as values.
"""

from __future__ import annotations

import functools
import json
from typing import Annotated, Any

from pydantic import ConfigDict, Field, ValidationError

from shared.contract.endpoints import endpoint
from shared.contract.fields import IMAGE_BASE64_FIELD, IMAGE_FIELD, Fields, form_values, invalid, json_integer
from shared.contract.refusals import refusal
from shared.contract.schema import legacy_spellings

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


@functools.cache
def json_body(fields: type[Fields]) -> type[Fields]:
    """The JSON request body of the endpoint taking `fields` (the document's `requestBody`
    too): `image_base64` beside them, their text spellings in its schema."""
    return _with_image(fields, IMAGE_BASE64_FIELD, _Base64, ConfigDict(json_schema_extra=legacy_spellings))


@functools.cache
def form_body(fields: type[Fields]) -> type[Fields]:
    """The multipart request body of the endpoint taking `fields`, as the document shows it."""
    return _with_image(fields, IMAGE_FIELD, _File)


def _with_image(fields: type[Fields], name: str, annotation: Any, config: ConfigDict | None = None) -> type[Fields]:
    """`fields` plus the photo's field, required."""
    namespace: dict[str, Any] = {
        "__annotations__": {name: annotation},
        name: ...,
        "__module__": __name__,
        "__doc__": fields.__doc__,
    }
    if config is not None:
        namespace["model_config"] = config
    return type(
        f"{fields.__name__.removesuffix('Fields')}{'Json' if name == IMAGE_BASE64_FIELD else 'Form'}",
        (fields,),
        namespace,
    )


def validate_json(name: str, body: bytes) -> tuple[dict[str, Any], str]:
    """A JSON body's options and its `image_base64`; ContractError(1001) naming the field."""
    model = json_body(endpoint(name).fields)
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
        raise invalid("请求体不是有效的 JSON") from None
    except RecursionError:  # the decoder's own depth limit
        raise invalid("请求体的 JSON 嵌套过深") from None
    return document


def parse_options(name: str, fields: Any) -> dict[str, Any]:
    """The validated options of endpoint `name` from form-style fields (a werkzeug MultiDict
    of multipart's text fields, or a plain dict of text or JSON values); ContractError(1001)
    naming the bad field, ValueError for an unknown endpoint.

    measure -> {"gender"}; grow -> {"plans", "gender"}; mark -> {"hairline_points",
    "drop_mm"} (one of them None); hairline -> {"styles", "gender"}; mask,
    special-points, features -> {}. `gender` on grow and hairline is an optional extension
    of contract.md: the design heights depend on it (analysis.md § Designs).
    """
    model = endpoint(name).fields
    return _validate_python(model, form_values(model, fields)).options()


def _validate_python(model: type[Fields], values: Any) -> Fields:
    if not isinstance(values, dict):
        raise invalid("请求体必须是 JSON 对象")
    try:
        return model.model_validate(values)
    except ValidationError as error:
        raise refusal(error) from None
