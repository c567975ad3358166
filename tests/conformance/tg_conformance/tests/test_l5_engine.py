"""Level 5, the engine: copies between the device and PYTHON and between two instances of the device; TinyJit
replay and symbolic shapes where tgcore has them."""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import tgcore
from tg_conformance import reference as ref
from tg_conformance.checks import assert_array
from tg_conformance.target import Target
from tg_conformance.tensors import tensor, values
from tgcore import Device, Tensor, Variable
from tgcore.device import Buffer
from tgcore.dtype import DType, dtypes
from tgcore.ops import BinaryOps

pytestmark = pytest.mark.usefixtures("executing")

COPY_DTYPES = [dtypes.float32, dtypes.int64, dtypes.float16, dtypes.bool, dtypes.uint8, dtypes.bfloat16]


def _round_trip(target: Target, other: str, dtype: DType, rng: np.random.Generator) -> None:
    """x + 1 computed on the target, copied to `other`, flipped there, copied back; checked at each step."""
    x = values(dtype, (5, 13), rng, -100, 100)
    on_device = tensor(target, x, dtype)
    if dtype != dtypes.bool:  # computed on the device before the copy
        on_device = on_device + tensor(target, np.ones_like(x), dtype)
        x = ref.alu_reference(BinaryOps.ADD, dtype, [x.reshape(-1), np.ones(x.size, x.dtype)]).reshape(x.shape)
    moved = on_device.to(other)
    assert moved.device == Device.canonicalize(other), f"to({other!r}) gave a tensor on {moved.device}"
    assert_array(f"{dtype.short_name} copied {target.name} -> {other}", target.name, moved.numpy(), x)
    back = moved.flip(1).to(target.name)
    assert back.device == target.name, f"to({target.name!r}) gave a tensor on {back.device}"
    assert_array(f"{dtype.short_name} flipped on {other} and copied back to {target.name}", target.name,
                 back.numpy(), np.ascontiguousarray(x[:, ::-1]))


@pytest.mark.tg_op("copy to PYTHON and back")
@pytest.mark.parametrize("dtype", COPY_DTYPES, ids=lambda d: d.short_name)
def test_copy_to_python_and_back(executing: Target, dtype: DType, rng: np.random.Generator) -> None:
    if executing.name.split(":")[0] == "PYTHON":
        pytest.skip("the device under test is PYTHON itself (the copy between two instances covers it)")
    executing.require(dtype)
    if dtype not in Device["PYTHON"].spec.dtypes:
        pytest.skip(f"PYTHON does not claim dtype {dtype.short_name}")
    _round_trip(executing, "PYTHON", dtype, rng)


@pytest.mark.tg_op("copy between instances")
@pytest.mark.parametrize("dtype", COPY_DTYPES, ids=lambda d: d.short_name)
def test_copy_between_instances(executing: Target, dtype: DType, rng: np.random.Generator) -> None:
    """`t.to("<DEV>:1")` computes on a second instance of the device, and back."""
    executing.require(dtype)
    base, _, index = executing.name.partition(":")
    other = f"{base}:{int(index or 0) + 1}"
    try:
        Buffer(other, 1, dtypes.uint8).allocate()
    except Exception as e:  # e.g. a machine with one GPU
        pytest.skip(f"{other} is not usable on this machine: {type(e).__name__}: {e}")
    _round_trip(executing, other, dtype, rng)


@pytest.mark.tg_op("TinyJit")
def test_tinyjit_replay(executing: Target, rng: np.random.Generator) -> None:
    jit = getattr(tgcore, "TinyJit", None)
    if jit is None:
        pytest.skip("TinyJit does not exist in tgcore yet (`from tgcore import TinyJit` fails)")

    @jit
    def step(a: Tensor, b: Tensor) -> Tensor:
        return (a * b + a.exp2()).sum(axis=1).realize()

    for i in range(5):
        a = rng.uniform(-2, 2, (4, 6)).astype(np.float32)
        b = rng.uniform(-2, 2, (4, 6)).astype(np.float32)
        got = step(Tensor(a, device=executing.name), Tensor(b, device=executing.name)).numpy()
        exp = (a.astype(np.float64) * b + np.exp2(a.astype(np.float64))).sum(axis=1)
        assert_array(f"TinyJit call {i}", executing.name, got, exp, atol=1e-5, rtol=1e-5, exact_dtype=False)


@pytest.mark.tg_op("symbolic shapes")
def test_symbolic_shapes(executing: Target) -> None:
    """One TinyJit recording replayed for inputs of shape (3, i), i a bound Variable taking several values."""
    jit = getattr(tgcore, "TinyJit", None)
    if jit is None:
        pytest.skip("TinyJit does not exist in tgcore yet, and symbolic shapes come with it")

    @jit
    def step(a: Tensor) -> Tensor:
        return (a * 2 + 1).sum(1).realize()

    for n in (3, 5, 7, 4):
        x = np.arange(3 * n, dtype=np.float32).reshape(3, n)
        try:
            a = Tensor(x, device=executing.name).reshape(3, Variable("i", 1, 10).bind(n))
        except (ValueError, TypeError, NotImplementedError) as e:
            pytest.skip(f"tgcore's Tensor does not take symbolic shapes yet: reshape to (3, i) raised "
                        f"{type(e).__name__}: {e}")
        assert_array(f"jitted (a * 2 + 1).sum(1) with a of shape (3, i={n})", executing.name, step(a).numpy(),
                     (x * 2 + 1).sum(1))


# names of symbolic sizes come from outside (a model file's dimension names): they must reach no device's source as
# written. Several would run `touch <marker>` if pasted into C; the others are keywords and names renderers use
HOSTILE_NAMES = [
    'N\n#define N (system("touch {marker}"), 4)\n', 'n; system("touch {marker}"); int m',
    'n */ system("touch {marker}"); /* x', 'n // x\nsystem("touch {marker}");', '"system(\\"touch {marker}\\")"',
    "it's", "back\\slash", "%d %n", "two words", "naïve", "int", "return", "bufs", "vals", "gidx0", "acc0", "main",
]


@pytest.mark.tg_op("hostile Variable names")
@pytest.mark.parametrize("index", range(len(HOSTILE_NAMES)))
def test_hostile_variable_names(executing: Target, index: int, tmp_path: Any, monkeypatch: Any) -> None:
    """A kernel over a size named by a hostile string compiles, gives numpy's result, and runs nothing else."""
    monkeypatch.chdir(tmp_path)
    marker = tmp_path / "pwned"
    name = HOSTILE_NAMES[index].format(marker=marker)
    x = np.arange(6 * 7, dtype=np.float32).reshape(6, 7)
    rows, cols = Variable(name, 1, 6).bind(4), Variable("n", 1, 7).bind(5)
    a = Tensor(x[:4, :5].copy(), device=executing.name).reshape(rows, cols)
    assert_array(f"(a * 2 + 1).sum() with a size named {name!r}", executing.name, (a * 2 + 1).sum().numpy(),
                 np.float32((x[:4, :5] * 2 + 1).sum()))
    assert not marker.exists(), f"a Variable named {name!r} ran a command: {marker} was created"
