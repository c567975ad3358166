"""The operator registry: implementations keyed by (op_type, since_version), and what each one is handed."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence, Union

import numpy as np

from tgcore.dtype import DType, dtypes
from tgcore.onnx import lowbit
from tgcore.onnx.errors import NotSymbolic, UnsupportedOp
from tgcore.shape.symbolic import Node as SymNode
from tgcore.shape.symbolic import sint
from tgcore.tensor import Tensor

Result = Union[Tensor, None, Sequence[Optional[Tensor]]]
OpFn = Callable[["Node"], Result]

# op_type -> {since_version: implementation}: ONNX's default domain
REGISTRY: dict[str, dict[int, OpFn]] = {}
# the other domains tgcore runs: domain -> its own registry of the same form
TRAINING_DOMAIN, ML_DOMAIN, PREVIEW_DOMAIN = "ai.onnx.preview.training", "ai.onnx.ml", "ai.onnx.preview"
DOMAINS: dict[str, dict[str, dict[int, OpFn]]] = {"": REGISTRY, TRAINING_DOMAIN: {}, ML_DOMAIN: {}, PREVIEW_DOMAIN: {}}


def op(op_type: str, *since: int, domain: str = "") -> Callable[[OpFn], OpFn]:
    """Register `fn` for op_type of `domain` (default: ONNX's) at each since_version: a model importing version v of
    the domain gets the newest one with since <= v."""

    def register(fn: OpFn) -> OpFn:
        for v in since or (1,):
            DOMAINS[domain].setdefault(op_type, {})[v] = fn
        return fn

    return register


# the operators of ONNX's default domain that tgcore does not run, and why (every other one is in REGISTRY)
_STRINGS = "it works on string tensors, which tgcore has no dtype for (numbers only)"
REFUSED: dict[str, str] = {
    "ImageDecoder": "it decodes encoded image bytes (JPEG, PNG, BMP, WebP, ...), which needs an image codec that "
    "tgcore does not include: decode the image before the model and feed it the pixels",
    **{name: _STRINGS for name in ("RegexFullMatch", "StringConcat", "StringNormalizer", "StringSplit")},
}


def lookup(op_type: str, opset: int, domain: str = "") -> OpFn:
    versions = DOMAINS[domain].get(op_type)
    if not versions:
        if domain:
            known = ", ".join(sorted(DOMAINS[domain]))
            why = f"not an operator of domain {domain!r} that tgcore runs (it runs {known})"
            raise UnsupportedOp(op_type, opset, why)
        raise UnsupportedOp(op_type, opset, REFUSED.get(op_type, "not an operator of ONNX's default domain"))
    usable = [v for v in versions if v <= opset]
    if not usable:
        raise UnsupportedOp(op_type, opset, f"implemented only from opset {min(versions)} on")
    return versions[max(usable)]


def onnx_to_dtype(elem_type: int, op_type: str = "?", opset: Optional[int] = None) -> DType:
    """The tgcore dtype of an ONNX TensorProto element type, or UnsupportedOp saying why not."""
    from onnx import TensorProto, helper

    if elem_type == TensorProto.BFLOAT16:
        return dtypes.bfloat16
    try:
        npdt = helper.tensor_dtype_to_np_dtype(elem_type)
        return dtypes.from_np(npdt)
    except (KeyError, TypeError, ValueError) as e:
        name = helper.tensor_dtype_to_string(elem_type) if elem_type else "UNDEFINED"
        raise UnsupportedOp(op_type, opset, f"element type {name} has no tgcore dtype") from e


def to_tensor(arr: np.ndarray, device: str) -> Tensor:
    """A numpy array as a tensor; bfloat16 (ml_dtypes, which numpy has no name for) travels as its bits, the low-bit
    ml_dtypes types (float8, float4, int4, int2) as a LowBitTensor of their carrier dtype (see lowbit.py)."""
    if arr.dtype.name == "bfloat16":
        bits = np.ascontiguousarray(arr).view(np.uint16).reshape(arr.shape)  # (ascontiguousarray makes 0-d 1-d)
        return Tensor(bits, device=device).bitcast(dtypes.bfloat16)
    if lowbit.of_numpy(arr.dtype) is not None:
        return lowbit.from_numpy(arr, device)
    return Tensor(arr, device=device)


def to_numpy(t: Tensor) -> np.ndarray:
    """A tensor's values on the host; bfloat16 and the low-bit types as their ml_dtypes arrays."""
    if isinstance(t, lowbit.LowBitTensor):
        return lowbit.to_numpy(t)
    if t.dtype == dtypes.bfloat16:
        import ml_dtypes  # (onnx depends on it)

        return t.bitcast(dtypes.uint16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


class Known(dict):
    """Host copies of tensors' values, by tensor id; it holds the tensors too, so no id is reused while it lives."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.alive: list[Tensor] = list(getattr(args[0], "alive", [])) if args else []
        # reads of computed values to the host (a shape, a condition or a count the graph's next steps depend on):
        # a graph that makes none runs the same kernels for any input values, so its kernels can be replayed
        self.computed_reads = 0
        # walking with symbolic sizes (tgcore/onnx/dynamic.py): a host read of a computed value, or of a symbolic one
        # as a number, raises NotSymbolic; host copies of shapes may hold symbolic sizes (object arrays)
        self.symbolic: bool = getattr(args[0], "symbolic", False) if args else False

    def put(self, t: Tensor, value: np.ndarray) -> Tensor:
        self[id(t)] = value
        self.alive.append(t)
        return t


@dataclass
class Node:
    """One node being run: its inputs (None for an omitted optional one), attributes and the model's opset."""

    op_type: str
    opset: int
    inputs: list[Optional[Tensor]]
    attrs: dict[str, Any]
    device: str
    num_outputs: int
    # host copies of values known before any kernel runs (initializers, Constant, Shape), by tensor id
    known: Known = field(default_factory=Known)
    # runs a subgraph (If, Loop) with extra named values; set by the graph runner
    run_graph: Optional[Callable[[Any, dict[str, Tensor]], list[Tensor]]] = None
    # runs again the nodes before this one that read the given values (by name), directly or through others: the values
    # they would see then, and the names that changed (Gradient); set by the graph runner
    rerun: Optional[Callable[[dict[str, Tensor]], tuple[dict[str, Tensor], set[str]]]] = None

    def __getitem__(self, i: int) -> Optional[Tensor]:
        return self.inputs[i] if i < len(self.inputs) else None

    def get(self, name: str, default: Any = None) -> Any:
        return self.attrs.get(name, default)

    def host(self, i: int) -> Optional[np.ndarray]:
        """Input i's values on the host (shapes, axes, pads): read from the host copy when one is known."""
        t = self[i]
        if t is None:
            return None
        return self.host_of(t)

    def host_of(self, t: Tensor) -> np.ndarray:
        """Any tensor's values on the host, from its host copy when one is known."""
        if (v := self.known.get(id(t))) is not None:
            if v.dtype == object:  # (symbolic sizes: only sints() reads them)
                raise NotSymbolic(f"{self.op_type} reads a symbolic size as a number")
            return v
        if self.known.symbolic:
            raise NotSymbolic(f"{self.op_type} reads a computed value on the host")
        self.known.computed_reads += 1
        return to_numpy(t)

    def ints(self, i: int) -> Optional[list[int]]:
        v = self.host(i)
        return None if v is None else [int(e) for e in v.reshape(-1)]

    def sints(self, i: int) -> Optional[list[sint]]:
        """Input i's values as ints, or symbolic sizes where its host copy holds them (a shape read from a symbolic
        tensor); for the inputs that say a shape (Reshape, Expand, ConstantOfShape)."""
        t = self[i]
        if t is None:
            return None
        v = self.known.get(id(t))
        if v is None or v.dtype != object:
            return self.ints(i)
        return [e if isinstance(e, SymNode) else int(e) for e in v.reshape(-1)]

    def unsupported(self, why: str) -> UnsupportedOp:
        return UnsupportedOp(self.op_type, self.opset, why)

    def const(self, value: Any, dtype: DType) -> Tensor:
        return Tensor(np.asarray(value, dtype=dtype.np), device=self.device)


def wide_float(*dts: DType) -> DType:
    """The dtype a float computation on inputs of `dts` runs in: float64 when one is float64, else float32 (the half
    types' 11 or 8 bits are too few to draw random numbers, sample or transform in)."""
    return dtypes.float64 if dtypes.float64 in dts else dtypes.float32


def norm_axis(axis: int, ndim: int) -> int:
    return axis + ndim if axis < 0 else axis


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


INT_MAX = 2**63 - 1
NAN = math.nan
