"""Tensor.shard: one tensor split across device instances gives the results of the unsharded run."""

from __future__ import annotations

import numpy as np
import pytest

from tgcore import Tensor
from tgcore.multi import MultiLazyBuffer
from tgcore.nn import Linear
from tgcore.nn.optim import Adam

DEVICES = ("PYTHON", "PYTHON:1", "PYTHON:2")
rng = np.random.default_rng(0)
A = rng.standard_normal((7, 6)).astype(np.float32)
W = rng.standard_normal((6, 5)).astype(np.float32)
Y = rng.integers(0, 3, 7).astype(np.int32)


@pytest.mark.parametrize("axis", [None, 0, 1])
def test_shard_roundtrip_and_parts(axis):
    x = Tensor(A).shard(DEVICES, axis=axis)
    assert x.device == DEVICES and x.shape == A.shape
    assert isinstance(x.lazydata, MultiLazyBuffer)
    if axis is not None:
        assert [lb.shape[axis] for lb in x.lazydata.lbs] == {0: [3, 2, 2], 1: [2, 2, 2]}[axis]
    np.testing.assert_array_equal(x.numpy(), A)


@pytest.mark.parametrize("axis", [None, 0, 1])
def test_sharded_ops_match_unsharded(axis):
    x = Tensor(A).shard(DEVICES, axis=axis)
    np.testing.assert_allclose((x * 2 + 1).exp().numpy(), np.exp(A * 2 + 1), rtol=1e-6)
    np.testing.assert_allclose(x.sum().numpy(), A.sum(), rtol=1e-5)
    np.testing.assert_allclose(x.sum(axis=0).numpy(), A.sum(axis=0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(x.max(axis=1).numpy(), A.max(axis=1))
    np.testing.assert_allclose(x.softmax(-1).numpy(), np.exp(A) / np.exp(A).sum(-1, keepdims=True), rtol=1e-5)
    np.testing.assert_allclose(x.permute(1, 0).numpy(), A.T)
    np.testing.assert_allclose(x.reshape(7, 6, 1).expand(7, 6, 2).numpy(), np.broadcast_to(A[..., None], (7, 6, 2)))
    np.testing.assert_allclose(x.pad(((1, 0), (0, 2))).numpy(), np.pad(A, ((1, 0), (0, 2))))
    np.testing.assert_allclose(x[1:5, ::2].numpy(), A[1:5, ::2])
    np.testing.assert_allclose((x @ Tensor(W).shard(DEVICES)).numpy(), A @ W, rtol=1e-5, atol=1e-5)


def test_mixed_shardings_combine():
    a, b = Tensor(A).shard(DEVICES, axis=0), Tensor(A).shard(DEVICES, axis=1)
    np.testing.assert_allclose((a + b).numpy(), A + A)
    np.testing.assert_allclose((a * Tensor(A).shard(DEVICES)).numpy(), A * A)


def test_gradient_of_sharded_weights():
    w = Tensor(W).shard(DEVICES)
    w.requires_grad = True
    x = Tensor(A).shard(DEVICES, axis=0)
    (x @ w).relu().sum().backward()
    mask = ((A @ W) > 0).astype(np.float32)
    np.testing.assert_allclose(w.grad.numpy(), A.T @ mask, rtol=1e-5, atol=1e-5)


def test_sharded_training_matches_unsharded():
    def train(devices):
        Tensor.manual_seed(1)
        l1, l2 = Linear(6, 8), Linear(8, 3)
        params = [l1.weight, l1.bias, l2.weight, l2.bias]
        if devices:
            for p in params:
                p.shard_(devices)
        opt = Adam(params, lr=1e-2)
        losses = []
        with Tensor.train():
            for _ in range(3):
                xt, yt = Tensor(A), Tensor(Y)
                if devices:
                    xt, yt = xt.shard(devices, axis=0), yt.shard(devices, axis=0)
                opt.zero_grad()
                loss = l2(l1(xt).relu()).sparse_categorical_crossentropy(yt)
                loss.backward()
                opt.step()
                losses.append(loss.item())
        return np.array(losses), l1.weight.numpy()

    plain_losses, plain_w = train(None)
    sharded_losses, sharded_w = train(DEVICES[:2])
    np.testing.assert_allclose(sharded_losses, plain_losses, rtol=1e-5)
    np.testing.assert_allclose(sharded_w, plain_w, rtol=1e-5, atol=1e-6)


def test_shard_errors():
    x = Tensor(A).shard(DEVICES, axis=0)
    with pytest.raises(ValueError, match="already sharded"):
        x.shard(DEVICES)
    with pytest.raises(ValueError, match="distinct"):
        Tensor(A).shard(("PYTHON", "python:0"))
