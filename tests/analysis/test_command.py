"""`hairgate analyze`: the real command in a subprocess (stdout is exactly one JSON document),
and `command.run` in-process for its error paths and settings."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from analysis import command
from analysis.native_logs import CHATTER_WARNINGS
from cluster.cli import build_parser
from shared.contract import GENERATOR_PREVIEW, is_envelope

from .images import encode

REPO = Path(__file__).resolve().parents[2]


def hairgate(*arguments: str | Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    script = Path(sys.executable).with_name("hairgate")
    launcher = [str(script)] if script.exists() else [sys.executable, "-m", "cluster.cli"]
    return subprocess.run([*launcher, *map(str, arguments)], capture_output=True, text=True, timeout=timeout, cwd=REPO)


def stdout_json(result: subprocess.CompletedProcess[str]) -> Any:
    try:
        return json.loads(result.stdout)  # the whole of stdout: no log line may leak into it
    except ValueError:
        pytest.fail(f"stdout is not one JSON document:\n{result.stdout[:2000]}\nstderr:\n{result.stderr[-2000:]}")


def png_file(url: str) -> Path:
    assert url.startswith("file:///")
    path = Path(url.removeprefix("file://"))
    assert path.is_file()
    return path


@pytest.fixture
def astronaut_file(tmp_path: Path, astronaut: np.ndarray) -> Path:
    path = tmp_path / "astronaut.png"
    path.write_bytes(encode(astronaut, "PNG"))
    return path


def test_measure_prints_data_with_urls_of_written_pngs(astronaut_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = hairgate("analyze", astronaut_file, "--out", out, "--gender", "female")
    assert result.returncode == 0, result.stderr[-3000:]
    data = stdout_json(result)
    assert data["image"] == {"width": 512, "height": 512}
    assert not any(key.endswith("_base64") for key in data)
    annotated = png_file(data["annotated_image_url"])
    assert annotated.parent == out.resolve()
    with Image.open(annotated) as image:
        assert image.format == "PNG" and image.size == (512, 512)
    # MediaPipe's native start-up chatter (TFLite INFO, absl banner, per-graph warnings) is
    # filtered, and so are libvips' INFO lines of each PNG encoded
    for chatter in ("TensorFlow Lite", "absl::InitializeLog", "threadpool completed", *CHATTER_WARNINGS):
        assert chatter not in result.stderr, result.stderr[-3000:]


@pytest.mark.slow
def test_a_file_that_is_not_an_image_prints_the_envelope(tmp_path: Path) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("not a photo\n")
    result = hairgate("analyze", notes, "--out", tmp_path / "out")
    assert result.returncode == command.EXIT_BAD_INPUT
    envelope = stdout_json(result)
    assert is_envelope(envelope) and envelope["code"] == 1002 and envelope["data"] is None
    assert not (tmp_path / "out").exists()  # nothing written for a failure


@pytest.mark.slow
def test_mark_without_out_writes_to_a_temporary_folder_named_on_stderr(photos_dir: Path) -> None:
    # a head of hair to grow from (the astronaut's fringe hides her hairline: nothing to grow)
    points = "[[380, 110], [455, 104], [530, 110]]"  # across obama's forehead, below his hairline
    result = hairgate("analyze", photos_dir / "obama.jpg", "--endpoint", "mark", "--points", points)
    assert result.returncode == 0, result.stderr[-3000:]
    data = stdout_json(result)
    assert set(data) == {"marked_image_url", "grown_image_url", "generator"}
    assert data["generator"] == GENERATOR_PREVIEW  # no ComfyUI here: the built-in preview grows it
    marked, grown = png_file(data["marked_image_url"]), png_file(data["grown_image_url"])
    assert grown.parent == marked.parent
    assert f"images written to {marked.parent}" in result.stderr
    for leftover in marked.parent.iterdir():
        leftover.unlink()
    marked.parent.rmdir()


@pytest.mark.slow
def test_special_points_need_no_images(astronaut_file: Path) -> None:
    result = hairgate("analyze", astronaut_file, "--endpoint", "special-points")
    assert result.returncode == 0, result.stderr[-3000:]
    data = stdout_json(result)
    assert set(data["points"]) >= {"trichion", "glabella", "menton", "left_iris_center"}
    assert "images written" not in result.stderr


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    """`command.run` configures process-wide logging onto this test's captured stderr."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:], root.level = handlers, level


def _args(*argv: str) -> Any:
    return build_parser().parse_args(["analyze", *argv])


def test_bad_option_is_1001_before_anything_loads(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    missing = tmp_path / "missing.jpg"  # never read: the options fail first
    assert command.run(_args(str(missing), "--endpoint", "grow", "--plans", "standard,bold")) == command.EXIT_BAD_INPUT
    envelope = json.loads(capsys.readouterr().out)
    assert envelope["code"] == 1001 and "plans" in envelope["message"]


def test_unreadable_photo_is_1001(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert command.run(_args(str(tmp_path / "missing.jpg"))) == command.EXIT_BAD_INPUT
    envelope = json.loads(capsys.readouterr().out)
    assert envelope["code"] == 1001 and "missing.jpg" in envelope["message"]


def test_image_writer_swaps_keys_at_any_depth(tmp_path: Path, astronaut: np.ndarray) -> None:
    from analysis.drawing.render import png_base64

    png = png_base64(astronaut[:8, :8])
    data = {
        "results": [{"plan": "standard", "image_base64": png, "grown_image_base64": None}],
        "mask_image_base64": png,
        "hair_area_ratio": 0.1,
    }
    published = command.ImageWriter(str(tmp_path), "p.grow").publish(data)
    assert published["hair_area_ratio"] == 0.1 and published["results"][0]["grown_image_url"] is None
    first = png_file(published["results"][0]["image_url"])
    assert first.name == "p.grow.results.0.image.png"
    assert png_file(published["mask_image_url"]).name == "p.grow.mask_image.png"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["p.grow.mask_image.png", "p.grow.results.0.image.png"]


def test_config_limits_apply(capsys: pytest.CaptureFixture[str], tmp_path: Path, astronaut_file: Path) -> None:
    config = tmp_path / "settings.toml"
    config.write_text("[analysis]\nmin_short_side_px = 600\n")
    assert command.run(_args(str(astronaut_file), "--config", str(config))) == command.EXIT_BAD_INPUT
    envelope = json.loads(capsys.readouterr().out)
    assert envelope["code"] == 1004 and "600" in envelope["message"]


def test_broken_config_is_a_system_error_named_on_stderr(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    config = tmp_path / "settings.toml"
    config.write_text("[analysis]\nmin_short_side = 600\n")  # misspelled key
    assert command.run(_args("photo.jpg", "--config", str(config))) == command.EXIT_SYSTEM_ERROR
    captured = capsys.readouterr()
    assert json.loads(captured.out)["code"] == 1007
    assert "analysis.min_short_side" in captured.err


@pytest.mark.parametrize("out", ["/proc/nope", "file"])
def test_an_unusable_out_folder_is_a_one_line_usage_error_before_any_analysis(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, out: str
) -> None:
    (tmp_path / "file").write_text("a file, not a folder")
    out_path = out if out.startswith("/") else str(tmp_path / out)
    missing = tmp_path / "missing.jpg"  # never read: --out fails first
    assert command.run(_args(str(missing), "--out", out_path)) == command.EXIT_BAD_INPUT
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1
    assert captured.err.startswith(f"hairgate analyze: error: --out {out_path}: ")
