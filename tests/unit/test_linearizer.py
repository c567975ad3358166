"""The linearizer's choices that depend on what a Renderer declares (here: fused_mulacc)."""

from __future__ import annotations

import numpy as np

from tgcore import Tensor, dtypes
from tgcore.codegen.kernel import Kernel
from tgcore.codegen.uops import UOp, UOps
from tgcore.engine.realize import get_kernel
from tgcore.ops import BinaryOps, TernaryOps
from tgcore.runtime.python import PythonRenderer


class FusedRenderer(PythonRenderer):
    fused_mulacc = True


def _uops(t: Tensor, fused: bool, optimize: bool = True) -> list[UOp]:
    renderer = FusedRenderer() if fused else PythonRenderer()
    ast = t.schedule()[-1].ast
    k = get_kernel(renderer, ast, "PYTHON") if optimize else Kernel(ast, renderer)
    return k.to_program().uops


def _value_ops(uops: list[UOp]) -> list[object]:
    """The ALU ops on non-index values (anything but int32)."""
    return [u.arg for u in uops if u.op is UOps.ALU and u.dtype is not None and u.dtype.scalar() != dtypes.int32]


def test_a_fused_renderer_accumulates_products_with_mulacc() -> None:
    rng = np.random.default_rng(0)
    a = Tensor(rng.standard_normal((8, 12)).astype(np.float32))
    b = Tensor(rng.standard_normal((12, 4)).astype(np.float32))
    for optimize in (False, True):
        fused = _uops(a @ b, True, optimize)
        assert TernaryOps.MULACC in _value_ops(fused) and BinaryOps.MUL not in _value_ops(fused)
        read = {id(s) for u in fused for s in u.src}
        assert all(id(u) in read for u in fused if u.op is UOps.ALU)  # the products MULACC took over are gone
        plain = _value_ops(_uops(a @ b, False, optimize))
        assert TernaryOps.MULACC not in plain and BinaryOps.MUL in plain and BinaryOps.ADD in plain
    # only float32 / float64 SUMs of products: a plain sum, a max of products and an int contraction keep their ops
    assert TernaryOps.MULACC not in _value_ops(_uops(a.sum(axis=1), True))
    assert TernaryOps.MULACC not in _value_ops(_uops((a * 2).max(axis=1), True))
    ints = Tensor(np.arange(96, dtype=np.int32).reshape(8, 12)) @ Tensor(np.ones((12, 4), np.int32))
    assert TernaryOps.MULACC not in [u.arg for u in _uops(ints, True) if u.op is UOps.ALU]
    assert TernaryOps.MULACC in _value_ops(_uops(a.cast(dtypes.float64) @ b.cast(dtypes.float64), True))
