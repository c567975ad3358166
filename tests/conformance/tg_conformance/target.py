"""The device under test: its DeviceSpec and the parts its plugins gave, and the mode the suite runs it in."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import pytest

from tgcore.device import Device, DeviceUnavailable
from tgcore.dtype import DType, dtypes
from tgcore.plugin import DeviceSpec
from tgcore.registry import plugins

RUN, COMPILE, RENDER = "run", "compile", "render"
ENV_DEVICE = "TG_CONFORMANCE_DEVICE"  # the device to test when --device is not given
_MODE_FLAG = {COMPILE: "--compile-only", RENDER: "--render-only"}


class TargetUnavailable(Exception):
    """The device cannot be tested in the asked mode here; the message says why."""


@dataclass
class Target:
    """A device as the suite tests it. `device` is None when the mode does not execute (compile or render only)."""

    name: str
    mode: str
    spec: DeviceSpec
    renderer: Any
    compiler: Optional[Any]
    runtime: Optional[type]
    device: Optional[Any]

    @staticmethod
    def resolve(name: str, mode: str = RUN) -> Target:
        """The target for device `name`; TargetUnavailable when it cannot be tested in `mode` here."""
        if mode not in (RUN, COMPILE, RENDER):
            raise ValueError(f"unknown mode {mode!r}: expected one of {RUN}, {COMPILE}, {RENDER}")
        try:
            full = Device.canonicalize(name)
        except ValueError as e:
            raise TargetUnavailable(str(e)) from e
        reason = Device.status(full)
        if reason is None:
            try:
                dev = Device[full]
            except DeviceUnavailable as e:
                raise TargetUnavailable(str(e)) from e
            return Target(full, mode, dev.spec, dev.renderer, dev.compiler, dev.runtime, dev if mode == RUN else None)
        if mode == RUN:
            raise TargetUnavailable(reason)
        # compile-only and render-only need just the renderer (and compiler), even where the device cannot run
        base = full.split(":")[0]
        spec = Device.specs().get(base)
        if spec is None:
            raise TargetUnavailable(reason)
        try:
            renderer = plugins.part("tg_renderer", base)
            compiler = plugins.part("tg_compiler", base) if mode == COMPILE else None
        except Exception as e:
            raise TargetUnavailable(f"{reason}; and its parts cannot be made: {type(e).__name__}: {e}") from e
        if renderer is None or (mode == COMPILE and compiler is None):
            part = "renderer" if renderer is None else "compiler"
            raise TargetUnavailable(f"{reason}; and no plugin provides its {part}")
        return Target(full, mode, spec, renderer, compiler, None, None)

    @property
    def executes(self) -> bool:
        return self.mode == RUN

    def supports(self, dt: DType) -> bool:
        return dt in self.spec.dtypes

    def require(self, *dts: DType) -> None:
        """Skip (with the reason) unless the device claims every dtype in `dts`."""
        for dt in dts:
            if not self.supports(dt):
                pytest.skip(f"{self.name} does not claim dtype {dt.short_name} (DeviceSpec.dtypes)")

    def require_execution(self) -> None:
        if not self.executes:
            pytest.skip(f"{_MODE_FLAG[self.mode]}: this test executes on the device")

    def require_compiler(self) -> None:
        if self.mode == RENDER:
            pytest.skip("--render-only: this test needs the compiler")

    def tolerance(self, dt: DType) -> tuple[float, float]:
        """(atol, rtol) the device declares for transcendental results of float dtype `dt`."""
        tol = self.spec.tolerances.get(dt)
        if tol is None:
            pytest.fail(f"{self.name} claims dtype {dt.short_name} but declares no tolerance for it in "
                        "DeviceSpec.tolerances: add {dtype: (atol, rtol)} for every float dtype it claims")
        return tol

    def float_dtypes(self) -> list[DType]:
        return [dt for dt in self.spec.dtypes if dtypes.is_float(dt)]
