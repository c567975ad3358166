"""tgcore.nn layers: forward and gradients against numpy implementations, parameter shapes, init and signatures."""

from __future__ import annotations

import inspect
import math
from typing import Any, Callable, Iterator, Optional

import numpy as np
import pytest

from tgcore import Tensor, dtypes, nn
from tgcore.nn.state import get_state_dict

Ref = Callable[[dict[str, np.ndarray]], np.ndarray]


@pytest.fixture(autouse=True)
def _restore_training() -> Iterator[None]:
    prev = Tensor.training
    yield
    Tensor.training = prev


def _tup(v: Any, n: int) -> tuple[int, ...]:
    return (v,) * n if isinstance(v, int) else tuple(v)


# ***** numpy references (float64) *****


def conv_np(
    x: np.ndarray,
    w: np.ndarray,
    b: Optional[np.ndarray],
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
) -> np.ndarray:
    """Cross-correlation over any number of spatial axes, torch's Conv semantics."""
    nd = w.ndim - 2
    s, p, d = _tup(stride, nd), _tup(padding, nd), _tup(dilation, nd)
    x = np.pad(x, [(0, 0), (0, 0)] + [(pi, pi) for pi in p])
    n, (cout, cin_g), kernel = x.shape[0], w.shape[:2], w.shape[2:]
    out_sp = [(x.shape[2 + i] - d[i] * (kernel[i] - 1) - 1) // s[i] + 1 for i in range(nd)]
    out = np.zeros((n, cout, *out_sp))
    cout_g = cout // groups
    for g in range(groups):
        xg, wg = x[:, g * cin_g : (g + 1) * cin_g], w[g * cout_g : (g + 1) * cout_g]
        for k in np.ndindex(*kernel):
            window = tuple(slice(k[i] * d[i], k[i] * d[i] + s[i] * (out_sp[i] - 1) + 1, s[i]) for i in range(nd))
            patch = xg[(slice(None), slice(None), *window)]
            out[:, g * cout_g : (g + 1) * cout_g] += np.einsum(
                "nc...,oc->no...", patch, wg[(slice(None), slice(None), *k)]
            )
    return out if b is None else out + b.reshape(1, -1, *[1] * nd)


def conv_transpose_np(
    x: np.ndarray,
    w: np.ndarray,
    b: Optional[np.ndarray],
    stride: Any = 1,
    padding: Any = 0,
    output_padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
) -> np.ndarray:
    """Transposed convolution, torch's ConvTranspose semantics: every input element scatters a scaled kernel."""
    nd = w.ndim - 2
    s, p, op, d = _tup(stride, nd), _tup(padding, nd), _tup(output_padding, nd), _tup(dilation, nd)
    n, cin, in_sp = x.shape[0], x.shape[1], x.shape[2:]
    cout_g, kernel = w.shape[1], w.shape[2:]
    full = [(in_sp[i] - 1) * s[i] + d[i] * (kernel[i] - 1) + 1 + op[i] for i in range(nd)]
    out = np.zeros((n, cout_g * groups, *full))
    cin_g = cin // groups
    for g in range(groups):
        xg, wg = x[:, g * cin_g : (g + 1) * cin_g], w[g * cin_g : (g + 1) * cin_g]
        for k in np.ndindex(*kernel):
            contrib = np.einsum("nc...,co->no...", xg, wg[(slice(None), slice(None), *k)])
            spots = tuple(slice(k[i] * d[i], k[i] * d[i] + s[i] * (in_sp[i] - 1) + 1, s[i]) for i in range(nd))
            out[(slice(None), slice(g * cout_g, (g + 1) * cout_g), *spots)] += contrib
    out = out[(slice(None), slice(None), *(slice(p[i], full[i] - p[i]) for i in range(nd)))]
    return out if b is None else out + b.reshape(1, -1, *[1] * nd)


def normalize_np(x: np.ndarray, axes: tuple[int, ...], eps: float) -> np.ndarray:
    mean = x.mean(axis=axes, keepdims=True)
    return (x - mean) / np.sqrt(x.var(axis=axes, keepdims=True) + eps)


def per_channel(v: np.ndarray, ndim: int) -> np.ndarray:
    return v.reshape(1, -1, *[1] * (ndim - 2))


# ***** the check: forward, and the gradient of sum(out * R) for the input and every parameter *****


def numeric_grad(f: Callable[[np.ndarray], float], at: np.ndarray, h: float = 1e-6) -> np.ndarray:
    grad = np.zeros_like(at)
    for i in np.ndindex(*at.shape):
        plus, minus = at.copy(), at.copy()
        plus[i] += h
        minus[i] -= h
        grad[i] = (f(plus) - f(minus)) / (2 * h)
    return grad


def check_layer(
    layer: Any,
    x_np: np.ndarray,
    ref: Ref,
    params: tuple[str, ...] = ("weight", "bias"),
    rtol: float = 1e-4,
    atol: float = 1e-4,
) -> None:
    x = Tensor(x_np.astype(np.float32), requires_grad=True)
    values = {"x": x_np.astype(np.float32).astype(np.float64)}
    values.update({p: getattr(layer, p).numpy().astype(np.float64) for p in params})
    for p in params:  # as an optimizer would (a tensor's requires_grad starts as None: no gradient)
        getattr(layer, p).requires_grad = True
    out = layer(x)
    want = ref(values)
    assert out.shape == want.shape
    np.testing.assert_allclose(out.numpy(), want, rtol=rtol, atol=atol)
    r = np.random.default_rng(0).standard_normal(want.shape)
    (out * Tensor(r.astype(np.float32))).sum().backward()
    for name in ("x",) + params:
        got = (x if name == "x" else getattr(layer, name)).grad
        assert got is not None, f"no gradient for {name}"
        numeric = numeric_grad(lambda v: float((ref({**values, name: v}) * r).sum()), values[name])
        np.testing.assert_allclose(got.numpy(), numeric, rtol=rtol, atol=atol, err_msg=f"gradient of {name}")


def _x(*shape: int, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape)


# ***** layers *****


def test_linear() -> None:
    layer = nn.Linear(5, 3)
    check_layer(layer, _x(2, 4, 5), lambda v: v["x"] @ v["weight"].T + v["bias"])
    check_layer(nn.Linear(4, 2, bias=False), _x(3, 4), lambda v: v["x"] @ v["weight"].T, params=("weight",))


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"stride": 2, "padding": 1},
        {"padding": (1, 0), "dilation": 2, "groups": 2},
        {"stride": (1, 2), "bias": False},
    ],
)
def test_conv2d(kwargs: dict[str, Any]) -> None:
    layer = nn.Conv2d(4, 2, (3, 2) if "bias" in kwargs else 3, **kwargs)
    opts = {k: v for k, v in kwargs.items() if k != "bias"}
    params = ("weight",) if kwargs.get("bias") is False else ("weight", "bias")
    check_layer(layer, _x(2, 4, 6, 5), lambda v: conv_np(v["x"], v["weight"], v.get("bias"), **opts), params)


