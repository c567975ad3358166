"""Optimizers: they update parameters in place (Tensor.assign) from their .grad."""

from __future__ import annotations

from typing import Sequence

from tgcore.helpers import dedup
from tgcore.tensor import Tensor


class Optimizer:
    """Holds the parameters that require grad; `step()` updates them, `zero_grad()` clears their grads."""

    def __init__(self, params: Sequence[Tensor], lr: float) -> None:
        for p in params:
            if p.requires_grad is None:
                p.requires_grad = True
        self.params: list[Tensor] = dedup([p for p in params if p.requires_grad])
        if not self.params:
            raise ValueError("the optimizer got no parameters that require grad")
        self.buffers: list[Tensor] = dedup([p for p in params if not p.requires_grad])
        self.lr = Tensor([lr], requires_grad=False, device=self.params[0].device).contiguous()

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    def step(self) -> None:
        Tensor.realize(*self.schedule_step())

    def schedule_step(self) -> list[Tensor]:
        for p in self.params:
            if p.grad is None:
                raise RuntimeError(f"parameter of shape {p.shape} has no gradient: call backward() before step()")
        return self._step() + self.params + self.buffers

    def _step(self) -> list[Tensor]:
        raise NotImplementedError


class SGD(Optimizer):
    """Stochastic gradient descent with optional momentum, Nesterov momentum and weight decay."""

    def __init__(
        self,
        params: Sequence[Tensor],
        lr: float = 0.001,
        momentum: float = 0.0,
        weight_decay: float = 0.0,
        nesterov: bool = False,
    ) -> None:
        super().__init__(params, lr)
        self.momentum, self.wd, self.nesterov = momentum, weight_decay, nesterov
        self.b = (
            [Tensor.zeros(*p.shape, device=p.device, requires_grad=False).contiguous() for p in self.params]
            if momentum
            else []
        )

    def _step(self) -> list[Tensor]:
        for i, p in enumerate(self.params):
            assert p.grad is not None
            g = p.grad + self.wd * p.detach()
            if self.momentum:
                self.b[i].assign(self.momentum * self.b[i] + g)
                g = (g + self.momentum * self.b[i]) if self.nesterov else self.b[i]
            p.assign(p.detach() - g * self.lr)
        return self.b


class Adam(Optimizer):
    """Adam (Kingma & Ba), with decoupled weight decay when used as AdamW."""

    def __init__(
        self,
        params: Sequence[Tensor],
        lr: float = 0.001,
        b1: float = 0.9,
        b2: float = 0.999,
        eps: float = 1e-8,
        weight_decay: float = 0.0,
    ) -> None:
        super().__init__(params, lr)
        self.b1, self.b2, self.eps, self.wd = b1, b2, eps, weight_decay
        dev = self.params[0].device
        self.b1_t = Tensor([1.0], device=dev, requires_grad=False).contiguous()
        self.b2_t = Tensor([1.0], device=dev, requires_grad=False).contiguous()
        self.m = [Tensor.zeros(*p.shape, device=p.device, requires_grad=False).contiguous() for p in self.params]
        self.v = [Tensor.zeros(*p.shape, device=p.device, requires_grad=False).contiguous() for p in self.params]

    def _step(self) -> list[Tensor]:
        self.b1_t.assign(self.b1_t * self.b1)
        self.b2_t.assign(self.b2_t * self.b2)
        for i, p in enumerate(self.params):
            assert p.grad is not None
            g = p.grad
            self.m[i].assign(self.b1 * self.m[i] + (1.0 - self.b1) * g)
            self.v[i].assign(self.b2 * self.v[i] + (1.0 - self.b2) * (g * g))
            m_hat = self.m[i] / (1.0 - self.b1_t)
            v_hat = self.v[i] / (1.0 - self.b2_t)
            update = m_hat / (v_hat.sqrt() + self.eps) + self.wd * p.detach()
            p.assign(p.detach() - self.lr * update)
        return [self.b1_t, self.b2_t] + self.m + self.v


def AdamW(
    params: Sequence[Tensor],
    lr: float = 0.001,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    weight_decay: float = 0.01,
) -> Adam:
    """Adam with decoupled weight decay."""
    return Adam(params, lr, b1, b2, eps, weight_decay)
