"""Level 3: hand-built uop kernels, rendered by the device's own renderer, compared lane by lane with the reference.

Every ALU op on every dtype it is defined on (edge cases crossed with each other: NaN, +-inf, -0.0, integer min and
max, division by 0, INT_MIN / -1, shifts by 0, width-1, width and beyond), CAST and BITCAST between dtypes, gated
LOAD and STORE, a DEFINE_ACC / PHI reduction loop and DEFINE_VAR. In --compile-only / --render-only mode every
kernel is still built and rendered (and compiled), and nothing runs. The kernels are built and compiled ahead on
worker threads (the builders live in `tg_conformance.uop_cases`).
"""
from __future__ import annotations

from typing import Any, Callable, Iterator

import numpy as np
import pytest

from tg_conformance import reference as ref
from tg_conformance import uop_cases as cases
from tg_conformance.kernels import compile_pool
from tg_conformance.target import Target
from tgcore.codegen.uops import UOps
from tgcore.dtype import DType, dtypes

NUMERIC = (*ref.INTS, *ref.FLOATS)
ALU_CASES = [pytest.param(op, dt, id=f"{op.name}-{dt.short_name}") for op in ref.ALU_OPS for dt in ref.defined_on(op)]
CAST_CASES = [pytest.param(src, dst, id=f"{src.short_name}-{dst.short_name}")
              for src in ref.EVERY_DTYPE for dst in ref.EVERY_DTYPE if src != dst]
BITCAST_CASES = [pytest.param(src, dst, id=f"{src.short_name}-{dst.short_name}")
                 for src in ref.EVERY_DTYPE for dst in ref.EVERY_DTYPE
                 if src != dst and src.itemsize == dst.itemsize and dtypes.bool not in (src, dst)]
REDUCE_CASES = [pytest.param(op, dt, id=f"{op}-{dt.short_name}") for op in ("SUM", "MAX") for dt in NUMERIC]


def _cast(target: Target, rng: np.random.Generator, dtype: DType, dst: DType) -> cases.Case:
    return cases.convert(target, rng, UOps.CAST, dtype, dst)


def _bitcast(target: Target, rng: np.random.Generator, dtype: DType, dst: DType) -> cases.Case:
    return cases.convert(target, rng, UOps.BITCAST, dtype, dst)


# the builder of each test, by test function name: the compile-ahead fixture builds every selected test's kernel
BUILDERS: dict[str, Callable[..., cases.Case]] = {
    "test_alu": cases.alu, "test_cast": _cast, "test_bitcast": _bitcast, "test_load_gated": cases.load_gated,
    "test_store_gated": cases.store_gated, "test_reduce_loop": cases.reduce_loop,
    "test_define_var": cases.define_var, "test_where_chain": cases.where_chain,
}


@pytest.fixture(scope="module", autouse=True)
def _compile_ahead(request: pytest.FixtureRequest, target: Target) -> Iterator[None]:
    selected = [(BUILDERS[item.originalname], item.name, dict(item.callspec.params))
                for item in request.session.items
                if getattr(item, "module", None) is request.module and item.originalname in BUILDERS
                and hasattr(item, "callspec")]
    cases.compile_ahead(target, selected)
    yield
    compile_pool.close()


def _run(request: pytest.FixtureRequest, target: Target, rng: np.random.Generator, **params: Any) -> None:
    cases.run_case(target, BUILDERS[request.node.originalname](target, rng, **params))


@pytest.mark.parametrize("op,dtype", ALU_CASES)
def test_alu(request: pytest.FixtureRequest, target: Target, op: Any, dtype: DType, rng: np.random.Generator) -> None:
    _run(request, target, rng, op=op, dtype=dtype)


@pytest.mark.tg_op("CAST")
@pytest.mark.parametrize("dtype,dst", CAST_CASES)
def test_cast(request: pytest.FixtureRequest, target: Target, dtype: DType, dst: DType,
              rng: np.random.Generator) -> None:
    _run(request, target, rng, dtype=dtype, dst=dst)


@pytest.mark.tg_op("BITCAST")
@pytest.mark.parametrize("dtype,dst", BITCAST_CASES)
def test_bitcast(request: pytest.FixtureRequest, target: Target, dtype: DType, dst: DType,
                 rng: np.random.Generator) -> None:
    _run(request, target, rng, dtype=dtype, dst=dst)


@pytest.mark.tg_op("LOAD gated")
@pytest.mark.parametrize("dtype", ref.EVERY_DTYPE, ids=lambda d: d.short_name)
def test_load_gated(request: pytest.FixtureRequest, target: Target, dtype: DType, rng: np.random.Generator) -> None:
    _run(request, target, rng, dtype=dtype)


@pytest.mark.tg_op("STORE gated")
@pytest.mark.parametrize("dtype", ref.EVERY_DTYPE, ids=lambda d: d.short_name)
def test_store_gated(request: pytest.FixtureRequest, target: Target, dtype: DType, rng: np.random.Generator) -> None:
    _run(request, target, rng, dtype=dtype)


@pytest.mark.tg_op("reduce loop")
@pytest.mark.parametrize("op,dtype", REDUCE_CASES)
def test_reduce_loop(request: pytest.FixtureRequest, target: Target, op: str, dtype: DType,
                     rng: np.random.Generator) -> None:
    _run(request, target, rng, op=op, dtype=dtype)


@pytest.mark.tg_op("DEFINE_VAR")
@pytest.mark.parametrize("count", [0, 1, 6])
def test_define_var(request: pytest.FixtureRequest, target: Target, count: int, rng: np.random.Generator) -> None:
    _run(request, target, rng, count=count)


@pytest.mark.tg_op("WHERE chain")
@pytest.mark.parametrize("dtype", [dtypes.float32, dtypes.int32], ids=lambda d: d.short_name)
def test_where_chain(request: pytest.FixtureRequest, target: Target, dtype: DType, rng: np.random.Generator) -> None:
    _run(request, target, rng, dtype=dtype)
