"""Optimizers: each `step()` updates its parameters in place (Tensor.assign) from their `.grad`.

The update rules and defaults are those of tinygrad 0.9.0: SGD is LARS without the trust ratio, and
Adam / AdamW are LAMB without it.
"""

from __future__ import annotations

from typing import Sequence, Union

from tgcore.dtype import dtypes, least_upper_dtype
from tgcore.helpers import dedup, flatten, getenv
from tgcore.lazy import LazyBuffer
from tgcore.ops import BinaryOps, UnaryOps
from tgcore.tensor import Tensor

__all__ = ["Optimizer", "OptimizerGroup", "LARS", "SGD", "LAMB", "Adam", "AdamW"]


class Optimizer:
    """Base class: holds the parameters to train (`params`), the tensors to keep realized (`buffers`) and `lr`."""

    def __init__(self, params: Sequence[Tensor], lr: float) -> None:
        # a tensor that has not said whether it wants a gradient does, once it is handed to an optimizer
        for p in params:
            if p.requires_grad is None:
                p.requires_grad = True
        self.params: list[Tensor] = dedup([p for p in params if p.requires_grad])
        if not self.params:
            raise ValueError(
                "the optimizer got no parameters that require grad: pass the model's tensors "
                "(e.g. tgcore.nn.state.get_parameters(model))"
            )
        self.device = self.params[0].device
        # tensors that are not trained (e.g. BatchNorm running statistics) but are realized with every step
        self.buffers: list[Tensor] = dedup([p for p in params if not p.requires_grad])
        # lr is a tensor so that a schedule can change it without recompiling; kept in at least float32
        lr_dtype = least_upper_dtype(dtypes.default_float, dtypes.float32)
        self.lr = Tensor(lr if getenv("CONST_LR") else [lr], requires_grad=False, device=self.device, dtype=lr_dtype)

    def zero_grad(self) -> None:
        """Forget the gradients of every parameter."""
        for p in self.params:
            p.grad = None

    def step(self) -> None:
        """Update every parameter from its gradient, now."""
        Tensor.realize(*self.schedule_step())

    def schedule_step(self) -> list[Tensor]:
        """The tensors to realize to perform one step (the updated parameters, buffers and optimizer state)."""
        if not Tensor.training:
            raise RuntimeError(
                "Tensor.training is False: an optimizer step needs training mode. "
                "Set Tensor.training = True (or use `with Tensor.train():`) before calling step()."
            )
        for p in self.params:
            if p.grad is None:
                raise RuntimeError(
                    f"a parameter of shape {p.shape} has no gradient: call backward() on a loss that depends on it "
                    "before step(), or leave it out of the optimizer"
                )
        return self._step() + self.params + self.buffers

    def _step(self) -> list[Tensor]:
        raise NotImplementedError(f"{type(self).__name__} must implement _step()")

    def _lr_for(self, p: Tensor) -> Tensor:
        """lr shaped to broadcast with `p` without growing it (lr has shape (1,), which would turn a 0-d p into 1-d)."""
        return self.lr.reshape(()) if p.ndim == 0 and self.lr.ndim == 1 else self.lr


class OptimizerGroup(Optimizer):
    """Several optimizers stepped as one (e.g. a different optimizer for the biases)."""

    def __init__(self, *optimizers: Optimizer) -> None:  # no super().__init__: the members hold lr and state
        self.optimizers = optimizers
        self.params = flatten([o.params for o in optimizers])
        self.buffers = flatten([o.buffers for o in optimizers])

    def __getitem__(self, i: int) -> Optimizer:
        return self.optimizers[i]

    def zero_grad(self) -> None:
        for o in self.optimizers:
            o.zero_grad()

    def _step(self) -> list[Tensor]:
        return [t for o in self.optimizers for t in o._step()]


