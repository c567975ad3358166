"""The Metal devices as tg-metal holds them: for each instance an MTLDevice, its command queue, and the command buffers
still running. METAL (= METAL:0) is the system default device; METAL:1, METAL:2, ... are the Mac's other Metal
devices, in the order MTLCopyAllDevices lists them.

pyobjc (`Metal`, `libdispatch`) is imported here, lazily and only on macOS, so that discovering the plugin never
imports it and Linux never needs it. Everything that stops Metal from working becomes a `MetalUnavailable` whose
message says why and what to do.
"""

from __future__ import annotations

import platform
import sys
from typing import Any

from tgcore.plugin import InstanceCache, instance_index

_INSTALL_HINT = "pip install pyobjc-framework-Metal pyobjc-framework-libdispatch (tg-metal depends on both on macOS)"


class MetalUnavailable(RuntimeError):
    """Metal cannot be used here; the message says why."""


def describe(error: Any) -> str:
    """The message of an NSError (or whatever Metal returned in its place)."""
    if error is None:
        return "Metal gave no error message"
    text = error.localizedDescription() if hasattr(error, "localizedDescription") else error
    return str(text)


def import_metal() -> tuple[Any, Any]:
    """The pyobjc modules `Metal` and `libdispatch`; MetalUnavailable off macOS or without them."""
    if sys.platform != "darwin":
        raise MetalUnavailable(f"Metal needs macOS (this is {platform.system() or sys.platform})")
    try:
        import libdispatch  # type: ignore[import-not-found]
        import Metal  # type: ignore[import-not-found]
    except ImportError as e:
        raise MetalUnavailable(f"pyobjc's Metal bindings cannot be imported ({e}): {_INSTALL_HINT}") from e
    return Metal, libdispatch


def metal_devices(metal: Any) -> list[Any]:
    """The Mac's Metal devices: the system default first, then the others; MetalUnavailable when there is none."""
    default = metal.MTLCreateSystemDefaultDevice()
    if default is None:
        raise MetalUnavailable("this Mac has no Metal device: MTLCreateSystemDefaultDevice() returned nil")
    others = [d for d in (metal.MTLCopyAllDevices() or []) if d.registryID() != default.registryID()]
    return [default, *others]


class MetalContext:
    """One Metal device, its command queue, and the command buffers committed without waiting."""

    def __init__(self, metal: Any, dispatch: Any, device: Any) -> None:
        self.metal, self.dispatch, self.device = metal, dispatch, device
        self.queue = self.device.newCommandQueue()
        if self.queue is None:
            raise MetalUnavailable(f"Metal device {self.device.name()} could not make a command queue")
        self.in_flight: list[Any] = []

    @property
    def name(self) -> str:
        return str(self.device.name())

    def wait(self, command_buffer: Any) -> None:
        """Block until `command_buffer` is done; RuntimeError with Metal's message if it failed."""
        command_buffer.waitUntilCompleted()
        error = command_buffer.error()
        if error is not None:
            raise RuntimeError(f"a Metal command buffer failed on {self.name}: {describe(error)}")

    def synchronize(self) -> None:
        """Wait for every command buffer committed so far (the queue runs them in order)."""
        pending, self.in_flight = self.in_flight, []
        for command_buffer in pending:
            self.wait(command_buffer)


def open_context(instance: str) -> MetalContext:
    """A new context of device instance `instance`; MetalUnavailable when it cannot be used here."""
    index = instance_index(instance)
    metal, dispatch = import_metal()
    devices = metal_devices(metal)
    if index >= len(devices):
        names = ", ".join(f"METAL:{i} = {d.name()}" for i, d in enumerate(devices))
        raise MetalUnavailable(f"{instance} does not exist: this Mac has {len(devices)} Metal device(s) ({names})")
    return MetalContext(metal, dispatch, devices[index])


_contexts: InstanceCache[MetalContext] = InstanceCache(open_context)  # one per instance, made on first use


def get_context(instance: str = "METAL") -> MetalContext:
    """The context of device instance `instance`, made on first use; MetalUnavailable when it cannot be used here."""
    return _contexts(instance)
