"""`GET /openapi.json` and `GET /docs`: the public contract as an OpenAPI 3.1 document.

The document is generated from the endpoint registry and the models both services validate
with (`shared.contract`), never written beside them (contract.md § The contract as a document). quart-schema builds it,
through its public hooks: its `document_*` decorators mark each business route with its
fields model, headers and answer, and `ContractDocument` (its `openapi_provider_class` hook:
the methods it documents as overridable) keeps the document to the business endpoints,
gives each request body both media types, and puts the answer headers and a real example
answer where OpenAPI wants them. quart-schema's app extension itself is not installed: it
would replace the gateway's JSON provider, response conversion and WebSocket class, and
rebuild the document on every request.

Built once: at start, and again on the first request after a reload changed the settings it
states (`edge.web.entrance.DocumentFacts`: the rate-limit key header, the public base URL,
the largest photo side that bounds `hairline_points`' coordinates); answered as stored bytes. `/docs` is
Swagger UI 5 with its files served here from the installed `flask_swagger_ui` package (its
`dist/`): no CDN, which clinics' networks block.
"""

from __future__ import annotations

import importlib.util
import json
from importlib.metadata import version
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, Field, TypeAdapter, create_model
from quart import Blueprint, Quart
from quart import Response as QuartResponse
from quart_schema import document_headers, document_request, document_response, operation_id, tag
from quart_schema.extension import QuartSchema
from quart_schema.openapi import QUART_SCHEMA_OPERATION_ID_ATTRIBUTE, Info, OpenAPIProvider, Server, Tag
from quart_schema.validation import DataSource
from werkzeug.routing.rules import Rule

from edge.web.entrance import DocumentFacts, Entrance
from shared.contract import (
    HEADER_ALTERNATIVE_ENDPOINT,
    HEADER_CURRENT_LOAD,
    HEADER_ERROR_TYPE,
    HEADER_EXECUTION_ID,
    HEADER_IDEMPOTENCY_KEY,
    HEADER_IDEMPOTENCY_REPLAYED,
    HEADER_MODEL_VERSION,
    HEADER_REQUEST_ID,
    HEADER_RETRY_AFTER,
    HEADER_RETRY_POLICY,
    MSG_IDEMPOTENCY_KEY_INVALID,
    ErrorType,
    RetryAdvice,
)
from shared.contract.bodies import form_body, json_body
from shared.contract.endpoints import ENDPOINTS, AnsweredBy, Endpoint, endpoint_at
from shared.contract.envelope import answer_model
from shared.contract.fields import IMAGE_FIELD
from shared.contract.headers import MODEL_VERSION_PATTERN
from shared.contract.schema import bound_coordinates

if TYPE_CHECKING:
    from edge.gateway import Gateway

OPENAPI_PATH = "/openapi.json"
DOCS_PATH = "/docs"
DOCS_ASSETS_PATH = "/docs/assets"
PACKAGE = "hairgate"
_REF = "#/components/schemas/{model}"
_SWAGGER_FILES = frozenset(
    {
        "swagger-ui-bundle.js",
        "swagger-ui-standalone-preset.js",
        "swagger-ui.css",
        "favicon-32x32.png",
        "favicon-16x16.png",
    }
)
_EXAMPLES = json.loads((Path(__file__).with_name("openapi_examples.json")).read_text(encoding="utf-8"))


def _no_default(schema: dict[str, Any]) -> None:
    schema.pop("default", None)  # an absent header has no value to show


def request_headers(key_header: str) -> type[BaseModel]:
    """The headers a client may send; field names are the headers' in snake case."""
    fields: dict[str, Any] = {
        "x_request_id": (
            str,
            Field(
                None,
                json_schema_extra=_no_default,
                description=(
                    f"{HEADER_REQUEST_ID}: your id for this request, echoed in request_id and the answer's "
                    "header when it is "
                    "1–64 of A-Z a-z 0-9 . _ -; anything else is replaced by a generated id"
                ),
            ),
        ),
        "idempotency_key": (
            str,
            Field(
                None,
                pattern=r"^[ -~]{1,128}$",
                json_schema_extra=_no_default,
                description=(
                    f"{HEADER_IDEMPOTENCY_KEY}: makes a retry safe (docs/api.md § Retrying); else 1001 "
                    f"{MSG_IDEMPOTENCY_KEY_INVALID}"
                ),
            ),
        ),
    }
    if key_header:
        name = key_header.lower().replace("-", "_")
        fields[name] = (
            str,
            Field(
                None,
                json_schema_extra=_no_default,
                description=(f"{key_header}: your API key, the rate limit's key (docs/api.md § Rate limit)"),
            ),
        )
    return create_model("RequestHeaders", **fields)


