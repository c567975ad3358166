"""`python -m tgcore devices`: which plugins and devices are installed, which work, and why the others don't."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Callable, Optional

from tgcore import helpers
from tgcore.device import Device, DeviceUnavailable
from tgcore.plugin import PLUGIN_API_VERSION, Compiler, version_refusal
from tgcore.registry import PluginRecord, plugins


def plugin_state(record: PluginRecord) -> str:
    """ "loaded", "rejected (why)" (every device it registers is built for a plugin API this core does not serve) or
    "failed (error)" (it did not import, or broke the contract)."""
    if record.error:
        return f"failed ({record.error})"
    claims = [r for r in plugins.registry.registrations if r.plugin == record.name]
    refusals = [version_refusal(r.plugin, r.spec.api_version) for r in claims]
    if claims and all(refusals):
        return f"rejected ({refusals[0]})"
    return "loaded"


def compiler_identity(device: str) -> str:
    """What the device's Compiler says it is (Compiler.identity; its class name where it says nothing)."""
    try:
        compiler = plugins.part("tg_compiler", device)
    except Exception as e:  # (a device that is unavailable may not even make one)
        return f"none ({type(e).__name__}: {e})"
    if compiler is None:
        return "none"
    return (compiler.identity if isinstance(compiler, Compiler) else "") or type(compiler).__name__


def devices() -> int:
    """Print every plugin and device with its state; return 0."""
    plugins.load()
    registry = plugins.registry
    statuses = Device.statuses()  # (every probe at once, each within TGCORE_PROBE_TIMEOUT)
    major, minor = PLUGIN_API_VERSION
    print(f"tgcore plugin API {major}.{minor} (loads plugins built for {major}.0 to {major}.{minor})")
    print(f"compile cache: {helpers.CACHEDB} (CACHEDB)")
    print()
    print(f"{'plugin':12s} {'version':12s} {'source':32s} state")
    for rec in plugins.records.values():
        state = plugin_state(rec)
        devices_of = f"; devices: {', '.join(rec.devices) or 'none'}" if state == "loaded" else ""
        print(f"{rec.name:12s} {rec.version:12s} {rec.source:32s} {state}{devices_of}")
    print()
    print(f"{'device':10s} {'plugin':12s} {'priority':>8s}  status")
    # one row per claim on a device name: the one in use first, then any it shadows or that was refused
    rank = {name: -spec.priority for name, spec in registry.specs.items()}
    claims = sorted(registry.registrations, key=lambda r: (rank.get(r.device, 0), r.device, r.refused is not None))
    for claim in claims:
        spec = claim.spec
        if claim.refused is None:
            reason = statuses.get(claim.device)
            status = "available" if reason is None else f"unavailable: {reason}"
        else:
            status = f"unavailable: {claim.refused}"
        print(f"{claim.device:10s} {claim.plugin:12s} {spec.priority:8d}  {status}")
        details: list[tuple[str, Callable[[], str]]] = [
            ("about", lambda: spec.description or "(no description)"),
            ("dtypes", lambda: " ".join(dt.short_name for dt in spec.dtypes) or "none"),
        ]
        if claim.refused is None and not spec.storage_only:
            details.append(("compiler", lambda: compiler_identity(claim.device)))
        for label, text in details:
            print(f"{'':10s} {label + ':':9s} {text()}")
    for conflict in registry.conflicts:
        print(f"note: {plugins.describe(conflict)}")
    print()
    print(default_line())
    return 0


def default_line() -> str:
    """The default device and why; or why there is none; and whether a DEVICE= that names one can be used."""
    try:
        default, why = Device.default_and_reason()
    except DeviceUnavailable as e:
        return f"default device: none ({e})"
    line = f"default device: {default} ({why})"
    reason: Optional[str] = None
    if why.startswith("set by"):
        try:
            reason = Device.status(default)
        except ValueError as e:  # a DEVICE= that is not a device name at all
            reason = str(e)
    if reason is not None:
        setting = f"DEVICE={os.environ['DEVICE']}" if why == "set by DEVICE" else why.removeprefix("set by ")
        line += f"\nwarning: {setting} names a device that is unavailable here: {reason}"
    return line


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "devices": lambda args: devices(),
    "info": lambda args: devices(),
    "new-plugin": lambda args: _new_plugin(args.args),
}


def _new_plugin(argv: list[str]) -> int:
    from tgcore.scaffold import main as new_plugin  # (imported only for this command)

    return new_plugin(argv)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tgcore", description=__doc__)
    parser.add_argument(
        "command",
        choices=sorted(COMMANDS),
        help="devices: list plugins and devices; new-plugin NAME [--dir DIR]: write a device plugin package",
    )
    parser.add_argument("args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)  # the subcommand's own
    args = parser.parse_args(argv)
    if args.args and args.command != "new-plugin":
        parser.error(f"{args.command} takes no arguments, got {' '.join(args.args)}")
    return COMMANDS[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
