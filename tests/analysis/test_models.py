"""load_models: which segmenter, which device, and a clear reason when weights cannot load."""

from __future__ import annotations

import subprocess
import sys
from contextlib import closing
from pathlib import Path

import pytest
import torch
from torch.nn.modules.module import register_module_forward_hook

from analysis.models import ModelLoadError, load_models, resolve_device
from analysis.segmentation import hairnet_graph
from analysis.segmentation.bisenet import BiSeNet, BisenetSegmenter, ContextPath
from analysis.segmentation.fallback import FallbackSegmenter
from analysis.segmentation.hairnet import HairNetSegmenter

REPO = Path(__file__).resolve().parents[2]


def test_web_side_imports_load_neither_torch_nor_mediapipe():
    # The GPU host's web process imports these; torch or MediaPipe there would defeat the
    # model process. A fresh interpreter, since this one has both loaded already.
    probe = (
        "import sys, analysis.models, analysis.image_input, analysis.face.pose, analysis.face.calibration, "
        "analysis.face.landmarks, analysis.types; "
        "print(sorted(name for name in ('torch', 'mediapipe', 'cv2') if name in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_device_resolution():
    assert resolve_device("cpu") == "cpu"
    assert resolve_device("auto") == ("cuda:0" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ModelLoadError, match="unknown device"):
        resolve_device("tpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA GPU")
def test_cuda_without_a_gpu_says_so():
    with pytest.raises(ModelLoadError, match="no CUDA GPU"):
        resolve_device("cuda")


@pytest.fixture(scope="module")
def weights_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("models") / "79999_iter.pth"
    torch.save(BiSeNet().state_dict(), path)
    return path


def test_named_weights_load_bisenet(weights_file):
    with closing(load_models(str(weights_file), device="cpu")) as models:
        assert isinstance(models.segmenter, BisenetSegmenter)
        assert models.segmenter.name == "bisenet"
        assert models.device == "cpu"


def test_missing_weights_file_says_not_found(tmp_path):
    with pytest.raises(ModelLoadError, match=r"weights file not found: .*absent\.pth"):
        load_models(str(tmp_path / "absent.pth"), device="cpu")


def test_unreadable_weights_say_why(tmp_path):
    garbage = tmp_path / "garbage.pth"
    garbage.write_bytes(b"this is not a checkpoint")
    with pytest.raises(ModelLoadError, match="cannot be loaded"):
        load_models(str(garbage), device="cpu")


def test_wrong_network_weights_name_the_key(tmp_path):
    wrong = tmp_path / "resnet.pth"
    torch.save({"conv1.weight": torch.zeros(64, 3, 7, 7)}, wrong)
    with pytest.raises(ModelLoadError, match=r"cp\.resnet\.conv1\.weight"):
        load_models(str(wrong), device="cpu")


def test_no_weights_means_the_hair_network_on_the_gpu_when_there_is_one():
    with closing(load_models("", device="auto")) as models:
        assert isinstance(models.segmenter, HairNetSegmenter)
        assert models.segmenter.name == "hairnet"
        assert models.device == ("cuda:0" if torch.cuda.is_available() else "cpu")
        assert next(models.segmenter.network.parameters()).device.type == models.device.split(":")[0]


def test_the_fallback_only_when_the_network_cannot_run(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(hairnet_graph, "MODEL_FILE", tmp_path / "absent.tflite")
    with closing(load_models("", device="cpu")) as models:
        assert isinstance(models.segmenter, FallbackSegmenter)
        assert models.segmenter.name == "fallback" and models.device == "cpu"
    assert "hair network unavailable" in caplog.text and "absent.tflite" in caplog.text


@pytest.mark.parametrize("segmenter", ["hairnet", "bisenet"])
def test_the_network_has_run_once_when_the_models_are_handed_over(segmenter, weights_file):
    # its first run allocates and picks kernels (~0.2 s on a CPU, CUDA's start more): the
    # load pays for it, not the first client's photo
    ran: list[str] = []

    def record(module, inputs, output):
        if isinstance(module, (hairnet_graph.HairNetwork, ContextPath)):
            ran.append(type(module).__name__)

    hook = register_module_forward_hook(record)
    try:
        with closing(load_models(str(weights_file) if segmenter == "bisenet" else "", device="cpu")):
            pass
    finally:
        hook.remove()
    assert ran == (["ContextPath"] if segmenter == "bisenet" else ["HairNetwork"])


def test_a_network_that_cannot_run_once_is_not_handed_over(monkeypatch, caplog):
    def no_kernel(self):
        raise RuntimeError("CUDA error: no kernel image is available for execution on the device")

    monkeypatch.setattr(HairNetSegmenter, "warm_up", no_kernel)
    with closing(load_models("", device="auto")) as models:
        assert isinstance(models.segmenter, FallbackSegmenter)
    assert "hair network unavailable" in caplog.text and "no kernel image" in caplog.text


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA GPU")
def test_an_asked_for_gpu_that_is_missing_is_an_error_not_the_fallback():
    with pytest.raises(ModelLoadError, match="no CUDA GPU"):
        load_models("", device="cuda")


def test_close_releases_the_segmenter_too(astronaut, face):
    models = load_models("", device="cpu")
    models.close()
    with pytest.raises(ValueError, match="_graph is None"):  # MediaPipe's graph is gone
        models.segmenter.segment(astronaut, face)
