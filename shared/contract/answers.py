"""Each endpoint's `data` on code 0, as pydantic models: what the gateway answers.

Image keys appear as the `_url` the gateway rewrote them to (contract.md § Images in
responses: a worker sends `*_base64`, `url_key_for`). Numbers are JSON numbers; a key that
may be null says so. The models document the answers (`/openapi.json`) and check them in the
end-to-end tests (`shared.contract.envelope.envelope_errors`); endpoint 4's also checks the
vision LLM's answer (`edge.local.features`).
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from shared.contract.fields import Plan, Style

BASE64_SUFFIX = "_base64"
URL_SUFFIX = "_url"

# Who drew a `grown_image_*` (contract.md endpoints 2 and 3); None when nobody did.
GENERATOR_COMFYUI = "comfyui"
GENERATOR_PREVIEW = "preview"


def url_key_for(key: str) -> str | None:
    """`annotated_image_base64` -> `annotated_image_url`; None for keys that carry no image."""
    if key.endswith(BASE64_SUFFIX) and len(key) > len(BASE64_SUFFIX):
        return key[: -len(BASE64_SUFFIX)] + URL_SUFFIX
    return None


# (image keys as the `_url` it rewrote them to, contract.md § Images
# in responses). Numbers are JSON numbers; a key that may be null says so.

Url = Annotated[str, Field(description="an absolute URL of a PNG served by the gateway (/static/annotations/…)")]
Generator = Annotated[
    Literal["comfyui", "preview"] | None,
    Field(description="who drew grown_image_url: comfyui, the built-in preview, or null with grown_image_url null"),
]
Pixel = Annotated[tuple[float, float], Field(description="[x, y] in pixels of the upright photo")]


class _Answer(BaseModel):
    model_config = ConfigDict(frozen=True)


class ImageSize(_Answer):
    width: int
    height: int


class Pose(_Answer):
    yaw: float
    pitch: float
    roll: float


class Face(_Answer):
    bbox: Annotated[list[float], Field(min_length=4, max_length=4, description="[x, y, width, height]")]
    pose: Pose


class Calibration(_Answer):
    method: Literal["iris"]
    iris_diameter_px: float
    mm_per_px: float


class Hairline(_Answer):
    status: Literal["ok", "uncertain", "no_hairline", "occluded"]
    points: list[Pixel] | None
    trichion: Pixel | None
    shape: Literal["straight", "rounded", "m_shape", "widows_peak", "receding"] | None
    uncertainty_mm: float | None


class TempleRecession(_Answer):
    left: float | None
    right: float | None


class Measurements(_Answer):
    forehead_height_mm: float | None
    upper_third_mm: float | None
    middle_third_mm: float | None
    lower_third_mm: float | None
    thirds_ratio: Annotated[list[float], Field(min_length=3, max_length=3)] | None
    hairline_width_mm: float | None
    temple_recession_mm: TempleRecession | None


class Assessment(_Answer):
    forehead: Literal["normal", "high", "low"] | None
    notes: list[str]


class MeasureData(_Answer):
    """Endpoint 1: the hairline, the forehead and the facial thirds, measured."""

    image: ImageSize
    face: Face
    calibration: Calibration
    hairline: Hairline
    measurements: Measurements
    assessment: Assessment
    segmenter: Literal["bisenet", "hairnet", "fallback"]
    annotated_image_url: Url


class GrowResult(_Answer):
    plan: Plan
    hairline_drop_mm: float | None
    image_url: Url
    grown_image_url: Url | None
    generator: Generator


class GrowData(_Answer):
    """Endpoint 2: one result per requested plan, in the order asked."""

    results: list[GrowResult]


class MarkData(_Answer):
    """Endpoint 3: the hairline marked, and the photo grown down to it."""

    marked_image_url: Url
    grown_image_url: Url | None
    generator: Generator


class HairlineImage(_Answer):
    style: Style
    image_url: Url


class HairlineData(_Answer):
    """Endpoint 5: one design per requested style."""

    hairline_images: list[HairlineImage]


class MaskData(_Answer):
    """Endpoint 6: the hair mask (255 hair, 0 else; the photo's size)."""

    mask_image_url: Url
    hair_area_ratio: Annotated[float, Field(ge=0, le=1)]


class SpecialPoints(_Answer):
    trichion: Pixel
    glabella: Pixel
    nasion: Pixel
    subnasale: Pixel
    menton: Pixel
    left_temple: Pixel
    right_temple: Pixel
    left_iris_center: Pixel
    right_iris_center: Pixel


class SpecialPointsData(_Answer):
    """Endpoint 99: named key points of the face mesh (trichion: the mesh's top, not the hairline)."""

    image: ImageSize
    points: SpecialPoints


# -- endpoint 4: the vision LLM's answer (the gateway adds `model`) ------------------------

SUMMARY_MAX_CHARS = 200
_CJK = re.compile(r"[\u4e00-\u9fff]")


def _text(value: str) -> str:
    # A validator, not `min_length`: strict schemas of some providers refuse length keywords.
    value = value.strip()
    if not value:
        raise ValueError("must not be empty")
    return value


def _chinese_summary(value: str) -> str:
    value = _text(value)
    if len(value) > SUMMARY_MAX_CHARS:
        raise ValueError(f"longer than {SUMMARY_MAX_CHARS} characters")
    if not _CJK.search(value):
        raise ValueError("not Chinese")
    return value


Text = Annotated[str, AfterValidator(_text)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Skin(_Strict):
    tone: Literal["fair", "light", "medium", "tan", "dark"] = Field(description="肤色深浅")
    condition: Text = Field(description="皮肤状况，简短中文描述")


class FaceFeatures(_Strict):
    """What the LLM must answer (contract.md endpoint 4, less `model`, which the gateway adds)."""

    face_shape: Literal["oval", "round", "square", "heart", "oblong", "diamond", "triangle"] = Field(description="脸型")
    skin: Skin
    hair_density: Literal["dense", "normal", "thinning", "sparse", "bald"] = Field(description="发量/头发密度")
    hair_color: Text = Field(description="发色，简短中文描述")
    summary: Annotated[str, AfterValidator(_chinese_summary)] = Field(
        description=f"面部特征总结，中文，不超过 {SUMMARY_MAX_CHARS} 字"
    )


class FeaturesData(FaceFeatures):
    model: str = Field(description="the configured model")
