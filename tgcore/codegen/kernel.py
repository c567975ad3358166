"""Kernel: one kernel's AST with the shapes of every buffer it touches, simplified and ready to linearize.

The kernel's index space is `full_shape`: the global axes first, then the reduce axes. Every buffer has a
ShapeTracker of that rank; a buffer written or read after the reduce has size 1 on the reduce axes.
"""

from __future__ import annotations

from typing import Optional

from tgcore.dtype import DType, dtypes
from tgcore.helpers import to_function_name
from tgcore.ops import BinaryOps, BufferOps, LazyOp, ReduceOps, UnaryOps
from tgcore.renderer import ProgramSpec, Renderer
from tgcore.shape.shapetracker import ShapeTracker
from tgcore.shape.symbolic import sint


def dtype_of(op: LazyOp) -> DType:
    """The dtype an AST node produces."""
    if op.op in (BufferOps.LOAD, BufferOps.CONST, BufferOps.STORE):
        return op.arg.dtype
    if op.op in (UnaryOps.CAST, UnaryOps.BITCAST):
        return op.arg
    if op.op in (BinaryOps.CMPLT, BinaryOps.CMPEQ):
        return dtypes.bool
    return dtype_of(op.src[-1])


class Kernel:
    """An AST plus its buffers' ShapeTrackers over one shared index space."""

    def __init__(self, ast: LazyOp, opts: Renderer) -> None:
        if ast.op is not BufferOps.STORE:
            raise ValueError(f"a kernel AST must have a STORE root, got {ast.op}")
        self.ast, self.opts = ast, opts
        nodes = ast.lazyops()
        self.reduceops = [x for x in nodes if x.op in ReduceOps]
        self.leaves = [x for x in nodes if x.op in (BufferOps.LOAD, BufferOps.CONST, BufferOps.STORE)]
        self.sts: dict[LazyOp, ShapeTracker] = {x: x.arg.st for x in self.leaves}
        output_shape = ast.arg.st.shape
        if self.reduceops:
            full = self.reduceops[0].src[0]
            while full.op not in (BufferOps.LOAD, BufferOps.CONST):
                full = full.src[0]
            self.full_shape: tuple[sint, ...] = full.arg.st.shape
            for r in self.reduceops:
                if r.arg != self.reduceops[0].arg:
                    raise ValueError(f"a kernel's reduces must share their axes, got {[x.arg for x in self.reduceops]}")
        else:
            self.full_shape = output_shape
        for st in self.sts.values():
            if len(st.shape) != len(self.full_shape):
                raise ValueError(f"buffer shape {st.shape} does not match the kernel's shape {self.full_shape}")
        self.reduce_axes = tuple(i for i, (o, f) in enumerate(zip(output_shape, self.full_shape)) if o != f)
        self.n_reduce = 0
        self._reduce_last()
        self._merge_axes()

    @property
    def shape_len(self) -> int:
        return len(self.full_shape)

    @property
    def first_reduce(self) -> int:
        """The index of the first reduce axis (== shape_len when there is none)."""
        return self.shape_len - self.n_reduce

    def _reduce_last(self) -> None:
        """Permute so the reduce axes come after the global axes."""
        self.n_reduce = len(self.reduce_axes)
        order = tuple([i for i in range(self.shape_len) if i not in self.reduce_axes] + list(self.reduce_axes))
        if order != tuple(range(self.shape_len)):
            self.sts = {k: st.permute(order) for k, st in self.sts.items()}
            self.full_shape = tuple(self.full_shape[i] for i in order)

    def _merge_axes(self) -> None:
        """Drop axes of size 1 and merge neighbouring axes every buffer can merge without a second view."""
        keep = [i for i, s in enumerate(self.full_shape) if s != 1]
        if len(keep) != self.shape_len:
            self.n_reduce = len([i for i in keep if i >= self.first_reduce])
            self.sts = {k: st.reshape(tuple(st.shape[i] for i in keep)) for k, st in self.sts.items()}
            self.full_shape = tuple(self.full_shape[i] for i in keep)
        i = 0
        while i < self.shape_len - 1:
            if (i < self.first_reduce) != (i + 1 < self.first_reduce):  # never merge a global with a reduce axis
                i += 1
                continue
            merged = {}
            for k, st in self.sts.items():
                new = st.reshape(st.shape[:i] + (st.shape[i] * st.shape[i + 1],) + st.shape[i + 2 :])
                if len(new.views) != len(st.views):
                    break
                merged[k] = new
            else:
                if i >= self.first_reduce:
                    self.n_reduce -= 1
                self.sts = merged
                self.full_shape = (
                    self.full_shape[:i] + (self.full_shape[i] * self.full_shape[i + 1],) + self.full_shape[i + 2 :]
                )
                continue
            i += 1

    @property
    def name(self) -> str:
        prefix = "r" if self.reduceops else "E"
        return to_function_name(prefix + "_" + "_".join(str(s) for s in self.full_shape) if self.full_shape else prefix)

    def to_program(self, name_override: Optional[str] = None) -> ProgramSpec:
        """Linearize and render this kernel."""
        from tgcore.codegen.linearizer import Linearizer

        lin = Linearizer(self)
        uops = lin.linearize()
        name = name_override or self.name
        src = self.opts.render(name, uops)
        return ProgramSpec(
            name,
            src,
            self.opts.device,
            lin.global_size,
            lin.local_size,
            tuple(lin.variables),
            (0,),
            lin.op_estimate,
            lin.mem_estimate,
            uops,
        )
