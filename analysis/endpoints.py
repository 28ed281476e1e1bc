"""One entry point per analysed endpoint: image bytes + parsed options in, the `data` dict out.

Each is registered under its name in the endpoint registry (`@handles`, `HANDLERS`): the GPU
host's model process calls `run_endpoint`; `hairgate analyze` calls it in-process. Checks
run in the order of gpu_host.md: decode (1003/1002/1004) -> face count (1005/1006) -> pose
(1008) -> analysis. Options were validated by `shared.contract.bodies.parse_options` before
(1001); only what needs the decoded image (mark points inside it) is checked here, and a
refusal is an `AnalysisError` (`analysis.errors`), which the caller answers.

Returned dicts are plain JSON values: images are base64 PNG strings under keys ending in
`_base64` (the gateway turns them into `_url`s), grown images come from the built-in
preview (`analysis.drawing.preview`, `generator: "preview"`), coordinates are rounded to 0.1 px.

The inpainting masks that generation needs are internal: only when the caller sets
`options[INPAINT_MASK_OPTION]` (never set by `parse_options`, so never by a client) does
each grow result, and the mark data, carry `inpaint_mask_png` (base64 PNG; the name does
not end in `_base64`, so the gateway would never publish it) instead of a preview: the host
sets it when ComfyUI is configured, and ComfyUI draws the grown image from that mask.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from shared.contract import GENERATOR_PREVIEW, MSG_ANSWER_TOO_LARGE, MSG_NO_HAIRLINE_TO_LOWER, RefusalKind
from shared.contract import endpoints as registry
from shared.contract.hop import INPAINT_MASK_KEY, INPAINT_MASK_OPTION
from shared.settings import AnalysisSettings

from .drawing import designs, preview, render
from .errors import AnalysisError
from .face.calibration import calibrate
from .face.landmarks import FaceMeshDetector
from .face.pose import check_pose, estimate_pose, pose_is_stable, turned_over
from .face.upright import Upright
from .frame import FaceFrame
from .hairline.decision import Candidate, Decision, decide
from .hairline.frontal import hairline_candidate, headwear_in_mask
from .hairline.measurements import measure_face
from .image_input import decode_image
from .models import Models
from .types import Calibration, Face, Hairline, HairSegmentation, LandmarkId, Pose


@dataclass(frozen=True)
class Analysis:
    """Everything the hair endpoints share: one face, its scale, hair and hairline, all in
    the photo's own pixels (a tilted head was analysed upright and mapped back)."""

    face: Face
    pose: Pose
    calibration: Calibration
    segmentation: HairSegmentation
    hairline: Hairline


@dataclass(frozen=True)
class FrontalFace:
    """The one face, its pose, and how far past a yaw/pitch limit it is measured (degrees)."""

    face: Face
    pose: Pose
    past_limit_degrees: float = 0.0


# -- the handler table: one entry per endpoint of the registry the analysis answers ----------

Run = Callable[[np.ndarray, Models, dict[str, Any], AnalysisSettings], dict[str, Any]]


@dataclass(frozen=True)
class Handler:
    """The analysis of one endpoint, and how many pictures of the photo's size it draws for
    its options (a grown picture, or the inpainting mask ComfyUI draws it from, counts as one)."""

    run: Run
    pictures: Callable[[dict[str, Any]], int]


HANDLERS: dict[str, Handler] = {}


def handles(name: str, pictures: Callable[[dict[str, Any]], int]) -> Callable[[Run], Run]:
    """Registers the decorated function as the analysis of the registry's endpoint `name`
    (`shared.contract.endpoints`; ValueError for a name it does not know)."""

    def register(run: Run) -> Run:
        HANDLERS[registry.endpoint(name).name] = Handler(run, pictures)
        return run

    return register


def _one(options: dict[str, Any]) -> int:
    return 1


def _none(options: dict[str, Any]) -> int:
    return 0


def _round(value: float, digits: int = 1) -> float:
    return round(float(value), digits)


def _point(point: Any) -> list[float] | None:
    if point is None:
        return None
    x, y = np.asarray(point, dtype=np.float64).reshape(2)
    return [_round(x), _round(y)]


def _points(points: Any) -> list[list[float]] | None:
    if points is None:
        return None
    rows = np.asarray(points, dtype=np.float64).reshape(-1, 2)
    return [_point(row) for row in rows[np.isfinite(rows).all(axis=1)]]  # type: ignore[misc]


def frontal_face(rgb: np.ndarray, detector: FaceMeshDetector, limits: AnalysisSettings) -> FrontalFace:
    """Exactly one face (1005/1006), frontal enough (1008; near a yaw/pitch limit, a stable
    pose reading is measured rather than refused: `pose.check_pose`)."""
    face = detector.detect(rgb)
    pose = estimate_pose(face)
    if detector.upside_down(rgb, face):  # roll over the full circle: the landmarks read it near 0
        pose = replace(pose, roll_degrees=turned_over(pose.roll_degrees))
    past_limit = check_pose(pose, limits, stable=_near_a_limit(pose, limits) and pose_is_stable(face, pose))
    return FrontalFace(face, pose, past_limit)