class AnswerHeaders(BaseModel):
    """Documentation only: the headers of every `/api/` answer (`ContractDocument` places them)."""

    x_request_id: str = Field(description="the answer's request_id")
    retry_after: int = Field(
        None,
        ge=0,
        json_schema_extra=_no_default,  # type: ignore[assignment]
        description=(
            "seconds to wait before retrying, on every 1007: from the failure's kind and when the pool "
            "may next take a job (docs/api.md § Retry guidance)"
        ),
    )
    x_retry_policy: Literal[tuple(advice.value for advice in RetryAdvice)] = Field(  # type: ignore[valid-type]
        None,
        json_schema_extra=_no_default,
        description=(
            "on every 1007 (and a photo refused for its content): how to space retries — exponential_backoff "
            "(double the wait each time), fixed (wait Retry-After each time), none (do not retry it as it is)"
        ),
    )
    x_error_type: Literal[tuple(kind.value for kind in ErrorType)] = Field(  # type: ignore[valid-type]
        None,
        json_schema_extra=_no_default,
        description="what went wrong on the GPU host, when one named it (also in a 1007's data.error_type)",
    )
    x_current_load: str = Field(
        pattern=r"^(0\.\d\d|1\.00)$",
        description="busy GPU hosts over online ones, 0.00-1.00 (1.00: none online): degrade before you are refused",
    )
    x_alternative_endpoint: str = Field(
        None,
        json_schema_extra=_no_default,  # type: ignore[assignment]
        description="another entrance to try meanwhile, on an answer with Retry-After (when configured)",
    )
    idempotency_replayed: str = Field(
        None,
        json_schema_extra=_no_default,  # type: ignore[assignment]
        description="true on a stored answer replayed for the same Idempotency-Key",
    )
    x_execution_id: str = Field(
        None,
        json_schema_extra=_no_default,  # type: ignore[assignment]
        description="the gateway's id of this execution (its audit row)",
    )
    x_model_version: str = Field(
        None,
        pattern=f"^{MODEL_VERSION_PATTERN}$",
        json_schema_extra=_no_default,  # type: ignore[assignment]
        description=(
            "the analysis that produced the answer, <package version>+<12 hex> (the GPU host's; the gateway's own "
            "for endpoints 4 and 99; a replay: the original's); absent when no model answered (docs/api.md)"
        ),
    )


_HEADER_NAMES = {
    "x_request_id": HEADER_REQUEST_ID,
    "retry_after": HEADER_RETRY_AFTER,
    "idempotency_replayed": HEADER_IDEMPOTENCY_REPLAYED,
    "x_execution_id": HEADER_EXECUTION_ID,
    "x_retry_policy": HEADER_RETRY_POLICY,
    "x_error_type": HEADER_ERROR_TYPE,
    "x_current_load": HEADER_CURRENT_LOAD,
    "x_alternative_endpoint": HEADER_ALTERNATIVE_ENDPOINT,
    "x_model_version": HEADER_MODEL_VERSION,
}


def _schema(model: Any, mode: str = "validation") -> tuple[dict[str, Any], dict[str, Any]]:
    """`model`'s JSON Schema with its definitions split off for `components/schemas`."""
    schema = TypeAdapter(model).json_schema(ref_template=_REF, mode=mode)  # type: ignore[arg-type]
    return schema.pop("$defs", {}), schema


def _component(model: type[BaseModel], mode: str = "validation") -> tuple[dict[str, Any], dict[str, Any]]:
    """A `$ref` to `model` and the components it needs, itself included."""
    definitions, schema = _schema(model, mode)
    return {"$ref": _REF.format(model=model.__name__)}, {**definitions, model.__name__: schema}


