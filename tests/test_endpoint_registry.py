"""Adding an endpoint is one registry entry plus its handler (issue 41): an endpoint the tests
add (`shine`: one entry in `shared.contract.endpoints.ENDPOINTS`, one analysis handler) is
routed and answered by the GPU host, routed and checked by the gateway, in its OpenAPI
document, offered by `hairgate analyze` and run by the analysis, with nothing else changed.
And every view agrees with the registry as shipped."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from pydantic import BaseModel, Field

from analysis.endpoints import HANDLERS, Handler, run_endpoint
from analysis.models import Models
from cluster.cli import build_parser
from edge.app import create_app as create_gateway_app
from edge.gateway import build_gateway
from edge.web.api_routes import LOCAL_ANSWERS
from shared.contract import Code
from shared.contract.bodies import parse_options
from shared.contract.endpoints import ENDPOINTS, AnsweredBy, Endpoint, answered_by
from shared.contract.fields import MSG_NO_IMAGE, ImageOnlyFields
from shared.settings import AnalysisSettings, DispatchSettings
from tests.analysis.images import encode
from tests.edge.conftest import make_settings
from tests.gpu_host.conftest import fake_model, post_image, serving


class ShineData(BaseModel):
    """Endpoint 7 (the tests'): how much of the photo shines."""

    shine_ratio: float = Field(ge=0, le=1)


SHINE = Endpoint(
    "shine",
    "/api/v1/hair/shine",
    ImageOnlyFields,
    ShineData,
    AnsweredBy.GPU_HOST,
    "7 · shine: how much of the photo shines",
)


def _shine(rgb: np.ndarray, models: Models, options: dict[str, Any], limits: AnalysisSettings) -> dict[str, Any]:
    return {"shine_ratio": round(float((rgb > 250).all(axis=2).mean()), 4)}


@pytest.fixture
def shine(monkeypatch: pytest.MonkeyPatch) -> Iterator[Endpoint]:
    monkeypatch.setitem(ENDPOINTS, SHINE.name, SHINE)  # the entry
    monkeypatch.setitem(HANDLERS, SHINE.name, Handler(_shine, pictures=lambda options: 0))  # its handler
    yield SHINE


async def test_the_gpu_host_routes_and_answers_a_new_endpoint(shine: Endpoint) -> None:
    model = fake_model()
    async with serving(model) as client:
        await model.wait_ready()
        answer = await (await post_image(client, b"ok", shine.path)).get_json()
    assert answer["code"] == Code.OK and answer["data"]["endpoint"] == "shine"  # the model process ran it


async def test_the_gateway_routes_checks_and_documents_a_new_endpoint(shine: Endpoint, tmp_path: Path) -> None:
    app = create_gateway_app(build_gateway(make_settings(tmp_path)))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway.test") as client:
        refused = (await client.post(shine.path, json={})).json()  # checked before a queue slot
        document = (await client.get("/openapi.json")).json()
    assert (refused["code"], refused["message"]) == (Code.INVALID_PARAMETER, MSG_NO_IMAGE)
    operation = document["paths"][shine.path]["post"]
    assert operation["operationId"] == "shine" and operation["summary"] == shine.summary
    assert "ShineAnswer" in document["components"]["schemas"]


def test_the_cli_and_the_analysis_run_a_new_endpoint(shine: Endpoint) -> None:
    assert build_parser().parse_args(["analyze", "photo.png", "--endpoint", "shine"]).endpoint == "shine"
    photo = encode(np.full((600, 800, 3), 255, np.uint8), "PNG")
    data = run_endpoint("shine", photo, parse_options("shine", {}), None, AnalysisSettings())  # type: ignore[arg-type]
    assert data == {"shine_ratio": 1.0}


def test_every_view_is_the_registry() -> None:
    analysed = {name for name, endpoint in ENDPOINTS.items() if endpoint.analysed}
    assert set(HANDLERS) == analysed  # the analysis answers what the registry says it does
    assert set(LOCAL_ANSWERS) == {endpoint.name for endpoint in answered_by(AnsweredBy.GATEWAY)}
    parser = build_parser()
    for name in ENDPOINTS:
        if name in analysed:
            assert parser.parse_args(["analyze", "photo.png", "--endpoint", name]).endpoint == name
        else:
            with pytest.raises(SystemExit):  # argparse: not one of the choices
                parser.parse_args(["analyze", "photo.png", "--endpoint", name])
    assert DispatchSettings().slow_paths == tuple(endpoint.path for endpoint in ENDPOINTS.values() if endpoint.slow)
