"""Devices as the core sees them: Buffers, device instances, and `Device` (which devices are usable, the default).

The base classes a plugin's parts derive from live in the contract (tgcore/plugin.py); their old names here
(`tgcore.device.Compiler`, `CompileError`, `Allocator`, `LRUAllocator`, `MallocAllocator`, ...) are re-exports."""

from __future__ import annotations

import inspect
import math
import os
import threading
import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np

from tgcore.codegen.program import render_check
from tgcore.dtype import DType, dtypes
from tgcore.helpers import DEBUG, GlobalCounters
from tgcore.plugin import (
    ALIGNMENT,
    HUGE_PAGE,
    MAX_BUFFER_BYTES,
    Allocator,
    Collective,
    CompileError,
    Compiler,
    DeviceSpec,
    LRUAllocator,
    MallocAllocator,
    Program,
    Renderer,
)
from tgcore.registry import outside_stacklevel, plugins

__all__ = [
    "ALIGNMENT",
    "HUGE_PAGE",
    "MAX_BUFFER_BYTES",
    "Allocator",
    "Buffer",
    "BufferOptions",
    "CompileError",
    "Compiled",
    "Compiler",
    "Device",
    "DeviceFallbackWarning",
    "DeviceUnavailable",
    "LRUAllocator",
    "MallocAllocator",
    "probe_timeout",
]


class DeviceUnavailable(RuntimeError):
    """A device was asked for that is unknown, or known but not usable here; the message says why."""


# ***** buffers *****


@dataclass(frozen=True)
class BufferOptions:
    """Hints for an allocation."""

    host: bool = False
    nolru: bool = False