def test_conv1d() -> None:
    layer = nn.Conv1d(2, 4, 3, stride=2, padding=1, groups=2)
    assert layer.weight.shape == (4, 1, 3)
    check_layer(layer, _x(2, 2, 7), lambda v: conv_np(v["x"], v["weight"], v["bias"], stride=2, padding=1, groups=2))


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"stride": 2, "padding": 1, "output_padding": 1}, {"stride": (2, 1), "dilation": 2, "groups": 2}],
)
def test_conv_transpose2d(kwargs: dict[str, Any]) -> None:
    layer = nn.ConvTranspose2d(4, 2, 3, **kwargs)
    assert layer.weight.shape == (4, 2 // kwargs.get("groups", 1), 3, 3)
    check_layer(layer, _x(1, 4, 3, 4), lambda v: conv_transpose_np(v["x"], v["weight"], v["bias"], **kwargs))


def test_conv_transpose1d() -> None:
    layer = nn.ConvTranspose1d(2, 3, 3, stride=3, padding=1, output_padding=2)
    assert layer.weight.shape == (2, 3, 3)
    check_layer(
        layer,
        _x(2, 2, 4),
        lambda v: conv_transpose_np(v["x"], v["weight"], v["bias"], stride=3, padding=1, output_padding=2),
    )


def _bn_train_ref(v: dict[str, np.ndarray]) -> np.ndarray:
    x = v["x"]
    axes = (0,) + tuple(range(2, x.ndim))
    return normalize_np(x, axes, 1e-5) * per_channel(v["weight"], x.ndim) + per_channel(v["bias"], x.ndim)


def test_batchnorm2d_training_uses_batch_statistics_and_tracks_them() -> None:
    layer = nn.BatchNorm2d(3)
    layer.weight, layer.bias = Tensor([1.0, 2.0, -1.0]), Tensor([0.0, 0.5, 1.0])
    x = _x(2, 3, 4, 3) * 2 + 1
    Tensor.training = True
    check_layer(layer, x, _bn_train_ref)
    # the check ran the layer once: the running statistics moved 10% toward the batch's (unbiased variance)
    x32 = x.astype(np.float32).astype(np.float64)
    np.testing.assert_allclose(layer.running_mean.numpy(), 0.1 * x32.mean(axis=(0, 2, 3)), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(layer.running_var.numpy(), 0.9 + 0.1 * x32.var(axis=(0, 2, 3), ddof=1), rtol=1e-5)
    assert layer.num_batches_tracked.numpy().tolist() == [1.0]


def test_batchnorm2d_eval_uses_running_statistics() -> None:
    layer = nn.BatchNorm2d(2, eps=1e-3)
    layer.running_mean, layer.running_var = Tensor([0.5, -1.0]), Tensor([4.0, 0.25])
    layer.weight, layer.bias = Tensor([2.0, 1.0]), Tensor([0.0, 3.0])
    Tensor.training = False

    def ref(v: dict[str, np.ndarray]) -> np.ndarray:
        mean, var = np.array([0.5, -1.0]), np.array([4.0, 0.25])
        return (v["x"] - per_channel(mean, 4)) / np.sqrt(per_channel(var, 4) + 1e-3) * per_channel(
            v["weight"], 4
        ) + per_channel(v["bias"], 4)

    check_layer(layer, _x(2, 2, 3, 3), ref)
    assert layer.num_batches_tracked.numpy().tolist() == [0.0]


def test_batchnorm2d_without_affine_or_tracking() -> None:
    layer = nn.BatchNorm2d(2, affine=False, track_running_stats=False)
    assert layer.weight is None and layer.bias is None
    Tensor.training = True
    x = _x(3, 2, 2, 2)
    out = layer(Tensor(x.astype(np.float32)))
    np.testing.assert_allclose(out.numpy(), normalize_np(x, (0, 2, 3), 1e-5), rtol=1e-4, atol=1e-5)
    assert layer.running_mean.numpy().tolist() == [0.0, 0.0]


def test_groupnorm() -> None:
    layer = nn.GroupNorm(2, 4)
    layer.weight, layer.bias = Tensor([1.0, 2.0, 0.5, -1.0]), Tensor([0.1, 0.2, 0.3, 0.4])

    def ref(v: dict[str, np.ndarray]) -> np.ndarray:
        x = v["x"]
        y = normalize_np(x.reshape(x.shape[0], 2, -1), (2,), 1e-5).reshape(x.shape)
        return y * per_channel(v["weight"], x.ndim) + per_channel(v["bias"], x.ndim)

    check_layer(layer, _x(2, 4, 3, 2) * 3, ref)
    plain = nn.GroupNorm(1, 3, affine=False)
    x = _x(2, 3, 5)
    np.testing.assert_allclose(plain(Tensor(x.astype(np.float32))).numpy(), normalize_np(x, (1, 2), 1e-5), atol=1e-4)


def test_instancenorm() -> None:
    layer = nn.InstanceNorm(3, eps=1e-3)
    layer.weight, layer.bias = Tensor([1.0, 2.0, 0.5]), Tensor([0.0, -1.0, 1.0])

    def ref(v: dict[str, np.ndarray]) -> np.ndarray:
        x = v["x"]
        return normalize_np(x, (2, 3), 1e-3) * per_channel(v["weight"], 4) + per_channel(v["bias"], 4)

    check_layer(layer, _x(2, 3, 2, 3), ref)


def test_layernorm() -> None:
    layer = nn.LayerNorm((3, 4))
    layer.weight, layer.bias = Tensor(_x(3, 4, seed=5).astype(np.float32)), Tensor(_x(3, 4, seed=6).astype(np.float32))
    check_layer(layer, _x(2, 3, 4), lambda v: normalize_np(v["x"], (-2, -1), 1e-5) * v["weight"] + v["bias"])
    with pytest.raises(ValueError, match="normalized shape"):
        layer(Tensor.zeros(2, 4, 3))
    plain = nn.LayerNorm(5, eps=1e-2, elementwise_affine=False)
    assert plain.weight is None and plain.normalized_shape == (5,)
    x = _x(3, 5)
    np.testing.assert_allclose(plain(Tensor(x.astype(np.float32))).numpy(), normalize_np(x, (-1,), 1e-2), atol=1e-5)


def test_layernorm2d() -> None:
    layer = nn.LayerNorm2d(3)
    layer.weight, layer.bias = Tensor([1.0, -2.0, 0.5]), Tensor([0.0, 1.0, 2.0])

    def ref(v: dict[str, np.ndarray]) -> np.ndarray:
        return normalize_np(v["x"], (1,), 1e-5) * per_channel(v["weight"], 4) + per_channel(v["bias"], 4)

    check_layer(layer, _x(2, 3, 2, 2), ref)


def test_embedding() -> None:
    layer = nn.Embedding(6, 3)
    idx = np.array([[0, 5, 2], [2, 2, 1]])
    layer.weight.requires_grad = True
    out = layer(Tensor(idx))
    w = layer.weight.numpy()
    np.testing.assert_array_equal(out.numpy(), w[idx])
    r = _x(2, 3, 3).astype(np.float32)
    (out * Tensor(r)).sum().backward()
    want = np.zeros_like(w)
    np.add.at(want, idx, r)
    assert layer.weight.grad is not None
    np.testing.assert_allclose(layer.weight.grad.numpy(), want, rtol=1e-6)
    assert layer(Tensor([], dtype=dtypes.int32)).shape == (0, 3)
    assert list(get_state_dict(layer)) == ["weight"]


# ***** parameters: names, shapes, initialization *****


def test_state_dict_names_and_shapes_match_pytorch() -> None:
    # the keys and shapes of torch.nn's layers of the same arguments (num_batches_tracked is (1,) as in tinygrad)
    expected = {
        "linear": ({"weight": (3, 5), "bias": (3,)}, nn.Linear(5, 3)),
        "conv1d": ({"weight": (6, 2, 3), "bias": (6,)}, nn.Conv1d(4, 6, 3, groups=2)),
        "conv2d": ({"weight": (6, 4, 3, 2)}, nn.Conv2d(4, 6, (3, 2), bias=False)),
        "convt1d": ({"weight": (4, 3, 5), "bias": (6,)}, nn.ConvTranspose1d(4, 6, 5, groups=2)),
        "convt2d": ({"weight": (4, 6, 3, 3), "bias": (6,)}, nn.ConvTranspose2d(4, 6, 3)),
        "bn": (
            {"weight": (3,), "bias": (3,), "running_mean": (3,), "running_var": (3,), "num_batches_tracked": (1,)},
            nn.BatchNorm2d(3),
        ),
        "gn": ({"weight": (6,), "bias": (6,)}, nn.GroupNorm(3, 6)),
        "in": ({"weight": (6,), "bias": (6,)}, nn.InstanceNorm(6)),
        "ln": ({"weight": (2, 3), "bias": (2, 3)}, nn.LayerNorm((2, 3))),
        "ln2d": ({"weight": (4,), "bias": (4,)}, nn.LayerNorm2d(4)),
        "emb": ({"weight": (10, 4)}, nn.Embedding(10, 4)),
    }
    for name, (want, layer) in expected.items():
        got = {k: tuple(v.shape) for k, v in get_state_dict(layer).items()}
        assert got == want, name


def test_initialization_ranges() -> None:
    Tensor.manual_seed(1)
    cases = [
        (nn.Linear(50, 40).weight, 1 / math.sqrt(50)),
        (nn.Linear(50, 40).bias, 1 / math.sqrt(50)),
        (nn.Conv2d(8, 30, 3, groups=2).weight, 1 / math.sqrt(4 * 9)),
        (nn.Conv2d(8, 30, 3, groups=2).bias, 1 / math.sqrt(4 * 9)),
        (nn.ConvTranspose2d(30, 8, 3, groups=2).weight, 1 / math.sqrt(4 * 9)),
        (nn.Embedding(60, 40).weight, math.sqrt(6 / 100)),
    ]
    for t, bound in cases:
        v = t.numpy()
        assert np.abs(v).max() <= bound * (1 + 1e-6)
        assert np.abs(v).max() > 0.8 * bound  # it fills the range: not a narrower distribution
    bn = nn.BatchNorm2d(2)
    assert bn.running_var.numpy().tolist() == [1.0, 1.0] and bn.running_mean.requires_grad is False


SIGNATURES: dict[str, list[tuple[str, Any]]] = {
    "Linear": [("in_features", None), ("out_features", None), ("bias", True)],
    "Conv1d": [
        ("in_channels", None),
        ("out_channels", None),
        ("kernel_size", None),
        ("stride", 1),
        ("padding", 0),
        ("dilation", 1),
        ("groups", 1),
        ("bias", True),
    ],
    "Conv2d": [
        ("in_channels", None),
        ("out_channels", None),
        ("kernel_size", None),
        ("stride", 1),
        ("padding", 0),
        ("dilation", 1),
        ("groups", 1),
        ("bias", True),
    ],
    "ConvTranspose1d": [
        ("in_channels", None),
        ("out_channels", None),
        ("kernel_size", None),
        ("stride", 1),
        ("padding", 0),
        ("output_padding", 0),
        ("dilation", 1),
        ("groups", 1),
        ("bias", True),
    ],
    "ConvTranspose2d": [
        ("in_channels", None),
        ("out_channels", None),
        ("kernel_size", None),
        ("stride", 1),
        ("padding", 0),
        ("output_padding", 0),
        ("dilation", 1),
        ("groups", 1),
        ("bias", True),
    ],
    "BatchNorm2d": [("sz", None), ("eps", 1e-5), ("affine", True), ("track_running_stats", True), ("momentum", 0.1)],
    "GroupNorm": [("num_groups", None), ("num_channels", None), ("eps", 1e-5), ("affine", True)],
    "InstanceNorm": [("num_features", None), ("eps", 1e-5), ("affine", True)],
    "LayerNorm": [("normalized_shape", None), ("eps", 1e-5), ("elementwise_affine", True)],
    "LayerNorm2d": [("normalized_shape", None), ("eps", 1e-5), ("elementwise_affine", True)],
    "Embedding": [("vocab_size", None), ("embed_size", None)],
}


@pytest.mark.parametrize("name", sorted(SIGNATURES))
def test_signatures_match_tinygrad(name: str) -> None:
    params = list(inspect.signature(getattr(nn, name)).parameters.values())
    got = [(p.name, None if p.default is inspect.Parameter.empty else p.default) for p in params]
    assert got == SIGNATURES[name]


# ***** the same layers, with weights from PyTorch, against PyTorch's outputs *****


def test_layers_match_pytorch_with_its_weights(tmp_path: Any) -> None:
    torch = pytest.importorskip("torch")
    from tgcore.nn.state import load_state_dict, torch_load

    torch.manual_seed(0)
    pairs = [
        (torch.nn.Linear(5, 3), nn.Linear(5, 3), (2, 5)),
        (
            torch.nn.Conv1d(4, 6, 3, stride=2, padding=1, groups=2),
            nn.Conv1d(4, 6, 3, stride=2, padding=1, groups=2),
            (2, 4, 7),
        ),
        (
            torch.nn.Conv2d(2, 3, (3, 2), dilation=(1, 2), padding=1),
            nn.Conv2d(2, 3, (3, 2), dilation=(1, 2), padding=1),
            (1, 2, 5, 6),
        ),
        (
            torch.nn.ConvTranspose1d(2, 4, 3, stride=2, groups=2),
            nn.ConvTranspose1d(2, 4, 3, stride=2, groups=2),
            (2, 2, 4),
        ),
        (
            torch.nn.ConvTranspose2d(3, 2, 3, stride=2, padding=1, output_padding=1),
            nn.ConvTranspose2d(3, 2, 3, stride=2, padding=1, output_padding=1),
            (1, 3, 3, 4),
        ),
        (torch.nn.BatchNorm2d(3), nn.BatchNorm2d(3), (4, 3, 2, 2)),
        (torch.nn.GroupNorm(2, 4), nn.GroupNorm(2, 4), (2, 4, 3, 3)),
        (torch.nn.InstanceNorm2d(3, affine=True), nn.InstanceNorm(3), (2, 3, 4, 4)),
        (torch.nn.LayerNorm((3, 4)), nn.LayerNorm((3, 4)), (2, 3, 4)),
    ]
    for i, (tm, layer, shape) in enumerate(pairs):
        with torch.no_grad():
            for p in tm.parameters():
                p.copy_(torch.randn_like(p))
            if isinstance(tm, torch.nn.BatchNorm2d):
                tm.running_mean.copy_(torch.randn(3))
                tm.running_var.copy_(torch.rand(3) + 0.5)
        tm.eval()
        fn = tmp_path / f"layer{i}.pt"
        torch.save(tm.state_dict(), fn)
        load_state_dict(layer, torch_load(fn), verbose=False)
        x = np.random.default_rng(i).standard_normal(shape).astype(np.float32)
        Tensor.training = False
        want = tm(torch.from_numpy(x)).detach().numpy()
        np.testing.assert_allclose(layer(Tensor(x)).numpy(), want, rtol=1e-4, atol=1e-4, err_msg=type(tm).__name__)
    emb_t, emb = torch.nn.Embedding(7, 3), nn.Embedding(7, 3)
    torch.save(emb_t.state_dict(), tmp_path / "emb.pt")
    load_state_dict(emb, torch_load(tmp_path / "emb.pt"), verbose=False)
    idx = np.array([[1, 6], [0, 1]])
    np.testing.assert_array_equal(emb(Tensor(idx)).numpy(), emb_t(torch.from_numpy(idx)).detach().numpy())
