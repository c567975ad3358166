"""The plugin contract: hook specs, DeviceSpec, and discovery of plugins through the `tgcore` entry-point group.

A plugin is a module with pluggy hook implementations. It declares its devices in `tg_register_devices`, and
answers the four part hooks (renderer, compiler, allocator, runtime) for the device names it knows; each part
hook is firstresult, so the first plugin that answers wins (use `tryfirst=True` to override another's part).

Discovery is lazy (on the first use of `Device`) and isolated (each plugin is loaded in its own try; a broken
one is recorded with its cause and the others still load). Environment controls:
`TGCORE_PLUGINS=a,b` loads only those entry points, `TGCORE_DISABLE_PLUGINS=a,b` skips those,
`TGCORE_PLUGIN_AUTOLOAD=0` loads none (the built-in PYTHON and DISK devices are always there).
"""

from __future__ import annotations

import os
import types
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any, Callable, Optional

import pluggy

from tgcore.dtype import DType, dtypes

PLUGIN_API_VERSION = 1
ENTRY_POINT_GROUP = "tgcore"

hookspec = pluggy.HookspecMarker("tgcore")
hookimpl = pluggy.HookimplMarker("tgcore")

ALL_DTYPES: tuple[DType, ...] = (
    dtypes.bool,
    dtypes.int8,
    dtypes.uint8,
    dtypes.int16,
    dtypes.uint16,
    dtypes.int32,
    dtypes.uint32,
    dtypes.int64,
    dtypes.uint64,
    dtypes.float16,
    dtypes.bfloat16,
    dtypes.float32,
    dtypes.float64,
)
# (atol, rtol) a device promises for transcendental results; exact ops (add, compare, ...) must match exactly
DEFAULT_TOLERANCES: dict[DType, tuple[float, float]] = {
    dtypes.float16: (1e-3, 1e-2),
    dtypes.bfloat16: (1e-2, 5e-2),
    dtypes.float32: (1e-6, 1e-5),
    dtypes.float64: (1e-12, 1e-10),
}


@dataclass
class DeviceSpec:
    """What a plugin says about one device it provides."""

    name: str  # canonical upper-case name, e.g. "MYDEV"
    api_version: int  # the PLUGIN_API_VERSION the plugin was written for
    priority: int = 0  # the highest-priority available device is the default
    # None when usable here, else why not; a probe that takes an argument is also asked about each instance
    # ("MYDEV:1"), so a missing second device is reported before its first use
    probe: Callable[..., Optional[str]] = lambda: None
    dtypes: tuple[DType, ...] = ALL_DTYPES
    tolerances: dict[DType, tuple[float, float]] = field(default_factory=lambda: dict(DEFAULT_TOLERANCES))
    description: str = ""
    # a device that only holds data (reads, writes, views and copies of its buffers) and runs no kernels: it needs
    # only an allocator, it is never the default device nor in Device.available(), and the core refuses to compute
    # on it with an error that says to copy the data to a compute device first (the built-in DISK device)
    storage_only: bool = False
    # instances are named by any text after the colon, kept as written ("DISK:/data/Weights.bin"), instead of by
    # a number ("MYDEV:1"); only the device type before the colon is upper-cased
    path_instances: bool = False


class HookSpecs:
    """The hooks a plugin may implement."""

    @hookspec
    def tg_register_devices(self, registry: DeviceRegistry) -> None:
        """Add a DeviceSpec for each device this plugin provides: `registry.add(DeviceSpec(...))`."""

    # Each part hook gets `device`, the canonical name without `:N` ("MYDEV"), and may also take `instance`, the
    # device instance being opened ("MYDEV" or "MYDEV:1"): pluggy passes only the arguments an implementation names.

    @hookspec(firstresult=True)
    def tg_renderer(self, device: str, instance: str) -> Any:
        """A Renderer instance for `device`, or None if not this plugin's."""

    @hookspec(firstresult=True)
    def tg_compiler(self, device: str, instance: str) -> Any:
        """A Compiler instance for `device`, or None."""

    @hookspec(firstresult=True)
    def tg_allocator(self, device: str, instance: str) -> Any:
        """An Allocator for one device instance (it is asked once per instance), or None."""

    @hookspec(firstresult=True)
    def tg_runtime(self, device: str, instance: str) -> Any:
        """The Program class for `device` (called as Program(instance, name, lib)), or None."""


class DeviceRegistry:
    """Collects DeviceSpecs from one plugin at a time, checking the contract."""

    def __init__(self) -> None:
        self.specs: dict[str, DeviceSpec] = {}
        self.owner: dict[str, str] = {}
        self.rejected: dict[str, str] = {}  # device name -> why it was refused
        self._current_plugin = ""

    def add(self, spec: DeviceSpec) -> None:
        """Register a device; a version mismatch or a duplicate name is recorded as the device's error."""
        name = spec.name.upper()
        if spec.api_version != PLUGIN_API_VERSION:
            self.rejected[name] = (
                f"plugin {self._current_plugin!r} targets tgcore plugin API {spec.api_version}, but this tgcore serves "
                f"API {PLUGIN_API_VERSION}: install a version of the plugin built for API {PLUGIN_API_VERSION} "
                f"(or a tgcore that serves API {spec.api_version})"
            )
            return
        if name in self.specs and self.owner[name] != self._current_plugin:
            self.rejected[f"{name} ({self._current_plugin})"] = (
                f"plugin {self._current_plugin!r} registers device {name}, already registered by {self.owner[name]!r}"
            )
            return
        spec.name = name
        self.specs[name] = spec
        self.owner[name] = self._current_plugin


