"""The differentiable functions: each one's forward and backward, written on LazyBuffer ops."""

from __future__ import annotations

import math
from operator import attrgetter
from typing import Any, Optional

import numpy as np

from tgcore.dtype import DType, dtypes, sum_acc_dtype
from tgcore.helpers import argsort
from tgcore.lazy import LazyBuffer
from tgcore.ops import BinaryOps, ComposedOps, ReduceOps, TernaryOps, UnaryOps
from tgcore.shape.symbolic import sint


class Function:
    """One differentiable op. `apply` runs forward on the inputs' LazyBuffers and records itself for backward."""

    def __init__(self, device: str, *tensors: Any) -> None:
        self.device = device
        self.needs_input_grad = needs = list(map(_requires_grad, tensors))  # map: no comprehension frame per op
        self.requires_grad = True if any(needs) else None if None in needs else False
        if self.requires_grad:
            self.parents = tensors

    def forward(self, *args: Any, **kwargs: Any) -> LazyBuffer:
        raise NotImplementedError(f"forward not implemented for {type(self).__name__}")

    def backward(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"backward not implemented for {type(self).__name__}")

    @classmethod
    def forward_only(cls, *x: LazyBuffer, **kwargs: Any) -> LazyBuffer:
        """This function's forward on LazyBuffers, recording nothing for backward (for a result that needs no
        gradient): the graph apply builds, without a Tensor or a context kept."""
        return cls.forward(cls.__new__(cls), *x, **kwargs)

    @classmethod
    def apply(cls, *x: Any, **kwargs: Any) -> Any:
        """Run this function on tensors `x`; the result is a tensor of the inputs' type."""
        first = x[0]
        ctx = cls(first.lazydata.device, *x)  # (Tensor.device without the property call)
        tensor_type = type(first)
        ret = tensor_type.__new__(tensor_type)
        ret.lazydata = ctx.forward(*map(_lazydata, x), **kwargs)
        ret.requires_grad, ret.grad = ctx.requires_grad, None
        ret._ctx = ctx if ctx.requires_grad and not tensor_type.no_grad else None
        return ret


class Chain(Function):
    """Several Functions applied as one (Tensor.dot's reshapes, permute and expands, its product and its sum): the
    same LazyBuffer graph, forward and backward, as applying them one by one, without a Tensor and an apply for each
    step. `branches`: per input, its steps (a Function class and its keyword arguments) up to `join`, the Function of
    every branch's result; `tail`: the steps after it."""

    def forward(
        self,
        *xs: LazyBuffer,
        branches: tuple[tuple[tuple[type[Function], dict[str, Any]], ...], ...],
        join: type[Function],
        tail: tuple[tuple[type[Function], dict[str, Any]], ...],
    ) -> LazyBuffer:
        ends, self.branches = [], []
        for x, steps, needs in zip(xs, branches, self.needs_input_grad):
            ctxs = [self._step(cls, [needs]) for cls, _ in steps]
            for ctx, (_, kwargs) in zip(ctxs, steps):
                x = ctx.forward(x, **kwargs)
            ends.append(x)
            self.branches.append(ctxs)
        self.join = self._step(join, self.needs_input_grad)
        y = self.join.forward(*ends)
        self.tail = [self._step(cls, [self.requires_grad]) for cls, _ in tail]
        for ctx, (_, kwargs) in zip(self.tail, tail):
            y = ctx.forward(y, **kwargs)
        return y

    def _step(self, cls: type[Function], needs: list[Any]) -> Function:
        """A step's Function, made without Tensors: it needs the gradient of its input where the chain's does."""
        ctx = cls.__new__(cls)
        ctx.device, ctx.needs_input_grad, ctx.requires_grad = self.device, needs, any(needs)
        return ctx

    def backward(self, grad_output: LazyBuffer) -> tuple[Optional[LazyBuffer], ...]:
        for ctx in reversed(self.tail):
            grad_output = ctx.backward(grad_output)
        grads = self.join.backward(grad_output)
        out = []
        for g, ctxs in zip(grads if isinstance(grads, tuple) else (grads,), self.branches):
            if g is not None:
                for ctx in reversed(ctxs):
                    g = ctx.backward(g)
            out.append(g)
        return tuple(out)


