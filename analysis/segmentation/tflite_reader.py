"""A reader of the few parts of a TFLite flatbuffer that a float model's graph needs.

TFLite files are flatbuffers (schema: tensorflow/lite/schema/schema.fbs). Only these tables
are read: Model (operator codes, subgraph 0, buffers), OperatorCode, SubGraph, Tensor,
Buffer, Operator and the builtin options of the ops `hairnet` executes. Pure Python over
`struct`: no TensorFlow, no generated schema classes (the `tflite` package would bring
hundreds of them for six tables). Every read is bounds-checked by `struct`; a file that is
not a TFLite model raises `TfliteFormatError`.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import numpy as np

FILE_IDENTIFIER = b"TFL3"
# BuiltinOperator enum values used here (schema.fbs)
BUILTIN_NAMES = {0: "ADD", 2: "CONCATENATION", 3: "CONV_2D", 4: "DEPTHWISE_CONV_2D", 32: "CUSTOM", 54: "PRELU"}
# TensorType enum -> numpy dtype
TENSOR_DTYPES = {0: np.float32, 1: np.float16, 2: np.int32, 3: np.uint8, 4: np.int64, 9: np.int8}


class TfliteFormatError(ValueError):
    """The bytes are not a TFLite model this reader understands."""


class _Table:
    """One flatbuffer table: fields by index through its vtable."""

    def __init__(self, data: bytes, position: int) -> None:
        self.data, self.position = data, position
        vtable = position - struct.unpack_from("<i", data, position)[0]
        vtable_size = struct.unpack_from("<H", data, vtable)[0]
        self._offsets = struct.unpack_from(f"<{(vtable_size - 4) // 2}H", data, vtable + 4)

    def _field(self, index: int) -> int | None:
        if index >= len(self._offsets) or self._offsets[index] == 0:
            return None
        return self.position + self._offsets[index]

    def scalar(self, index: int, fmt: str, default: int = 0) -> int:
        where = self._field(index)
        return default if where is None else int(struct.unpack_from("<" + fmt, self.data, where)[0])

    def _indirect(self, where: int) -> int:
        return where + struct.unpack_from("<I", self.data, where)[0]

    def table(self, index: int) -> _Table | None:
        where = self._field(index)
        return None if where is None else _Table(self.data, self._indirect(where))

    def _vector(self, index: int) -> tuple[int, int] | None:
        """(start of the elements, element count)."""
        where = self._field(index)
        if where is None:
            return None
        start = self._indirect(where)
        return start + 4, struct.unpack_from("<I", self.data, start)[0]

    def string(self, index: int) -> str:
        vector = self._vector(index)
        return "" if vector is None else self.data[vector[0] : vector[0] + vector[1]].decode("utf-8")

    def numbers(self, index: int, fmt: str) -> tuple[int, ...]:
        vector = self._vector(index)
        return () if vector is None else struct.unpack_from(f"<{vector[1]}{fmt}", self.data, vector[0])

    def raw(self, index: int) -> bytes:
        vector = self._vector(index)
        return b"" if vector is None else self.data[vector[0] : vector[0] + vector[1]]

    def tables(self, index: int) -> list[_Table]:
        vector = self._vector(index)
        if vector is None:
            return []
        return [_Table(self.data, self._indirect(vector[0] + 4 * i)) for i in range(vector[1])]


@dataclass(frozen=True)
class Tensor:
    name: str
    shape: tuple[int, ...]
    value: np.ndarray | None  # the constant's data (weights, biases), None for activations


@dataclass(frozen=True)
class Operator:
    kind: str  # builtin name, or the custom op's name for CUSTOM
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    options: dict[str, int] = field(default_factory=dict)  # builtin options, by schema name
    custom_options: bytes = b""


@dataclass(frozen=True)
class Graph:
    """Subgraph 0 of a model, operators in execution order."""

    tensors: tuple[Tensor, ...]
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    operators: tuple[Operator, ...]


# builtin options tables: (field name, struct format, default) by field index (schema.fbs)
_ACTIVATION = ("fused_activation_function", "b", 0)
_OPTION_FIELDS: dict[str, tuple[tuple[str, str, int], ...]] = {
    "CONV_2D": (
        ("padding", "b", 0),
        ("stride_w", "i", 0),
        ("stride_h", "i", 0),
        _ACTIVATION,
        ("dilation_w_factor", "i", 1),
        ("dilation_h_factor", "i", 1),
    ),
    "DEPTHWISE_CONV_2D": (
        ("padding", "b", 0),
        ("stride_w", "i", 0),
        ("stride_h", "i", 0),
        ("depth_multiplier", "i", 0),
        _ACTIVATION,
        ("dilation_w_factor", "i", 1),
        ("dilation_h_factor", "i", 1),
    ),
    "ADD": (_ACTIVATION,),
    "CONCATENATION": (("axis", "i", 0), _ACTIVATION),
    "PRELU": (),
}


def read_graph(data: bytes) -> Graph:
    """Subgraph 0 of the TFLite model in `data`, constants decoded (little-endian)."""
    if len(data) < 8 or data[4:8] != FILE_IDENTIFIER:
        raise TfliteFormatError("not a TFLite model (no TFL3 file identifier)")
    try:
        return _read_graph(data)
    except (struct.error, IndexError, UnicodeDecodeError, ValueError) as error:
        raise TfliteFormatError(f"malformed TFLite model: {error}") from error


def _read_graph(data: bytes) -> Graph:
    model = _Table(data, struct.unpack_from("<I", data, 0)[0])
    codes = [_operator_name(code) for code in model.tables(1)]
    subgraphs = model.tables(2)
    if not subgraphs:
        raise TfliteFormatError("the model has no subgraph")
    buffers = [buffer.raw(0) for buffer in model.tables(4)]
    graph = subgraphs[0]
    tensors = tuple(_tensor(tensor, buffers) for tensor in graph.tables(0))
    operators = tuple(_operator(operator, codes) for operator in graph.tables(3))
    return Graph(tensors, graph.numbers(1, "i"), graph.numbers(2, "i"), operators)


def _operator_name(code: _Table) -> str:
    # builtin_code (field 3) superseded the byte-wide deprecated_builtin_code (field 0)
    builtin = max(code.scalar(0, "b"), code.scalar(3, "i"))
    name = BUILTIN_NAMES.get(builtin, f"BUILTIN_{builtin}")
    return code.string(1) if name == "CUSTOM" else name


def _tensor(tensor: _Table, buffers: list[bytes]) -> Tensor:
    shape = tuple(tensor.numbers(0, "i"))
    kind = tensor.scalar(1, "b")
    raw = buffers[tensor.scalar(2, "I")]
    value = None
    if raw:
        if kind not in TENSOR_DTYPES:
            raise TfliteFormatError(f"tensor type {kind} is not supported")
        value = np.frombuffer(raw, dtype=np.dtype(TENSOR_DTYPES[kind]).newbyteorder("<")).reshape(shape)
    return Tensor(tensor.string(3), shape, value)


def _operator(operator: _Table, codes: list[str]) -> Operator:
    kind = codes[operator.scalar(0, "I")]
    options: dict[str, int] = {}
    table = operator.table(4)
    for index, (name, fmt, default) in enumerate(_OPTION_FIELDS.get(kind, ())):
        options[name] = default if table is None else table.scalar(index, fmt, default)
    return Operator(kind, operator.numbers(1, "i"), operator.numbers(2, "i"), options, operator.raw(5))
