"""The endpoint registry: every business endpoint of the public API, declared once.

Each entry names its path, its request model (`fields`), its answer model (`data`), who
answers it (a GPU host, or the gateway itself), whether it is slow (it generates pictures)
and whether `hairgate analyze` offers it. Every view is built from the registry when it is
built, never copied: the gateway's routes (`edge.web.api_routes`) and its OpenAPI document
(`edge.web.openapi`), the GPU host's routes and dispatch (`gpu_host.app`), the CLI's choices
(`cluster.cli`), the analysis' handler table (`analysis.endpoints`), the request checks
(`shared.contract.bodies`) and the default `edge.dispatch.slow_paths`.

Adding an endpoint is one entry here plus its handler: the analysis' (`analysis.endpoints`,
`@handles(name)`) for an endpoint the analysis answers, the gateway's own
(`edge.web.api_routes`) for one the gateway answers otherwise (tests/test_endpoint_registry.py
adds one and finds it everywhere).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from pydantic import BaseModel

from shared.contract.answers import (
    FeaturesData,
    GrowData,
    HairlineData,
    MarkData,
    MaskData,
    MeasureData,
    SpecialPointsData,
)
from shared.contract.fields import Fields, GrowFields, HairlineFields, ImageOnlyFields, MarkFields, MeasureFields

API_PREFIX = "/api/"


class AnsweredBy(StrEnum):
    GPU_HOST = "gpu_host"  # checked, queued and forwarded by the gateway; run by a host's model process
    GATEWAY = "gateway"  # run by the gateway itself (edge.local): never a GPU host, never a pool slot


@dataclass(frozen=True)
class Endpoint:
    """One business endpoint (contract.md § Endpoints); POST only."""

    name: str  # the analysis', the CLI's (`hairgate analyze --endpoint`) and the document's (`operation_id`)
    path: str
    fields: type[Fields]  # its non-image fields (the request bodies: `shared.contract.bodies`)
    data: type[BaseModel]  # its `data` on code 0
    answered_by: AnsweredBy
    summary: str  # the document's title for it, with the contract's number
    description: str = ""
    # Slow: it generates grown pictures (ComfyUI, ~6-18 s): its own timeout and scheduling
    # class on the gateway (the default `edge.dispatch.slow_paths`), and its GPU host asks the
    # model process for inpainting masks where ComfyUI is configured.
    slow: bool = False
    # The analysis answers it (`analysis.endpoints`), so `hairgate analyze` offers it.
    analysed: bool = True

    @property
    def operation_id(self) -> str:
        """Its name as an identifier: the document's operationId, the route's endpoint name."""
        return self.name.replace("-", "_")


# name -> endpoint, in the contract's order (the document lists them in this order)
ENDPOINTS: dict[str, Endpoint] = {
    entry.name: entry
    for entry in (
        Endpoint(
            "measure",
            "/api/v1/hair/measure",
            MeasureFields,
            MeasureData,
            AnsweredBy.GPU_HOST,
            "1 · measure: the hairline, forehead and facial thirds",
            "An annotated photo, the hairline with its status (ok, uncertain, no_hairline, occluded) and band, "
            "the thirds in millimetres (calibrated by the iris).",
        ),
        Endpoint(
            "grow",
            "/api/v1/hair/grow",
            GrowFields,
            GrowData,
            AnsweredBy.GPU_HOST,
            "2 · grow: transplant plans, each drawn and grown",
            "One result per plan, in the order asked; grown_image_url null with generator null when nothing "
            "could be grown. Slow with ComfyUI (~18 s).",
            slow=True,
        ),
        Endpoint(
            "mark",
            "/api/v1/hair/mark",
            MarkFields,
            MarkData,
            AnsweredBy.GPU_HOST,
            "3 · mark: a hairline of your choosing, drawn and grown",
            "Exactly one of hairline_points (3–1000 points inside the photo) and drop_mm (0–40).",
            slow=True,
        ),
        Endpoint(
            "hairline",
            "/api/v1/hair/hairline",
            HairlineFields,
            HairlineData,
            AnsweredBy.GPU_HOST,
            "5 · hairline: candidate hairline designs, one per style",
        ),
        Endpoint(
            "mask",
            "/api/v1/hair/mask",
            ImageOnlyFields,
            MaskData,
            AnsweredBy.GPU_HOST,
            "6 · mask: the hair segmentation as a PNG",
        ),
        Endpoint(
            "special-points",
            "/api/v1/face/special-points",
            ImageOnlyFields,
            SpecialPointsData,
            AnsweredBy.GATEWAY,
            "99 · special-points: named facial key points",
            "Runs on the gateway's CPU: answers even when no GPU host is online.",
        ),
        Endpoint(
            "features",
            "/api/v1/face/features",
            ImageOnlyFields,
            FeaturesData,
            AnsweredBy.GATEWAY,
            "4 · features: a structured description of the face (vision LLM)",
            "Runs on the gateway; not configured: 1007 面部特征分析未配置 with Retry-After: 3600.",
            analysed=False,  # a vision LLM answers it
        ),
    )
}


def endpoint(name: str) -> Endpoint:
    """The endpoint called `name`; ValueError for an unknown one (a programming error)."""
    try:
        return ENDPOINTS[name]
    except KeyError:
        raise ValueError(f"unknown endpoint {name!r}; known: {', '.join(ENDPOINTS)}") from None


def endpoint_at(path: str) -> Endpoint | None:
    """The endpoint served at `path`; None for any other path."""
    return next((entry for entry in ENDPOINTS.values() if entry.path == path), None)


def answered_by(who: AnsweredBy) -> list[Endpoint]:
    """The endpoints `who` answers, in the registry's order."""
    return [entry for entry in ENDPOINTS.values() if entry.answered_by is who]


def api_paths() -> tuple[str, ...]:
    """Every business path: the GPU hosts' first, then the gateway's (the metric labels' order)."""
    return tuple(entry.path for who in AnsweredBy for entry in answered_by(who))