class Buffer:
    """`size` elements of `dtype` on `device`; memory is allocated on first use and freed with the object."""

    def __init__(
        self,
        device: str,
        size: int,
        dtype: DType,
        opaque: Any = None,
        options: Optional[BufferOptions] = None,
        initial_value: Optional[bytes] = None,
        base: Optional[Buffer] = None,
        offset: int = 0,
    ) -> None:
        if size < 0:
            raise ValueError(f"buffer size must be >= 0, got {size}")
        if size * dtype.itemsize > MAX_BUFFER_BYTES:  # (fails here, where the tensor is made, not at its realize)
            raise MemoryError(
                f"a buffer of {size} {dtype.short_name} elements on {device} would be {size * dtype.itemsize} "
                f"bytes: no buffer can be larger than {MAX_BUFFER_BYTES} bytes; use a smaller shape or a narrower dtype"
            )
        self.device, self.size, self.dtype, self.options = device, size, dtype, options
        self.base, self.offset = base, offset  # a view into `base` starting at byte `offset`
        self._opaque: Any = None
        if opaque is not None:
            self.allocate(opaque)
        if initial_value is not None:
            self.allocate()
            self.copyin(memoryview(initial_value))

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def is_allocated(self) -> bool:
        return self._opaque is not None

    def allocate(self, opaque: Any = None) -> Buffer:
        """Give the buffer memory (its own, the given opaque, or a slice of its base)."""
        if self._opaque is not None:
            return self
        self._allocator = allocator = Device[self.device].allocator  # kept: __del__ frees through it
        if self.base is not None:
            self.base.allocate()
            if not allocator.supports_offset:
                raise NotImplementedError(f"device {self.device} cannot make buffer views: its allocator has no offset")
            self._opaque = allocator.offset(self.base._opaque, self.nbytes, self.offset)
        elif opaque is not None:
            self._opaque = opaque
        else:
            nbytes = self.size * self.dtype.itemsize  # (self.nbytes without the property call: once per op)
            try:
                self._opaque = allocator.alloc(nbytes, self.options)
            except MemoryError as e:
                raise MemoryError(
                    f"device {self.device} has no memory for a buffer of {self.size} {self.dtype.short_name} elements "
                    f"({nbytes} bytes, {GlobalCounters.mem_used} bytes in use by tgcore): {e}; free the tensors that "
                    "are no longer needed, or use smaller ones"
                ) from e
            GlobalCounters.mem_used += nbytes
        return self

    def __del__(self) -> None:
        if getattr(self, "_opaque", None) is None or self.base is not None:
            return
        try:
            nbytes = self.size * self.dtype.itemsize
            GlobalCounters.mem_used -= nbytes
            self._allocator.free(self._opaque, nbytes, self.options)
        except Exception:  # interpreter shutdown: the memory goes with the process
            pass

    def __repr__(self) -> str:
        state = "" if self._opaque is not None else " unallocated"
        return f"<buf device:{self.device} size:{self.size} dtype:{self.dtype}{state}>"

    def view(self, size: int, dtype: DType, offset: int) -> Buffer:
        """A buffer over `size` elements of `dtype` starting `offset` bytes into this one."""
        if offset + size * dtype.itemsize > self.nbytes:
            raise ValueError(f"view of {size} x {dtype} at byte {offset} exceeds a buffer of {self.nbytes} bytes")
        root = self.base if self.base is not None else self
        return Buffer(self.device, size, dtype, base=root, offset=self.offset + offset)

    def copyin(self, mv: memoryview) -> Buffer:
        mv = mv.cast("B") if mv.nbytes else memoryview(b"")
        if mv.nbytes != self.nbytes:
            raise ValueError(f"copyin of {mv.nbytes} bytes into a buffer of {self.nbytes} bytes")
        self.allocate()
        if self.nbytes:
            Device[self.device].allocator.copyin(self._opaque, mv)
        return self

    def copyout(self, mv: memoryview) -> memoryview:
        mv = mv.cast("B") if mv.nbytes else mv
        if mv.nbytes != self.nbytes:
            raise ValueError(f"copyout of a buffer of {self.nbytes} bytes into {mv.nbytes} bytes")
        self.allocate()
        if self.nbytes:
            Device[self.device].synchronize()
            Device[self.device].allocator.copyout(mv, self._opaque)
        return mv

    def as_buffer(self) -> memoryview:
        """The contents as a memoryview (zero-copy where the allocator allows)."""
        allocator = Device[self.device].allocator
        if allocator.supports_as_buffer:
            self.allocate()
            Device[self.device].synchronize()
            return allocator.as_buffer(self._opaque)
        return self.copyout(memoryview(bytearray(self.nbytes)))

    def numpy(self) -> np.ndarray:
        """A numpy copy of the contents (bfloat16 comes back as float32)."""
        raw = bytearray(self.nbytes)
        self.copyout(memoryview(raw))
        if self.dtype == dtypes.bfloat16:
            return (np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
        return np.frombuffer(raw, dtype=self.dtype.np)


# ***** device instances and the registry *****


class Compiled:
    """One device instance: the four parts its plugins gave, bound to a name like "MYDEV" or "MYDEV:1"."""

    def __init__(
        self,
        name: str,
        spec: DeviceSpec,
        renderer: Renderer,
        compiler: Compiler,
        allocator: Allocator,
        runtime: type[Program],
    ) -> None:
        self.name, self.spec, self.renderer, self.compiler, self.allocator, self.runtime = (
            name,
            spec,
            renderer,
            compiler,
            allocator,
            runtime,
        )

    def synchronize(self) -> None:
        """Wait for every queued operation on this device."""
        if self.allocator.supports_synchronize:
            self.allocator.synchronize()

    @property
    def collective(self) -> Optional[Collective]:
        """The device's optional Collective (plugin API 2.1: the tg_collective hook), asked once; None when no plugin
        offers one (then tgcore.distributed copies through host arrays)."""
        if "_collective" not in self.__dict__:
            got = plugins.part("tg_collective", self.name.split(":")[0], self.name)
            if got is not None and not isinstance(got, Collective):
                raise TypeError(
                    f"the tg_collective hook for device {self.name} returned a {type(got).__name__}, not a "
                    "tgcore.plugin.Collective (or None)"
                )
            self._collective = got
        return self._collective

    def __repr__(self) -> str:
        return f"<Compiled {self.name}>"


_PARTS = ("tg_renderer", "tg_compiler", "tg_allocator", "tg_runtime")

PROBE_TIMEOUT_ENV = "TGCORE_PROBE_TIMEOUT"
DEFAULT_PROBE_TIMEOUT_S = 5.0  # a probe that has not answered by then is taken as hung (today's probes take < 0.2 s)
_UNKNOWN = object()  # (a status not computed yet: None means "usable")


class DeviceFallbackWarning(UserWarning):
    """The device that would be the default is not available here, so new tensors go to another one."""


def probe_timeout() -> Optional[float]:
    """The seconds one device's probe may take (TGCORE_PROBE_TIMEOUT, default 5); None when 0 asks for no limit."""
    raw = os.environ.get(PROBE_TIMEOUT_ENV, "").strip()
    if not raw:
        return DEFAULT_PROBE_TIMEOUT_S
    try:
        seconds = float(raw)
    except ValueError:
        seconds = math.nan
    if math.isnan(seconds):
        raise ValueError(
            f"{PROBE_TIMEOUT_ENV}={raw!r} is not a number: expected the seconds a device's probe may take "
            f"(e.g. {PROBE_TIMEOUT_ENV}=30, or 0 for no limit)"
        )
    return None if seconds <= 0 or math.isinf(seconds) else seconds


def _checked_answer(answer: Any, what: str) -> Optional[str]:
    """A probe's answer as a status: None (usable) or a reason; anything else breaks the contract."""
    if answer is None or isinstance(answer, str):
        return answer
    return f"{what} returned {answer!r}: expected None (usable here) or a str that says why not"


class _Check:
    """One device check (a probe, and for a device the part hooks) running in a daemon thread of its own, so that a
    hung one is abandoned at its deadline (its late answer is ignored) and the checks of several devices overlap."""

    def __init__(self, name: str, work: Callable[[], Optional[str]]) -> None:
        self.name, self._work = name, work
        self._done = threading.Event()
        self._answer: Optional[str] = None
        self._error: Optional[BaseException] = None
        try:
            threading.Thread(target=self._run, name=f"tgcore probe {name}", daemon=True).start()
        except RuntimeError:  # no thread can be started (a process at its limit): check here, without a deadline
            self._run()

    def _run(self) -> None:
        try:
            self._answer = self._work()
        except BaseException as e:  # (a SystemExit would otherwise end the thread without a word)
            self._error = e
        finally:
            self._done.set()

    def result(self, deadline: Optional[float], timeout: Optional[float]) -> Optional[str]:
        """The check's answer, or why there is none by `deadline` (time.monotonic(); None waits as long as it takes)."""
        if not self._done.wait(None if deadline is None else max(0.0, deadline - time.monotonic())):
            return (
                f"probe timed out: no answer within {timeout:g} s ({PROBE_TIMEOUT_ENV}), so it is taken as hung (on a "
                f"driver, a device or a tool it starts); if this device is only slow to start, set {PROBE_TIMEOUT_ENV} "
                "to more seconds (0 for no limit)"
            )
        if isinstance(self._error, KeyboardInterrupt):
            raise self._error
        if self._error is not None:
            return f"probe raised {type(self._error).__name__}: {self._error}"
        return self._answer


def _check_device(base: str, spec: DeviceSpec) -> Optional[str]:
    """None when device `base` is usable: its probe says so and plugins provide every part it needs; else why not."""
    reason = _checked_answer(spec.probe(), "probe")
    if reason is not None:
        return reason
    needed = ("tg_allocator",) if spec.storage_only else _PARTS  # storage runs no kernels
    missing = []
    for part in needed:
        try:
            if plugins.part(part, base) is None:
                missing.append(part[3:])
        except KeyboardInterrupt:
            raise
        except BaseException as e:
            return f"its {part} hook raised {type(e).__name__}: {e}"
    if missing:
        return f"no plugin provides its {', '.join(missing)}"
    return None if spec.storage_only else _render_check(base, spec)


def _render_check(base: str, spec: DeviceSpec) -> Optional[str]:
    """None when device `base`'s renderer renders a small kernel of the basic ops (render only: cheap), else why not:
    a device that cannot render a load, an add or an exp is unusable, whatever its probe says."""
    floats = [dt for dt in spec.dtypes if dtypes.is_float(dt)]
    dtype = dtypes.float32 if dtypes.float32 in spec.dtypes else (floats or list(spec.dtypes) or [dtypes.float32])[0]
    try:
        renderer = plugins.part("tg_renderer", base)
    except KeyboardInterrupt:
        raise
    except BaseException as e:
        return f"its tg_renderer hook raised {type(e).__name__}: {e}"
    return render_check(renderer, dtype)


def _check_instance(spec: DeviceSpec, instance: str) -> Optional[str]:
    """The spec's probe asked about one instance (a probe that takes no argument answers for the device only)."""
    return _checked_answer(spec.probe(instance), "probe")


def _takes_instance(spec: DeviceSpec) -> bool:
    try:
        return bool(inspect.signature(spec.probe).parameters)
    except (TypeError, ValueError):  # a callable without a signature is asked about the device only
        return False


class _Device:
    """`Device["MYDEV"]` gives the device instance; `Device.DEFAULT` is the device new tensors go to.

    Discovery, probes, opening an instance and choosing DEFAULT happen once, under the plugin manager's lock and checked
    again inside it, so threads that start at once wait for one answer; what is known already is read without a lock.
    """

    def __init__(self) -> None:
        self._instances: dict[str, Compiled] = {}
        self._default: Optional[str] = None
        self._status: dict[str, Optional[str]] = {}  # device or instance name -> None (usable) or why not
        self._storage_only: dict[str, bool] = {}  # device or instance name -> DeviceSpec.storage_only
        self._warned: set[str] = set()  # fall-back warnings given, by text: each once per process
        plugins.on_change.append(self._reset)

    def _reset(self) -> None:
        with plugins.lock:
            self._instances.clear()
            self._status.clear()
            self._storage_only.clear()
            self._default = None

    @staticmethod
    def canonicalize(name: Optional[str]) -> str:
        """Upper case, `:0` dropped: "mydev" -> "MYDEV", "mydev:0" -> "MYDEV", "mydev:1" -> "MYDEV:1"; a device whose
        instances are named by a path keeps the path as written: "disk:/tmp/X" -> "DISK:/tmp/X"."""
        if name is None:
            return Device.DEFAULT
        if not isinstance(name, str) or not name:
            raise ValueError(f"device name must be a non-empty string, got {name!r}")
        base, _, index = name.partition(":")
        if index:
            spec = Device.specs().get(base.upper())
            if spec is not None and spec.path_instances:
                return f"{base.upper()}:{index}"
            if not index.isdigit():
                raise ValueError(f"bad device name {name!r}: expected NAME or NAME:N with N a number")
        return base.upper() + (f":{int(index)}" if index and int(index) != 0 else "")

    def storage_only(self, name: str) -> bool:
        """Whether device `name` (canonical) only holds data and runs no kernels (DeviceSpec.storage_only)."""
        if (known := self._storage_only.get(name)) is None:
            spec = self.specs().get(name.split(":")[0]) if isinstance(name, str) else None  # (or devices of a shard)
            known = self._storage_only[name] = spec is not None and spec.storage_only
        return known

    def specs(self) -> dict[str, DeviceSpec]:
        plugins.load()
        return plugins.registry.specs

    def status(self, name: str) -> Optional[str]:
        """None when device (or device instance) `name` is usable here, else the reason it is not."""
        full = self.canonicalize(name)
        if (known := self._status.get(full, _UNKNOWN)) is not _UNKNOWN:
            return known  # type: ignore[return-value]
        base = full.split(":")[0]
        self._check([base])
        if full == base or self._status[base] is not None:  # (an instance of an unusable device is unusable)
            return self._status[base]
        with plugins.lock:
            if full not in self._status:
                spec, reason = self.specs()[base], None
                if _takes_instance(spec):
                    timeout = probe_timeout()
                    deadline = None if timeout is None else time.monotonic() + timeout
                    reason = _Check(full, lambda: _check_instance(spec, full)).result(deadline, timeout)
                self._status[full] = reason
            return self._status[full]

    def _check(self, bases: list[str]) -> None:
        """Find out whether each device in `bases` is usable, where not known yet: the probes run at once, each in a
        thread of its own within the time limit, so several slow ones take as long as the slowest, not their sum."""
        if all(base in self._status for base in bases):
            return
        with plugins.lock:
            specs = self.specs()
            checks: dict[str, _Check] = {}
            for base in bases:
                if base in self._status or base in checks:
                    continue
                if base in specs:
                    checks[base] = _Check(base, lambda base=base, spec=specs[base]: _check_device(base, spec))
                else:
                    self._status[base] = self._unknown_reason(base)
            if not checks:
                return
            timeout = probe_timeout()
            deadline = None if timeout is None else time.monotonic() + timeout
            for base, check in checks.items():
                self._status[base] = self._with_shadowed(base, check.result(deadline, timeout))

    def _unknown_reason(self, base: str) -> str:
        if base in plugins.registry.rejected:
            return plugins.registry.rejected[base]
        failed = [f"{r.name}: {r.error}" for r in plugins.records.values() if r.error]
        return f"no installed plugin provides device {base}; available devices: {sorted(self.specs())}" + (
            f"; plugins that failed to load: {'; '.join(failed)}" if failed else ""
        )

    @staticmethod
    def _with_shadowed(base: str, reason: Optional[str]) -> Optional[str]:
        """An unusable device's reason, naming the other plugins that register the same name (and how to pick one)."""
        others = [r.plugin for r in plugins.registry.claims(base) if r.refused is not None]
        if reason is None or not others:
            return reason
        owner = plugins.registry.owner.get(base, "?")
        names = ", ".join(repr(o) for o in others) + (" also registers" if len(others) == 1 else " also register")
        return (
            f"{reason} (device {base} of plugin {owner!r}; {names} {base}, shadowed by it: "
            f"{plugins.how_to_choose(others[0], owner)})"
        )

    def __getitem__(self, name: str) -> Compiled:
        if (inst := self._instances.get(name)) is not None:  # already canonical and open: the common case, no lock
            return inst
        full = self.canonicalize(name)
        if (inst := self._instances.get(full)) is not None:
            return inst
        if (reason := self.status(full)) is not None:
            raise DeviceUnavailable(f"device {full} is not available: {reason}")
        with plugins.lock:
            if (inst := self._instances.get(full)) is not None:  # another thread opened it meanwhile
                return inst
            base = full.split(":")[0]
            try:
                parts = [plugins.part(p, base, full) for p in _PARTS]
            except KeyboardInterrupt:
                raise
            except BaseException as e:
                raise DeviceUnavailable(f"device {full}: a plugin part raised {type(e).__name__}: {e}") from e
            inst = self._instances[full] = Compiled(full, self.specs()[base], *parts)
        if DEBUG >= 1:
            print(f"opened device {full} from plugin {plugins.registry.owner[base]}")
        return inst

    def statuses(self) -> dict[str, Optional[str]]:
        """The status of every registered device (None: usable, else why not), their probes run at once."""
        names = list(self.specs())
        self._check(names)
        return {name: self._status.get(name) for name in names}

    def available(self) -> list[str]:
        """Names of the usable devices that run kernels, highest priority first (a storage-only device, such as
        DISK, holds data for them and is not listed)."""
        specs = self.specs()
        compute = [n for n in specs if not specs[n].storage_only]
        self._check(compute)
        return sorted((n for n in compute if self._status.get(n, _UNKNOWN) is None), key=lambda n: -specs[n].priority)

    @property
    def DEFAULT(self) -> str:
        if (default := self._default) is not None:
            return default
        with plugins.lock:
            if self._default is None:
                default, why = self.default_and_reason()
                if why == _BY_PRIORITY:
                    self._warn_fallback(default)
                if not plugins.loaded:  # (asked by a plugin while it is being imported: decide once all are in)
                    return default
                self._default = default
            return self._default

    @DEFAULT.setter
    def DEFAULT(self, name: str) -> None:
        self._default = self.canonicalize(name)

    def _warn_fallback(self, default: str) -> None:
        """Warn (once) when devices of higher priority than `default` are unavailable: no silent fall-back."""
        specs = self.specs()
        skipped = [
            f"{n} (priority {spec.priority}): {self._status.get(n)}"
            for n, spec in sorted(specs.items(), key=lambda item: -item[1].priority)
            if not spec.storage_only and spec.priority > specs[default].priority and self.status(n) is not None
        ]
        message = (
            f"{'device' if len(skipped) == 1 else 'devices'} of higher priority than {default} "
            f"{'is' if len(skipped) == 1 else 'are'} not available here: {'; '.join(skipped)}. New tensors go to "
            f"{default} (priority {specs[default].priority}) instead: fix the cause to use the device, or set "
            f"DEVICE={default} to choose {default} (which also silences this warning); `python -m tgcore devices` "
            "lists every device"
        )
        if skipped and message not in self._warned:
            self._warned.add(message)
            warnings.warn(message, DeviceFallbackWarning, stacklevel=outside_stacklevel())

    def default_and_reason(self) -> tuple[str, str]:
        """The default device and why it was chosen."""
        if env := os.environ.get("DEVICE"):
            return self.canonicalize(env), "set by DEVICE"
        for name, spec in list(self.specs().items()):
            if not spec.storage_only and os.environ.get(name, "") not in ("", "0"):
                return name, f"set by {name}={os.environ[name]}"
        available = self.available()
        if not available:
            specs = self.specs()
            reasons = [f"{n}: {self.status(n)}" for n in specs if not specs[n].storage_only]
            raise DeviceUnavailable(
                f"no device is available ({'; '.join(reasons) or 'no device is registered'}); "
                "run `python -m tgcore devices` to see every plugin and device"
            )
        return available[0], _BY_PRIORITY


_BY_PRIORITY = "the available device with the highest priority"

Device = _Device()