_requires_grad = attrgetter("requires_grad")
_lazydata = attrgetter("lazydata")


class Contiguous(Function):
    def forward(self, x: LazyBuffer) -> LazyBuffer:
        return x.contiguous()

    def backward(self, grad_output: LazyBuffer) -> LazyBuffer:
        return grad_output


class Clone(Function):
    def forward(self, x: LazyBuffer) -> LazyBuffer:
        return x.copy()

    def backward(self, grad_output: LazyBuffer) -> LazyBuffer:
        return grad_output


class ContiguousBackward(Function):
    def forward(self, x: LazyBuffer) -> LazyBuffer:
        return x

    def backward(self, grad_output: LazyBuffer) -> LazyBuffer:
        return grad_output.contiguous()


class Cast(Function):
    def forward(self, x: LazyBuffer, dtype: DType, bitcast: bool = False) -> LazyBuffer:
        self.input_dtype, self.bitcast = x.dtype, bitcast
        return x.cast(dtype, bitcast)

    def backward(self, grad_output: LazyBuffer) -> LazyBuffer:
        return grad_output.cast(self.input_dtype, self.bitcast)


# ***** unary ops *****


class Neg(Function):
    def forward(self, x: LazyBuffer) -> LazyBuffer:
        return x.e(UnaryOps.NEG)

    def backward(self, grad_output: LazyBuffer) -> LazyBuffer:
        return grad_output.e(UnaryOps.NEG)


class Reciprocal(Function):
    def forward(self, x: LazyBuffer) -> LazyBuffer:
        self.ret = x.const(1).e(BinaryOps.DIV, x)
        return self.ret

    def backward(self, grad_output: LazyBuffer) -> LazyBuffer:
        return grad_output.e(UnaryOps.NEG).e(BinaryOps.MUL, self.ret).e(BinaryOps.MUL, self.ret)


class Sin(Function):
    def forward(self, x: LazyBuffer) -> LazyBuffer:
        self.x = x
        return x.e(UnaryOps.SIN)

    def backward(self, grad_output: LazyBuffer) -> LazyBuffer:
        return self.x.composed(ComposedOps.COS).e(BinaryOps.MUL, grad_output)


class Cos(Function):
    def forward(self, x: LazyBuffer) -> LazyBuffer:
        self.x = x
        return x.composed(ComposedOps.COS)

    def backward(self, grad_output: LazyBuffer) -> LazyBuffer:
        return self.x.e(UnaryOps.SIN).e(UnaryOps.NEG).e(BinaryOps.MUL, grad_output)


class Relu(Function):
    # max(x, 0) keeps NaN (numpy's maximum does); the gradient at 0 is 0
    def forward(self, x: LazyBuffer) -> LazyBuffer:
        self.ret = x.e(BinaryOps.MAX, x.const(0))
        return self.ret

    def backward(self, grad_output: LazyBuffer) -> LazyBuffer:
        return self.ret.const(0).e(BinaryOps.CMPLT, self.ret).cast(grad_output.dtype).e(BinaryOps.MUL, grad_output)


class Log(Function):
    def forward(self, x: LazyBuffer) -> LazyBuffer:
        self.x = x
        return x.e(UnaryOps.LOG2).e(BinaryOps.MUL, x.const(math.log(2)))

    def backward(self, grad_output: LazyBuffer) -> LazyBuffer:
        return grad_output.e(BinaryOps.DIV, self.x)


class Exp(Function):
    def forward(self, x: LazyBuffer) -> LazyBuffer:
        self.ret = x.composed(ComposedOps.EXP)
        return self.ret

    def backward(self, grad_output: LazyBuffer) -> LazyBuffer:
        return self.ret.e(BinaryOps.MUL, grad_output)


