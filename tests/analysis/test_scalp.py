"""The bare-scalp rule as a table (issue 27): `no_hairline` needs skin colour, a face-smooth
texture and no network sure of hair, with the top of the head in the photo."""

from __future__ import annotations

import numpy as np
import pytest

from analysis.face.head_samples import ColourModel, HeadColours
from analysis.hairline.scalp import NETWORK_SURE, SMOOTH_SCALP_RATIO, TopOfHead, may_be_a_ring


def _colours(skin_coloured: bool) -> HeadColours:
    skin = np.array([150.0, 140.0, 140.0])
    top = skin + (5.0 if skin_coloured else 60.0)
    return HeadColours(
        ColourModel.fit(np.tile(skin, (10, 1))), skin, top, None, 0.9 if skin_coloured else 0.0, np.zeros((2, 2), bool)
    )


@pytest.mark.parametrize(
    "skin, texture, network, cut, bald, light",
    [
        (True, 0.8, 0.4, False, True, False),  # a bald head: the network's scalp ring is weak
        (True, 0.8, None, False, True, False),  # the fallback: no network to ask
        (True, 2.3, 1.0, False, False, True),  # red hair the colour test calls skin (openface_adams)
        (True, 0.8, NETWORK_SURE, False, False, True),  # smooth light hair the network is sure of
        (True, SMOOTH_SCALP_RATIO + 0.1, 0.4, False, False, True),  # strands the network sees weakly
        (True, None, None, False, False, True),  # no skin-coloured pixel to judge smoothness on
        (True, 0.8, 0.4, True, False, True),  # the frame's top edge cuts the head (openface_lennon-1)
        (False, 0.8, 0.4, False, False, False),  # dark hair
    ],
)
def test_bare_scalp_needs_every_view(
    skin: bool, texture: float | None, network: float | None, cut: bool, bald: bool, light: bool
) -> None:
    top = TopOfHead(_colours(skin), texture, network, cut)
    assert (top.bare_scalp, top.light_hair) == (bald, light)


def test_the_networks_ring_is_not_read_where_the_frame_cuts_the_head_or_hair_has_strands() -> None:
    assert may_be_a_ring(TopOfHead(_colours(True), 0.8, 0.9, False))
    assert may_be_a_ring(TopOfHead(_colours(False), None, 0.9, False))
    assert not may_be_a_ring(TopOfHead(_colours(True), 0.8, 0.9, True))
    assert not may_be_a_ring(TopOfHead(_colours(True), 2.0, 0.9, False))
