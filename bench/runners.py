"""What a workload runs on: a tgcore device, or a peer (numpy, torch, tinygrad on its CLANG device).

Every peer is an optional import: a missing one is listed with the reason and the run goes on without it.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import shutil
import types
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import numpy as np

PEERS = ("numpy", "torch", "tinygrad")
TINYGRAD_VERSION = "0.9.0"
TINYGRAD_DEVICE = "CLANG"


@dataclass
class Runner:
    """One column of the table: a framework, and for tgcore and tinygrad the device it runs on."""

    name: str  # the column's title: a tgcore device name, or "numpy", "torch", "tinygrad"
    framework: str  # "tgcore", "numpy", "torch" or "tinygrad"
    device: str = ""  # tgcore and tinygrad: the device; torch: "cpu"
    lib: Any = None  # tgcore, tinygrad: Tensor, Device, TinyJit, Linear, Adam, GlobalCounters, Buffer in one namespace
    torch: Any = field(default=None, repr=False)

    @property
    def is_peer(self) -> bool:
        return self.framework != "tgcore"

    @property
    def lazy(self) -> bool:
        """tgcore and tinygrad share one API (tinygrad 0.9.0's), so a workload writes that code once."""
        return self.framework in ("tgcore", "tinygrad")

    def put(self, array: np.ndarray) -> Any:
        """`array` as this runner's tensor, realized on its device."""
        if self.lazy:
            return self.lib.Tensor(array, device=self.device).realize()
        if self.framework == "torch":
            return self.torch.from_numpy(np.ascontiguousarray(array))
        return array

    def sync(self) -> None:
        """Wait until the device has finished what was queued (a no-op where every op is synchronous)."""
        if self.lazy:
            self.lib.Device[self.device].synchronize()

    def numpy(self, x: Any) -> np.ndarray:
        if self.lazy:
            return x.numpy()
        if self.framework == "torch":
            return x.detach().numpy()
        return np.asarray(x)


def _lazy_lib(prefix: str) -> types.SimpleNamespace:
    """The tinygrad-0.9.0-style API of `prefix` ("tgcore" or "tinygrad") as one namespace."""
    top = importlib.import_module(prefix)
    nn = importlib.import_module(f"{prefix}.nn")
    optim = importlib.import_module(f"{prefix}.nn.optim")
    device = importlib.import_module(f"{prefix}.device")
    helpers = importlib.import_module(f"{prefix}.helpers")
    return types.SimpleNamespace(
        Tensor=top.Tensor,
        Device=top.Device,
        TinyJit=top.TinyJit,
        Linear=nn.Linear,
        Adam=optim.Adam,
        GlobalCounters=helpers.GlobalCounters,
        Buffer=device.Buffer,
    )


def tgcore_devices(requested: Optional[list[str]]) -> tuple[list[Runner], dict[str, str], bool]:
    """Runners for the tgcore devices to measure, the reasons others are left out, and whether PYTHON was asked for.

    Default: every available device but PYTHON (a UOp interpreter, measured only on the tiny workloads)."""
    lib = _lazy_lib("tgcore")
    skipped: dict[str, str] = {}
    if requested:
        names = [lib.Device.canonicalize(n) for n in requested]
        for n in names:
            if (reason := lib.Device.status(n)) is not None:
                skipped[n] = reason
        names = [n for n in names if n not in skipped]
    else:
        for n in lib.Device.specs():
            if (reason := lib.Device.status(n)) is not None:
                skipped[n] = reason
        names = lib.Device.available()
    if not requested:  # the plugins this repository ships first, then by priority; the interpreter last
        order = {"CLANG": 0, "LLVM": 1, "PYTHON": 3}
        names = sorted(names, key=lambda n: order.get(n, 2))
    runners = [Runner(n, "tgcore", n, lib) for n in names]
    return runners, skipped, bool(requested and "PYTHON" in [r.name for r in runners])


def _numpy() -> Runner:
    return Runner("numpy", "numpy")


def _torch() -> Runner:
    torch = importlib.import_module("torch")
    return Runner("torch", "torch", "cpu", torch=torch)


def _tinygrad() -> Runner:
    version = importlib.metadata.version("tinygrad")
    if version != TINYGRAD_VERSION:
        raise RuntimeError(f"tinygrad {version} is installed; the peer is tinygrad {TINYGRAD_VERSION}")
    if shutil.which("clang") is None:
        raise RuntimeError("tinygrad's CLANG device runs the `clang` program, which is not on PATH (install clang)")
    lib = _lazy_lib("tinygrad")
    lib.Device[TINYGRAD_DEVICE]  # open it now, so that a broken install shows here and not inside a workload
    return Runner("tinygrad", "tinygrad", TINYGRAD_DEVICE, lib)


_PEER_FACTORIES: dict[str, Callable[[], Runner]] = {"numpy": _numpy, "torch": _torch, "tinygrad": _tinygrad}


def peers(requested: list[str]) -> tuple[list[Runner], dict[str, str]]:
    """The peers that import and work here, and for the others the reason."""
    found, missing = [], {}
    for name in requested:
        if name not in _PEER_FACTORIES:
            raise SystemExit(f"unknown peer {name!r}: choose from {', '.join(PEERS)}")
        try:
            found.append(_PEER_FACTORIES[name]())
        except Exception as e:  # ImportError, or an install that cannot run here
            missing[name] = f"{type(e).__name__}: {e}"
    return found, missing