class Expm1(Function):
    def forward(self, x: LazyBuffer) -> LazyBuffer:
        self.x = x
        return x.composed(ComposedOps.EXPM1)

    def backward(self, grad_output: LazyBuffer) -> LazyBuffer:
        # (not expm1 + 1: -1 + 1 is 0 for x < -17)
        return self.x.composed(ComposedOps.EXP).e(BinaryOps.MUL, grad_output)


class Log1p(Function):
    def forward(self, x: LazyBuffer) -> LazyBuffer:
        self.x = x
        return x.composed(ComposedOps.LOG1P)

    def backward(self, grad_output: LazyBuffer) -> LazyBuffer:
        return grad_output.e(BinaryOps.DIV, self.x.e(BinaryOps.ADD, self.x.const(1)))


class Tanh(Function):
    def forward(self, x: LazyBuffer) -> LazyBuffer:
        self.x = x
        return x.composed(ComposedOps.TANH)

    def backward(self, grad_output: LazyBuffer) -> LazyBuffer:
        # 1 / cosh(x)^2, not 1 - tanh(x)^2, which cancels as tanh(x) nears 1
        c = self.x.composed(ComposedOps.COSH)
        return grad_output.e(BinaryOps.DIV, c.e(BinaryOps.MUL, c))


class Sinh(Function):
    def forward(self, x: LazyBuffer) -> LazyBuffer:
        self.x = x
        return x.composed(ComposedOps.SINH)

    def backward(self, grad_output: LazyBuffer) -> LazyBuffer:
        return self.x.composed(ComposedOps.COSH).e(BinaryOps.MUL, grad_output)


class Cosh(Function):
    def forward(self, x: LazyBuffer) -> LazyBuffer:
        self.x = x
        return x.composed(ComposedOps.COSH)

    def backward(self, grad_output: LazyBuffer) -> LazyBuffer:
        return self.x.composed(ComposedOps.SINH).e(BinaryOps.MUL, grad_output)


class Softplus(Function):
    # log(1 + e^x); the gradient is sigmoid(x)
    def forward(self, x: LazyBuffer) -> LazyBuffer:
        self.x = x
        return x.composed(ComposedOps.SOFTPLUS)

    def backward(self, grad_output: LazyBuffer) -> LazyBuffer:
        return self.x.composed(ComposedOps.SIGMOID).e(BinaryOps.MUL, grad_output)


class Exp2(Function):
    # 2**x as the EXP2 op itself: through exp (x * ln 2, then / ln 2) the argument picks up a rounding error that
    # exp2 multiplies (up to ~90 ulp near 128 in float32)
    def forward(self, x: LazyBuffer) -> LazyBuffer:
        self.ret = x.e(UnaryOps.EXP2)
        return self.ret

    def backward(self, grad_output: LazyBuffer) -> LazyBuffer:
        return self.ret.e(BinaryOps.MUL, self.ret.const(math.log(2))).e(BinaryOps.MUL, grad_output)


class Log2(Function):
    # log2(x) as the LOG2 op itself (not log(x) / ln 2, two more roundings)
    def forward(self, x: LazyBuffer) -> LazyBuffer:
        self.x = x
        return x.e(UnaryOps.LOG2)

    def backward(self, grad_output: LazyBuffer) -> LazyBuffer:
        return grad_output.e(BinaryOps.DIV, self.x.e(BinaryOps.MUL, self.x.const(math.log(2))))


class Sqrt(Function):
    def forward(self, x: LazyBuffer) -> LazyBuffer:
        self.ret = x.e(UnaryOps.SQRT)
        return self.ret

    def backward(self, grad_output: LazyBuffer) -> LazyBuffer:
        return grad_output.e(BinaryOps.DIV, self.ret.e(BinaryOps.MUL, self.ret.const(2)))


