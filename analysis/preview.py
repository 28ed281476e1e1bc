"""The built-in growth preview (gpu_host.md § Generation): the client's own hair pulled
down to a planned hairline, for hosts without ComfyUI.

Recipe, in the face's midline frame (`designs.FaceFrame`: `v` up the midline, `u` across):
- per column `u`, the drop `d(u)` is how far the planned line lies below the current one,
  smoothed across columns and tapered to 0 over the outer quarters of the plan, so the
  shift field has no seam anywhere;
- the band between the lines is filled with the hair just above the current hairline,
  moved down by `d(u)`: the current hairline's own edge (its fine hairs, its skin-to-hair
  transition) lands on the new line, and colour, texture and light are the client's own;
- where the hair above the line (at most `MAX_SOURCE_MM` of it: further up lies the head's
  outline) is shorter than the drop, it is stretched over the band (strands lengthen,
  nothing repeats); stretched more than `MAX_STRETCH`, it smears: None;
- blended over `UNDER_EDGE_MM` below the new edge (skin into skin) and faded into the
  original hair above the old edge's see-through front.
Nothing moves below the brows (the blend weight is 0 there) and pixels change only within
the band, `UNDER_EDGE_MM` below it and `EDGE_ZONE_MM + FEATHER_MM` above it. No hairline,
or no hair above it: None (nothing to grow from). A pure function: the input is not written.

Known limit (docs/generation.md): short stubble far above a deep plan still reads as a
streaky patch. Measured by scripts/bench_preview.py; pictures in docs/generation.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np

from .designs import Design, FaceFrame, current_heights, has_hairline
from .head_samples import brow_curve
from .types import Calibration, Face, Hairline

FEATHER_MM = 2.5  # blend width at the top of the fill, above the old edge zone
# Below the new edge the blend runs over UNDER_EDGE_MM: the old edge's soft underside (fine
# hairs thinning into skin) comes along, so the new line is as soft as the old one.
UNDER_EDGE_MM = 4.0
# The hair just above a traced hairline is its soft, see-through front (the trace sits where
# the hair coverage crosses one half): the fill covers it too, or it shows as a pale seam
# between the grown hair and the hair behind.
EDGE_ZONE_MM = 3.5
SMOOTH_MM = 3.0  # Gaussian sigma of the drop across columns: the traced hairline is jagged
TAPER_FRACTION = 0.25  # share of the plan's width over which the drop fades in at each end
MIN_HAIR_MM = 2.0  # a column needs this much hair above its hairline to lend any
MAX_SOURCE_MM = 12.0  # the hair lent lies at most this far above the hairline: beyond, the head's outline
MAX_STRETCH = 2.5  # hair stretched more than this over the band no longer looks like hair
BROW_MARGIN_MM = 3.0  # nothing changes below this line above the brows
COLUMN_STEP_PX = 1.0


def grow_preview(
    rgb: np.ndarray,
    face: Face,
    hairline: Hairline,
    hair: np.ndarray,
    design: Design,
    calibration: Calibration,
) -> np.ndarray | None:
    """The photo with hair grown down to `design`, or None without hair to grow from.

    `rgb` is the analysed photo (H, W, 3) uint8, `hair` its hair mask (bool, same size),
    `hairline` the detected one, `design` the planned or marked line (image px)."""
    if not has_hairline(hairline) or not hair.any():
        return None
    frame = FaceFrame.from_face(face)
    px_per_mm = 1.0 / calibration.mm_per_px
    columns = _columns(frame, hairline, hair, design, px_per_mm)
    if columns is None:
        return None
    box = _box(frame, columns, rgb.shape[:2], px_per_mm)
    if box is None:
        return rgb.copy()
    return _blend(rgb, face, frame, columns, box, px_per_mm)


@dataclass(frozen=True)
class _Columns:
    """Per-column geometry on a regular grid of `u`; heights are `v` in px."""

    u: np.ndarray
    current_v: np.ndarray  # the traced hairline
    smooth_v: np.ndarray  # the same, smoothed: where stretched hair is anchored
    drop: np.ndarray  # how far the hair moves down (smooth, 0 at the plan's ends)
    hair_height: np.ndarray  # how much hair lies above the line, to lend


def _columns(
    frame: FaceFrame, hairline: Hairline, hair: np.ndarray, design: Design, px_per_mm: float
) -> _Columns | None:
    design_uv = frame.to_frame(design.points)
    order = np.argsort(design_uv[:, 0])
    design_u, design_v = design_uv[order, 0], design_uv[order, 1]
    u = np.arange(design_u[0], design_u[-1] + COLUMN_STEP_PX, COLUMN_STEP_PX)
    current_v = current_heights(hairline, frame, u)
    hair_height = _hair_above(frame, hair, u, current_v, px_per_mm)
    lends = hair_height >= MIN_HAIR_MM * px_per_mm
    if not lends.any():
        return None  # a hairline with no hair above it: nothing to take texture from
    raw = np.clip(current_v - np.interp(u, design_u, design_v), 0.0, None)
    raw[~lends] = 0.0
    sigma = SMOOTH_MM * px_per_mm / COLUMN_STEP_PX
    drop = np.minimum(_smooth(raw, sigma), raw.max()) * _taper(len(u))
    # a column without hair of its own borrows its neighbours' (the drop there comes from them too)
    hair_height = _smooth(np.interp(u, u[lends], hair_height[lends]), sigma)
    grows = drop > MIN_HAIR_MM * px_per_mm
    if grows.any() and np.median(drop[grows] / hair_height[grows]) > MAX_STRETCH:
        return None  # a thin strip (stubble) far above the plan: stretched, it smears, not hair
    return _Columns(u, current_v, _smooth(current_v, sigma), drop, hair_height)


def _smooth(values: np.ndarray, sigma: float) -> np.ndarray:
    return cv2.GaussianBlur(values.reshape(1, -1), (0, 0), sigmaX=sigma, borderType=cv2.BORDER_REPLICATE).ravel()


def _taper(count: int) -> np.ndarray:
    """1 in the middle, a raised-cosine fade to 0 over TAPER_FRACTION at each end."""
    ramp = max(1, round(TAPER_FRACTION * count))
    fade = 0.5 - 0.5 * np.cos(np.linspace(0.0, np.pi, ramp))
    weights = np.ones(count)
    weights[:ramp] = np.minimum(weights[:ramp], fade)
    weights[count - ramp:] = np.minimum(weights[count - ramp:], fade[::-1])
    return weights


def _hair_above(frame: FaceFrame, hair: np.ndarray, u: np.ndarray, current_v: np.ndarray, px_per_mm: float) -> np.ndarray:
    """Per column, how far (px, along `up`) the hair reaches unbroken above the current line."""
    steps = np.arange(0.0, MAX_SOURCE_MM * px_per_mm, max(1.0, 0.5 * px_per_mm))
    uu = np.broadcast_to(u[:, None], (len(u), len(steps)))
    vv = current_v[:, None] + steps[None, :]
    points = frame.to_image(np.stack([uu.ravel(), vv.ravel()], axis=1))
    height, width = hair.shape
    x, y = np.round(points[:, 0]).astype(int), np.round(points[:, 1]).astype(int)
    inside = (x >= 0) & (x < width) & (y >= 0) & (y < height)
    is_hair = (hair[np.clip(y, 0, height - 1), np.clip(x, 0, width - 1)] & inside).reshape(len(u), len(steps))
    is_hair[:, 0] = True  # the traced edge itself sits where coverage crosses one half
    first_gap = np.where(is_hair.all(axis=1), len(steps), np.argmin(is_hair, axis=1))
    return steps[np.clip(first_gap - 1, 0, len(steps) - 1)]


def _box(frame: FaceFrame, columns: _Columns, shape: tuple[int, int], px_per_mm: float) -> tuple[int, int, int, int] | None:
    """x0, y0, x1, y1 of the pixels that may change (the band +- the feather), or None."""
    grows = columns.drop > 0.25
    if not grows.any():
        return None
    feather = FEATHER_MM * px_per_mm
    u = columns.u[grows]
    low = columns.current_v[grows] - columns.drop[grows] - UNDER_EDGE_MM * px_per_mm
    high = columns.current_v[grows] + EDGE_ZONE_MM * px_per_mm + feather
    corners = frame.to_image(np.concatenate([np.stack([u, low], 1), np.stack([u, high], 1)]))
    x0, y0 = np.floor(corners.min(axis=0)).astype(int) - 2
    x1, y1 = np.ceil(corners.max(axis=0)).astype(int) + 3
    height, width = shape
    x0, y0, x1, y1 = max(0, x0), max(0, y0), min(width, x1), min(height, y1)
    return (x0, y0, x1, y1) if x1 > x0 and y1 > y0 else None


def _smoothstep(edge0: np.ndarray | float, edge1: np.ndarray | float, x: np.ndarray) -> np.ndarray:
    t = np.clip((x - edge0) / np.maximum(edge1 - edge0, 1e-6), 0.0, 1.0)
    return t * t * (3.0 - 2.0 * t)


def _blend(
    rgb: np.ndarray, face: Face, frame: FaceFrame, columns: _Columns, box: tuple[int, int, int, int], px_per_mm: float
) -> np.ndarray:
    x0, y0, x1, y1 = box
    ys, xs = np.mgrid[y0:y1, x0:x1].astype(np.float64)
    uv = frame.to_frame(np.stack([xs.ravel(), ys.ravel()], axis=1))
    u, v = uv[:, 0], uv[:, 1]
    current = np.interp(u, columns.u, columns.current_v)
    drop = np.interp(u, columns.u, columns.drop, left=0.0, right=0.0)
    hair_height = np.interp(u, columns.u, columns.hair_height)
    feather = FEATHER_MM * px_per_mm
    # Where each pixel's hair comes from: `drop` higher up (`reach`: how far above the
    # current line). Where the hair above is shorter than the drop, the hair that is there
    # is stretched over the band instead (strands lengthen; nothing repeats). Below the new
    # edge (the lower feather) it is the skin under the old edge, unstretched.
    reach = drop + (v - current)
    anchor = np.interp(u, columns.u, columns.smooth_v)
    stretch = np.maximum(drop / hair_height, 1.0)
    lifted = np.minimum(anchor + (v + drop - anchor) / stretch, current + hair_height)  # never past the hair
    source_v = np.where(reach < 0, v + drop, lifted)
    source = frame.to_image(np.stack([u, source_v], axis=1)).astype(np.float32)
    shape = ys.shape
    moved = cv2.remap(rgb, source[:, 0].reshape(shape), source[:, 1].reshape(shape),
                      cv2.INTER_LINEAR, borderMode=cv2.BORDER_REFLECT)
    new_edge = current - drop
    top = current + EDGE_ZONE_MM * px_per_mm
    under = UNDER_EDGE_MM * px_per_mm
    weight = _smoothstep(new_edge - under, new_edge - under / 3, v) * (1.0 - _smoothstep(top, top + feather, v))
    weight *= drop > 0.25
    below_brows = ys.ravel() >= brow_curve(face, xs.ravel()) - BROW_MARGIN_MM * px_per_mm
    weight[below_brows] = 0.0
    weight = weight.reshape(shape)[..., None]
    out = rgb.copy()
    region = out[y0:y1, x0:x1].astype(np.float32)
    out[y0:y1, x0:x1] = np.clip(np.rint(region + weight * (moved.astype(np.float32) - region)), 0, 255).astype(np.uint8)
    return out
