"""Gradients of conv2d (any number of spatial axes) and conv_transpose2d, against a numpy reference that scatters
each kernel tap's products by hand: strides, dilations, groups, asymmetric and oversized padding, sizes the stride
does not divide, one input differentiated at a time, dtypes."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest

from tgcore import Tensor, dtypes
from tgcore.errors import ShapeError

R = np.random.default_rng(11)


def _taps(kernel: tuple[int, ...], out: tuple[int, ...], strides: tuple[int, ...], dils: tuple[int, ...]) -> Any:
    """For each kernel position: the position and the slices of the padded input its products read."""
    for k in itertools.product(*map(range, kernel)):
        yield k, tuple(slice(ki * d, ki * d + (o - 1) * s + 1, s) for ki, d, o, s in zip(k, dils, out, strides))


def np_conv_grads(
    x: np.ndarray, w: np.ndarray, g: np.ndarray, stride: Any, dilation: Any, pads: list[tuple[int, int]], groups: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(output, d sum(out * g) / dx, d sum(out * g) / dw) of a cross-correlation, (before, after) pads per spatial
    axis."""
    nd = w.ndim - 2
    strides = (stride,) * nd if isinstance(stride, int) else tuple(stride)
    dils = (dilation,) * nd if isinstance(dilation, int) else tuple(dilation)
    xp = np.pad(x, [(0, 0), (0, 0)] + list(pads))
    cout, cin = w.shape[:2]
    out_sp = tuple((n - d * (k - 1) - 1) // s + 1 for n, d, k, s in zip(xp.shape[2:], dils, w.shape[2:], strides))
    out = np.zeros((x.shape[0], cout, *out_sp))
    gxp, gw = np.zeros_like(xp), np.zeros_like(w)
    per, summed = cout // groups, [0, *range(2, 2 + nd)]  # (batch and output positions)
    for k, sl in _taps(w.shape[2:], out_sp, strides, dils):
        for grp in range(groups):
            xs = xp[(slice(None), slice(grp * cin, (grp + 1) * cin), *sl)]  # (N, cin, *out)
            wk = w[(slice(grp * per, (grp + 1) * per), slice(None), *k)]  # (per, cin)
            gk = g[:, grp * per : (grp + 1) * per]  # (N, per, *out)
            out[:, grp * per : (grp + 1) * per] += np.einsum("nc...,pc->np...", xs, wk)
            gxp[(slice(None), slice(grp * cin, (grp + 1) * cin), *sl)] += np.einsum("np...,pc->nc...", gk, wk)
            gw[(slice(grp * per, (grp + 1) * per), slice(None), *k)] += np.tensordot(gk, xs, axes=(summed, summed))
    # back to the unpadded input: the padding's gradients dropped
    gx = gxp[(slice(None), slice(None), *[slice(a, a + n) for (a, _), n in zip(pads, x.shape[2:])])]
    return out, gx, gw


CASES = [
    # x shape, w shape, conv2d keywords, pads per spatial axis (for the reference)
    ((2, 3, 7, 8), (4, 3, 3, 3), dict(padding=1), [(1, 1), (1, 1)]),
    ((2, 3, 9, 8), (4, 3, 3, 3), dict(stride=2, padding=1), [(1, 1), (1, 1)]),  # 9 is not a multiple of 2
    ((1, 4, 9, 10), (6, 2, 3, 2), dict(groups=2, dilation=2, stride=(1, 2)), [(0, 0), (0, 0)]),
    ((2, 2, 6, 7), (3, 2, 2, 3), dict(padding=(1, 0, 2, 1)), [(2, 1), (1, 0)]),  # (left, right, top, bottom)
    ((1, 2, 5, 5), (3, 2, 1, 1), dict(padding=1, stride=2), [(1, 1), (1, 1)]),  # padding wider than the kernel
    ((1, 2, 6, 6), (2, 2, 3, 3), dict(padding=3, dilation=1), [(3, 3), (3, 3)]),
    ((2, 4, 7, 7), (4, 1, 3, 3), dict(groups=4, padding=1, stride=2), [(1, 1), (1, 1)]),  # depthwise
    # depthwise, stride 1: the flat stencil over rows of the padded width (Tensor._conv_depthwise_flat)
    ((2, 4, 7, 7), (4, 1, 5, 5), dict(groups=4, padding=2), [(2, 2), (2, 2)]),
    ((1, 3, 6, 14), (3, 1, 3, 3), dict(groups=3, padding=(1, 0, 2, 1)), [(2, 1), (1, 0)]),  # rows of 13
    ((1, 2, 5, 9), (2, 1, 2, 5), dict(groups=2, padding=(2, 2, 0, 1)), [(0, 1), (2, 2)]),  # a 2x5 kernel
    # ... and of stride 2, in 4 phases of ceil(k / 2) taps a side
    ((2, 3, 9, 9), (3, 1, 5, 5), dict(groups=3, padding=2, stride=2), [(2, 2), (2, 2)]),
    ((1, 4, 13, 12), (4, 1, 3, 3), dict(groups=4, padding=(1, 0, 1, 1), stride=2), [(1, 1), (1, 0)]),  # 6x7 out
    ((1, 2, 8, 10), (2, 1, 4, 3), dict(groups=2, padding=(0, 2, 3, 0), stride=2), [(3, 0), (0, 2)]),
    ((2, 3, 11), (5, 3, 4), dict(stride=3, padding=2, dilation=2), [(2, 2)]),  # 1-d
    ((1, 2, 5, 4, 6), (3, 2, 2, 3, 2), dict(padding=(1, 0, 2), stride=(2, 1, 2)), [(1, 1), (0, 0), (2, 2)]),  # 3-d
]


@pytest.mark.parametrize("xs,ws,kw,pads", CASES, ids=[f"case{i}" for i in range(len(CASES))])
def test_conv_gradients(xs: tuple, ws: tuple, kw: dict, pads: list) -> None:
    x, w = R.standard_normal(xs), R.standard_normal(ws)
    tx, tw = Tensor(x, requires_grad=True), Tensor(w, requires_grad=True)
    out = tx.conv2d(tw, **kw)
    g = R.standard_normal(out.shape)
    exp_out, exp_gx, exp_gw = np_conv_grads(x, w, g, kw.get("stride", 1), kw.get("dilation", 1), pads,
                                            kw.get("groups", 1))  # fmt: skip
    np.testing.assert_allclose(out.numpy(), exp_out, rtol=1e-10, atol=1e-10)
    (out * Tensor(g)).sum().backward()
    assert tx.grad is not None and tw.grad is not None
    assert tx.grad.shape == x.shape and tw.grad.shape == w.shape
    np.testing.assert_allclose(tx.grad.numpy(), exp_gx, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(tw.grad.numpy(), exp_gw, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("which", ["input", "weight"])
def test_one_side_differentiated(which: str) -> None:
    x, w, b = R.standard_normal((2, 3, 6, 5)), R.standard_normal((4, 3, 3, 3)), R.standard_normal(4)
    tx, tw = Tensor(x, requires_grad=which == "input"), Tensor(w, requires_grad=which == "weight")
    tb = Tensor(b, requires_grad=True)
    out = tx.conv2d(tw, tb, stride=2, padding=1)
    g = R.standard_normal(out.shape)
    (out * Tensor(g)).sum().backward()
    _, exp_gx, exp_gw = np_conv_grads(x, w, g, 2, 1, [(1, 1), (1, 1)], 1)
    kept, dropped, expect = (tx, tw, exp_gx) if which == "input" else (tw, tx, exp_gw)
    assert dropped.grad is None
    np.testing.assert_allclose(kept.grad.numpy(), expect, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(tb.grad.numpy(), g.sum((0, 2, 3)), rtol=1e-10)


def test_chained_convs_and_relu() -> None:
    # a gradient that arrives through another conv and a relu: conv -> relu -> conv, against the reference twice
    x, w1, w2 = R.standard_normal((2, 2, 8, 8)), R.standard_normal((3, 2, 3, 3)), R.standard_normal((2, 3, 3, 3))
    tx, t1, t2 = (Tensor(a, requires_grad=True) for a in (x, w1, w2))
    h = tx.conv2d(t1, padding=1)
    out = h.relu().conv2d(t2, stride=2)
    g = R.standard_normal(out.shape)
    (out * Tensor(g)).sum().backward()
    hv, _, _ = np_conv_grads(x, w1, np.zeros((2, 3, 8, 8)), 1, 1, [(1, 1), (1, 1)], 1)
    _, gh, gw2 = np_conv_grads(np.maximum(hv, 0), w2, g, 2, 1, [(0, 0), (0, 0)], 1)
    _, gx, gw1 = np_conv_grads(x, w1, gh * (hv > 0), 1, 1, [(1, 1), (1, 1)], 1)
    for t, expect in ((tx, gx), (t1, gw1), (t2, gw2)):
        np.testing.assert_allclose(t.grad.numpy(), expect, rtol=1e-9, atol=1e-9)


def test_conv_transpose_gradient_is_conv() -> None:
    # <convT(x), z> = <x, conv(z)>: the gradient of convT's input is conv(z), cut to the input's size
    x, w = R.standard_normal((1, 3, 4, 5)), R.standard_normal((3, 2, 3, 3))
    tx, tw = Tensor(x, requires_grad=True), Tensor(w, requires_grad=True)
    y = tx.conv_transpose2d(tw, stride=2, padding=1, output_padding=1)
    z = R.standard_normal(y.shape)
    (y * Tensor(z)).sum().backward()
    cz = Tensor(z).conv2d(Tensor(w), stride=2, padding=1).numpy()
    np.testing.assert_allclose(tx.grad.numpy(), cz[..., :4, :5], rtol=1e-10, atol=1e-10)
    # and the weight's: convT(x)'s weight gradient is the conv weight gradient of z against x, channels swapped
    _, _, gw = np_conv_grads(z, np.zeros((3, 2, 3, 3)), x, 2, 1, [(1, 1), (1, 1)], 1)
    np.testing.assert_allclose(tw.grad.numpy(), gw, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("xdt,wdt", [(dtypes.float32, dtypes.float32), (dtypes.float16, dtypes.float32),
                                     (dtypes.float16, dtypes.float16)])  # fmt: skip
def test_gradient_dtypes(xdt: Any, wdt: Any) -> None:
    x, w = R.standard_normal((2, 3, 6, 6)), R.standard_normal((4, 3, 3, 3))
    tx = Tensor(x.astype(xdt.np), requires_grad=True)
    tw = Tensor(w.astype(wdt.np), requires_grad=True)
    out = tx.conv2d(tw, padding=1)
    g = R.standard_normal(out.shape)
    (out * Tensor(g.astype(out.dtype.np))).sum().backward()
    assert tx.grad.dtype == xdt and tw.grad.dtype == wdt
    _, exp_gx, exp_gw = np_conv_grads(x.astype(xdt.np).astype(np.float64), w.astype(wdt.np).astype(np.float64),
                                      g.astype(out.dtype.np).astype(np.float64), 1, 1, [(1, 1), (1, 1)], 1)  # fmt: skip
    tol = 2e-2 if dtypes.float16 in (xdt, wdt) else 1e-4
    np.testing.assert_allclose(tx.grad.numpy().astype(np.float64), exp_gx, rtol=tol, atol=tol)
    np.testing.assert_allclose(tw.grad.numpy().astype(np.float64), exp_gw, rtol=tol, atol=tol)


def test_depthwise_conv_takes_list_strides_and_dilations(monkeypatch: pytest.MonkeyPatch) -> None:
    # (as an ONNX model gives them): the flat stencil's checks read lists as tuples, and the stencil runs
    flat = Tensor._conv_depthwise_flat
    calls: list[tuple[int, int]] = []
    monkeypatch.setattr(Tensor, "_conv_depthwise_flat", lambda self, w, s, *a: calls.append(s) or flat(self, w, s, *a))
    x, w = R.standard_normal((1, 3, 7, 7)).astype(np.float32), R.standard_normal((3, 1, 5, 5)).astype(np.float32)
    for stride in ([1, 1], [2, 2]):
        got = Tensor(x).conv2d(Tensor(w), groups=3, stride=stride, dilation=[1, 1], padding=[2, 2]).numpy()
        o = 6 // stride[0] + 1
        ref = np_conv_grads(x, w, np.zeros((1, 3, o, o)), tuple(stride), 1, [(2, 2), (2, 2)], 3)[0]
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
    assert calls == [(1, 1), (2, 2)]


TRANSPOSE_CASES = [
    # x shape, weight shape (Cin, Cout / groups, *kernel), conv_transpose2d keywords
    ((2, 3, 5, 6), (3, 4, 3, 3), dict(stride=2, padding=1, output_padding=1)),
    ((1, 4, 7, 5), (4, 3, 1, 1), dict(stride=2)),  # a 1x1 kernel: phases with no tap are zeros
    ((1, 4, 5, 4), (4, 3, 4, 3), dict(stride=3, padding=1, output_padding=2, groups=2)),
    ((2, 2, 4, 4), (2, 3, 5, 2), dict(stride=(2, 4), padding=(2, 0), output_padding=(1, 3))),
    ((1, 2, 6, 6), (2, 2, 3, 3), dict(stride=2, padding=3)),  # padding past the kernel: the output is trimmed
    ((1, 2, 5, 5), (2, 2, 3, 3), dict(stride=2, dilation=2, padding=1)),  # dilated: the spread input
    ((2, 3, 9), (3, 2, 4), dict(stride=3, padding=1, output_padding=1)),  # 1-d
]


@pytest.mark.parametrize("xs,ws,kw", TRANSPOSE_CASES, ids=[f"case{i}" for i in range(len(TRANSPOSE_CASES))])
def test_conv_transpose_matches_reference(monkeypatch: pytest.MonkeyPatch, xs: tuple, ws: tuple, kw: dict) -> None:
    # conv_transpose(x) is the input gradient of the conv with the same weight, taken at x
    phases = Tensor._conv_transpose_phases
    calls: list[tuple[int, ...]] = []
    monkeypatch.setattr(
        Tensor, "_conv_transpose_phases", lambda self, w, g, s, p: calls.append(s) or phases(self, w, g, s, p)
    )
    x, w, b = R.standard_normal(xs), R.standard_normal(ws), R.standard_normal(ws[1] * kw.get("groups", 1))
    nd = len(ws) - 2
    stride, dilation = (kw.get(k, 1) for k in ("stride", "dilation"))
    strides, dils = ((v,) * nd if isinstance(v, int) else v for v in (stride, dilation))
    pad, out_pad = (kw.get(k, 0) for k in ("padding", "output_padding"))
    pads, out_pads = ((v,) * nd if isinstance(v, int) else v for v in (pad, out_pad))
    size = [(n - 1) * s - 2 * p + d * (k - 1) + o + 1 for n, s, p, d, k, o in zip(xs[2:], strides, pads, dils, ws[2:],
                                                                                 out_pads)]  # fmt: skip
    _, expect, _ = np_conv_grads(np.zeros((xs[0], ws[1] * kw.get("groups", 1), *size)), w, x, strides, dils,
                                 [(p, p) for p in pads], kw.get("groups", 1))  # fmt: skip
    got = Tensor(x).conv_transpose2d(Tensor(w), Tensor(b), **kw).numpy()
    np.testing.assert_allclose(got, expect + b.reshape(1, -1, *([1] * nd)), rtol=1e-10, atol=1e-10)
    assert calls == ([] if any(d > 1 for d in dils) else [strides])


@pytest.mark.parametrize("cin,stride,prepadded", [(3, 1, True), (16, 1, True), (3, 2, False), (32, 1, False)])
def test_few_input_channels_read_a_padded_copy(cin: int, stride: int, prepadded: bool) -> None:
    # a stride-1 conv of few input channels first copies its input padded (a kernel whose output has the padded
    # shape), so the conv's windows read no padding masks; the results are the reference's either way
    x, w = R.standard_normal((2, cin, 9, 8)).astype(np.float32), R.standard_normal((4, cin, 3, 3)).astype(np.float32)
    out = Tensor(x).conv2d(Tensor(w), padding=(2, 1, 1, 0), stride=stride)  # (left, right, top, bottom)
    shapes = [si.outputs[0].shape for si in out.schedule()]
    assert ((2, cin, 10, 11) in shapes) == prepadded
    ref = np_conv_grads(x, w, np.zeros(out.shape), stride, 1, [(1, 0), (2, 1)], 1)[0]
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("xs,ws,kw,pads", CASES, ids=[f"case{i}" for i in range(len(CASES))])
@pytest.mark.parametrize("dtype", [dtypes.float32, dtypes.float64])
def test_inference_convs_build_the_same_graph_on_the_lazybuffers(
    monkeypatch: pytest.MonkeyPatch, xs: tuple, ws: tuple, kw: dict, pads: list, dtype: Any
) -> None:
    # a conv that records no gradient is built on the LazyBuffers directly (Tensor._conv_lazy): the graph, so the
    # kernels and the bits, of the general path (reached here by naming the accumulation dtype, which changes
    # nothing), and the reference's values
    from tgcore.engine.schedule import _graph_key

    taken: list[tuple] = []
    lazy = Tensor._conv_lazy
    monkeypatch.setattr(Tensor, "_conv_lazy", lambda self, *a: taken.append(self.shape) or lazy(self, *a))
    x, w = R.standard_normal(xs).astype(dtype.np), R.standard_normal(ws).astype(dtype.np)
    tx, tw = Tensor(x), Tensor(w)
    fast = tx.conv2d(tw, **kw)
    general = tx.conv2d(tw, acc_dtype=dtype, **kw)
    args = (kw.get("groups", 1), kw.get("stride", 1), kw.get("dilation", 1), tuple(pads))
    depthwise = tx._depthwise_flat_strides(tw, *args) is not None  # (a stencil of its own)
    assert taken == ([] if depthwise else [xs])
    assert fast.lazydata.st == general.lazydata.st
    assert _graph_key([fast.lazydata.base])[0] == _graph_key([general.lazydata.base])[0]
    assert fast.dtype == dtype and fast.requires_grad is None
    exp = np_conv_grads(x, w, np.zeros(fast.shape), kw.get("stride", 1), kw.get("dilation", 1), pads,
                        kw.get("groups", 1))[0]  # fmt: skip
    tol = 1e-5 if dtype == dtypes.float32 else 1e-10
    np.testing.assert_allclose(fast.numpy(), exp, rtol=tol, atol=tol)
    np.testing.assert_array_equal(fast.numpy(), general.numpy())


def test_an_inference_conv_whose_window_does_not_fit_raises() -> None:
    with pytest.raises(ShapeError, match="a window of 5 taps"):
        Tensor.ones(1, 2, 4, 4).conv2d(Tensor.ones(3, 2, 5, 5))
    with pytest.raises(ValueError, match="must be ints or 2-tuples"):
        Tensor.ones(1, 2, 8, 8).conv2d(Tensor.ones(3, 2, 3, 3), stride=(1, 1, 1))