class Sigmoid(Function):
    # 1 / (1 + exp(-x))
    def forward(self, x: LazyBuffer) -> LazyBuffer:
        self.ret = x.composed(ComposedOps.SIGMOID)
        return self.ret

    def backward(self, grad_output: LazyBuffer) -> LazyBuffer:
        return self.ret.e(BinaryOps.MUL, self.ret.const(1).e(BinaryOps.SUB, self.ret)).e(BinaryOps.MUL, grad_output)


class ZeroGradient(Function):
    """A step function of x (floor, round, ...): the value is computed off the tape, the gradient is 0."""

    def forward(self, x: LazyBuffer, value: LazyBuffer) -> LazyBuffer:
        return value

    def backward(self, grad_output: LazyBuffer) -> LazyBuffer:
        return grad_output.const(0)


class Sign(Function):
    def forward(self, x: LazyBuffer) -> LazyBuffer:
        return x.e(BinaryOps.CMPEQ, x.const(0)).e(
            TernaryOps.WHERE, x.const(0), x.e(BinaryOps.CMPLT, x.const(0)).e(TernaryOps.WHERE, x.const(-1), x.const(1))
        )

    def backward(self, grad_output: LazyBuffer) -> LazyBuffer:
        return grad_output.const(0)  # as torch: the gradient of sign is 0 everywhere


# ***** binary ops *****


class NoGradient(Function):
    """An op without a gradient (a comparison, a bitwise op): its result does not require grad, as in torch, so a
    loss that depends on a tensor only through such ops cannot be differentiated (backward raises)."""

    def __init__(self, device: str, *tensors: Any) -> None:
        self.device = device
        self.needs_input_grad = [False] * len(tensors)
        self.requires_grad = False


class Less(NoGradient):
    def forward(self, x: LazyBuffer, y: LazyBuffer) -> LazyBuffer:
        return x.e(BinaryOps.CMPLT, y)


class Eq(NoGradient):
    def forward(self, x: LazyBuffer, y: LazyBuffer) -> LazyBuffer:
        return x.e(BinaryOps.CMPEQ, y)


class Bitwise(NoGradient):
    """XOR, AND, OR, SHL or SHR of integers or bools: no gradient flows through bits."""

    def forward(self, x: LazyBuffer, y: LazyBuffer, op: BinaryOps) -> LazyBuffer:
        return x.e(op, y)


class Add(Function):
    def forward(self, x: LazyBuffer, y: LazyBuffer) -> LazyBuffer:
        return x.e(BinaryOps.ADD, y)

    def backward(self, grad_output: LazyBuffer) -> tuple[Optional[LazyBuffer], Optional[LazyBuffer]]:
        return (grad_output if self.needs_input_grad[0] else None, grad_output if self.needs_input_grad[1] else None)


class Sub(Function):
    def forward(self, x: LazyBuffer, y: LazyBuffer) -> LazyBuffer:
        return x.e(BinaryOps.SUB, y)

    def backward(self, grad_output: LazyBuffer) -> tuple[Optional[LazyBuffer], Optional[LazyBuffer]]:
        return (
            grad_output if self.needs_input_grad[0] else None,
            grad_output.e(UnaryOps.NEG) if self.needs_input_grad[1] else None,
        )


class Mul(Function):
    def forward(self, x: LazyBuffer, y: LazyBuffer) -> LazyBuffer:
        self.x, self.y = x, y
        return x.e(BinaryOps.MUL, y)

    def backward(self, grad_output: LazyBuffer) -> tuple[Optional[LazyBuffer], Optional[LazyBuffer]]:
        return (
            self.y.e(BinaryOps.MUL, grad_output) if self.needs_input_grad[0] else None,
            self.x.e(BinaryOps.MUL, grad_output) if self.needs_input_grad[1] else None,
        )


class Div(Function):
    def forward(self, x: LazyBuffer, y: LazyBuffer) -> LazyBuffer:
        self.x, self.y = x, y
        return x.e(BinaryOps.DIV, y)

    def backward(self, grad_output: LazyBuffer) -> tuple[Optional[LazyBuffer], Optional[LazyBuffer]]:
        return (
            grad_output.e(BinaryOps.DIV, self.y) if self.needs_input_grad[0] else None,
            grad_output.e(UnaryOps.NEG).e(BinaryOps.MUL, self.x).e(BinaryOps.DIV, self.y.e(BinaryOps.MUL, self.y))
            if self.needs_input_grad[1]
            else None,
        )


