"""The workloads, by letter. Each module has TITLE, TINY (whether the PYTHON device runs it by default) and run(ctx)."""

from __future__ import annotations

from types import ModuleType

from bench.workloads import (
    checks,
    conv,
    dispatch,
    distributed,
    elementwise,
    embedding,
    first_call,
    matmul,
    models,
    onnx_models,
    reduce,
    train,
)

WORKLOADS: dict[str, ModuleType] = {
    "a": matmul,
    "b": elementwise,
    "c": reduce,
    "d": conv,
    "e": dispatch,
    "f": train,
    "g": first_call,
    "h": models,
    "i": checks,
    "l": embedding,
    "m": distributed,
    "o": onnx_models,
}
