"""The 19-class face-parsing BiSeNet, and the hair segmenter built on it.

The network is the one of zllrunning/face-parsing.PyTorch (MIT), written out here so that
the public `79999_iter.pth` state dict loads with `strict=True`: a ResNet18 context path
(written here: torchvision's would download ImageNet weights when built), attention
refinement modules, a feature fusion module and three output heads, of which output 0 is
the prediction. The original's spatial path is the ResNet's 1/8 feature map.

This is the only analysis module that imports torch at module level; everything else imports
it lazily, so the GPU host's web process never loads torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch import nn

from ..types import Face, HairSegmentation

CLASS_COUNT = 19
BACKGROUND, HAIR, HAT = 0, 17, 18
INPUT_SIZE = 512
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class ConvBNReLU(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, kernel_size: int = 3, padding: int = 1) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=padding, bias=False)
        self.bn = nn.BatchNorm2d(out_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.bn(self.conv(x)))


class BasicBlock(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.downsample: nn.Sequential | None = None
        if in_channels != out_channels or stride != 1:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False),
                nn.BatchNorm2d(out_channels),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        residual = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
        shortcut = x if self.downsample is None else self.downsample(x)
        return F.relu(shortcut + residual)


def _stage(in_channels: int, out_channels: int, stride: int) -> nn.Sequential:
    return nn.Sequential(BasicBlock(in_channels, out_channels, stride), BasicBlock(out_channels, out_channels))


class ResNet18(nn.Module):
    """ResNet18 without its classifier; returns the 1/8, 1/16 and 1/32 feature maps."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = _stage(64, 64, stride=1)
        self.layer2 = _stage(64, 128, stride=2)
        self.layer3 = _stage(128, 256, stride=2)
        self.layer4 = _stage(256, 512, stride=2)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x = self.layer1(self.maxpool(F.relu(self.bn1(self.conv1(x)))))
        feat8 = self.layer2(x)
        feat16 = self.layer3(feat8)
        feat32 = self.layer4(feat16)
        return feat8, feat16, feat32


