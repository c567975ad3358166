"""What a report was measured with: the plugin (entry point, distribution, version), tgcore's version, the compiler
(its class, `cachekey` and `identity`), the compile cache and the machine, so two reports can be told apart and a
result traced to the build that gave it."""
from __future__ import annotations

import os
import platform
from importlib import metadata
from typing import Any, Optional

import tgcore
from tg_conformance import ENV_PRIVATE_CACHE
from tg_conformance.target import Target
from tgcore import helpers
from tgcore.registry import plugins


def _distribution_of(module: str) -> Optional[dict[str, str]]:
    """The installed distribution that holds top-level package `module`, and its version, where known."""
    try:
        names = metadata.packages_distributions().get(module.split(".")[0], [])
    except Exception:  # a broken install's metadata must not stop the report
        return None
    if not names:
        return None
    try:
        version = metadata.version(names[0])
    except metadata.PackageNotFoundError:
        version = "unknown"
    return {"name": names[0], "version": version}


def _entry_point(name: str) -> Optional[str]:
    """`name = value` of the entry point of plugin `name` in the group tgcore, or None (built in, registered)."""
    for ep in metadata.entry_points(group="tgcore"):
        if ep.name == name:
            return f"{ep.name} = {ep.value}"
    return None


def plugin_info(device: str) -> dict[str, Any]:
    """The plugin that registered `device`: its name, where it came from, its entry point and distribution."""
    name = plugins.registry.owner.get(device.split(":")[0])
    record = plugins.records.get(name) if name is not None else None
    return {
        "name": name,
        "source": getattr(record, "source", None),
        "entry_point": _entry_point(name) if name is not None else None,
        "distribution": getattr(record, "distribution", None) or ("tgcore" if getattr(record, "source", "") ==
                                                                   "builtin" else None),
        "version": getattr(record, "version", None),
    }


def part_info(part: Any) -> Optional[dict[str, Any]]:
    """A part (renderer, compiler) as `module.Class` and the distribution its module comes from."""
    if part is None:
        return None
    cls = type(part)
    return {"class": f"{cls.__module__}.{cls.__qualname__}", "distribution": _distribution_of(cls.__module__)}


def compiler_info(compiler: Any) -> Optional[dict[str, Any]]:
    """The compiler as the cache knows it (`cachekey`) and as a person does (`identity`, where it declares one:
    e.g. "gcc 12.2.0 -O2 -march=native")."""
    info = part_info(compiler)
    if info is not None:
        info["cachekey"] = getattr(compiler, "cachekey", None)
        identity = getattr(compiler, "identity", None)
        info["identity"] = None if identity is None else str(identity)
    return info


def cpu_name() -> str:
    """The processor's model name where the OS tells it, else its architecture."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Hardware", "Processor") and value.strip():
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def machine_info() -> dict[str, Any]:
    return {"cpu": cpu_name(), "cpu_count": os.cpu_count(), "arch": platform.machine(), "os": platform.platform(),
            "python": f"{platform.python_implementation()} {platform.python_version()}"}


def cache_info() -> dict[str, Any]:
    private = os.environ.get(ENV_PRIVATE_CACHE)
    return {"path": helpers.CACHEDB, "private": private is not None and helpers.CACHEDB == private,
            "disabled": helpers.getenv("DISABLE_COMPILER_CACHE") != 0}


def run_environment(target: Target) -> dict[str, Any]:
    """The keys of the JSON report that say what the run measured, and where."""
    return {
        "tgcore_version": tgcore.__version__,
        "plugin": plugin_info(target.name),
        "renderer": {**(part_info(target.renderer) or {}), "global_max": getattr(target.renderer, "global_max", None)},
        "compiler": compiler_info(target.compiler),
        "compile_cache": cache_info(),
        "machine": machine_info(),
    }
