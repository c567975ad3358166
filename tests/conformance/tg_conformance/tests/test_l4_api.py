"""Level 4: the processing ops of the Tensor API (pooling, einsum, norms, attention, losses, scans, gathers) in
float32 on the device under test, against numpy implementations."""

from __future__ import annotations

from typing import Callable

import numpy as np
import pytest

from tg_conformance.checks import assert_array
from tg_conformance.target import Target
from tg_conformance.tensors import tensor, values
from tgcore import Tensor
from tgcore.dtype import dtypes

pytestmark = pytest.mark.usefixtures("executing")
F32 = dtypes.float32
ATOL, RTOL = 1e-4, 1e-4  # composed of several kernels: sums in a different order than numpy's


def _windows(x: np.ndarray, k: int, s: int) -> np.ndarray:
    """(N, C, OH, OW, k, k) windows of an (N, C, H, W) array."""
    n, c, h, w = x.shape
    oh, ow = (h - k) // s + 1, (w - k) // s + 1
    out = np.empty((n, c, oh, ow, k, k), x.dtype)
    for i in range(oh):
        for j in range(ow):
            out[:, :, i, j] = x[:, :, i * s : i * s + k, j * s : j * s + k]
    return out


def _layernorm(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    return (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5)


def _attention(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    s = q.astype(np.float64) @ k.swapaxes(-1, -2) / np.sqrt(q.shape[-1])
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v


def _cross_entropy(logits: np.ndarray, labels: np.ndarray) -> np.ndarray:
    z = logits.astype(np.float64)
    logp = z - z.max(-1, keepdims=True) - np.log(np.exp(z - z.max(-1, keepdims=True)).sum(-1, keepdims=True))
    return np.array(-logp[np.arange(len(labels)), labels].mean())


CASES: dict[str, tuple[tuple[tuple[int, ...], ...], Callable[..., Tensor], Callable[..., np.ndarray]]] = {
    "avg_pool2d": (
        ((2, 3, 7, 9),),
        lambda x: x.avg_pool2d(kernel_size=(2, 2)),
        lambda x: _windows(x, 2, 2).mean(axis=(-1, -2)),
    ),
    "max_pool2d": (
        ((2, 3, 7, 9),),
        lambda x: x.max_pool2d(kernel_size=(3, 3), stride=2),
        lambda x: _windows(x, 3, 2).max(axis=(-1, -2)),
    ),
    "einsum": (((3, 4, 5), (3, 5, 2)), lambda a, b: Tensor.einsum("bij,bjk->bik", a, b), lambda a, b: a @ b),
    "einsum trace": (((6, 6),), lambda a: Tensor.einsum("ii->", a), lambda a: np.array(np.trace(a))),
    "cumsum": (((5, 13),), lambda x: x.cumsum(1), lambda x: x.astype(np.float64).cumsum(1)),
    "logsumexp": (((4, 9),), lambda x: x.logsumexp(1), lambda x: np.log(np.exp(x.astype(np.float64)).sum(1))),
    "layernorm": (((3, 11),), lambda x: x.layernorm(), _layernorm),
    "attention": (((2, 5, 8), (2, 6, 8), (2, 6, 3)), Tensor.scaled_dot_product_attention, _attention),
    "var/std": (((7, 5),), lambda x: x.std(0) + x.var(1).sum(), lambda x: x.std(0, ddof=1) + x.var(1, ddof=1).sum()),
    "lerp": (((4, 6), (4, 6)), lambda a, b: a.lerp(b, 0.25), lambda a, b: a + (b - a) * 0.25),
}


@pytest.mark.tg_op("processing")
@pytest.mark.parametrize("name", list(CASES))
def test_processing_op(executing: Target, name: str, rng: np.random.Generator) -> None:
    executing.require(F32)
    shapes, fn, reference = CASES[name]
    xs = [values(F32, s, rng, -3, 3) for s in shapes]
    got = fn(*[tensor(executing, x, F32) for x in xs]).numpy()
    assert_array(
        f"{name} on float32",
        executing.name,
        got,
        np.asarray(reference(*xs), dtype=np.float32),
        atol=ATOL,
        rtol=RTOL,
        inputs=[(f"x{i}", x) for i, x in enumerate(xs)],
    )


@pytest.mark.tg_op("processing")
def test_gather_and_cross_entropy(executing: Target, rng: np.random.Generator) -> None:
    executing.require(F32)
    x = values(F32, (6, 5), rng, -3, 3)
    idx = rng.integers(0, 5, (6, 3)).astype(np.int32)
    got = tensor(executing, x, F32).gather(1, Tensor(idx, device=executing.name)).numpy()
    assert_array("gather on axis 1", executing.name, got, np.take_along_axis(x, idx, 1), inputs=[("x", x)])
    labels = rng.integers(0, 5, 6).astype(np.int32)
    loss = tensor(executing, x, F32).sparse_categorical_crossentropy(Tensor(labels, device=executing.name)).numpy()
    assert_array(
        "sparse_categorical_crossentropy",
        executing.name,
        loss,
        _cross_entropy(x, labels).astype(np.float32),
        atol=ATOL,
        rtol=RTOL,
        inputs=[("x", x)],
    )