class Mod(Function):
    # the remainder of division truncated toward zero (C's % and fmod); d/dy is piecewise -trunc(x/y), not passed on
    def forward(self, x: LazyBuffer, y: LazyBuffer) -> LazyBuffer:
        return x.e(BinaryOps.MOD, y)

    def backward(self, grad_output: LazyBuffer) -> tuple[Optional[LazyBuffer], None]:
        return grad_output if self.needs_input_grad[0] else None, None


# ***** ternary ops *****


class Where(Function):
    def forward(self, x: LazyBuffer, y: LazyBuffer, z: LazyBuffer) -> LazyBuffer:
        self.x = x
        return self.x.e(TernaryOps.WHERE, y, z)

    def backward(self, grad_output: LazyBuffer) -> tuple[None, Optional[LazyBuffer], Optional[LazyBuffer]]:
        return (
            None,
            self.x.e(TernaryOps.WHERE, grad_output, grad_output.const(0)) if self.needs_input_grad[1] else None,
            self.x.e(TernaryOps.WHERE, grad_output.const(0), grad_output) if self.needs_input_grad[2] else None,
        )


class Maximum(Function):
    # the larger of two floats, with NaN winning (numpy's maximum) as one MAX. A tie sends half the gradient each
    # way; a NaN in y takes all of it, like the larger operand
    def forward(self, x: LazyBuffer, y: LazyBuffer) -> LazyBuffer:
        self.x, self.y = x, y
        return x.e(BinaryOps.MAX, y)

    def backward(self, grad_output: LazyBuffer) -> tuple[Optional[LazyBuffer], Optional[LazyBuffer]]:
        x, y, g = self.x, self.y, grad_output
        y_is_nan = y.e(BinaryOps.CMPEQ, y).e(TernaryOps.WHERE, g.const(0), g.const(1))
        tie_or_nan = x.e(BinaryOps.CMPEQ, y).e(TernaryOps.WHERE, g.const(0.5), y_is_nan)
        to_y = x.e(BinaryOps.CMPLT, y).e(TernaryOps.WHERE, g.const(1), tie_or_nan)
        return (
            g.const(1).e(BinaryOps.SUB, to_y).e(BinaryOps.MUL, g) if self.needs_input_grad[0] else None,
            to_y.e(BinaryOps.MUL, g) if self.needs_input_grad[1] else None,
        )


# ***** reduce ops *****


class Sum(Function):
    # its forward is x.r(reduce_op, axis) and nothing else: a reduction that records no gradient is that reduce alone
    # (Tensor._reduce), without this context
    reduce_op = ReduceOps.SUM

    def forward(self, x: LazyBuffer, axis: tuple[int, ...]) -> LazyBuffer:
        self.input_shape = x.shape
        return x.r(self.reduce_op, axis)

    def backward(self, grad_output: LazyBuffer) -> LazyBuffer:
        return grad_output.expand(self.input_shape)


class Max(Function):
    reduce_op = ReduceOps.MAX  # (as Sum's)

    def forward(self, x: LazyBuffer, axis: tuple[int, ...]) -> LazyBuffer:
        self.x, self.ret, self.axis = x, x.r(self.reduce_op, axis), axis
        return self.ret

    def backward(self, grad_output: LazyBuffer) -> LazyBuffer:
        # the gradient is shared equally among the positions that hold the max
        max_is_1s = self.x.e(BinaryOps.CMPEQ, self.ret.expand(self.x.shape)).cast(dtypes.float)
        div = max_is_1s.r(ReduceOps.SUM, self.axis).expand(self.x.shape)
        return (
            max_is_1s.e(BinaryOps.DIV, div).cast(grad_output.dtype).e(BinaryOps.MUL, grad_output.expand(self.x.shape))
        )


