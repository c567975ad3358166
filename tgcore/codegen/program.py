"""From an optimized Kernel to a ProgramSpec: linearize it and render it with its renderer.

A module of its own so that the kernel optimizer (kernel.py) and the linearizer (linearizer.py, which reads the
Kernel) do not import each other: this one sits above both. It also renders the small kernel of basic ops with which
the core checks that a device's renderer can render at all (tgcore/device.py)."""

from __future__ import annotations

from typing import Optional

from tgcore.codegen.kernel import Kernel
from tgcore.codegen.linearizer import Linearizer
from tgcore.codegen.names import check_names, kernel_identifier
from tgcore.dtype import DType, dtypes
from tgcore.ops import BinaryOps, BufferOps, LazyOp, MemBuffer, UnaryOps
from tgcore.plugin import ProgramSpec, Renderer
from tgcore.shape.shapetracker import ShapeTracker

__all__ = ["to_program", "basic_ops_kernel", "render_check"]


def to_program(k: Kernel, name_override: Optional[str] = None) -> ProgramSpec:
    """Linearize and render kernel `k` (named `name_override`, made an identifier, when given)."""
    lin = Linearizer(k)
    uops = lin.linearize()
    name = kernel_identifier(name_override) if name_override is not None else k.name
    check_names(name, lin.header)  # the one check between the names of the kernel and the renderer
    src = k.opts.render(name, uops)
    return ProgramSpec(
        name,
        src,
        k.opts.device,
        lin.global_size,
        lin.local_size,
        tuple(lin.variables),
        (0,),
        lin.op_estimate,
        lin.mem_estimate,
        uops,
        lin.thread_extent,
    )


# the basic ops every compute device renders: a load, an add and a multiply, the transcendentals, a store
_BASIC_UNARY = (UnaryOps.EXP2, UnaryOps.LOG2, UnaryOps.SIN)
BASIC_OPS = ("LOAD", "ADD", "MUL", *(op.name for op in _BASIC_UNARY), "STORE")


def basic_ops_kernel(renderer: Renderer, dtype: DType = dtypes.float32, n: int = 16) -> Kernel:
    """out[i] = sin(log2(exp2(a[i] * a[i] + a[i]))) over `n` elements of `dtype` (the transcendentals only for a
    float dtype), unoptimized, for `renderer`."""
    st = ShapeTracker.from_shape((n,))
    x = LazyOp(BufferOps.LOAD, (), MemBuffer(1, dtype, st))
    y = LazyOp(BinaryOps.ADD, (LazyOp(BinaryOps.MUL, (x, x)), x))
    if dtypes.is_float(dtype):
        for op in _BASIC_UNARY:
            y = LazyOp(op, (y,))
    return Kernel(LazyOp(BufferOps.STORE, (y,), MemBuffer(0, dtype, st)), renderer)


def render_check(renderer: Renderer, dtype: DType = dtypes.float32) -> Optional[str]:
    """None when `renderer` renders the kernel of basic ops (render only: nothing is compiled or run), else why not."""
    try:
        src = to_program(basic_ops_kernel(renderer, dtype), "tg_render_check").src
    except KeyboardInterrupt:
        raise
    except BaseException as e:
        what = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
        return (
            f"its renderer {type(renderer).__name__} cannot render a kernel of basic ops ({', '.join(BASIC_OPS)} on "
            f"{dtype.short_name}): {what}"
        )
    if not isinstance(src, str) or not src.strip():
        return f"its renderer {type(renderer).__name__} rendered {src!r} for a kernel of basic ops: expected text"
    return None
