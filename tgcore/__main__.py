"""`python -m tgcore devices`: which plugins and devices are installed, which work, and why the others don't."""

from __future__ import annotations

import argparse
import sys

from tgcore.device import Device, DeviceUnavailable
from tgcore.plugin import PLUGIN_API_VERSION, plugins


def devices() -> int:
    """Print every plugin and device with its status; return 0."""
    plugins.load()
    registry = plugins.registry
    statuses = Device.statuses()  # (every probe at once, each within TGCORE_PROBE_TIMEOUT)
    print(f"tgcore plugin API {PLUGIN_API_VERSION}")
    print(f"{'plugin':12s} {'version':12s} {'source':32s} status")
    for rec in plugins.records.values():
        status = f"error: {rec.error}" if rec.error else f"loaded, devices: {', '.join(rec.devices) or 'none'}"
        print(f"{rec.name:12s} {rec.version:12s} {rec.source:32s} {status}")
    print()
    print(f"{'device':10s} {'plugin':12s} {'priority':>8s}  status")
    # one row per claim on a device name: the one in use first, then any it shadows or that was refused
    rank = {name: -spec.priority for name, spec in registry.specs.items()}
    claims = sorted(registry.registrations, key=lambda r: (rank.get(r.device, 0), r.device, r.refused is not None))
    for claim in claims:
        if claim.refused is None:
            reason = statuses.get(claim.device)
            status = "available" if reason is None else f"unavailable: {reason}"
        else:
            status = f"unavailable: {claim.refused}"
        print(f"{claim.device:10s} {claim.plugin:12s} {claim.spec.priority:8d}  {status}")
    for conflict in registry.conflicts:
        print(f"note: {plugins.describe(conflict)}")
    try:
        default, why = Device.default_and_reason()
        print(f"\ndefault device: {default} ({why})")
    except DeviceUnavailable as e:
        print(f"\ndefault device: none ({e})")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tgcore", description=__doc__)
    parser.add_argument(
        "command",
        choices=["devices", "info", "new-plugin"],
        help="devices: list plugins and devices; new-plugin NAME [--dir DIR]: write a device plugin package",
    )
    parser.add_argument("args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)  # the subcommand's own
    args = parser.parse_args(argv)
    if args.command == "new-plugin":
        from tgcore.scaffold import main as new_plugin

        return new_plugin(args.args)
    if args.args:
        parser.error(f"{args.command} takes no arguments, got {' '.join(args.args)}")
    return devices()


if __name__ == "__main__":
    sys.exit(main())