class LARS(Optimizer):
    """Layer-wise Adaptive Rate Scaling (You et al. 2017): SGD whose step is scaled per tensor by a trust ratio.

    With `classic=True` the learning rate is applied before the momentum buffer, otherwise after it.
    `tcoef=0` turns the trust ratio off (plain SGD).
    """

    def __init__(
        self,
        params: Sequence[Tensor],
        lr: float = 0.001,
        momentum: float = 0.9,
        weight_decay: float = 1e-4,
        nesterov: bool = False,
        classic: bool = True,
        tcoef: float = 0.001,
    ) -> None:
        super().__init__(params, lr)
        self.momentum, self.wd, self.nesterov, self.classic, self.tcoef = (
            momentum,
            weight_decay,
            nesterov,
            classic,
            tcoef,
        )
        self.b: list[Tensor] = (
            [Tensor.zeros(*p.shape, dtype=p.dtype, device=p.device, requires_grad=False) for p in self.params]
            if momentum
            else []
        )

    def _step(self) -> list[Tensor]:
        for i, p in enumerate(self.params):
            assert p.grad is not None  # checked in schedule_step
            g = p.grad.contiguous()
            trust: Union[Tensor, float] = 1.0
            if self.tcoef != 0:
                weight_norm = p.detach().square().sum().sqrt()
                grad_norm = g.square().sum().sqrt()
                ratio = self.tcoef * weight_norm / (grad_norm + self.wd * weight_norm)
                trust = (weight_norm > 0).where((grad_norm > 0).where(ratio, 1.0), 1.0)
            g = g + self.wd * p.detach()
            lr = self._lr_for(p)
            if self.classic:
                g = g * trust * lr
            if self.momentum:
                # the buffer starts at zero, so the first step needs no special case
                self.b[i].assign((self.momentum * self.b[i] + g).cast(self.b[i].dtype))
                g = (g + self.momentum * self.b[i]) if self.nesterov else self.b[i]
            if not self.classic:
                g = g * trust * lr
            p.assign((p.detach() - g).cast(p.dtype))
        return self.b


class SGD(LARS):
    """Stochastic gradient descent with optional momentum (classic or the common form), Nesterov and weight decay.

    The update (classic=False): b = momentum * b + (g + wd * p); p -= lr * (nesterov ? g + wd * p + momentum * b : b).
    """

    def __init__(
        self,
        params: Sequence[Tensor],
        lr: float = 0.001,
        momentum: float = 0.0,
        weight_decay: float = 0.0,
        nesterov: bool = False,
        classic: bool = False,
    ) -> None:
        super().__init__(params, lr, momentum, weight_decay, nesterov, classic, tcoef=0.0)


class LAMB(Optimizer):
    """LAMB (You et al. 2019): Adam whose step is scaled per tensor by ||p|| / ||update||; `adam=True` drops the scale.

    Moments are kept in float32 whatever the parameters' dtype.
    """

    def __init__(
        self,
        params: Sequence[Tensor],
        lr: float = 0.001,
        b1: float = 0.9,
        b2: float = 0.999,
        eps: float = 1e-6,
        weight_decay: float = 0.0,
        adam: bool = False,
    ) -> None:
        super().__init__(params, lr)
        self.b1, self.b2, self.eps, self.wd, self.adam = b1, b2, eps, weight_decay, adam
        # b1**t and b2**t, for the bias correction
        self.b1_t, self.b2_t = (
            Tensor([1], dtype=dtypes.float32, device=self.device, requires_grad=False).realize() for _ in range(2)
        )
        self.m = [
            Tensor.zeros(*p.shape, dtype=dtypes.float32, device=p.device, requires_grad=False).contiguous()
            for p in self.params
        ]
        self.v = [
            Tensor.zeros(*p.shape, dtype=dtypes.float32, device=p.device, requires_grad=False).contiguous()
            for p in self.params
        ]

    def _step(self) -> list[Tensor]:
        if self._plain():
            return self._plain_step()
        self.b1_t.assign(self.b1_t * self.b1)
        self.b2_t.assign(self.b2_t * self.b2)
        # the bias corrections' divisors, built once for every parameter (and as 0-d for a 0-d one)
        c1, c2 = 1.0 - self.b1_t, 1.0 - self.b2_t
        c1_0d, c2_0d = c1.reshape(()), c2.reshape(())
        for i, p in enumerate(self.params):
            assert p.grad is not None  # checked in schedule_step
            g = p.grad
            self.m[i].assign((self.b1 * self.m[i] + (1.0 - self.b1) * g).cast(dtypes.float32))
            self.v[i].assign((self.b2 * self.v[i] + (1.0 - self.b2) * (g * g)).cast(dtypes.float32))
            m_hat = self.m[i] / (c1_0d if p.ndim == 0 else c1)
            v_hat = self.v[i] / (c2_0d if p.ndim == 0 else c2)
            update = m_hat / (v_hat.sqrt() + self.eps)
            if self.wd != 0:  # (the terms that would add 0 or multiply by 1 are not built: fewer ops to run eagerly)
                update = update + self.wd * p.detach()
            scale = self._lr_for(p)
            if not self.adam:
                weight_norm = p.detach().square().sum().sqrt()
                update_norm = update.square().sum().sqrt()
                scale = scale * (weight_norm > 0).where((update_norm > 0).where(weight_norm / update_norm, 1.0), 1.0)
            p.assign((p.detach() - scale * update).cast(p.dtype))
        return [self.b1_t, self.b2_t] + self.m + self.v

    def _plain(self) -> bool:
        """Whether this step can take _plain_step: Adam or AdamW (no trust ratio), float32 parameters and gradients on
        one device each."""
        return self.adam and all(
            type(p.lazydata) is LazyBuffer
            and p.dtype is dtypes.float32
            and p.grad is not None
            and type(p.grad.lazydata) is LazyBuffer
            and p.grad.dtype is dtypes.float32
            for p in self.params
        )

    def _plain_step(self) -> list[Tensor]:
        """_step's graph built on the LazyBuffers themselves: the same ops on the same operands in the same order (so
        the same kernels: a test compares them), without a Tensor, a broadcast check and a Function per op, which
        made the optimizer the larger part of a small model's eager training step."""

        def const(x: LazyBuffer, v: float) -> LazyBuffer:  # a Python number in an op with x, as Tensor's ops make it
            return x.const(dtypes.as_const(v, x.dtype))

        def broadcast(x: LazyBuffer, shape: tuple[int, ...]) -> LazyBuffer:  # (1,)-shaped to shape, as Tensor's
            return x if x.shape == shape else x.reshape_expand((1,) * (len(shape) - len(x.shape)) + x.shape, shape)

        mul, add, div = BinaryOps.MUL, BinaryOps.ADD, BinaryOps.DIV
        for t, b in ((self.b1_t, self.b1), (self.b2_t, self.b2)):
            _assign(t, t.lazydata.e(mul, const(t.lazydata, b)))
        b1_t, b2_t = self.b1_t.lazydata, self.b2_t.lazydata
        c1, c2 = const(b1_t, 1.0).e(BinaryOps.SUB, b1_t), const(b2_t, 1.0).e(BinaryOps.SUB, b2_t)
        lr = self.lr.lazydata
        for i, p in enumerate(self.params):
            g, m, v = p.grad.lazydata, self.m[i].lazydata, self.v[i].lazydata  # type: ignore[union-attr]
            _assign(self.m[i], const(m, self.b1).e(mul, m).e(add, const(g, 1.0 - self.b1).e(mul, g)))
            gg = g.e(mul, g)
            _assign(self.v[i], const(v, self.b2).e(mul, v).e(add, const(gg, 1.0 - self.b2).e(mul, gg)))
            m, v, shape = self.m[i].lazydata, self.v[i].lazydata, p.shape
            zero_d = p.ndim == 0
            m_hat = m.e(div, c1.reshape(()) if zero_d else broadcast(c1, shape))
            v_hat = v.e(div, c2.reshape(()) if zero_d else broadcast(c2, shape))
            root = v_hat.e(UnaryOps.SQRT)
            update = m_hat.e(div, root.e(add, const(root, self.eps)))
            w = p.lazydata
            if self.wd != 0:
                update = update.e(add, const(w, self.wd).e(mul, w))
            step = broadcast(lr.reshape(()) if zero_d and len(lr.shape) == 1 else lr, shape).e(mul, update)
            _assign(p, w.e(BinaryOps.SUB, step))
        return [self.b1_t, self.b2_t] + self.m + self.v


