"""The hair network: the TFLite reader, the torch port against LiteRT, the segmenter."""

from __future__ import annotations

import hashlib
import struct

import numpy as np
import pytest
import torch

from analysis.segmentation import hairnet_graph
from analysis.segmentation.hairnet import HairNetSegmenter
from analysis.segmentation.hairnet_graph import HairNetwork, _max_pool_with_argmax, _max_unpool
from analysis.segmentation.network_crop import NetworkCrop
from analysis.segmentation.subject_hair import subject_hair
from analysis.segmentation.tflite_reader import TfliteFormatError, read_graph
from analysis.types import Face

from .hairnet_reference import REFERENCE, STRIDE, reference_inputs


@pytest.fixture(scope="module")
def network() -> HairNetwork:
    return HairNetwork.from_file()


def test_the_bundled_file_is_the_published_network() -> None:
    data = hairnet_graph.MODEL_FILE.read_bytes()
    assert len(data) == 780_588
    assert hashlib.sha256(data).hexdigest() == hairnet_graph.MODEL_SHA256


def test_the_reader_finds_every_operator_and_the_weights() -> None:
    graph = read_graph(hairnet_graph.MODEL_FILE.read_bytes())
    kinds = [operator.kind for operator in graph.operators]
    assert {kind: kinds.count(kind) for kind in set(kinds)} == {
        "CONV_2D": 90,
        "DEPTHWISE_CONV_2D": 28,
        "PRELU": 100,
        "ADD": 28,
        "CONCATENATION": 2,
        "MaxPoolingWithArgmax2D": 3,
        "MaxUnpooling2D": 3,
        "Convolution2DTransposeBias": 5,
    }
    (source,), (target,) = graph.inputs, graph.outputs
    assert (graph.tensors[source].name, graph.tensors[source].shape) == ("input_1", (1, 512, 512, 4))
    assert graph.tensors[target].shape == (1, 512, 512, 2)
    parameters = sum(tensor.value.size for tensor in graph.tensors if tensor.value is not None)
    assert 170_000 < parameters < 190_000  # "~180 k parameters"
    dilated = [op for op in graph.operators if op.options.get("dilation_w_factor", 1) > 1]
    assert {op.options["dilation_w_factor"] for op in dilated} == {2, 4, 8}


@pytest.mark.parametrize("data", [b"", b"not a model at all", b"\x10\x00\x00\x00TFL3" + b"\xff" * 8])
def test_what_is_not_a_tflite_model_is_refused_clearly(data: bytes) -> None:
    with pytest.raises(TfliteFormatError):
        read_graph(data)


def test_a_damaged_bundled_file_is_refused_not_run(tmp_path, monkeypatch) -> None:
    damaged = tmp_path / "hair_segmentation.tflite"
    damaged.write_bytes(hairnet_graph.MODEL_FILE.read_bytes()[:-1] + b"\0")
    monkeypatch.setattr(hairnet_graph, "MODEL_FILE", damaged)
    with pytest.raises(TfliteFormatError, match="SHA-256"):
        HairNetwork.from_file()


@pytest.mark.parametrize("name", ["astronaut", "noise"])
def test_the_torch_port_computes_what_litert_computes(network: HairNetwork, name: str) -> None:
    """Reference logits from LiteRT 2.3 (XNNPACK), made by tests/analysis/hairnet_reference.py."""
    x = torch.from_numpy(reference_inputs()[name]).permute(2, 0, 1)[None]
    with torch.inference_mode():
        logits = network(x)[0].permute(1, 2, 0).numpy()[::STRIDE, ::STRIDE]
    reference = np.load(REFERENCE)[name]
    assert np.abs(logits - reference).max() <= 1e-4 * max(1.0, np.abs(reference).max())


def test_ties_in_a_pooling_window_go_where_mediapipe_puts_them() -> None:
    # three equal maxima: MediaPipe numbers positions column by column and keeps the first,
    # (1, 0); torch's row-by-row scan would pick (0, 1)
    x = torch.tensor([[[[0.0, 5.0], [5.0, 5.0]]]])
    values, positions = _max_pool_with_argmax(x, 2, 2)
    assert values.item() == 5.0 and positions.item() == 1
    restored = _max_unpool(values, positions, 2, 2)
    assert restored.tolist() == [[[[0.0, 0.0], [5.0, 0.0]]]]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU on this machine")
def test_cuda_computes_what_the_cpu_computes(network: HairNetwork) -> None:
    x = torch.from_numpy(reference_inputs()["astronaut"]).permute(2, 0, 1)[None]
    with torch.inference_mode():
        cpu = network(x)
        gpu = HairNetwork.from_file().to("cuda:0")(x.to("cuda:0")).cpu()
    assert torch.abs(cpu - gpu).max().item() <= 1e-3


def test_the_astronauts_hair_is_found_and_nothing_else(
    astronaut: np.ndarray, face: Face, hairnet: HairNetSegmenter
) -> None:
    result = hairnet.segment(astronaut, face)
    assert result.segmenter == "hairnet"
    assert result.hair.shape == result.person.shape == astronaut.shape[:2] and result.hair.dtype == bool
    assert result.hair[40, 226]  # her crown on the midline
    for cheek in (50, 280):
        x, y = face.points[cheek].round().astype(int)
        assert not result.hair[y, x]
    assert not result.hair[20, 60] and not result.hair[480, 250]  # the sky, her suit
    np.testing.assert_array_equal(result.hair, hairnet.segment(astronaut, face).hair)  # deterministic


def test_the_network_square_follows_a_rolled_head(face: Face) -> None:
    crop = NetworkCrop.around(face, 512)
    square = crop.face_in_square(face)
    top, chin = square.points[10], square.points[152]
    assert abs(top[0] - chin[0]) < 1.0 and top[1] < chin[1]  # upright in the square
    # the face is a third of the square, its centre shifted up a quarter face height
    assert abs(np.linalg.norm(top - chin) - 512 / 3) < 1.0
    assert abs((top[1] + chin[1]) / 2 - (256 + 0.25 * 512 / 3)) < 1.0


def test_hair_that_does_not_reach_the_head_is_not_the_subjects(face: Face) -> None:
    probability = np.zeros((face.image_height, face.image_width), np.float32)
    probability[5:25, 5:60] = 1.0  # a patch in the sky, far from her head
    top = face.points[10].round().astype(int)
    probability[top[1] - 40 : top[1] - 5, top[0] - 30 : top[0] + 30] = 1.0  # her crown
    hair = subject_hair(probability, face)
    assert not hair[5:25, 5:60].any()
    assert hair[top[1] - 30, top[0]]


def test_the_face_below_the_brows_is_never_scalp_hair(face: Face) -> None:
    probability = np.ones((face.image_height, face.image_width), np.float32)  # "everything is hair"
    hair = subject_hair(probability, face)
    for landmark in (1, 13, 152, 50, 280):  # nose, lips, chin, cheeks
        x, y = face.points[landmark].round().astype(int)
        assert not hair[y, x]
    x, y = face.points[10].round().astype(int)
    assert hair[y - 10, x]


def test_the_custom_op_options_are_raw_int32_structs() -> None:
    graph = read_graph(hairnet_graph.MODEL_FILE.read_bytes())
    pool = next(op for op in graph.operators if op.kind == "MaxPoolingWithArgmax2D")
    assert struct.unpack_from("<5i", pool.custom_options) == (1, 2, 2, 2, 2)  # SAME, stride 2, filter 2
