"""The face-counting test set: real photos composed the way press photos go wrong.

Every case is built at run time from real photos that ship with installed packages (the
astronaut, Grace Hopper, scikit-image's text/page/brick/rocket/coffee/cat photos) and, when
present, the labelled photos in ../shared/photos; sources and licences are in README.md
beside this file. The expected count was checked by looking at each composed picture
(`python -m tests.analysis.face_counting_set OUT_DIR` writes them as PNGs).

- single: one person before a busy background (lettering, a printed page, brick, a rocket
  launch, a night sky), with or without a small poster / pencil drawing / bronze "statue"
  of another face in the backdrop (under a third of the person's face width: not a person
  in the photo);
- pair: two people side by side, the second scaled 1 : 1 down to 1 : 0.5, either on the
  left, aligned at the top, middle or bottom;
- group: three people;
- none: real photos without a face (coffee, a cat, a rocket, text).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np
from matplotlib import cbook
from PIL import Image
from skimage import data

PHOTOS_DIR = Path(__file__).resolve().parents[2] / ".." / "shared" / "photos"
# the labelled photos that show one person's whole head (the bald crops are tight)
PRESS_PHOTOS = ("obama.jpg", "lacamoire.jpg", "rose_leslie.jpg", "tom_cruise.jpg", "biden2.jpg")
# face width (mesh bounding box) over photo height, measured once on each source photo
FACE_SHARE = {
    "astronaut": 0.178,
    "hopper": 0.303,
    "obama": 0.211,
    "lacamoire": 0.243,
    "rose_leslie": 0.306,
    "tom_cruise": 0.511,
    "biden2": 0.376,
}
FACE_PX = 150  # the main person's face width in every composed picture
EXTRA_FACE_RATIO = 0.22  # a poster, drawing or statue in the backdrop: well under a third


def grace_hopper() -> np.ndarray:
    with cbook.get_sample_data("grace_hopper.jpg") as file:
        return np.asarray(Image.open(file).convert("RGB"))


def press_photo(name: str) -> np.ndarray:
    with Image.open(PHOTOS_DIR / name) as image:
        return np.asarray(image.convert("RGB"))


@dataclass(frozen=True)
class Person:
    name: str
    photo: Callable[[], np.ndarray]

    def with_face_width(self, pixels: float) -> np.ndarray:
        photo = self.photo()
        return scaled_to_height(photo, max(2, round(pixels / FACE_SHARE[self.name])))


def _rgb(gray_or_rgb: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(np.dstack([gray_or_rgb] * 3) if gray_or_rgb.ndim == 2 else gray_or_rgb[..., :3])


def scaled_to_height(rgb: np.ndarray, height: int) -> np.ndarray:
    width = max(1, round(rgb.shape[1] * height / rgb.shape[0]))
    interpolation = cv2.INTER_AREA if height < rgb.shape[0] else cv2.INTER_CUBIC
    return cv2.resize(rgb, (width, height), interpolation=interpolation)


def tiled(background: np.ndarray, height: int, width: int) -> np.ndarray:
    """A busy backdrop: `background` repeated (mirrored at the seams) to the size."""
    background = _rgb(background)
    reps = (-(-height // background.shape[0]), -(-width // background.shape[1]), 1)
    return np.ascontiguousarray(np.tile(background, reps)[:height, :width])


def paste(canvas: np.ndarray, picture: np.ndarray, top: int, left: int) -> None:
    canvas[top : top + picture.shape[0], left : left + picture.shape[1]] = picture


def pencil_drawing(rgb: np.ndarray) -> np.ndarray:
    """A grey pencil drawing of the photo (OpenCV's non-photorealistic rendering)."""
    gray, _ = cv2.pencilSketch(cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR), sigma_s=40, sigma_r=0.08, shade_factor=0.05)
    return _rgb(gray)


def bronze(rgb: np.ndarray) -> np.ndarray:
    """The photo as a bronze bust: lightness only, tinted."""
    light = cv2.cvtColor(rgb, cv2.COLOR_RGB2GRAY).astype(np.float32) / 255.0
    return np.clip(light[..., None] * np.array([205.0, 140.0, 80.0]), 0, 255).astype(np.uint8)


def pair(first: Person, second: Person, ratio: float, align: str, second_left: bool = False) -> np.ndarray:
    """Two people side by side on a grey canvas, the second's face `ratio` times as wide."""
    one, two = first.with_face_width(FACE_PX), second.with_face_width(FACE_PX * ratio)
    height = max(one.shape[0], two.shape[0])
    canvas = np.full((height, one.shape[1] + two.shape[1], 3), 110, np.uint8)
    place = {
        "top": lambda picture: 0,
        "middle": lambda picture: (height - picture.shape[0]) // 2,
        "bottom": lambda picture: height - picture.shape[0],
    }[align]
    left, right = (two, one) if second_left else (one, two)
    paste(canvas, left, place(left), 0)
    paste(canvas, right, place(right), left.shape[1])
    return canvas


