"""MediaPipe's hair segmentation network, its TFLite graph executed with torch.

The bundled `data/hair_segmentation.tflite` (Apache-2.0, google/mediapipe; see
data/NOTICE) is read with `tflite_reader` and its 259 operators are run in order as torch
ops (NCHW inside; weights converted once at load time). Input [1, 4, 512, 512]: RGB / 255
and a zero "previous mask" channel; output [1, 2, 512, 512] logits (background, hair).
TFLite semantics that differ from torch's defaults (analysis.md § Hair segmentation):
- SAME padding puts the odd pixel at the bottom/right (a 2x2 stride-2 conv pads nothing);
- the MediaPipe custom ops' options are raw little-endian int32 structs, and in them
  padding 1 = SAME, 2 = VALID (the builtin ops' enum is 0 = SAME, 1 = VALID);
- Convolution2DTransposeBias is a full transposed conv cropped to in * stride, plus bias.
MaxPoolingWithArgmax2D / MaxUnpooling2D keep MediaPipe's window order and first-maximum
rule, so ties land where LiteRT puts them.

Only the interpreter: what the segmenter does with the network's answer is `hairnet`.
This module imports torch at module level: only the model process imports it.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .tflite_reader import Graph, Operator, TfliteFormatError, read_graph

MODEL_FILE = Path(__file__).resolve().parent.parent / "data" / "hair_segmentation.tflite"
MODEL_SHA256 = "d2c940c4fd80edeaf38f5d7387d1b4235ee320ed120080df67c663e749e77633"
INPUT_SIZE = 512
HAIR_CHANNEL = 1

# fused activation functions (schema.fbs ActivationFunctionType)
_ACTIVATIONS: dict[int, Callable[[torch.Tensor], torch.Tensor]] = {
    0: lambda x: x,
    1: F.relu,
    3: lambda x: torch.clamp(x, 0.0, 6.0),
}
_BUILTIN_SAME, _BUILTIN_VALID = 0, 1
_CUSTOM_SAME, _CUSTOM_VALID = 1, 2

Step = Callable[[list[torch.Tensor]], list[torch.Tensor]]


def _same_padding(size: int, kernel: int, stride: int, dilation: int) -> tuple[int, int]:
    """(before, after) of TFLite SAME padding along one axis: the odd pixel goes after."""
    out = -(-size // stride)
    total = max(0, (out - 1) * stride + (kernel - 1) * dilation + 1 - size)
    return total // 2, total - total // 2


class HairNetwork(nn.Module):
    """The TFLite graph as a torch module: `forward(x)` with x [N, 4, 512, 512] -> logits."""

    def __init__(self, graph: Graph) -> None:
        super().__init__()
        self._graph = graph
        self._constants = nn.ParameterList()
        self._steps: list[tuple[Step, tuple[int, ...], tuple[int, ...]]] = []
        for operator in graph.operators:
            # the step closes over its constants; it is given the activations only
            activations = tuple(i for i in operator.inputs if graph.tensors[i].value is None)
            self._steps.append((self._build(operator), activations, operator.outputs))
        self.requires_grad_(False)

    @classmethod
    def from_file(cls, path: Path | None = None) -> HairNetwork:
        """The network of a TFLite file, by default the bundled one (which must be the
        published file: a damaged copy is refused, not run)."""
        data = (path or MODEL_FILE).read_bytes()
        if path is None and hashlib.sha256(data).hexdigest() != MODEL_SHA256:
            raise TfliteFormatError(f"{MODEL_FILE} is not the bundled hair network (SHA-256 differs)")
        return cls(read_graph(data))

    def _constant(self, index: int, layout: Callable[[torch.Tensor], torch.Tensor] = lambda t: t) -> int:
        """Register tensor `index` (which must be a constant) in torch layout; its slot."""
        value = self._graph.tensors[index].value
        if value is None:
            raise TfliteFormatError(f"tensor {self._graph.tensors[index].name!r} should be a constant")
        tensor = layout(torch.from_numpy(np.array(value, dtype=np.float32)))
        self._constants.append(nn.Parameter(tensor.contiguous(), requires_grad=False))
        return len(self._constants) - 1

    def _build(self, operator: Operator) -> Step:
        builders = {
            "CONV_2D": self._conv,
            "DEPTHWISE_CONV_2D": self._conv,
            "PRELU": self._prelu,
            "ADD": self._add,
            "CONCATENATION": self._concatenation,
            "MaxPoolingWithArgmax2D": self._max_pool,
            "MaxUnpooling2D": self._max_unpool,
            "Convolution2DTransposeBias": self._transpose_conv,
        }
        if operator.kind not in builders:
            raise TfliteFormatError(f"operator {operator.kind} is not supported")
        return builders[operator.kind](operator)

    def _conv(self, operator: Operator) -> Step:
        options = operator.options
        depthwise = operator.kind == "DEPTHWISE_CONV_2D"
        # CONV_2D weights are OHWI, DEPTHWISE [1, kh, kw, C]; torch wants O, I/groups, kh, kw
        weight = self._constant(
            operator.inputs[1], (lambda t: t.permute(3, 0, 1, 2)) if depthwise else (lambda t: t.permute(0, 3, 1, 2))
        )
        bias = self._constant(operator.inputs[2])
        kernel_h, kernel_w = self._graph.tensors[operator.inputs[1]].shape[1:3]
        stride = (options["stride_h"], options["stride_w"])
        dilation = (options["dilation_h_factor"], options["dilation_w_factor"])
        same = options["padding"] == _BUILTIN_SAME
        groups = self._graph.tensors[operator.inputs[0]].shape[3] if depthwise else 1
        activation = _ACTIVATIONS[options["fused_activation_function"]]

        def step(inputs: list[torch.Tensor]) -> list[torch.Tensor]:
            x = inputs[0]
            if same:
                top, bottom = _same_padding(x.shape[2], kernel_h, stride[0], dilation[0])
                left, right = _same_padding(x.shape[3], kernel_w, stride[1], dilation[1])
                if top or bottom or left or right:
                    x = F.pad(x, (left, right, top, bottom))
            out = F.conv2d(x, self._constants[weight], self._constants[bias], stride, 0, dilation, groups)
            return [activation(out)]

        return step

    def _prelu(self, operator: Operator) -> Step:
        # alpha [1, 1, C] (per channel) -> [1, C, 1, 1]
        alpha = self._constant(operator.inputs[1], lambda t: t.reshape(-1)[None, :, None, None])

        def step(inputs: list[torch.Tensor]) -> list[torch.Tensor]:
            x = inputs[0]
            return [torch.where(x >= 0, x, x * self._constants[alpha])]

        return step

    def _add(self, operator: Operator) -> Step:
        activation = _ACTIVATIONS[operator.options["fused_activation_function"]]
        return lambda inputs: [activation(inputs[0] + inputs[1])]

    def _concatenation(self, operator: Operator) -> Step:
        axis = operator.options["axis"]
        rank = len(self._graph.tensors[operator.outputs[0]].shape)
        nchw_axis = (0, 2, 3, 1)[axis % rank]  # NHWC axis -> NCHW axis
        activation = _ACTIVATIONS[operator.options["fused_activation_function"]]
        return lambda inputs: [activation(torch.cat(inputs, dim=nchw_axis))]

    @staticmethod
    def _custom_options(operator: Operator, count: int) -> tuple[int, ...]:
        if len(operator.custom_options) < 4 * count:
            raise TfliteFormatError(f"{operator.kind}: options too short")
        return struct.unpack_from(f"<{count}i", operator.custom_options)

    def _max_pool(self, operator: Operator) -> Step:
        padding, stride_w, stride_h, filter_w, filter_h = self._custom_options(operator, 5)
        if padding not in (_CUSTOM_SAME, _CUSTOM_VALID) or (filter_h, filter_w) != (stride_h, stride_w):
            raise TfliteFormatError("MaxPoolingWithArgmax2D: only non-overlapping pooling is supported")
        return lambda inputs: list(_max_pool_with_argmax(inputs[0], stride_h, stride_w))

    def _max_unpool(self, operator: Operator) -> Step:
        _, stride_w, stride_h, filter_w, filter_h = self._custom_options(operator, 5)
        if (filter_h, filter_w) != (stride_h, stride_w):
            raise TfliteFormatError("MaxUnpooling2D: only non-overlapping pooling is supported")
        return lambda inputs: [_max_unpool(inputs[0], inputs[1], stride_h, stride_w)]

    def _transpose_conv(self, operator: Operator) -> Step:
        padding, stride_w, stride_h = self._custom_options(operator, 3)
        if padding != _CUSTOM_SAME:
            raise TfliteFormatError("Convolution2DTransposeBias: only SAME padding is supported")
        # weights OHWI -> torch conv_transpose [I, O, kh, kw]
        weight = self._constant(operator.inputs[1], lambda t: t.permute(3, 0, 1, 2))
        bias = self._constant(operator.inputs[2])
        kernel_h, kernel_w = self._graph.tensors[operator.inputs[1]].shape[1:3]

        def step(inputs: list[torch.Tensor]) -> list[torch.Tensor]:
            x = inputs[0]
            full = F.conv_transpose2d(x, self._constants[weight], self._constants[bias], (stride_h, stride_w))
            out_h, out_w = x.shape[2] * stride_h, x.shape[3] * stride_w
            top = ((x.shape[2] - 1) * stride_h + kernel_h - out_h) // 2
            left = ((x.shape[3] - 1) * stride_w + kernel_w - out_w) // 2
            return [full[:, :, top : top + out_h, left : left + out_w]]

        return step

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        values: dict[int, torch.Tensor] = {self._graph.inputs[0]: x}
        for step, inputs, outputs in self._steps:
            for index, value in zip(outputs, step([values[i] for i in inputs]), strict=True):
                values[index] = value
        return values[self._graph.outputs[0]]


def _max_pool_with_argmax(x: torch.Tensor, stride_h: int, stride_w: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Non-overlapping max pooling and, per output, the window position of the maximum.

    MediaPipe's op numbers a window's positions column by column (index = dx * stride_h +
    dy) and keeps the FIRST maximum in that order; torch's max_pool2d scans row by row, so
    on ties (flat regions, saturated activations) its unpooling puts the value elsewhere
    (measured: up to 1.4 in the logits). Ties are common here, so the order is reproduced.
    """
    n, c, h, w = x.shape
    if h % stride_h or w % stride_w:
        raise TfliteFormatError(f"max pooling of {h}x{w} by {stride_h}x{stride_w} does not tile")
    windows = x.reshape(n, c, h // stride_h, stride_h, w // stride_w, stride_w).permute(0, 1, 2, 4, 5, 3)
    windows = windows.reshape(n, c, h // stride_h, w // stride_w, stride_h * stride_w)
    values, positions = windows.max(dim=-1)  # torch returns the first maximum's index
    return values, positions


def _max_unpool(values: torch.Tensor, positions: torch.Tensor, stride_h: int, stride_w: int) -> torch.Tensor:
    """Each value put back at its window position (see `_max_pool_with_argmax`), zeros elsewhere."""
    n, c, h, w = values.shape
    spread = F.one_hot(positions, stride_h * stride_w).to(values.dtype) * values[..., None]
    spread = spread.reshape(n, c, h, w, stride_w, stride_h).permute(0, 1, 2, 5, 3, 4)
    return spread.reshape(n, c, h * stride_h, w * stride_w)


def hair_probability(network: HairNetwork, rgb512: np.ndarray, device: str) -> np.ndarray:
    """Hair probability [512, 512] float32 of a 512x512 RGB uint8 crop (softmax channel 1)."""
    x = torch.from_numpy(np.ascontiguousarray(rgb512, dtype=np.float32) / 255.0).permute(2, 0, 1)
    x = torch.cat([x, torch.zeros((1, INPUT_SIZE, INPUT_SIZE))])[None].to(device)
    with torch.inference_mode():
        logits = network(x)
        probability = torch.softmax(logits, dim=1)[0, HAIR_CHANNEL]
    return probability.float().cpu().numpy()
