"""`python -m tgcore devices`: which plugins and devices are installed, which work, and why the others don't."""

from __future__ import annotations

import argparse
import sys

from tgcore.device import Device, DeviceUnavailable
from tgcore.plugin import PLUGIN_API_VERSION, plugins


def devices() -> int:
    """Print every plugin and device with its status; return 0."""
    plugins.load()
    specs = plugins.registry.specs
    print(f"tgcore plugin API {PLUGIN_API_VERSION}")
    print(f"{'plugin':12s} {'version':12s} {'source':32s} status")
    for rec in plugins.records.values():
        status = f"error: {rec.error}" if rec.error else f"loaded, devices: {', '.join(rec.devices) or 'none'}"
        print(f"{rec.name:12s} {rec.version:12s} {rec.source:32s} {status}")
    print()
    print(f"{'device':10s} {'plugin':12s} {'priority':>8s}  status")
    for name in sorted(
        set(specs) | set(plugins.registry.rejected), key=lambda n: -specs[n].priority if n in specs else 0
    ):
        owner = plugins.registry.owner.get(name, "?")
        reason = Device.status(name)
        priority = f"{specs[name].priority:8d}" if name in specs else " " * 8
        print(f"{name:10s} {owner:12s} {priority}  {'available' if reason is None else 'unavailable: ' + reason}")
    try:
        default, why = Device.default_and_reason()
        print(f"\ndefault device: {default} ({why})")
    except DeviceUnavailable as e:
        print(f"\ndefault device: none ({e})")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tgcore", description=__doc__)
    parser.add_argument("command", choices=["devices", "info"], help="devices: list plugins and devices")
    parser.parse_args(argv)
    return devices()


if __name__ == "__main__":
    sys.exit(main())