def single_before(
    person: Person,
    backdrop: np.ndarray,
    extra: Person | None = None,
    look: Callable[[np.ndarray], np.ndarray] = lambda rgb: rgb,
) -> np.ndarray:
    """The person in the middle of a busy picture twice as wide; optionally another face,
    `EXTRA_FACE_RATIO` times as wide and rendered by `look`, hung in the top-left corner."""
    picture = person.with_face_width(FACE_PX)
    height, width = picture.shape[:2]
    canvas = tiled(backdrop, height, 2 * width)
    if extra is not None:
        paste(canvas, look(extra.with_face_width(FACE_PX * EXTRA_FACE_RATIO)), height // 20, width // 20)
    paste(canvas, picture, 0, width // 2)
    return canvas


@dataclass(frozen=True)
class Case:
    name: str
    faces: int  # 0, 1, or 2 for "two or more"
    build: Callable[[], np.ndarray]


ALIGNMENTS = ("top", "middle", "bottom")


def _backdrops() -> dict[str, Callable[[], np.ndarray]]:
    return {
        "text": data.text,
        "page": data.page,
        "brick": data.brick,
        "rocket": data.rocket,
        "hubble": data.hubble_deep_field,
    }


def cases(with_press_photos: bool) -> list[Case]:
    """The set; `with_press_photos` adds the cases built from ../shared/photos."""
    people = [Person("astronaut", data.astronaut), Person("hopper", grace_hopper)]
    if with_press_photos:
        people += [Person(name.split(".")[0], lambda name=name: press_photo(name)) for name in PRESS_PHOTOS]
    found = [
        Case(f"none_{name}", 0, lambda build=build: _rgb(build()))
        for name, build in {
            "coffee": data.coffee,
            "cat": data.chelsea,
            "rocket": data.rocket,
            "text": data.text,
        }.items()
    ]
    backdrops = list(_backdrops().items())
    for index, person in enumerate(people):
        backdrop_name, backdrop = backdrops[index % len(backdrops)]
        other = people[(index + 1) % len(people)]
        found += [
            Case(f"single_{person.name}_{backdrop_name}", 1, lambda p=person, b=backdrop: single_before(p, b())),
            Case(f"single_{person.name}_poster", 1, lambda p=person, o=other, b=backdrop: single_before(p, b(), o)),
            Case(
                f"single_{person.name}_drawing",
                1,
                lambda p=person, o=other, b=backdrop: single_before(p, b(), o, pencil_drawing),
            ),
            Case(
                f"single_{person.name}_statue",
                1,
                lambda p=person, o=other, b=backdrop: single_before(p, b(), o, bronze),
            ),
        ]
    for index, person in enumerate(people):
        other = people[(index + 1) % len(people)]
        for ratio in (1.0, 0.8, 0.65, 0.5):
            for align in ALIGNMENTS:
                found.append(
                    Case(
                        f"pair_{person.name}_{other.name}_{ratio}_{align}",
                        2,
                        lambda p=person, o=other, r=ratio, a=align: pair(p, o, r, a),
                    )
                )
        found.append(
            Case(
                f"pair_{other.name}_left_of_{person.name}_0.65",
                2,
                lambda p=person, o=other: pair(p, o, 0.65, "bottom", second_left=True),
            )
        )
    found.append(Case("group_three", 2, lambda: three(people[0], people[1], people[-1])))
    return found


def three(first: Person, second: Person, third: Person) -> np.ndarray:
    """Three people in a row, faces 1 : 0.8 : 0.6, bottoms aligned."""
    pictures = [
        first.with_face_width(FACE_PX),
        second.with_face_width(0.8 * FACE_PX),
        third.with_face_width(0.6 * FACE_PX),
    ]
    height = max(picture.shape[0] for picture in pictures)
    canvas = np.full((height, sum(picture.shape[1] for picture in pictures), 3), 110, np.uint8)
    left = 0
    for picture in pictures:
        paste(canvas, picture, height - picture.shape[0], left)
        left += picture.shape[1]
    return canvas


if __name__ == "__main__":  # write the pictures to look at them
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    for case in cases(PHOTOS_DIR.joinpath("labels.json").is_file()):
        Image.fromarray(case.build()).save(out / f"{case.faces}_{case.name}.png")
