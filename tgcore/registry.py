"""The plugin manager and the device registry: discovery of plugins through the `tgcore` entry-point group, their
records, the DeviceSpecs they register, and the answers of their part hooks.

This sits above the contract (tgcore/plugin.py), which it serves. Discovery is lazy (on the first use of `Device`) and
isolated: each plugin is imported and registered in its own try, and whatever its code raises (SystemExit included)
is recorded as its error while the others still load; only KeyboardInterrupt goes on to the user. Environment controls:
`TGCORE_PLUGINS=a,b` loads only those entry points, `TGCORE_DISABLE_PLUGINS=a,b` skips those, `TGCORE_PLUGIN_AUTOLOAD=0`
loads none. The built-in devices (PYTHON and DISK, in tgcore/runtime/) are always there: they are plugins too, loaded
by module name as an entry point is, so that this module does not import the runtimes that import it. A device name
that two plugins register goes to one of them by the rule written on PluginManager; the other claim is listed as
"shadowed by <plugin>". Each device's probe runs with a time limit (tgcore/device.py).
"""

from __future__ import annotations

import importlib
import os
import sys
import threading
import warnings
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any, Callable, Optional

import pluggy

from tgcore.plugin import ENTRY_POINT_GROUP, DeviceSpec, HookSpecs, plugin_module, version_refusal

__all__ = [
    "BUILTIN_PLUGINS",
    "Conflict",
    "DeviceRegistry",
    "PluginManager",
    "PluginRecord",
    "PluginWarning",
    "Registration",
    "plugin_module",
    "plugins",
]

# the devices that come with the core: plugin name -> the module that holds its hookimpls
BUILTIN_PLUGINS = {"python": "tgcore.runtime.python", "disk": "tgcore.runtime.disk"}


@dataclass
class Registration:
    """One plugin's claim on one device name, and why it is not the device's when it is not."""

    device: str  # canonical name
    plugin: str  # the plugin that registered it
    spec: DeviceSpec
    refused: Optional[str] = None  # None while this claim is the device's; else why not (API version, shadowed)


# which of two valid claims on one device name wins: (+1: the first, -1: the second, 0: neither) and the reason
Precedence = Callable[[Registration, Registration], tuple[int, str]]


@dataclass(frozen=True)
class Conflict:
    """Two plugins registered one device name: which claim is used, the other, and the rule that chose."""

    device: str
    winner: str
    loser: str
    why: str


def _by_priority(a: Registration, b: Registration) -> tuple[int, str]:
    if a.spec.priority != b.spec.priority:
        sign = 1 if a.spec.priority > b.spec.priority else -1
        high, low = sorted((a.spec.priority, b.spec.priority), reverse=True)
        return sign, f"it has the higher priority ({high} > {low})"
    return 0, ""


