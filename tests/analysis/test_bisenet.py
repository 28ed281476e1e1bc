"""BiSeNet: the network matches the public state dict, loads strictly, and segments through
the HairSegmenter interface. Random weights only: quality cannot be tested here."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from analysis.segmentation.bisenet import HAIR, HAT, BiSeNet, BisenetSegmenter, load_bisenet

MANIFEST = Path(__file__).parent / "data" / "bisenet_state_dict_manifest.json"


@pytest.fixture(scope="module")
def network() -> BiSeNet:
    torch.manual_seed(0)
    return BiSeNet().eval()


@pytest.fixture(scope="module")
def weights_file(network, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("bisenet") / "random.pth"
    torch.save(network.state_dict(), path)
    return path


def constant_class_network(label: int) -> BiSeNet:
    """A network whose main head says `label` everywhere and whose auxiliary heads say
    otherwise: the last ConvBNReLU outputs 1 everywhere, the classifier reads only `label`."""
    network = BiSeNet().eval()
    with torch.no_grad():
        head = network.conv_out
        head.conv.bn.weight.zero_()
        head.conv.bn.bias.fill_(1.0)
        head.conv_out.weight.zero_()
        head.conv_out.weight[label] = 1.0
        for auxiliary in (network.conv_out16, network.conv_out32):
            auxiliary.conv.bn.weight.zero_()
            auxiliary.conv.bn.bias.fill_(1.0)
            auxiliary.conv_out.weight.zero_()
            auxiliary.conv_out.weight[(label + 1) % 19] = 1.0
    return network


def test_state_dict_matches_the_public_weights_manifest(network):
    manifest = json.loads(MANIFEST.read_text())
    found = [
        [key, list(value.shape), str(value.dtype).removeprefix("torch.")] for key, value in network.state_dict().items()
    ]
    assert found == manifest["entries"]
    assert len(found) == manifest["n_entries"] == 191
    assert sum(parameter.numel() for parameter in network.parameters()) == manifest["n_params"] == 13_300_416


def test_strict_round_trip(network, weights_file):
    loaded = load_bisenet(weights_file, "cpu")
    assert not loaded.training
    for key, value in network.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key


def test_data_parallel_prefix_is_stripped(network, tmp_path):
    path = tmp_path / "parallel.pth"
    torch.save({f"module.{key}": value for key, value in network.state_dict().items()}, path)
    loaded = load_bisenet(path)
    assert torch.equal(loaded.state_dict()["cp.resnet.conv1.weight"], network.state_dict()["cp.resnet.conv1.weight"])


def test_checkpoint_without_batch_counters_loads(network, tmp_path):
    path = tmp_path / "old_pytorch.pth"
    torch.save({key: value for key, value in network.state_dict().items() if "num_batches_tracked" not in key}, path)
    loaded = load_bisenet(path)
    assert torch.equal(loaded.state_dict()["ffm.conv2.weight"], network.state_dict()["ffm.conv2.weight"])


def test_wrong_shape_names_the_key_and_both_shapes(network, tmp_path):
    state = dict(network.state_dict())
    state["conv_out.conv_out.weight"] = torch.zeros(2, 256, 1, 1)  # a 2-class head
    torch.save(state, tmp_path / "two_classes.pth")
    expected = r"'conv_out\.conv_out\.weight' has shape \(2, 256, 1, 1\), expected \(19, 256, 1, 1\)"
    with pytest.raises(ValueError, match=expected):
        load_bisenet(tmp_path / "two_classes.pth")


def test_missing_and_unexpected_keys_are_named(network, tmp_path):
    state = dict(network.state_dict())
    del state["ffm.conv2.weight"]
    torch.save(state, tmp_path / "missing.pth")
    with pytest.raises(ValueError, match=r"lacks 'ffm\.conv2\.weight'"):
        load_bisenet(tmp_path / "missing.pth")
    state = dict(network.state_dict(), **{"cp.resnet.fc.weight": torch.zeros(1000, 512)})
    torch.save(state, tmp_path / "extra.pth")
    with pytest.raises(ValueError, match=r"unexpected key 'cp\.resnet\.fc\.weight'"):
        load_bisenet(tmp_path / "extra.pth")


def test_a_whole_pickled_model_is_refused(tmp_path):
    torch.save([torch.zeros(3)], tmp_path / "list.pth")
    with pytest.raises(ValueError, match="not a BiSeNet state dict"):
        load_bisenet(tmp_path / "list.pth")


def test_output_zero_is_the_prediction(network):
    batch = torch.rand(1, 3, 128, 128)
    with torch.inference_mode():
        outputs = network(batch)
        assert [tuple(output.shape) for output in outputs] == [(1, 19, 128, 128)] * 3
        assert torch.equal(network.predict(batch), outputs[0])


def test_random_network_parses_the_astronaut(network, astronaut):
    labels = BisenetSegmenter.from_network(network).parse(astronaut)
    assert labels.shape == (512, 512) and labels.dtype == np.uint8
    assert labels.max() <= 18
    assert len(np.unique(labels)) > 1  # random weights still vary over the picture


def test_labels_come_back_at_the_input_size(grace_hopper):
    labels = BisenetSegmenter.from_network(constant_class_network(HAIR)).parse(grace_hopper)
    assert labels.shape == (600, 512)
    assert (labels == HAIR).all()


@pytest.mark.parametrize(
    "label, hair, hat, person", [(HAIR, True, False, True), (HAT, False, True, True), (0, False, False, False)]
)
def test_segment_maps_labels_to_masks(astronaut, detector, label, hair, hat, person):
    segmenter = BisenetSegmenter.from_network(constant_class_network(label))
    segmentation = segmenter.segment(astronaut, detector.detect(astronaut))
    assert segmenter.name == segmentation.segmenter == "bisenet"
    for mask, expected in ((segmentation.hair, hair), (segmentation.person, person), (segmentation.hat, hat)):
        assert mask.shape == (512, 512) and mask.dtype == bool
        assert (mask == expected).all()


def test_segmenter_loads_weights_from_a_file(weights_file, network, astronaut):
    from_file = BisenetSegmenter(weights_file, "cpu").parse(astronaut)
    np.testing.assert_array_equal(from_file, BisenetSegmenter.from_network(network).parse(astronaut))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU on this machine")
def test_cuda_agrees_with_cpu(weights_file, astronaut):
    on_gpu = BisenetSegmenter(weights_file, "cuda:0")
    assert next(on_gpu.network.parameters()).device.type == "cuda"
    agreement = (on_gpu.parse(astronaut) == BisenetSegmenter(weights_file, "cpu").parse(astronaut)).mean()
    assert agreement > 0.99