# ***** movement ops *****


class Expand(Function):
    # the backward of an expand is a sum over the expanded axes
    def forward(self, x: LazyBuffer, shape: tuple[sint, ...]) -> LazyBuffer:
        self.expanded_axis = tuple(i for i, (si, so) in enumerate(zip(x.shape, shape)) if si != so)
        return x.expand(shape)

    def backward(self, grad_output: LazyBuffer) -> LazyBuffer:
        return (
            grad_output.cast(sum_acc_dtype(grad_output.dtype))
            .r(ReduceOps.SUM, self.expanded_axis)
            .cast(grad_output.dtype)
        )


class BroadcastTo(Function):
    """Tensor._broadcast_to's reshape (leading axes of size 1) and expand as one Function: the same graph, forward
    (one view of the input, where the two steps made a view of a view) and backward (the expand's sum, then the
    reshape), without a Tensor and a Function for the step between (a broadcast operand is in most binary ops)."""

    def forward(self, x: LazyBuffer, shape: tuple[sint, ...]) -> LazyBuffer:
        self.input_shape = x.shape
        padded = (1,) * (len(shape) - len(x.shape)) + x.shape
        self.expanded_axis = tuple(i for i, (si, so) in enumerate(zip(padded, shape)) if si != so)
        return x.reshape_expand(padded, shape)

    def backward(self, grad_output: LazyBuffer) -> LazyBuffer:
        summed = grad_output.cast(sum_acc_dtype(grad_output.dtype)).r(ReduceOps.SUM, self.expanded_axis)
        return summed.cast(grad_output.dtype).reshape(self.input_shape)


class Reshape(Function):
    def forward(self, x: LazyBuffer, shape: tuple[sint, ...]) -> LazyBuffer:
        self.input_shape = x.shape
        return x.reshape(shape)

    def backward(self, grad_output: LazyBuffer) -> LazyBuffer:
        return grad_output.reshape(self.input_shape)


class Permute(Function):
    def forward(self, x: LazyBuffer, order: tuple[int, ...]) -> LazyBuffer:
        self.input_order = order
        return x.permute(order)

    def backward(self, grad_output: LazyBuffer) -> LazyBuffer:
        return grad_output.permute(argsort(self.input_order))


class Pad(Function):
    def forward(self, x: LazyBuffer, arg: tuple[tuple[int, int], ...]) -> LazyBuffer:
        self.narg = tuple((p[0], s + p[0]) for s, p in zip(x.shape, arg))
        return x.pad(arg)

    def backward(self, grad_output: LazyBuffer) -> LazyBuffer:
        return grad_output.shrink(self.narg)


class Shrink(Function):
    def forward(self, x: LazyBuffer, arg: tuple[tuple[sint, sint], ...]) -> LazyBuffer:
        self.narg = tuple((p[0], s - p[1]) for s, p in zip(x.shape, arg))
        return x.shrink(arg)

    def backward(self, grad_output: LazyBuffer) -> LazyBuffer:
        return grad_output.pad(self.narg)


class Flip(Function):
    def forward(self, x: LazyBuffer, axis: tuple[int, ...]) -> LazyBuffer:
        self.arg = tuple(-1 if i in set(axis) else 1 for i in range(len(x.shape)))
        return x.stride(self.arg)

    def backward(self, grad_output: LazyBuffer) -> LazyBuffer:
        return grad_output.stride(self.arg)


