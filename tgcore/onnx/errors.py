"""The errors of tgcore.onnx: each names the operator, the opset and why."""

from __future__ import annotations

from typing import Optional


class OnnxError(RuntimeError):
    """A model that tgcore cannot load or run."""


class UnsupportedOp(OnnxError, NotImplementedError):
    """An operator (or one of its attributes, inputs or dtypes) that tgcore does not run."""

    def __init__(self, op_type: str, opset: Optional[int], why: str) -> None:
        self.op_type, self.opset, self.why = op_type, opset, why
        at = f" (opset {opset})" if opset is not None else ""
        super().__init__(f"ONNX operator {op_type}{at} is not supported: {why}")


class NotSymbolic(Exception):
    """A graph walked with symbolic sizes met what needs concrete ones (an operator not known to take them, a symbolic
    size read as a number, a computed value read on the host): the model runs that call with concrete shapes instead.
    Raised and caught inside tgcore.onnx; never reaches a caller."""
