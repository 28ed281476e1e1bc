"""The preview's measured claim (analysis.md § Rendering, docs/generation.md § The preview's
texture, measured): on labelled photos through the real analysis (the hair network), every
plan that lowers the line grows a band with at least 0.7 of the high-frequency energy of
the hair above it, a lightness spread like that hair's, and a new edge no sharper than
1.5 x the person's own hairline."""

from __future__ import annotations

from pathlib import Path

import pytest

from analysis.drawing import designs
from analysis.drawing.preview import grow_preview
from analysis.drawing.preview_texture import band_texture
from analysis.endpoints import analyse
from analysis.face.landmarks import FaceMeshDetector
from analysis.models import CPU, Models
from analysis.segmentation.hairnet import HairNetSegmenter
from analysis.types import PLANS
from shared.settings import AnalysisSettings

from .images import load_photo

MIN_HIGH_FREQUENCY = 0.7
MAX_EDGE_SHARPNESS = 1.5
# "varies like that hair's": within 25 % (0.88-1.19 over the dev photos, docs/generation.md)
SPREAD_RANGE = (0.75, 1.25)


# rose_leslie: 2 px/mm, strands a pixel or two wide (0.69 with bilinear resampling, the case
# that taught the Lanczos move); lacamoire: dark hair, a deep drop through repeats; biden2:
# thin white hair over pink scalp
@pytest.mark.parametrize("name", ["rose_leslie.jpg", "lacamoire.jpg", "biden2.jpg"])
def test_the_grown_band_keeps_the_hair_s_texture_and_the_hairline_s_softness(
    name: str, photos_dir: Path, detector: FaceMeshDetector, hairnet: HairNetSegmenter
) -> None:
    rgb = load_photo(photos_dir, name)
    found = analyse(rgb, Models(detector=detector, segmenter=hairnet, device=CPU), AnalysisSettings())
    plans = designs.plan_designs(list(PLANS), found.face, found.hairline, found.calibration, "unknown")
    measured = []
    for plan in plans:
        if not plan.drop_mm:
            continue
        grown = grow_preview(rgb, found.face, found.hairline, found.segmentation, plan, found.calibration)
        assert grown is not None, plan.name
        texture = band_texture(rgb, grown, found.face, found.hairline, plan, found.calibration)
        assert texture is not None, plan.name
        measured.append((plan.name, texture))
    assert measured, "no plan lowers the line"
    for plan_name, texture in measured:
        assert texture.high_frequency_ratio >= MIN_HIGH_FREQUENCY, (plan_name, texture)
        assert texture.edge_sharpness_ratio <= MAX_EDGE_SHARPNESS, (plan_name, texture)
        assert SPREAD_RANGE[0] <= texture.lightness_spread_ratio <= SPREAD_RANGE[1], (plan_name, texture)