@dataclass
class PluginRecord:
    """One plugin as discovered: where it came from and whether it loaded."""

    name: str
    source: str  # "builtin", "entry point <value>", or "registered"
    version: str
    error: Optional[str] = None
    devices: list[str] = field(default_factory=list)


class PluginManager:
    """Loads plugins once, keeps their records, and asks their hooks."""

    def __init__(self) -> None:
        self.pm = pluggy.PluginManager("tgcore")
        self.pm.add_hookspecs(HookSpecs)
        self.records: dict[str, PluginRecord] = {}
        self.registry = DeviceRegistry()
        self.loaded = False
        self.on_change: list[Callable[[], None]] = []

    def load(self) -> None:
        """Discover the built-in device and the entry-point plugins (once)."""
        if self.loaded:
            return
        self.loaded = True
        # the built-in devices, registered like any plugin
        from tgcore.runtime import disk as disk_device
        from tgcore.runtime import python as python_device

        self._add(python_device, "python", "builtin", _dist_version("tgcore"))
        self._add(disk_device, "disk", "builtin", _dist_version("tgcore"))
        if os.environ.get("TGCORE_PLUGIN_AUTOLOAD", "1") == "0":
            return
        allow = _name_list(os.environ.get("TGCORE_PLUGINS"))
        deny = set(_name_list(os.environ.get("TGCORE_DISABLE_PLUGINS")) or [])
        for ep in sorted(metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
            if (allow is not None and ep.name not in allow) or ep.name in deny or ep.name in self.records:
                continue
            version = _dist_version(ep.dist.name) if ep.dist is not None else "unknown"
            try:
                module = ep.load()
            except Exception as e:  # an import error of one plugin must not stop the others
                self.records[ep.name] = PluginRecord(
                    ep.name, f"entry point {ep.value}", version, f"failed to import {ep.value}: {type(e).__name__}: {e}"
                )
                continue
            self._add(module, ep.name, f"entry point {ep.value}", version)

    def register(self, plugin: Any, name: Optional[str] = None) -> PluginRecord:
        """Register a plugin object (a module or any object with hookimpls) directly, e.g. from a test."""
        self.load()
        name = name or getattr(plugin, "__name__", type(plugin).__name__)
        if name in self.records:
            self.unregister(name)
        record = self._add(plugin, name, "registered", str(getattr(plugin, "__version__", "unknown")))
        for callback in self.on_change:
            callback()
        return record

    def unregister(self, name: str) -> None:
        """Remove a plugin and the devices it registered."""
        record = self.records.pop(name, None)
        if record is None:
            raise KeyError(f"no plugin named {name!r}; registered: {sorted(self.records)}")
        if self.pm.has_plugin(name):
            self.pm.unregister(name=name)
        for dev in record.devices:
            self.registry.specs.pop(dev, None)
            self.registry.owner.pop(dev, None)
            self.registry.rejected.pop(dev, None)
        for callback in self.on_change:
            callback()

    def _add(self, plugin: Any, name: str, source: str, version: str) -> PluginRecord:
        record = self.records[name] = PluginRecord(name, source, version)
        try:
            self.pm.register(plugin, name=name)
        except Exception as e:
            record.error = f"breaks the plugin contract: {type(e).__name__}: {e}"
            return record
        impl = getattr(plugin, "tg_register_devices", None)
        if impl is None:
            return record
        before_ok, before_bad = set(self.registry.specs), set(self.registry.rejected)
        self.registry._current_plugin = name
        try:
            impl(registry=self.registry)
        except Exception as e:
            record.error = f"tg_register_devices raised {type(e).__name__}: {e}"
        record.devices = sorted((set(self.registry.specs) - before_ok) | (set(self.registry.rejected) - before_bad))
        return record

    def part(self, hook: str, device: str, instance: Optional[str] = None) -> Any:
        """The first answer of part hook `hook` for `device` (and its `instance`, default the device itself)."""
        self.load()
        return getattr(self.pm.hook, hook)(device=device, instance=instance or device)


def _name_list(value: Optional[str]) -> Optional[list[str]]:
    return None if value is None else [v.strip() for v in value.split(",") if v.strip()]


def _dist_version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


plugins = PluginManager()


def plugin_module(name: str, **hooks: Callable[..., Any]) -> types.SimpleNamespace:
    """A plugin object from plain functions, each marked as a hookimpl: handy for tests and small plugins."""
    return types.SimpleNamespace(__name__=name, **{k: hookimpl(v) for k, v in hooks.items()})
