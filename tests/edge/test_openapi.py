"""`GET /openapi.json` and `GET /docs` on the gateway: a valid OpenAPI 3.1 document generated
from the endpoint registry and shared.contract's models, built once, with its page's files
served by the gateway (no CDN)."""

from __future__ import annotations

import json
import re
from importlib.metadata import version
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
from openapi_spec_validator import validate

from edge.app import create_app
from edge.gateway import build_gateway
from edge.web import openapi
from shared.contract import Code, fields
from shared.contract.endpoints import ENDPOINTS
from shared.contract.envelope import answer_model, envelope_errors
from tests.edge.conftest import make_settings

BUSINESS_PATHS = {endpoint.path for endpoint in ENDPOINTS.values()}


async def _document(client: httpx.AsyncClient) -> dict[str, Any]:
    response = await client.get("/openapi.json")
    assert response.status_code == 200 and response.headers["content-type"] == "application/json"
    return response.json()


RETRY_GUIDANCE = ("X-Retry-Policy", "X-Error-Type", "X-Current-Load", "X-Alternative-Endpoint")


async def test_the_document_is_valid_openapi_3_1_of_every_business_endpoint_only(client: httpx.AsyncClient) -> None:
    document = await _document(client)
    validate(document)
    assert document["openapi"].startswith("3.1") and document["info"]["version"] == version("hairgate")
    assert set(document["paths"]) == BUSINESS_PATHS  # no status page, /admin, /metrics, /static, nor itself
    for path, item in document["paths"].items():
        assert set(item) == {"post"}, path
        operation = item["post"]
        content = operation["requestBody"]["content"]
        assert set(content) == {"multipart/form-data", "application/json"}, path
        form = document["components"]["schemas"][content["multipart/form-data"]["schema"]["$ref"].rsplit("/", 1)[1]]
        body = document["components"]["schemas"][content["application/json"]["schema"]["$ref"].rsplit("/", 1)[1]]
        assert form["properties"]["image"]["format"] == "binary" and "image" in form["required"]
        assert "image_base64" in body["required"]
        assert {p["name"] for p in operation["parameters"] if p["in"] == "header"} == {
            "x-request-id",
            "idempotency-key",
        }
        answer = operation["responses"]["200"]
        assert {"X-Request-ID", "Retry-After", "Idempotency-Replayed", "X-Execution-ID"} <= set(answer["headers"])
        assert answer["content"]["application/json"]["examples"], f"{path}: a real example answer"
        guidance = {name: answer["headers"][name] for name in RETRY_GUIDANCE}
        assert guidance["X-Current-Load"]["required"] and not guidance["X-Retry-Policy"]["required"]
        assert guidance["X-Retry-Policy"]["schema"]["enum"] == ["exponential_backoff", "fixed", "none"]
        assert "cuda_oom" in guidance["X-Error-Type"]["schema"]["enum"]


def test_a_1007_may_name_its_kind_and_nothing_else() -> None:
    named = {"code": 1007, "message": "GPU 显存不足，请稍后重试", "request_id": "r", "data": {"error_type": "cuda_oom"}}
    assert envelope_errors("measure", named) is None
    assert envelope_errors("measure", {**named, "data": {"error_type": "flux"}}) is not None
    assert envelope_errors("measure", {**named, "data": {"error_type": "cuda_oom", "trace": 1}}) is not None


async def test_the_fields_in_the_document_are_the_models(client: httpx.AsyncClient) -> None:
    schemas = (await _document(client))["components"]["schemas"]
    mark = schemas["MarkJson"]
    assert (
        mark["properties"]["drop_mm"]["anyOf"][0] | {"maximum": fields.MAX_DROP_MM, "minimum": 0}
        == mark["properties"]["drop_mm"]["anyOf"][0]
    )
    points = mark["properties"]["hairline_points"]["anyOf"][0]
    assert (points["minItems"], points["maxItems"]) == (fields.MIN_HAIRLINE_POINTS, fields.MAX_HAIRLINE_POINTS)
    assert len(mark["oneOf"]) == 2  # exactly one of hairline_points and drop_mm
    assert schemas["GrowJson"]["properties"]["plans"]["anyOf"][0]["items"]["enum"] == list(fields.PLANS)
    assert schemas["HairlineForm"]["properties"]["styles"]["items"]["enum"] == list(fields.STYLES)
    gender = schemas["MeasureJson"]["properties"]["gender"]["anyOf"]
    assert gender[0]["enum"] == list(fields.GENDERS)  # the preferred spelling first, then the legacy text
    assert gender[1]["type"] == "string" and "legacy" in gender[1]["description"]
    codes = schemas["Refusal"]["properties"]["code"]["enum"]
    assert [0, *codes] == [int(code) for code in Code]