class Stride(Function):
    """Every k-th element along each axis (k >= 1, from the first): a view of the same memory."""

    def forward(self, x: LazyBuffer, arg: tuple[int, ...]) -> LazyBuffer:
        self.input_shape, self.arg = x.shape, arg
        return x.stride(arg)

    def backward(self, grad_output: LazyBuffer) -> LazyBuffer:
        # each gradient element back at its position, zeros between: (n, 1) padded to (n, k), flattened, trimmed
        g = grad_output
        for axis, (k, size) in enumerate(zip(self.arg, self.input_shape)):
            if k == 1:
                continue
            n = g.shape[axis]
            shape = g.shape
            g = g.reshape(shape[:axis] + (n, 1) + shape[axis + 1 :])
            g = g.pad(tuple((0, k - 1) if a == axis + 1 else (0, 0) for a in range(len(shape) + 1)))
            g = g.reshape(shape[:axis] + (n * k,) + shape[axis + 1 :])
            g = g.shrink(tuple((0, size) if a == axis else (0, s) for a, s in enumerate(g.shape)))
        return g


class Gather(Function):
    """out[p] = x[p with p[axis] = index[p]], x broadcast to the index's shape along its other axes of size 1 (an
    embedding table (1, vocab, dim) read by every token): a load at the index (LazyBuffer.gather). The gradient is
    the one-hot form, a sum over the index's positions: each row of x gets the gradients of the positions that
    picked it (a where, not a multiply: an inf elsewhere stays out)."""

    def forward(self, x: LazyBuffer, index: LazyBuffer, axis: int) -> LazyBuffer:
        self.x_shape, self.index, self.axis = x.shape, index, axis
        shape = tuple(x.shape[a] if a == axis else s for a, s in enumerate(index.shape))
        return x.expand(shape).gather(index, axis)

    def backward(self, grad_output: LazyBuffer) -> tuple[LazyBuffer, None]:
        g, index, axis, n = grad_output, self.index, self.axis, self.x_shape[self.axis]
        shape = (*g.shape, n)
        # the positions along the axis, in the index's dtype (int32 for a narrower one, which could not count them)
        idt = index.dtype if index.dtype.itemsize >= 4 else dtypes.int32
        positions = LazyBuffer.fromcpu(np.arange(n, dtype=idt.np), g.device).reshape((1,) * len(g.shape) + (n,))
        hit = index.cast(idt).reshape((*index.shape, 1)).expand(shape).e(BinaryOps.CMPEQ, positions.expand(shape))
        acc = g.cast(sum_acc_dtype(g.dtype))
        picked = hit.e(TernaryOps.WHERE, acc.reshape((*g.shape, 1)).expand(shape), acc.const(0, shape))
        # summed over the gathered axis and the axes x was broadcast along; the positions' axis then takes the
        # gathered axis's place
        summed = [a for a, s in enumerate(g.shape) if a == axis or (self.x_shape[a] == 1 and s != 1)]
        out = picked.r(ReduceOps.SUM, tuple(summed))
        order = list(range(len(shape)))
        order[axis], order[-1] = order[-1], order[axis]
        return out.permute(tuple(order)).reshape(self.x_shape).cast(g.dtype), None


class Copy(Function):
    """The data on another device; the gradient goes back to the device it came from."""

    def forward(self, x: LazyBuffer, device: str) -> LazyBuffer:
        self.input_device = x.device
        return x.copy_to_device(device)

    def backward(self, grad_output: LazyBuffer) -> LazyBuffer:
        return grad_output.copy_to_device(self.input_device)


class PowerGradient(Function):
    """x ** y computed ahead (`value`), with the derivatives given too: d/dx and d/dy as LazyBuffers of the output's
    shape (torch's: y x^(y-1), 0 where y == 0; x^y log x, 0 where x == 0 and y >= 0; NaN for a negative x to a
    non-integer power)."""

    def forward(self, x: LazyBuffer, y: LazyBuffer, value: LazyBuffer, dx: LazyBuffer, dy: LazyBuffer) -> LazyBuffer:
        self.dx, self.dy = dx, dy
        return value

    def backward(self, grad_output: LazyBuffer) -> tuple[Optional[LazyBuffer], Optional[LazyBuffer]]:
        return (
            grad_output.e(BinaryOps.MUL, self.dx) if self.needs_input_grad[0] else None,
            grad_output.e(BinaryOps.MUL, self.dy) if self.needs_input_grad[1] else None,
        )