def _assign(t: Tensor, value: LazyBuffer) -> None:
    """t.assign(value) for _plain_step's new values, without Tensor.assign's hazard walk where t is a computed base:
    each new value reads its own target only at the position it writes (m and v elementwise at the top, the parameter
    at the top of its update) and the other targets only through their assigns, which run as kernels of their own,
    so no kernel can overwrite what it has yet to read (the walk found nothing here, at 20 assigns a step of a
    3-layer MLP). Anything else (a view, a tensor not computed yet) takes Tensor.assign."""
    lb = t.lazydata
    if type(lb) is LazyBuffer and lb._base is None and lb.realized is not None and value.shape == lb.shape:
        t.lazydata = lb.assign(value)
    else:
        t.assign(_tensor(value))


def _tensor(x: LazyBuffer) -> Tensor:
    """A Tensor of a LazyBuffer that needs no gradient (an optimizer's new values)."""
    return Tensor(x, device=x.device, requires_grad=False)


class AdamW(LAMB):
    """Adam with decoupled weight decay (Loshchilov & Hutter): p -= lr * (m_hat / (sqrt(v_hat) + eps) + wd * p)."""

    def __init__(
        self,
        params: Sequence[Tensor],
        lr: float = 0.001,
        b1: float = 0.9,
        b2: float = 0.999,
        eps: float = 1e-8,
        weight_decay: float = 0.01,
    ) -> None:
        super().__init__(params, lr, b1, b2, eps, weight_decay, adam=True)


class Adam(LAMB):
    """Adam (Kingma & Ba 2014): p -= lr * m_hat / (sqrt(v_hat) + eps), with bias-corrected moments."""

    def __init__(
        self, params: Sequence[Tensor], lr: float = 0.001, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8
    ) -> None:
        super().__init__(params, lr, b1, b2, eps, 0.0, adam=True)