def _near_a_limit(pose: Pose, limits: AnalysisSettings) -> bool:
    return abs(pose.yaw_degrees) > limits.max_yaw_degrees or abs(pose.pitch_degrees) > limits.max_pitch_degrees


@dataclass(frozen=True)
class Traced:
    """Everything before the decision layer weighs the evidence (`hairline.decision`): the
    face, its scale, the upright working frame and the candidate hairline in it."""

    found: FrontalFace
    calibration: Calibration
    turn: Upright
    segmentation: HairSegmentation  # in the working (upright) frame
    candidate: Candidate

    def decided(self, limits: AnalysisSettings, decision: Decision | None = None) -> Analysis:
        """The analysis with the hairline decided by `decision` (default: the shipped file)."""
        hairline = self.turn.hairline_back(decide(self.candidate, decision))
        hairline = _widened_for_pose(hairline, self.found, self.calibration, limits)
        segmentation = self.turn.segmentation_back(self.segmentation)
        return Analysis(self.found.face, self.found.pose, self.calibration, segmentation, hairline)


def trace(rgb: np.ndarray, models: Models, limits: AnalysisSettings) -> Traced:
    """Refusals (1005/1006/1008), then segmentation and tracing up to the candidate answer."""
    found = frontal_face(rgb, models.detector, limits)
    calibration = calibrate(found.face, limits.iris_diameter_mm)
    turn = Upright.of(found.face, found.pose.roll_degrees)
    work_rgb, work_face = turn.image(rgb), turn.face(found.face)
    segmentation = models.segmenter.segment(work_rgb, work_face)
    candidate = hairline_candidate(work_rgb, work_face, segmentation, calibration)
    return Traced(found, calibration, turn, segmentation, candidate)


def analyse(rgb: np.ndarray, models: Models, limits: AnalysisSettings) -> Analysis:
    return trace(rgb, models, limits).decided(limits)


def _widened_for_pose(
    hairline: Hairline, found: FrontalFace, calibration: Calibration, limits: AnalysisSettings
) -> Hairline:
    """A photo measured past a yaw/pitch limit: the band grows by `pose_widening_mm`, and a
    note says why."""
    extra_mm = pose_widening_mm(hairline, found, calibration, limits)
    if extra_mm <= 0 or hairline.uncertainty_mm is None:
        return hairline
    pose = found.pose
    note = (
        f"头部偏转略超出建议范围（左右 {abs(pose.yaw_degrees):.0f}°，上下 {abs(pose.pitch_degrees):.0f}°），"
        f"误差范围已放宽 {extra_mm:.1f} mm；正对镜头重拍可更准确"
    )
    return replace(hairline, uncertainty_mm=hairline.uncertainty_mm + extra_mm, notes=(*hairline.notes, note))


def pose_widening_mm(
    hairline: Hairline, found: FrontalFace, calibration: Calibration, limits: AnalysisSettings
) -> float:
    """What the extra turn past a yaw/pitch limit can foreshorten the forehead by: height ×
    (cos limit − cos angle), for each angle past its own limit, the larger (0 within them)."""
    if found.past_limit_degrees <= 0 or hairline.trichion is None:
        return 0.0
    pose = found.pose
    frame = FaceFrame.from_face(found.face)
    height_mm = abs(float(frame.to_frame(np.asarray(hairline.trichion))[0, 1])) * calibration.mm_per_px
    past_limits = [
        (abs(angle), limit)
        for angle, limit in ((pose.yaw_degrees, limits.max_yaw_degrees), (pose.pitch_degrees, limits.max_pitch_degrees))
        if abs(angle) > limit
    ]
    return height_mm * max(
        (math.cos(math.radians(limit)) - math.cos(math.radians(angle)) for angle, limit in past_limits), default=0.0
    )


def _hairline_data(hairline: Hairline) -> dict[str, Any]:
    return {
        "status": hairline.status,
        "points": _points(hairline.points),
        "trichion": _point(hairline.trichion),
        "shape": hairline.shape,
        "uncertainty_mm": None if hairline.uncertainty_mm is None else _round(hairline.uncertainty_mm),
    }


