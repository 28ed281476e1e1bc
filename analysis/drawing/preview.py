"""The built-in growth preview (gpu_host.md § Generation): the client's own hair brought down
to a planned hairline, for hosts without ComfyUI.

Recipe, in the face's midline frame (`frame.FaceFrame`: `v` up the midline, `u` across):
- per column `u`, the drop `d(u)` is how far the planned line lies below the current one,
  smoothed across columns; it follows the plan's own shape, and a plan that ends below the
  current line is joined to it beyond its end along a temple's curve (`grown_edge`: no
  plateau, no vertical seam);
- the new edge is made irregular the way hair is: `d(u)` wanders by up to `EDGE_NOISE_MM`
  along the line (a fixed, seeded pattern: a retried request draws the same picture);
- the band is filled with the client's own hair: the strip just above the current hairline
  moved down by `d(u)`, so the old edge's fine hairs and soft skin-to-hair transition land
  on the new line. Where the hair above is shorter than the band needs, further copies of
  the hair strip (each from a slightly different column, `JITTER_MM`) continue it upwards,
  cross-faded over `OVERLAP` of their height: strands repeat softly, nothing is stretched
  or smeared into columns. The repeats carry the strip's strands on the colour of the hair
  moved once (`TREND_MM`), and every move resamples with Lanczos (`RESAMPLING`): the band
  keeps the hair's fine detail and shows no stripe per repeat; from the first repeat on
  that colour is the hair's own, smooth across columns (`_held_colour`: no stripe down the
  band). Only hair inside the person's outline is lent;
- blended over `UNDER_EDGE_MM` below the new edge (skin into skin; wider, up to
  `UNDER_EDGE_MAX_MM`, where the skin moved and the skin it lands on are lit more
  differently than the old edge's own contrast) and faded into the original hair above the
  old edge's see-through front.
A plan that does not lower the line (0 mm) returns the photo unchanged, bit for bit. Nothing
moves below the brows (the blend weight is 0 there) and pixels change only within the band,
`UNDER_EDGE_MAX_MM` + `EDGE_NOISE_MM` below it and `EDGE_ZONE_MM + FEATHER_MM` above it. No
hairline, or no hair above it: None (nothing to grow from). A pure function: the input is
not written.

Measured by scripts/bench_preview.py; pictures in docs/generation.md
(scripts/make_doc_pictures.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np

from ..face.head_samples import brow_curve, to_lab
from ..frame import FaceFrame
from ..types import Calibration, Face, Hairline, HairSegmentation
from .designs import Design, current_heights, has_hairline

FEATHER_MM = 2.5  # blend width at the top of the fill, above the old edge zone
# Below the new edge the blend runs over UNDER_EDGE_MM: the old edge's soft underside (fine
# hairs thinning into skin) comes along, so the new line is as soft as the old one. Measured
# (`preview_texture`, docs/generation.md): at 1.5 mm the new edge's steepest step was up to
# 1.6x the old one's on five photos (the moved skin and the forehead it lands on are lit
# differently: the blend between them was a step of its own); at 3.5 mm <= 1.47x on all.
# That step is as large as the lighting between the two skins differs: where it differs more
# than the old edge's own contrast (skin under the old edge against the hair above it), the
# blend widens by as much, up to UNDER_EDGE_MAX_MM (a stubble rim: the skin under it is
# 82 L darker than the forehead it lands on, twice the edge's contrast; at 3.5 mm the new
# edge was 1.58x the old one's, at 6.9 mm 1.09x).
UNDER_EDGE_MM = 3.5
UNDER_EDGE_MAX_MM = 8.0
SKIN_SAMPLES_MM = (0.5, 1.0, 1.5, 2.0)  # below a line: the skin the blend runs over
HAIR_SAMPLES_MM = (1.0, 2.0, 3.0)  # above the old line: the hair the old edge turns into
# The hair just above a traced hairline is its soft, see-through front (the trace sits where
# the hair coverage crosses one half): the fill covers it too, or it shows as a pale seam
# between the grown hair and the hair behind.
EDGE_ZONE_MM = 3.5
SMOOTH_MM = 3.0  # Gaussian sigma of the drop across columns: the traced hairline is jagged
END_SLOPE = 1.2  # a plan ending below the current line rejoins it this steeply (rise / run) ...
JOIN_MAX_MM = 15.0  # ... over at most this length beyond its end
END_ROUND_MM = 2.0
EDGE_NOISE_MM = 1.0  # how far the new edge wanders (hair does not end on a drawn curve)
EDGE_NOISE_PERIODS_MM = (3.0, 1.2)  # ... in tufts and in single locks along the line
# The front of a hairline is thinner than the hair behind, but the moved old edge brings its
# own thin front along: the fill reaches full cover FRONT_MM above the new edge. At 2.5 mm
# (a second fade over the old front's own) the band of a small drop kept 0.60-0.69 of the
# hair's high-frequency energy on seven photos, a smoothed strip; at 0.5 mm 0.76-1.01.
FRONT_MM = 0.5
MIN_HAIR_MM = 2.0  # a column needs this much hair above its hairline to lend any
MAX_SOURCE_MM = 12.0  # the hair lent lies at most this far above the hairline: beyond, the head's outline
MAX_REPEATS = 4.0  # a band deeper than this many times the hair lent would show its copies: None
EDGE_STRIP_MM = 3.0  # the old edge itself (at most 40 % of the hair lent) is moved once, never repeated
OVERLAP = 0.35  # share of each repeated strip cross-faded with the next
JITTER_MM = 4.0  # each repeat of the strip comes from a column up to this far away
BROW_MARGIN_MM = 3.0  # nothing changes below this line above the brows
MIN_DROP_PX = 0.5  # a plan lowering the line by less than this changes nothing
COLUMN_STEP_PX = 1.0
# The hair is moved by a smooth, sub-pixel drop in a rotated frame: every pixel is resampled
# between four source pixels. Bilinear resampling averages them, a low-pass filter on detail
# one or two pixels wide, which is what strands are in a small photo (at 2 px/mm:
# the band kept 0.69 of the hair's high-frequency energy, 1.0 moved by whole pixels).
# Lanczos (8x8 taps) keeps that detail (0.92-1.02) without the staircase of whole-pixel moves.
RESAMPLING = cv2.INTER_LANCZOS4
# Each repeat of the hair strip carries the strip's strands (detail finer than TREND_MM, the
# sigma of the photo's low-pass) on the colour the hair has at the top of the strip moved
# once: the strip's own trend (lighter at its front, darker at its top) repeated was a
# stripe every repeat (on a deep drop: bands 3-4 mm apart).
TREND_MM = 1.0
# From the first repeat on, that colour is the hair's alone (not the trend, which mixes in
# what lies beside the hair) and smoothed across columns over JITTER_MM (the repeats' own
# columns wander that far): held from a single point per column, the colour is the same all
# the way down the band, so any difference between neighbouring columns ran down it as a
# vertical stripe (a strip that is a rim of stubble at the head's outline, where
# that point's trend ran from stubble to half wall from column to column).
_SEED = 17  # of the edge pattern and the repeats' columns


def grow_preview(
    rgb: np.ndarray,
    face: Face,
    hairline: Hairline,
    segmentation: HairSegmentation,
    design: Design,
    calibration: Calibration,
) -> np.ndarray | None:
    """The photo with hair grown down to `design`, or None without hair to grow from.

    `rgb` is the analysed photo (H, W, 3) uint8, `segmentation` its masks (same size),
    `hairline` the detected one, `design` the planned or marked line (image px)."""
    # only hair inside the head's outline is lent: a hair network that paints the background
    # beyond a stubble rim as hair would lend the wall, repeated as stripes
    hair = segmentation.hair & segmentation.person
    if not has_hairline(hairline) or not hair.any():
        return None
    frame = FaceFrame.from_face(face)
    px_per_mm = 1.0 / calibration.mm_per_px
    columns = _columns(rgb, frame, hairline, hair, design, px_per_mm)
    if columns is None:
        return None
    height, width = rgb.shape[:2]
    box = _box(frame, columns, (height, width), px_per_mm)
    if box is None or design.drop_mm == 0.0:
        return rgb.copy()  # nothing lowered: the photo as it came
    return _blend(rgb, hair, face, frame, columns, box, px_per_mm)


@dataclass(frozen=True)
class _Columns:
    """Per-column geometry on a regular grid of `u`; heights are `v` in px."""

    u: np.ndarray
    current_v: np.ndarray  # the traced hairline
    drop: np.ndarray  # how far the hair moves down (smooth; 0 where the plan is not lower)
    hair_height: np.ndarray  # how much hair lies above the line, to lend
    lends: np.ndarray  # bool: the column has hair of its own to lend
    under: float  # px: the blend's width below the new edge


def _columns(
    rgb: np.ndarray, frame: FaceFrame, hairline: Hairline, hair: np.ndarray, design: Design, px_per_mm: float
) -> _Columns | None:
    u, drop = _drop_profile(frame, hairline, design, px_per_mm)
    current_v = current_heights(hairline, frame, u)
    hair_height = _hair_above(frame, hair, u, current_v, px_per_mm)
    lends = hair_height >= MIN_HAIR_MM * px_per_mm
    if not lends.any():
        return None  # a hairline with no hair above it: nothing to take texture from
    sigma = SMOOTH_MM * px_per_mm / COLUMN_STEP_PX
    drop = np.where(drop > 0, drop + _edge_noise(u, drop, px_per_mm), 0.0)
    # a column without hair of its own borrows its neighbours' (the drop there comes from them too)
    hair_height = _smooth(np.interp(u, u[lends], hair_height[lends]), sigma)
    grows = drop > MIN_HAIR_MM * px_per_mm
    if grows.any() and np.median(drop[grows] / hair_height[grows]) > MAX_REPEATS:
        return None  # a thin strip (stubble) far above the plan: repeated, it is a pattern, not hair
    return _Columns(u, current_v, drop, hair_height, lends, _under_edge(rgb, frame, u, current_v, drop, px_per_mm))


def _under_edge(
    rgb: np.ndarray, frame: FaceFrame, u: np.ndarray, current_v: np.ndarray, drop: np.ndarray, px_per_mm: float
) -> float:
    """The width (px) of the blend below the new edge: UNDER_EDGE_MM, widened by the lightness
    step between the skin moved and the skin it lands on over the old edge's own contrast
    (medians over the columns that grow), at most UNDER_EDGE_MAX_MM."""
    grows = drop > 0
    if not grows.any():
        return UNDER_EDGE_MM * px_per_mm
    current = current_v[grows]

    def lightness(base: np.ndarray, offsets_mm: tuple[float, ...]) -> np.ndarray:  # per column, median L
        heights = base[:, None] + np.asarray(offsets_mm)[None, :] * px_per_mm
        uu = np.broadcast_to(u[grows][:, None], heights.shape)
        points = frame.to_image(np.stack([uu.ravel(), heights.ravel()], axis=1))
        x = np.clip(np.round(points[:, 0]).astype(int), 0, rgb.shape[1] - 1)
        y = np.clip(np.round(points[:, 1]).astype(int), 0, rgb.shape[0] - 1)
        return np.median(to_lab(rgb[y, x][None])[0, :, 0].reshape(heights.shape), axis=1)

    below = tuple(-offset for offset in SKIN_SAMPLES_MM)
    moved, landed = lightness(current, below), lightness(current - drop[grows], below)
    contrast = float(np.median(np.abs(moved - lightness(current, HAIR_SAMPLES_MM))))
    step = float(np.median(np.abs(landed - moved)))
    widen = np.clip(step / max(contrast, 1.0), 1.0, UNDER_EDGE_MAX_MM / UNDER_EDGE_MM)
    return float(UNDER_EDGE_MM * widen * px_per_mm)


def _smooth(values: np.ndarray, sigma: float) -> np.ndarray:
    return cv2.GaussianBlur(values.reshape(1, -1), (0, 0), sigmaX=sigma, borderType=cv2.BORDER_REPLICATE).ravel()


def _joins(design_u: np.ndarray, design_drop: np.ndarray, px_per_mm: float) -> tuple[np.ndarray, np.ndarray]:
    """The plan's line continued beyond its ends, where it still lies below the current line:
    up to the current line along a temple's curve (raised cosine over drop / END_SLOPE, at
    most JOIN_MAX_MM), never a vertical seam. Returns the joined u grid and the drop on it."""
    step = COLUMN_STEP_PX
    lengths = [
        min(float(end) / END_SLOPE, JOIN_MAX_MM * px_per_mm) if end > MIN_DROP_PX else 0.0
        for end in (design_drop[0], design_drop[-1])
    ]
    before = np.arange(design_u[0] - lengths[0], design_u[0], step) if lengths[0] > 0 else np.zeros(0)
    after = np.arange(design_u[-1] + step, design_u[-1] + lengths[1] + step, step) if lengths[1] > 0 else np.zeros(0)

    def fade(distance: np.ndarray, length: float, end: float) -> np.ndarray:
        return end * (0.5 + 0.5 * np.cos(np.pi * np.clip(distance / max(length, 1.0), 0.0, 1.0)))

    u = np.concatenate([before, design_u, after])
    drop = np.concatenate(
        [
            fade(design_u[0] - before, lengths[0], float(design_drop[0])),
            design_drop,
            fade(after - design_u[-1], lengths[1], float(design_drop[-1])),
        ]
    )
    return u, drop


def grown_edge(face: Face, hairline: Hairline, design: Design, calibration: Calibration) -> np.ndarray | None:
    """(N, 2) image px: the line the preview grows the hair down to (before its edge's
    irregularity): the plan itself, joined to the current hairline beyond its ends; None
    without a hairline."""
    if not has_hairline(hairline):
        return None
    frame = FaceFrame.from_face(face)
    u, drop = _drop_profile(frame, hairline, design, 1.0 / calibration.mm_per_px)
    return frame.to_image(np.stack([u, current_heights(hairline, frame, u) - drop], axis=1))


def _drop_profile(
    frame: FaceFrame, hairline: Hairline, design: Design, px_per_mm: float
) -> tuple[np.ndarray, np.ndarray]:
    """The u grid (the plan's span and its joins) and the smooth drop on it, px."""
    design_uv = frame.to_frame(design.points)
    order = np.argsort(design_uv[:, 0])
    design_u, design_v = design_uv[order, 0], design_uv[order, 1]
    u = np.arange(design_u[0], design_u[-1] + COLUMN_STEP_PX, COLUMN_STEP_PX)
    raw = np.clip(current_heights(hairline, frame, u) - np.interp(u, design_u, design_v), 0.0, None)
    sigma = SMOOTH_MM * px_per_mm / COLUMN_STEP_PX
    u, drop = _joins(u, np.minimum(_smooth(raw, sigma), raw.max()), px_per_mm)
    drop = _smooth(drop, END_ROUND_MM * px_per_mm / COLUMN_STEP_PX)
    drop[drop < MIN_DROP_PX] = 0.0
    return u, drop


def _edge_noise(u: np.ndarray, drop: np.ndarray, px_per_mm: float) -> np.ndarray:
    """A smooth random wander of the new edge, EDGE_NOISE_MM at most, vanishing where the drop
    is small (the plan's ends) so it never moves the unchanged line."""
    rng = np.random.default_rng(_SEED)
    wander = np.zeros(len(u))
    for octave, period_mm in enumerate(EDGE_NOISE_PERIODS_MM):
        period = max(1.0, period_mm * px_per_mm / COLUMN_STEP_PX)
        knots = rng.uniform(-1.0, 1.0, int(len(u) / period) + 3)
        wander += 0.6**octave * _smooth(
            np.interp(np.arange(len(u)) / period, np.arange(len(knots)), knots), 0.3 * period
        )
    wander /= max(1e-6, float(np.abs(wander).max()))
    amplitude = EDGE_NOISE_MM * px_per_mm * np.clip(drop / (4.0 * EDGE_NOISE_MM * px_per_mm), 0.0, 1.0)
    return np.maximum(wander * amplitude, -drop)


def _hair_above(
    frame: FaceFrame, hair: np.ndarray, u: np.ndarray, current_v: np.ndarray, px_per_mm: float
) -> np.ndarray:
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


def _box(
    frame: FaceFrame, columns: _Columns, shape: tuple[int, int], px_per_mm: float
) -> tuple[int, int, int, int] | None:
    """x0, y0, x1, y1 of the pixels that may change (the band +- the feather), or None."""
    grows = columns.drop > 0
    if not grows.any():
        return None
    feather = FEATHER_MM * px_per_mm
    u = columns.u[grows]
    low = columns.current_v[grows] - columns.drop[grows] - columns.under
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


def _jitters(count: int, px_per_mm: float) -> np.ndarray:
    """Column offset of each repeat of the hair strip; the first (the moved edge) stays put."""
    offsets = np.random.default_rng(_SEED + 1).uniform(-1.0, 1.0, count) * JITTER_MM * px_per_mm
    offsets[0] = 0.0
    return offsets


@dataclass(frozen=True)
class _Sources:
    """Per pixel of the box, where its fill comes from (frame u, v)."""

    strands: list[tuple[np.ndarray, np.ndarray]]  # the repeat the pixel lies in, and the one before it
    fade: np.ndarray  # weight of the one before, where the two cross-fade
    held: tuple[np.ndarray, np.ndarray]  # where its low-frequency colour comes from
    settled: np.ndarray  # 0 within the hair moved once, 1 from the first repeat on: the colour is the hair's mean


def _source_heights(columns: _Columns, u: np.ndarray, reach: np.ndarray, px_per_mm: float) -> _Sources:
    """Where each pixel's hair comes from, as two (u, v) sources and the second's weight,
    and where its low-frequency colour comes from (`held`).

    `reach` is how far above the current line the pure downward move would fetch it. The old
    edge strip (up to `edge` above the line) is fetched once; above it the hair strip of
    height `period / (1 - OVERLAP)` repeats every `period`, each repeat from another column,
    and where two repeats overlap the earlier one fades out. `held` is the pure move up to
    the first repeat's top and that point above it: the repeats carry the strip's strands,
    never its trend from the light front to the dense hair, which repeated is a stripe.
    `settled` rises from 0 to 1 over the first repeat's cross-fade."""
    hair_height = np.interp(u, columns.u, columns.hair_height)
    edge = np.minimum(EDGE_STRIP_MM * px_per_mm, 0.4 * hair_height)
    strip = np.maximum(hair_height - edge, 1.0)
    period = (1.0 - OVERLAP) * strip
    above_edge = np.maximum(reach - edge, 0.0)
    repeat = np.floor(above_edge / period).astype(int)
    within = above_edge - repeat * period
    jitters = _jitters(int(repeat.max(initial=0)) + 2, px_per_mm)
    lending = columns.u[columns.lends]
    low, high = float(lending.min()), float(lending.max())

    def source(index: np.ndarray, height_in_strip: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        source_u = np.clip(u + jitters[np.maximum(index, 0)], low, high)
        base = np.interp(source_u, columns.u, columns.current_v)
        return source_u, base + np.where(reach < edge, reach, edge + height_in_strip)

    current = source(repeat, within)
    earlier = source(repeat - 1, within + period)  # the previous repeat, still inside its strip
    fade = (1.0 - _smoothstep(0.0, OVERLAP * strip, within)) * (repeat >= 1) * (reach >= edge)
    held = source(np.zeros_like(repeat), np.minimum(above_edge, period))
    settled = _smoothstep(period, period + OVERLAP * strip, above_edge) * (reach >= edge)
    return _Sources([current, earlier], fade, held, settled)


def _held_colour(
    rgb: np.ndarray, hair: np.ndarray, frame: FaceFrame, columns: _Columns, px_per_mm: float
) -> np.ndarray:
    """(N, 3) float32: per column, the photo's colour where `held` ends (the top of the first
    repeat, `_source_heights`), from hair pixels only (a column whose point is not hair takes
    its neighbours'), smoothed across columns over JITTER_MM."""
    edge = np.minimum(EDGE_STRIP_MM * px_per_mm, 0.4 * columns.hair_height)
    held_v = columns.current_v + edge + (1.0 - OVERLAP) * np.maximum(columns.hair_height - edge, 1.0)
    points = frame.to_image(np.stack([columns.u, held_v], axis=1))
    height, width = hair.shape
    x = np.clip(np.round(points[:, 0]).astype(int), 0, width - 1)
    y = np.clip(np.round(points[:, 1]).astype(int), 0, height - 1)
    known = hair[y, x]
    if not known.any():
        known = np.ones(len(x), dtype=bool)
    colours = rgb[y, x].astype(np.float64)
    sigma = JITTER_MM * px_per_mm / COLUMN_STEP_PX
    return np.stack(
        [_smooth(np.interp(columns.u, columns.u[known], colours[known, channel]), sigma) for channel in range(3)],
        axis=1,
    ).astype(np.float32)


def _blend(
    rgb: np.ndarray,
    hair: np.ndarray,
    face: Face,
    frame: FaceFrame,
    columns: _Columns,
    box: tuple[int, int, int, int],
    px_per_mm: float,
) -> np.ndarray:
    x0, y0, x1, y1 = box
    ys, xs = np.mgrid[y0:y1, x0:x1].astype(np.float64)
    uv = frame.to_frame(np.stack([xs.ravel(), ys.ravel()], axis=1))
    u, v = uv[:, 0], uv[:, 1]
    current = np.interp(u, columns.u, columns.current_v)
    drop = np.interp(u, columns.u, columns.drop, left=0.0, right=0.0)
    # the pure downward move fetches from `drop` higher up: the old edge lands on the new one;
    # below the new edge (the lower feather) it is the skin under the old edge
    reach = drop + (v - current)
    sources = _source_heights(columns, u, np.maximum(reach, 0.0), px_per_mm)
    fade, settled = sources.fade, sources.settled
    shape = ys.shape
    points = [
        frame.to_image(np.stack([np.where(reach < 0, u, su), np.where(reach < 0, v + drop, sv)], axis=1))
        for su, sv in (*sources.strands, sources.held)
    ]
    # the photo's low frequencies (colour and light over more than ~TREND_MM), around the sources only
    margin = 3.0 * TREND_MM * px_per_mm + 2.0
    corner = np.floor(np.min([p.min(axis=0) for p in points], axis=0) - margin).astype(int)
    far = np.ceil(np.max([p.max(axis=0) for p in points], axis=0) + margin).astype(int)
    left, upper = (int(value) for value in np.maximum(corner, 0))
    right, lower = (int(value) for value in np.minimum(far, (rgb.shape[1], rgb.shape[0])))
    trend = cv2.GaussianBlur(rgb[upper:lower, left:right].astype(np.float32), (0, 0), TREND_MM * px_per_mm)

    def moved(image: np.ndarray, source: np.ndarray, resampling: int, origin: tuple[int, int] = (0, 0)) -> np.ndarray:
        at: np.ndarray = (source - np.asarray(origin, dtype=np.float64)).astype(np.float32)
        return cv2.remap(
            image, at[:, 0].reshape(shape), at[:, 1].reshape(shape), resampling, borderMode=cv2.BORDER_REFLECT
        ).astype(np.float32)

    def smooth_at(source: np.ndarray) -> np.ndarray:  # the trend has no detail to lose: bilinear
        return moved(trend, source, cv2.INTER_LINEAR, (left, upper))

    def strands(source: np.ndarray) -> np.ndarray:  # the photo less its trend, at the source
        return moved(rgb, source, RESAMPLING) - smooth_at(source)

    fill = strands(points[0])
    if fade.any():  # the second source only matters where a repeat cross-fades into it
        fill += fade.reshape(shape)[..., None].astype(np.float32) * (strands(points[1]) - fill)
    held = smooth_at(points[2])
    if settled.any():
        colour = _held_colour(rgb, hair, frame, columns, px_per_mm)
        strip = np.stack([np.interp(u, columns.u, colour[:, channel]) for channel in range(3)], axis=1)
        held += settled.reshape(shape)[..., None].astype(np.float32) * (strip.reshape(*shape, 3) - held)
    fill += held
    new_edge = current - drop
    top = current + EDGE_ZONE_MM * px_per_mm
    under = columns.under
    front = FRONT_MM * px_per_mm
    weight = _smoothstep(new_edge - under, new_edge + front, v) * (
        1.0 - _smoothstep(top, top + FEATHER_MM * px_per_mm, v)
    )
    weight *= drop > 0
    below_brows = ys.ravel() >= brow_curve(face, xs.ravel()) - BROW_MARGIN_MM * px_per_mm
    weight[below_brows] = 0.0
    weight_image = weight.reshape(shape)[..., None].astype(np.float32)
    out = rgb.copy()
    region = out[y0:y1, x0:x1].astype(np.float32)
    out[y0:y1, x0:x1] = np.clip(np.rint(region + weight_image * (fill - region)), 0, 255).astype(np.uint8)
    return out