class ContractDocument(OpenAPIProvider):
    """quart-schema's provider, narrowed and completed through its overridable methods."""

    def generate_rules(self) -> Any:
        documented = {endpoint.path for endpoint in ENDPOINTS.values()}
        return (rule for rule in super().generate_rules() if rule.rule in documented)

    def generate_methods(self, rule: Rule) -> Any:
        return ["POST"]  # the only method of a business endpoint

    def build_request_body(self, model: Any, source: DataSource) -> tuple[dict[str, Any], dict[str, Any]]:
        """`model`: the endpoint's `Fields`; its JSON and multipart bodies both."""
        json_ref, json_components = _component(json_body(model))
        form_ref, form_components = _component(form_body(model))
        encoding: dict[str, Any] = {IMAGE_FIELD: {"contentType": "image/jpeg, image/png, image/webp"}}
        if "hairline_points" in model.model_fields:
            encoding["hairline_points"] = {"contentType": "application/json"}  # the polyline as JSON text
        body = {
            "required": True,
            "content": {
                "multipart/form-data": {"schema": form_ref, "encoding": encoding},
                "application/json": {"schema": json_ref},
            },
        }
        return body, {**json_components, **form_components}

    def build_response_object(self, model: Any, headers_model: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        reference, components = _component(model, "serialization")
        endpoint = model.__name__.removesuffix("Answer")
        content: dict[str, Any] = {"schema": reference}
        if endpoint in _EXAMPLES:
            content["examples"] = {name: {"value": value} for name, value in _EXAMPLES[endpoint].items()}
        response: dict[str, Any] = {"description": model.__doc__ or "", "content": {"application/json": content}}
        if headers_model is not None:
            _, schema = _schema(headers_model)
            required = set(schema.get("required", ()))
            response["headers"] = {
                _HEADER_NAMES[name]: {
                    "schema": {k: v for k, v in field.items() if k != "description"},
                    "description": field.get("description", ""),
                    "required": name in required,
                }
                for name, field in schema["properties"].items()
            }
        return response, components

    def operation_id(self, method: str, path: str, func: Any) -> str | None:
        return getattr(func, QUART_SCHEMA_OPERATION_ID_ATTRIBUTE, None)  # what `operation_id(...)` set


def _info() -> Info:
    return Info(
        title="hairgate",
        version=version(PACKAGE),
        description=(
            "Hair analysis behind one gateway. Every /api/ answer is HTTP 200 with the envelope "
            "{code, message, request_id, data}: read code (0 success, 1001–1008). Each endpoint takes "
            "multipart/form-data (the photo as the file image) or application/json (image_base64). "
            "The reference with examples: docs/api.md."
        ),
    )


class Document:
    """The document's bytes for the facts the entrance was last told, built when they change."""

    def __init__(self, app: Quart, entrance: Entrance) -> None:
        self._app, self._entrance = app, entrance
        self._built_for: DocumentFacts | None = None
        self._bytes = b""
        self.bytes()  # at start: a broken model fails the start, not the first reader

    def bytes(self) -> bytes:
        facts = self._entrance.document
        if facts != self._built_for:
            self._bytes = json.dumps(self.build(facts), ensure_ascii=False, separators=(",", ":")).encode()
            self._built_for = facts
        return self._bytes

    def build(self, facts: DocumentFacts) -> dict[str, Any]:
        headers = request_headers(facts.key_header)
        for rule in self._app.url_map.iter_rules():
            endpoint = endpoint_at(rule.rule)
            if endpoint is not None:
                _document(self._app.view_functions[rule.endpoint], endpoint, headers)
        extension = QuartSchema(
            info=_info(),
            servers=[Server(url=facts.public_base_url)],
            tags=[Tag(name="hair", description="GPU hosts"), Tag(name="face", description="the gateway itself")],
        )
        self._app.config.setdefault("QUART_SCHEMA_CONVERSION_PREFERENCE", "pydantic")
        self._app.config.setdefault("QUART_SCHEMA_CONVERT_CASING", False)
        document = ContractDocument(self._app, extension).schema()
        # as the service bounds them: a fuzzer's 7.5e179 is out of the document too (issue 39)
        bound_coordinates(document, facts.max_long_side_px)
        return document


def _document(view: Any, endpoint: Endpoint, headers: type[BaseModel]) -> None:
    """quart-schema's decorators, applied to the registered view (a partial: no name, no doc)."""
    document_request(endpoint.fields, source=DataSource.JSON)(view)
    document_headers(headers)(view)
    document_response(answer_model(endpoint.data), 200, AnswerHeaders)(view)
    operation_id(endpoint.operation_id)(view)
    view.__doc__ = f"{endpoint.summary}\n{endpoint.description}"
    tag(["hair" if endpoint.answered_by is AnsweredBy.GPU_HOST else "face"])(view)


def openapi_blueprint(app: Quart, gateway: Gateway) -> Blueprint:
    """The document and its page; register after the `/api/` blueprint (it documents its routes)."""
    blueprint = Blueprint("openapi", __name__)
    document = Document(app, gateway.entrance)
    assets = Path(importlib.util.find_spec("flask_swagger_ui").submodule_search_locations[0]) / "dist"  # type: ignore[union-attr,index]

    @blueprint.get(OPENAPI_PATH)
    async def openapi() -> QuartResponse:
        return QuartResponse(document.bytes(), content_type="application/json")

    @blueprint.get(DOCS_PATH)
    async def docs() -> QuartResponse:
        return QuartResponse(_PAGE, content_type="text/html; charset=utf-8")

    @blueprint.get(f"{DOCS_ASSETS_PATH}/<name>")
    async def docs_asset(name: str) -> QuartResponse:
        if name not in _SWAGGER_FILES:
            return QuartResponse("not found", status=404, content_type="text/plain")
        kind = {"js": "text/javascript", "css": "text/css", "png": "image/png"}[name.rsplit(".", 1)[1]]
        return QuartResponse(
            (assets / name).read_bytes(), content_type=kind, headers={"Cache-Control": "public, max-age=86400"}
        )

    return blueprint


_PAGE = f"""<!doctype html>
<html lang="en">
<head>
  <meta charset="utf-8">
  <title>hairgate API</title>
  <link rel="stylesheet" href="{DOCS_ASSETS_PATH}/swagger-ui.css">
  <link rel="icon" type="image/png" href="{DOCS_ASSETS_PATH}/favicon-32x32.png">
</head>
<body>
  <div id="swagger-ui"></div>
  <script src="{DOCS_ASSETS_PATH}/swagger-ui-bundle.js"></script>
  <script src="{DOCS_ASSETS_PATH}/swagger-ui-standalone-preset.js"></script>
  <script>
    window.ui = SwaggerUIBundle({{url: "{OPENAPI_PATH}", dom_id: "#swagger-ui", deepLinking: true,
      presets: [SwaggerUIBundle.presets.apis, SwaggerUIStandalonePreset], layout: "StandaloneLayout"}});
  </script>
</body>
</html>
"""