@handles("measure", pictures=_one)
def measure(rgb: np.ndarray, models: Models, options: dict[str, Any], limits: AnalysisSettings) -> dict[str, Any]:
    """Endpoint 1."""
    found = analyse(rgb, models, limits)
    face, pose, calibration = found.face, found.pose, found.calibration
    data: dict[str, Any] = {
        "image": {"width": face.image_width, "height": face.image_height},
        "face": {
            "bbox": list(face.bbox),
            "pose": {
                "yaw": _round(pose.yaw_degrees),
                "pitch": _round(pose.pitch_degrees),
                "roll": _round(pose.roll_degrees),
            },
        },
        "calibration": {
            "method": "iris",
            "iris_diameter_px": _round(calibration.iris_diameter_px),
            "mm_per_px": _round(calibration.mm_per_px, 4),
        },
        "hairline": _hairline_data(found.hairline),
        **measure_face(face, found.hairline, calibration, options.get("gender", "unknown"), limits),
        "segmenter": found.segmentation.segmenter,
    }
    annotated = render.annotate_measurement(rgb, face, found.hairline, calibration, data)  # draws on rgb
    data["annotated_image_base64"] = render.png_base64(annotated)
    return data


def _inpaint_mask(found: Analysis, design: designs.Design) -> str:
    mask = designs.inpainting_mask(found.face, design, found.hairline, found.calibration, found.segmentation.person)
    return render.png_base64(mask)


def _grown(rgb: np.ndarray, found: Analysis, design: designs.Design, options: dict[str, Any]) -> dict[str, Any]:
    """The grown picture's fields: nothing without hair to grow from; ComfyUI configured, its
    inpainting mask (the host fills the picture in); otherwise the built-in preview."""
    if not designs.has_hairline(found.hairline):
        return {"grown_image_base64": None, "generator": None}
    if options.get(INPAINT_MASK_OPTION):
        return {"grown_image_base64": None, "generator": None, INPAINT_MASK_KEY: _inpaint_mask(found, design)}
    grown = preview.grow_preview(rgb, found.face, found.hairline, found.segmentation, design, found.calibration)
    if grown is None:
        return {"grown_image_base64": None, "generator": None}
    return {"grown_image_base64": render.png_base64(grown), "generator": GENERATOR_PREVIEW}


def _plan_caption(design: designs.Design) -> str:
    drop = "n/a" if design.drop_mm is None else f"{design.drop_mm:.1f} mm"
    return f"plan {design.name}: drop {drop}"


@handles("grow", pictures=lambda options: 2 * len(options["plans"]))  # each plan drawn, and grown
def grow(rgb: np.ndarray, models: Models, options: dict[str, Any], limits: AnalysisSettings) -> dict[str, Any]:
    """Endpoint 2: one drawn plan per requested plan, each with its grown picture."""
    found = analyse(rgb, models, limits)
    plans = designs.plan_designs(
        options["plans"], found.face, found.hairline, found.calibration, options.get("gender", "unknown")
    )
    pictures = render.png_base64_all(
        [render.draw_design(rgb, found.hairline, plan, _plan_caption(plan)) for plan in plans]
    )
    results = []
    for plan, picture in zip(plans, pictures, strict=True):
        result: dict[str, Any] = {
            "plan": plan.name,
            "hairline_drop_mm": None if plan.drop_mm is None else _round(plan.drop_mm),
            "image_base64": picture,
        }
        result.update(_grown(rgb, found, plan, options))
        results.append(result)
    return {"results": results}


def _check_points_inside(points: list[list[float]], width: int, height: int) -> None:
    for index, (x, y) in enumerate(points):
        if not (0 <= x <= width and 0 <= y <= height):
            raise AnalysisError(
                RefusalKind.INVALID_OPTION,
                f"参数 hairline_points 第 {index + 1} 个点 ({x:g}, {y:g}) 超出图片范围 {width}×{height}",
            )


@handles("mark", pictures=lambda options: 2)  # the hairline drawn, and grown
def mark(rgb: np.ndarray, models: Models, options: dict[str, Any], limits: AnalysisSettings) -> dict[str, Any]:
    """Endpoint 3: the user's polyline, or the detected hairline lowered by `drop_mm`."""
    height, width = rgb.shape[:2]
    points = options.get("hairline_points")
    if points is not None:
        _check_points_inside(points, width, height)
    found = analyse(rgb, models, limits)
    if points is not None:
        design = designs.marked_hairline(points)
        caption = "marked hairline"
    elif not designs.has_hairline(found.hairline):
        raise AnalysisError(RefusalKind.INVALID_OPTION, MSG_NO_HAIRLINE_TO_LOWER.format(status=found.hairline.status))
    else:
        design = designs.lowered_hairline(found.face, found.hairline, found.calibration, options["drop_mm"])
        caption = f"hairline lowered {options['drop_mm']:.1f} mm"
    data: dict[str, Any] = {
        "marked_image_base64": render.png_base64(render.draw_design(rgb, found.hairline, design, caption)),
    }
    data.update(_grown(rgb, found, design, options))
    return data


