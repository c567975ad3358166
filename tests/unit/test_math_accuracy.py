"""Float functions within a few ulps of the exact value (float64 numpy, or the float64 of the float64 inputs), over
wide ranges and near 0, where plain compositions of exp2/log2/sin lose every digit (tgcore.lazymath)."""

from __future__ import annotations

from typing import Callable

import numpy as np
import pytest

from tgcore import Tensor, dtypes


def ulps(got: np.ndarray, exact: np.ndarray, dtype: type) -> float:
    """The largest error of `got` in units of the last place of the exact value rounded to `dtype`."""
    spacing = np.spacing(np.abs(exact.astype(dtype))).astype(np.float64)
    err = np.abs(got.astype(np.float64) - exact) / spacing
    both_nan = np.isnan(got) & np.isnan(exact)
    assert not (np.isnan(got) ^ np.isnan(exact)).any(), "NaN where the exact value is not, or the other way"
    same_inf = np.isinf(got) & (got.astype(np.float64) == exact)
    return float(np.max(np.where(both_nan | same_inf, 0.0, err)))


def softplus(x: np.ndarray) -> np.ndarray:
    return np.logaddexp(0.0, x)


Case = tuple[Callable[[Tensor], Tensor], Callable[[np.ndarray], np.ndarray], list[tuple[float, float]]]
# name: (tensor function, exact function of float64, ranges)
FUNCTIONS: dict[str, Case] = {
    "exp": (Tensor.exp, np.exp, [(-100, 88.7), (-1e-3, 1e-3)]),
    "expm1": (Tensor.expm1, np.expm1, [(-100, 88.7), (-1e-6, 1e-6), (-0.5, 0.5)]),
    "log1p": (Tensor.log1p, np.log1p, [(-0.999, 1e30), (-1e-6, 1e-6)]),
    "sigmoid": (Tensor.sigmoid, lambda x: 1 / (1 + np.exp(-x)), [(-80, 80), (-103, -80)]),
    "tanh": (Tensor.tanh, np.tanh, [(-20, 20), (-1e-4, 1e-4), (-1, 1)]),
    "sinh": (Tensor.sinh, np.sinh, [(-89, 89), (-1e-4, 1e-4)]),
    "cosh": (Tensor.cosh, np.cosh, [(-89, 89)]),
    "softplus": (Tensor.softplus, softplus, [(-100, 100), (-90, -20)]),
    "cos": (Tensor.cos, np.cos, [(-10, 10), (-1e5, 1e5), (-1e30, 1e30), (1.5, 1.65)]),
    "tan": (Tensor.tan, np.tan, [(-1.57, 1.57), (-1e4, 1e4)]),
    "atanh": (Tensor.atanh, np.arctanh, [(-0.999, 0.999), (-1e-4, 1e-4)]),
    "asinh": (Tensor.asinh, np.arcsinh, [(-1e3, 1e3), (-1e-4, 1e-4)]),
    "acosh": (Tensor.acosh, np.arccosh, [(1, 1.01), (1, 1e20)]),
    "elu": (Tensor.elu, lambda x: np.where(x > 0, x, np.expm1(np.minimum(x, 0))), [(-1e-4, 1e-4), (-20, 5)]),
    "exp2": (Tensor.exp2, np.exp2, [(-140, 127.9)]),
    "log2": (Tensor.log2, np.log2, [(1e-30, 1e30)]),
    "pow": (lambda t: t.pow(2.5), lambda x: np.power(x, 2.5), [(0, 1e15)]),
}
# float32 error bounds in ulps: a few for each function (numpy's own float32 functions are within 1-3); float64
# results are checked against numpy's float64 functions (themselves within an ulp)
BOUND = {"float32": 5.0, "float64": 6.0}
# float64 powers have no wider float to form y * log(x) in: their error grows with |y log x| (ulps per unit of it)
POW_FLOAT64_ULPS_PER_LOG = 3.0


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_within_a_few_ulps(name: str, dtype: str) -> None:
    fn, exact, ranges = FUNCTIONS[name]
    rng = np.random.default_rng(7)
    np_dtype = np.float32 if dtype == "float32" else np.float64
    for low, high in ranges:
        x = rng.uniform(low, high, 3000).astype(np_dtype)
        with np.errstate(over="ignore"):
            want = exact(x.astype(np.float64))
            got = fn(Tensor(x, dtype=getattr(dtypes, dtype))).numpy()
            assert got.dtype == np_dtype
            err = ulps(got, want, np_dtype)
        bound = BOUND[dtype]
        if name == "pow" and dtype == "float64":
            bound += POW_FLOAT64_ULPS_PER_LOG * 2.5 * np.log(high)
        assert err <= bound, f"{name} on {dtype} over [{low}, {high}]: {err:.1f} ulp"