class AttentionRefinementModule(nn.Module):
    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.conv = ConvBNReLU(in_channels, out_channels)
        self.conv_atten = nn.Conv2d(out_channels, out_channels, 1, bias=False)
        self.bn_atten = nn.BatchNorm2d(out_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        feat = self.conv(x)
        attention = torch.sigmoid(self.bn_atten(self.conv_atten(F.adaptive_avg_pool2d(feat, 1))))
        return feat * attention


class ContextPath(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.resnet = ResNet18()
        self.arm16 = AttentionRefinementModule(256, 128)
        self.arm32 = AttentionRefinementModule(512, 128)
        self.conv_head32 = ConvBNReLU(128, 128)
        self.conv_head16 = ConvBNReLU(128, 128)
        self.conv_avg = ConvBNReLU(512, 128, kernel_size=1, padding=0)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        feat8, feat16, feat32 = self.resnet(x)
        global_context = self.conv_avg(F.adaptive_avg_pool2d(feat32, 1))
        feat32_sum = self.arm32(feat32) + global_context  # broadcast == nearest upsampling of 1×1
        feat32_up = self.conv_head32(F.interpolate(feat32_sum, feat16.shape[2:], mode="nearest"))
        feat16_sum = self.arm16(feat16) + feat32_up
        feat16_up = self.conv_head16(F.interpolate(feat16_sum, feat8.shape[2:], mode="nearest"))
        return feat8, feat16_up, feat32_up


class FeatureFusionModule(nn.Module):
    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.convblk = ConvBNReLU(in_channels, out_channels, kernel_size=1, padding=0)
        self.conv1 = nn.Conv2d(out_channels, out_channels // 4, 1, bias=False)
        self.conv2 = nn.Conv2d(out_channels // 4, out_channels, 1, bias=False)

    def forward(self, spatial: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        feat = self.convblk(torch.cat([spatial, context], dim=1))
        attention = torch.sigmoid(self.conv2(F.relu(self.conv1(F.adaptive_avg_pool2d(feat, 1)))))
        return feat * attention + feat


class BiSeNetOutput(nn.Module):
    def __init__(self, in_channels: int, mid_channels: int, class_count: int) -> None:
        super().__init__()
        self.conv = ConvBNReLU(in_channels, mid_channels)
        self.conv_out = nn.Conv2d(mid_channels, class_count, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv_out(self.conv(x))


class BiSeNet(nn.Module):
    """forward(x) -> (main, aux16, aux32) logits at the input size; output 0 is the prediction."""

    def __init__(self, class_count: int = CLASS_COUNT) -> None:
        super().__init__()
        self.cp = ContextPath()
        self.ffm = FeatureFusionModule(256, 256)
        self.conv_out = BiSeNetOutput(256, 256, class_count)
        self.conv_out16 = BiSeNetOutput(128, 64, class_count)
        self.conv_out32 = BiSeNetOutput(128, 64, class_count)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        feat8, context8, context16 = self.cp(x)
        heads = (self._main_head(feat8, context8), self.conv_out16(context8), self.conv_out32(context16))
        return tuple(_resize_logits(head, x) for head in heads)  # type: ignore[return-value]

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        """Main-head logits only: the auxiliary heads exist for training."""
        feat8, context8, _ = self.cp(x)
        return _resize_logits(self._main_head(feat8, context8), x)

    def _main_head(self, feat8: torch.Tensor, context8: torch.Tensor) -> torch.Tensor:
        return self.conv_out(self.ffm(feat8, context8))


def _resize_logits(logits: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return F.interpolate(logits, like.shape[2:], mode="bilinear", align_corners=True)


def load_bisenet(path: str | Path, device: str | torch.device = "cpu") -> BiSeNet:
    """The network with the state dict at `path`, in eval mode; ValueError naming the first bad key."""
    # Loaded on the CPU first: the network is built there, then moved once.
    state = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(state, dict):
        raise ValueError(f"{path} holds a {type(state).__name__}, not a BiSeNet state dict")
    state = {key.removeprefix("module."): value for key, value in state.items()}
    network = BiSeNet()
    expected = network.state_dict()
    # Checkpoints saved before PyTorch 0.4.1 lack these counters; eval mode never reads them.
    for key in expected:
        if key.endswith(".num_batches_tracked"):
            state.setdefault(key, torch.tensor(0))
    check_state_dict(state, expected)
    network.load_state_dict(state, strict=True)
    return network.to(device).eval()


def check_state_dict(state: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    """Name the first key that is missing, unexpected or of the wrong shape."""
    for key, reference in expected.items():
        if key not in state:
            raise ValueError(f"BiSeNet state dict lacks {key!r} (shape {tuple(reference.shape)})")
        found = getattr(state[key], "shape", None)
        if found is None or tuple(found) != tuple(reference.shape):
            shown = "not a tensor" if found is None else f"shape {tuple(found)}"
            raise ValueError(f"BiSeNet state dict key {key!r} has {shown}, expected {tuple(reference.shape)}")
    unexpected = [key for key in state if key not in expected]
    if unexpected:
        raise ValueError(f"BiSeNet state dict has unexpected key {unexpected[0]!r} ({len(unexpected)} in all)")


class BisenetSegmenter:
    """The `HairSegmenter` for BiSeNet weights: hair = label 17, hat = 18, person = not background."""

    name: Literal["bisenet"] = "bisenet"

    def __init__(self, weights_path: str | Path, device: str = "cpu") -> None:
        self._attach(load_bisenet(weights_path, device), device)

    @classmethod
    def from_network(cls, network: BiSeNet, device: str = "cpu") -> BisenetSegmenter:
        """Wrap a network built elsewhere (tests use random weights)."""
        segmenter = cls.__new__(cls)
        segmenter._attach(network, device)
        return segmenter

    def _attach(self, network: BiSeNet, device: str) -> None:
        self.device = torch.device(device)
        self.network = network.to(self.device).eval()
        self._mean = torch.tensor(IMAGENET_MEAN, device=self.device).view(1, 3, 1, 1)
        self._std = torch.tensor(IMAGENET_STD, device=self.device).view(1, 3, 1, 1)

    def parse(self, rgb: np.ndarray) -> np.ndarray:
        """Face-parsing labels 0–18, uint8, at the input's size."""
        height, width = rgb.shape[:2]
        square = np.array(Image.fromarray(rgb).resize((INPUT_SIZE, INPUT_SIZE), Image.Resampling.BILINEAR))
        batch = torch.from_numpy(square).to(self.device).permute(2, 0, 1).unsqueeze(0).float() / 255.0
        with torch.inference_mode():
            logits = self.network.predict((batch - self._mean) / self._std)
        labels = logits.argmax(dim=1).to(torch.uint8).cpu().numpy()[0]
        if (height, width) == labels.shape:
            return labels
        return np.array(Image.fromarray(labels).resize((width, height), Image.Resampling.NEAREST))

    def segment(self, rgb: np.ndarray, face: Face) -> HairSegmentation:
        labels = self.parse(rgb)
        return HairSegmentation(
            segmenter="bisenet", hair=labels == HAIR, person=labels != BACKGROUND, hat=labels == HAT
        )

    def warm_up(self) -> None:
        """One run on a blank input (`load_models`: the first run's cost is the load's)."""
        self.parse(np.zeros((INPUT_SIZE, INPUT_SIZE, 3), np.uint8))

    def close(self) -> None:
        """Nothing to release: torch frees the network (and its GPU memory) with the object."""