@handles("hairline", pictures=lambda options: len(options["styles"]))
def hairline(rgb: np.ndarray, models: Models, options: dict[str, Any], limits: AnalysisSettings) -> dict[str, Any]:
    """Endpoint 5: one image per requested style."""
    found = analyse(rgb, models, limits)
    gender = options.get("gender", "unknown")
    styles = [
        designs.style_design(style, found.face, found.hairline, found.calibration, gender)
        for style in options["styles"]
    ]
    pictures = render.png_base64_all(
        [render.draw_design(rgb, found.hairline, style, f"style {style.name}") for style in styles]
    )
    return {
        "hairline_images": [
            {"style": style.name, "image_base64": picture} for style, picture in zip(styles, pictures, strict=True)
        ]
    }


@handles("mask", pictures=_one)
def mask(rgb: np.ndarray, models: Models, options: dict[str, Any], limits: AnalysisSettings) -> dict[str, Any]:
    """Endpoint 6: the hair mask (255/0, input size) and the share of the image it covers.
    Only the subject's hair (analysis.md § Rendering): a cap's band the segmenter took for
    hair, the one that makes the hairline `occluded`, is taken out."""
    found = frontal_face(rgb, models.detector, limits)
    turn = Upright.of(found.face, found.pose.roll_degrees)
    work_rgb, work_face = turn.image(rgb), turn.face(found.face)
    segmentation = models.segmenter.segment(work_rgb, work_face)
    headwear = headwear_in_mask(work_rgb, work_face, segmentation)
    hair = turn.mask_back(segmentation.hair if headwear is None else segmentation.hair & ~headwear)
    return {
        "mask_image_base64": render.png_base64(render.mask_image(hair)),
        "hair_area_ratio": _round(np.count_nonzero(hair) / hair.size, 4),
    }


def special_points_of(face: Face) -> dict[str, Any]:
    """Endpoint 99's data for a detected face: landmarks only, no segmentation.

    `trichion` is the top of the mesh (not a hairline); the temples are the upper lateral
    forehead points on the face oval (54 / 284); left/right are image-left/image-right."""
    named = {
        "trichion": LandmarkId.MESH_TOP,
        "glabella": LandmarkId.GLABELLA,
        "nasion": LandmarkId.NASION,
        "subnasale": LandmarkId.SUBNASALE,
        "menton": LandmarkId.MENTON,
        "left_temple": LandmarkId.UPPER_LATERAL_FOREHEAD[0],
        "right_temple": LandmarkId.UPPER_LATERAL_FOREHEAD[1],
        "left_iris_center": LandmarkId.IRIS_CENTERS[0],
        "right_iris_center": LandmarkId.IRIS_CENTERS[1],
    }
    return {
        "image": {"width": face.image_width, "height": face.image_height},
        "points": {name: _point(face.points[index]) for name, index in named.items()},
    }


def special_points(
    rgb: np.ndarray, detector: FaceMeshDetector, limits: AnalysisSettings | None = None
) -> dict[str, Any]:
    """Endpoint 99 (the gateway calls it on its own CPU); with `limits`, the pose gate
    (1008) applies as on every other endpoint."""
    face = frontal_face(rgb, detector, limits).face if limits is not None else detector.detect(rgb)
    return special_points_of(face)


@handles("special-points", pictures=_none)
def _special_points_endpoint(
    rgb: np.ndarray, models: Models, options: dict[str, Any], limits: AnalysisSettings
) -> dict[str, Any]:
    return special_points(rgb, models.detector, limits)


def check_answer_size(
    endpoint: str, options: dict[str, Any], width: int, height: int, limits: AnalysisSettings
) -> None:
    """1004 before anything is drawn when the answer's pictures would pass
    `limits.max_answer_megapixels`: one legal 52 MP /grow drew six ~73 MB PNGs, an answer
    over 512 MiB that took the host (and, retried, a second one) out of the pool."""
    count = HANDLERS[endpoint].pictures(options)
    megapixels = count * width * height / 1e6
    if megapixels > limits.max_answer_megapixels:
        message = MSG_ANSWER_TOO_LARGE.format(
            count=count, width=width, height=height, megapixels=megapixels, limit=limits.max_answer_megapixels
        )
        raise AnalysisError(RefusalKind.BAD_RESOLUTION, message)


def run_endpoint(
    endpoint: str, image: bytes, options: dict[str, Any], models: Models, limits: AnalysisSettings
) -> dict[str, Any]:
    """Decode `image` and run `endpoint`; AnalysisError for anything the client must fix."""
    try:
        handler = HANDLERS[endpoint]
    except KeyError:
        raise ValueError(f"unknown endpoint {endpoint!r}; known: {', '.join(HANDLERS)}") from None
    rgb = decode_image(image, limits)
    check_answer_size(endpoint, options, rgb.shape[1], rgb.shape[0], limits)
    return handler.run(rgb, models, options, limits)