class DeviceRegistry:
    """Collects DeviceSpecs from one plugin at a time, checking the contract and settling names claimed twice.

    Where two plugins register one device name, one claim wins and the other is kept as "shadowed by <plugin>"
    (its part hooks are not asked for that device); the rule is the manager's `precedence` (see PluginManager), and
    between equal claims the one registered first wins. `specs` and `owner` hold the winners, `rejected` the names
    that have no valid claim at all (with the reason), `registrations` every claim in the order it was made.
    """

    def __init__(self, precedence: Precedence = _by_priority) -> None:
        self.specs: dict[str, DeviceSpec] = {}
        self.owner: dict[str, str] = {}
        self.rejected: dict[str, str] = {}  # device name -> why it was refused
        self.registrations: list[Registration] = []
        self.precedence = precedence
        self.conflicts: list[Conflict] = []  # each time a name was claimed a second time: who won and why
        self._current_plugin = ""

    def add(self, spec: DeviceSpec) -> None:
        """Register a device; a version mismatch or a name another plugin also registers is settled here."""
        if not isinstance(spec, DeviceSpec):
            raise TypeError(f"registry.add expects a tgcore.plugin.DeviceSpec, got {type(spec).__name__}: {spec!r}")
        if not isinstance(spec.name, str) or not spec.name or ":" in spec.name:
            raise ValueError(f"a device name must be a non-empty string without ':', got {spec.name!r}")
        name = spec.name.upper()
        plugin = self._current_plugin
        # a plugin that registers one name again replaces its own earlier claim
        self.registrations = [r for r in self.registrations if (r.device, r.plugin) != (name, plugin)]
        claim = Registration(name, plugin, spec)
        if (refusal := version_refusal(plugin, spec.api_version)) is not None:
            claim.refused = refusal
        else:
            spec.name = name
        before = self.owner.get(name)
        self.registrations.append(claim)
        self._settle(name)
        if refusal is None and before is not None and before != plugin:
            winner, loser = (before, plugin) if self.owner[name] == before else (plugin, before)
            claims = {r.plugin: r for r in self.claims(name)}
            why = self.precedence(claims[winner], claims[loser])[1] or "it was registered first"
            self.conflicts.append(Conflict(name, winner, loser, why))

    def remove_plugin(self, plugin: str) -> None:
        """Drop every claim of `plugin`; a name it held goes to the best remaining claim."""
        names = {r.device for r in self.registrations if r.plugin == plugin}
        self.registrations = [r for r in self.registrations if r.plugin != plugin]
        for name in names:
            self._settle(name)

    def claims(self, name: str) -> list[Registration]:
        """Every claim on device `name`, in the order they were made."""
        return [r for r in self.registrations if r.device == name]

    def shadowed_plugins(self, name: str) -> list[str]:
        """The plugins whose claim on device `name` is refused: their part hooks must not answer for it."""
        return [r.plugin for r in self.registrations if r.device == name and r.refused is not None]

    def _settle(self, name: str) -> None:
        """Choose the winning claim on `name` and say of every other why it is not used."""
        claims = self.claims(name)
        valid = [r for r in claims if version_refusal(r.plugin, r.spec.api_version) is None]
        best: Optional[Registration] = None
        for claim in valid:
            if best is None or self.precedence(claim, best)[0] > 0:
                best = claim
        if best is None:
            self.specs.pop(name, None)
            self.owner.pop(name, None)
            if claims:
                self.rejected[name] = str(claims[0].refused)
            else:
                self.rejected.pop(name, None)
            return
        self.specs[name], self.owner[name] = best.spec, best.plugin
        self.rejected.pop(name, None)
        best.refused = None
        for claim in valid:
            if claim is not best:
                why = self.precedence(best, claim)[1] or "it was registered first"
                claim.refused = f"shadowed by plugin {best.plugin!r}, which also registers {name} ({why})"


# the distributions this project releases beside the core: between two claims of equal priority on one device name,
# theirs (and the built-in devices') win over a third party's
SHIPPED_DISTRIBUTIONS = frozenset({"tg-clang", "tg-llvm", "tg-opencl", "tg-cuda", "tg-metal"})


@dataclass
class PluginRecord:
    """One plugin as discovered: where it came from and whether it loaded."""

    name: str
    source: str  # "builtin", "entry point <value>", or "registered"
    version: str
    error: Optional[str] = None
    devices: list[str] = field(default_factory=list)
    distribution: Optional[str] = None  # the installed distribution of an entry point, where known

    @property
    def shipped(self) -> bool:
        """Whether this plugin comes with tgcore: built in, or from one of SHIPPED_DISTRIBUTIONS."""
        dist = (self.distribution or "").lower().replace("_", "-").replace(".", "-")
        return self.source == "builtin" or dist in SHIPPED_DISTRIBUTIONS


class PluginWarning(UserWarning):
    """Two plugins register one device name: the warning says which one is used, why, and how to choose."""