def test_special_values() -> None:
    x = np.float32([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-30, -1e-30])
    t = Tensor(x)
    with np.errstate(all="ignore"):
        for fn, ref in (
            (Tensor.exp, np.exp),
            (Tensor.expm1, np.expm1),
            (Tensor.tanh, np.tanh),
            (Tensor.sinh, np.sinh),
            (Tensor.cosh, np.cosh),
            (Tensor.sigmoid, lambda v: 1 / (1 + np.exp(-v))),
            (Tensor.cos, np.cos),
            (Tensor.log1p, np.log1p),
        ):
            got, want = fn(t).numpy(), ref(x).astype(np.float32)
            np.testing.assert_array_equal(got, want, err_msg=fn.__name__)
            zeros = want == 0
            np.testing.assert_array_equal(np.signbit(got[zeros]), np.signbit(want[zeros]), err_msg=fn.__name__)
    np.testing.assert_array_equal(Tensor(np.float32([-1.0, -2.0])).log1p().numpy(), np.float32([-np.inf, np.nan]))
    np.testing.assert_array_equal(Tensor(np.float32([-np.inf, np.inf])).softplus().numpy(), np.float32([0, np.inf]))


@pytest.mark.parametrize(
    "name,fn,derivative",
    [
        ("tanh", Tensor.tanh, lambda x: 1 / np.cosh(x) ** 2),
        ("sinh", Tensor.sinh, np.cosh),
        ("cosh", Tensor.cosh, np.sinh),
        ("expm1", Tensor.expm1, np.exp),
        ("log1p", Tensor.log1p, lambda x: 1 / (1 + x)),
        ("softplus", Tensor.softplus, lambda x: 1 / (1 + np.exp(-x))),
        ("cos", Tensor.cos, lambda x: -np.sin(x)),
        ("sin", Tensor.sin, np.cos),
        ("exp", Tensor.exp, np.exp),
    ],
)
def test_gradients(name: str, fn: Callable[[Tensor], Tensor], derivative: Callable) -> None:
    x = np.float32([-30.0, -3.0, -0.5, -1e-5, 0.0, 2e-5, 0.7, 4.0, 30.0])
    if name == "log1p":
        x = np.abs(x) + np.float32(0.5)
    t = Tensor(x, requires_grad=True)
    (fn(t) * 3).sum().backward()
    assert t.grad is not None
    np.testing.assert_allclose(t.grad.numpy(), 3 * derivative(x.astype(np.float64)), rtol=2e-6, atol=1e-30)


def test_halves_round_the_float32_result() -> None:
    from tgcore import Device

    if dtypes.float16 not in Device[Device.DEFAULT].spec.dtypes:
        pytest.skip(f"{Device.DEFAULT} does not claim float16")  # (the CPU plugins' tox envs run it on theirs)
    x = np.random.default_rng(3).uniform(-8, 8, 2000).astype(np.float16)
    for fn, ref in ((Tensor.exp, np.exp), (Tensor.tanh, np.tanh), (Tensor.cos, np.cos), (Tensor.expm1, np.expm1)):
        got = fn(Tensor(x, dtype=dtypes.float16)).numpy()
        assert got.dtype == np.float16
        assert ulps(got, ref(x.astype(np.float64)), np.float16) <= 1.0, fn.__name__