def test_every_example_is_an_answer_its_model_accepts() -> None:
    answers = {endpoint.data.__name__.removesuffix("Data"): endpoint.data for endpoint in ENDPOINTS.values()}
    assert set(openapi._EXAMPLES) == set(answers)
    for name, examples in openapi._EXAMPLES.items():
        for example in examples.values():
            answer_model(answers[name]).model_validate(example)


@pytest.mark.parametrize("max_long_side_px", [8192, 4000])
async def test_hairline_points_coordinates_are_bounded_as_the_service_bounds_them(
    tmp_path: Path, max_long_side_px: int
) -> None:
    # Issue 39: Schemathesis sent a coordinate of 7.5e179, valid by the document, which the
    # service refuses: a point lies inside the photo, whose longest side is at most the setting
    settings = make_settings(tmp_path)
    analysis = settings.analysis.model_copy(update={"max_long_side_px": max_long_side_px})
    gateway = build_gateway(settings.model_copy(update={"analysis": analysis}))
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=create_app(gateway)), base_url="http://g.test"
    ) as client:
        schemas = (await _document(client))["components"]["schemas"]
    for name, image in ("MarkJson", "image_base64"), ("MarkForm", "image"):
        schema = schemas[name]
        coordinate = schema["properties"]["hairline_points"]["anyOf"][0]["items"]["prefixItems"][0]
        assert coordinate["anyOf"][0] == {"type": "number", "minimum": 0, "maximum": max_long_side_px}
        for point, valid in ([7.5e179, 1], False), ([-1, 1], False), ([max_long_side_px, 0.5], True):
            body = {image: "aGFpcg==", "hairline_points": [point, [1, 1], [2, 2]]}
            assert jsonschema.Draft202012Validator(schema).is_valid(body) is valid, (name, point)
    assert "x-maximum" not in json.dumps(schemas), "every mark is replaced by the setting's value"


async def test_the_rate_limit_key_header_is_documented_when_configured(tmp_path: Path) -> None:
    gateway = build_gateway(make_settings(tmp_path, rate_limit={"enabled": True, "key_header": "X-Api-Key"}))
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=create_app(gateway)), base_url="http://g.test"
    ) as client:
        operation = (await _document(client))["paths"]["/api/v1/hair/measure"]["post"]
    assert "x-api-key" in {parameter["name"] for parameter in operation["parameters"]}


async def test_the_document_is_built_once_not_per_request(
    gateway: Any, client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    builds = []
    original = openapi.Document.build
    monkeypatch.setattr(openapi.Document, "build", lambda self, facts: builds.append(1) or original(self, facts))
    app = create_app(gateway)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://g.test") as fresh:
        first, second = (await fresh.get("/openapi.json")).content, (await fresh.get("/openapi.json")).content
        assert first == second and len(builds) == 1  # at start
        gateway.entrance.reconfigure(gateway.settings.model_copy())  # a reload that changed nothing it states
        await fresh.get("/openapi.json")
        assert len(builds) == 1
        edge = gateway.settings.edge.model_copy(update={"public_base_url": "https://moved.test"})
        gateway.entrance.reconfigure(gateway.settings.model_copy(update={"edge": edge}))  # as edge.reload tells it
        moved = await _document(fresh)
        await fresh.get("/openapi.json")
    assert len(builds) == 2 and moved["servers"] == [{"url": "https://moved.test"}]


async def test_the_docs_page_loads_only_files_the_gateway_serves(client: httpx.AsyncClient) -> None:
    page = await client.get("/docs")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "http://" not in page.text and "https://" not in page.text, "no CDN"
    linked = re.findall(r'(?:src|href)="([^"]+)"', page.text)
    assert any(link.endswith("swagger-ui-bundle.js") for link in linked)
    for link in linked:
        asset = await client.get(link)
        assert asset.status_code == 200 and len(asset.content) > 100, link
    assert (await client.get("/docs/assets/..%2Fsettings.py")).status_code == 404
    assert (await client.get("/docs/assets/index.html")).status_code == 404  # only the files it names
