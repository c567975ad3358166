"""Programs on a device that cannot run them here (--compile-only, --render-only): each program runs on a host
device that can, every kernel the engine lowers for it is captured, and each is lowered again for the device under
test, rendered by its renderer and (in compile-only mode) compiled by its compiler.

A kernel's AST comes from the scheduler, which knows nothing of devices; above it, the tensor layer picks some dtypes
from what the device claims (e.g. a power is formed in the next wider float where the device has one). So while a
program runs for the device under test, the host claims only the dtypes that device claims too: it schedules the
same kernels the device would, and the device's own Kernel optimizer and renderer make what it would launch.
"""
from __future__ import annotations

import contextlib
import os
from typing import Callable, Iterator, Optional, TypeVar

from tg_conformance.kernels import compile_pool
from tg_conformance.target import COMPILE, Target
from tgcore.codegen.program import to_program
from tgcore.device import Device
from tgcore.engine import realize
from tgcore.ops import LazyOp

ENV_HOST = "TG_CONFORMANCE_HOST"  # the device that runs the programs for a device that cannot
T = TypeVar("T")


def host_device() -> str:
    """The device that runs the programs when the device under test does not execute: $TG_CONFORMANCE_HOST, else
    tgcore's default device where it runs here, else PYTHON (built into tgcore, so always there)."""
    chosen = os.environ.get(ENV_HOST)
    if chosen:
        name = Device.canonicalize(chosen)
        reason = Device.status(name)
        if reason is not None:
            raise RuntimeError(f"the host device {name} (${ENV_HOST}) cannot run programs here: {reason}")
        return name
    default = Device.canonicalize(Device.DEFAULT)
    return default if Device.status(default) is None else "PYTHON"


@contextlib.contextmanager
def captured_kernels() -> Iterator[list[LazyOp]]:
    """The AST of every kernel the engine lowers inside the block, once each, in the order first seen."""
    asts: list[LazyOp] = []
    seen: set[LazyOp] = set()
    lower = realize.get_runner

    def recording(device: str, ast: LazyOp) -> realize.CompiledRunner:
        if ast not in seen:
            seen.add(ast)
            asts.append(ast)
        return lower(device, ast)

    realize.get_runner = recording  # the engine looks it up at each call: the lowering of every kernel passes here
    try:
        yield asts
    finally:
        realize.get_runner = lower


@contextlib.contextmanager
def claiming_dtypes_of(target: Target, host: str) -> Iterator[None]:
    """Inside the block the host's DeviceSpec claims only the dtypes that the target's claims too."""
    spec = Device[host].spec
    claimed = spec.dtypes
    spec.dtypes = tuple(dt for dt in claimed if dt in target.spec.dtypes)
    try:
        yield
    finally:
        spec.dtypes = claimed


def build_for_target(target: Target, asts: list[LazyOp], what: str) -> None:
    """Lower, render and (in compile-only mode) compile every kernel of `asts` for the target; one AssertionError
    naming each kernel that failed, the stage and the cause."""
    sources: list[tuple[str, Optional[str], Optional[Exception]]] = []
    for ast in asts:
        name = "?"
        try:
            kernel = realize.get_kernel(target.renderer, ast)
            name = kernel.name
            sources.append((name, to_program(kernel).src, None))
        except Exception as e:  # every kernel is tried; the failures are listed together
            sources.append((name, None, e))
    if target.mode == COMPILE and target.compiler is not None:
        for _, src, _ in sources:
            if src is not None:
                compile_pool.submit(target.compiler, src)
    failures = []
    for i, (name, src, error) in enumerate(sources):
        if error is not None:
            failures.append(f"kernel {i} ({name}): lowering or render failed: {type(error).__name__}: {error}")
            continue
        if target.mode == COMPILE and target.compiler is not None:
            try:
                compile_pool.compile(target.compiler, src)  # type: ignore[arg-type]
            except Exception as e:
                text = str(e) if len(str(e)) < 2000 else str(e)[:2000] + " ... (truncated)"
                failures.append(f"kernel {i} ({name}): compile failed: {type(e).__name__}: {text}")
    if not asts:
        failures.append("the program launched no kernel at all")
    if failures:
        stage = "rendered and compiled" if target.mode == COMPILE else "rendered"
        raise AssertionError(f"{what}: {len(failures)} of {len(asts)} kernels could not be {stage} for "
                             f"{target.name}:\n" + "\n".join(failures))


def run_program(target: Target, program: Callable[[str], T], what: str) -> Optional[T]:
    """`program(device)` on the target and its result; where the target does not execute, the program on the host
    device with its kernels built for the target instead, and None."""
    if target.executes:
        return program(target.name)
    host = host_device()
    stopped: Optional[Exception] = None
    with claiming_dtypes_of(target, host), captured_kernels() as asts:
        try:
            program(host)
        except Exception as e:  # the kernels captured so far are still built, then this is raised
            stopped = e
    build_for_target(target, asts, what)
    if stopped is not None:
        raise AssertionError(f"{what}: the program stopped on the host device {host} after {len(asts)} kernels "
                             f"(those were built for {target.name}): {type(stopped).__name__}: {stopped}"
                             ) from stopped
    return None