class PluginManager:
    """Loads plugins once, keeps their records, and asks their hooks.

    Which claim wins where two plugins register one device name, in order: when TGCORE_PLUGINS names both plugins,
    the one it names first; else the higher DeviceSpec.priority; else the plugin that ships with tgcore (built in, or
    one of SHIPPED_DISTRIBUTIONS); else the one loaded first (entry points load in the order of their names). The
    other claim is shown as "shadowed by <plugin>" and a PluginWarning names both. Discovery and registration hold
    `lock` (a re-entrant lock the device registry shares), so threads that start at once all see it complete.
    """

    def __init__(self) -> None:
        self.pm = pluggy.PluginManager("tgcore")
        self.pm.add_hookspecs(HookSpecs)
        self.records: dict[str, PluginRecord] = {}
        self.registry = DeviceRegistry(self._precedence)
        self.loaded = False
        self.on_change: list[Callable[[], None]] = []
        self.lock = threading.RLock()
        self._loading = False
        self._allow: Optional[list[str]] = None

    def load(self) -> None:
        """Discover the built-in devices and the entry-point plugins (once; threads that ask meanwhile wait)."""
        if self.loaded:
            return
        with self.lock:
            if self.loaded or self._loading:  # (a plugin's import that uses Device sees what is loaded so far)
                return
            self._loading = True
            try:
                self._load()
            except KeyboardInterrupt:  # the user stopped it: the next use starts discovery over
                self._forget()
                raise
            finally:
                self._loading = False
            self.loaded = True  # only now: a thread that sees it set sees every plugin
        for conflict in self.registry.conflicts:
            warnings.warn(self.describe(conflict), PluginWarning, stacklevel=outside_stacklevel())

    def _load(self) -> None:
        # the built-in devices, registered like any plugin (an import error of theirs is a bug: it is raised)
        for name, module in BUILTIN_PLUGINS.items():
            self._add(importlib.import_module(module), name, "builtin", _dist_version("tgcore"))
        self._allow = _name_list(os.environ.get("TGCORE_PLUGINS"))
        if os.environ.get("TGCORE_PLUGIN_AUTOLOAD", "1") == "0":
            return
        deny = set(_name_list(os.environ.get("TGCORE_DISABLE_PLUGINS")) or [])
        for ep in sorted(metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
            if (self._allow is not None and ep.name not in self._allow) or ep.name in deny:
                continue
            self._load_entry_point(ep)

    def _load_entry_point(self, ep: Any) -> None:
        """Import one entry point and register its module; whatever its code raises (SystemExit included) is kept
        in its record, only KeyboardInterrupt goes on to the user."""
        source = f"entry point {ep.value}"
        dist = ep.dist.name if getattr(ep, "dist", None) is not None else None
        if ep.name in self.records:  # a second distribution with an entry point of the same name
            taken = self.records[ep.name]
            key = f"{ep.name} ({dist or ep.value})"
            self.records[key] = PluginRecord(
                key,
                source,
                _dist_version(dist) if dist else "unknown",
                f"not loaded: the plugin name {ep.name!r} is taken by {taken.source}"
                + (f" of {taken.distribution}" if taken.distribution else "")
                + f"; uninstall one of the two, or disable this name with TGCORE_DISABLE_PLUGINS={ep.name}",
                distribution=dist,
            )
            return
        version = _dist_version(dist) if dist else "unknown"
        try:
            module = ep.load()
        except KeyboardInterrupt:
            raise
        except BaseException as e:  # an import of one plugin must not stop the others (nor end the program)
            self.records[ep.name] = PluginRecord(
                ep.name, source, version, f"failed to import {ep.value}: {_describe(e)}", distribution=dist
            )
            return
        self._add(module, ep.name, source, version, dist)

    def register(self, plugin: Any, name: Optional[str] = None) -> PluginRecord:
        """Register a plugin object (a module or any object with hookimpls) directly, e.g. from a test."""
        self.load()
        name = name or getattr(plugin, "__name__", type(plugin).__name__)
        with self.lock:
            if name in self.records:
                self.unregister(name)
            before = len(self.registry.conflicts)
            record = self._add(plugin, name, "registered", str(getattr(plugin, "__version__", "unknown")))
            for callback in self.on_change:
                callback()
        for conflict in self.registry.conflicts[before:]:
            warnings.warn(self.describe(conflict), PluginWarning, stacklevel=outside_stacklevel())
        return record

    def unregister(self, name: str) -> None:
        """Remove a plugin and the devices it registered (a device it shadowed goes back to the other plugin)."""
        with self.lock:
            record = self.records.pop(name, None)
            if record is None:
                raise KeyError(f"no plugin named {name!r}; registered: {sorted(self.records)}")
            if self.pm.has_plugin(name):
                self.pm.unregister(name=name)
            self.registry.remove_plugin(name)
            for callback in self.on_change:
                callback()

    def reset(self) -> None:
        """Forget every plugin and device: the next use discovers them again (for tests of discovery itself)."""
        with self.lock:
            self._forget()
            for callback in self.on_change:
                callback()

    def _forget(self) -> None:
        for name in list(self.records):
            if self.pm.has_plugin(name):
                self.pm.unregister(name=name)
        self.records.clear()
        self.registry = DeviceRegistry(self._precedence)
        self.loaded = False

    def _add(
        self, plugin: Any, name: str, source: str, version: str, distribution: Optional[str] = None
    ) -> PluginRecord:
        record = self.records[name] = PluginRecord(name, source, version, distribution=distribution)
        try:
            self.pm.register(plugin, name=name)
        except KeyboardInterrupt:
            raise
        except BaseException as e:
            record.error = f"breaks the plugin contract: {_describe(e)}"
            return record
        impl = getattr(plugin, "tg_register_devices", None)
        if impl is None:
            return record
        self.registry._current_plugin = name
        try:
            impl(registry=self.registry)
        except KeyboardInterrupt:
            raise
        except BaseException as e:  # SystemExit too: a plugin's code must not end the program
            record.error = f"tg_register_devices raised {_describe(e)}"
        record.devices = sorted({r.device for r in self.registry.registrations if r.plugin == name})
        return record

    def describe(self, conflict: Conflict) -> str:
        """A conflict as a sentence: the device, both plugins, which is used and why, and how to choose the other."""
        return (
            f"device {conflict.device} is registered by two plugins, {conflict.winner!r} and {conflict.loser!r}: "
            f"{conflict.winner!r} is used ({conflict.why}); {self.how_to_choose(conflict.loser, conflict.winner)}"
        )

    def how_to_choose(self, plugin: str, instead_of: str) -> str:
        """How a user makes `plugin`'s claim win over `instead_of`'s."""
        record = self.records.get(instead_of)
        if record is not None and record.source == "builtin":
            return f"a built-in device gives way only to a higher priority: {plugin!r} must register another name"
        return (
            f"to use {plugin!r} instead, set TGCORE_DISABLE_PLUGINS={instead_of}, or name {plugin!r} before "
            f"{instead_of!r} in TGCORE_PLUGINS (which loads only the plugins it names)"
        )

    def _precedence(self, a: Registration, b: Registration) -> tuple[int, str]:
        """Which of two claims on one device name wins (+1 a, -1 b, 0 neither) and why (the PluginManager rule)."""
        allow = self._allow or []
        if a.plugin in allow and b.plugin in allow:
            first = a if allow.index(a.plugin) < allow.index(b.plugin) else b
            return (1 if first is a else -1), f"TGCORE_PLUGINS names {first.plugin!r} first"
        if (by_priority := _by_priority(a, b))[0]:
            return by_priority
        shipped_a, shipped_b = (self._shipped(r.plugin) for r in (a, b))
        if shipped_a != shipped_b:
            return (1 if shipped_a else -1), f"{(a if shipped_a else b).plugin!r} ships with tgcore"
        return 0, ""

    def _shipped(self, plugin: str) -> bool:
        record = self.records.get(plugin)
        return record is not None and record.shipped

    def part(self, hook: str, device: str, instance: Optional[str] = None) -> Any:
        """The first answer of part hook `hook` for `device` (and its `instance`, default the device itself); a
        plugin whose claim on `device` is shadowed or refused is not asked."""
        self.load()
        caller = getattr(self.pm.hook, hook)
        kwargs = {"device": device, "instance": instance or device}
        if not (shadowed := self.registry.shadowed_plugins(device)):
            return caller(**kwargs)
        # pluggy's own subset caller needs hashable plugins (a SimpleNamespace is not): the same first-answer call,
        # in pluggy's order (the list is kept last-called first), over every other plugin's implementations
        for impl in reversed(caller.get_hookimpls()):
            if impl.plugin_name in shadowed or impl.hookwrapper or impl.wrapper:
                continue
            if (answer := impl.function(*(kwargs[name] for name in impl.argnames))) is not None:
                return answer
        return None


def outside_stacklevel() -> int:
    """The `stacklevel` for a warning raised by the caller of this function that names the first frame outside
    tgcore: the user's line that led to it, not the core's."""
    frame, level = sys._getframe(1), 1
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        frame, level = frame.f_back, level + 1
    return level


_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def _describe(e: BaseException) -> str:
    """ "SystemExit: 3", "ImportError: no module named x": an exception as a reason."""
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__


def _name_list(value: Optional[str]) -> Optional[list[str]]:
    return None if value is None else [v.strip() for v in value.split(",") if v.strip()]


def _dist_version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


plugins = PluginManager()
