"""`python -m tgcore devices`: each plugin's real name and state, each device's description, dtypes and compiler, the
compile cache, and a DEVICE= that names an unavailable device."""

from __future__ import annotations

from typing import Any

import pytest

from tgcore import helpers
from tgcore.__main__ import main
from tgcore.dtype import dtypes
from tgcore.plugin import PLUGIN_API_VERSION, DeviceSpec, MallocAllocator, part_for, plugin_module
from tgcore.runtime.python import PythonCompiler, PythonProgram, PythonRenderer


class NamedCompiler(PythonCompiler):
    identity = "namedcc 9.9 -O7"


def device_plugin(name: str, device: str, api_version: Any = PLUGIN_API_VERSION, probe: Any = None) -> Any:
    def register(registry: Any) -> None:
        registry.add(
            DeviceSpec(
                device,
                api_version,
                priority=-7,
                probe=lambda: probe,
                dtypes=(dtypes.int32, dtypes.float32),
                description=f"the {device} of {name}",
            )
        )

    return plugin_module(
        name,
        tg_register_devices=register,
        tg_renderer=part_for(device, PythonRenderer),
        tg_compiler=part_for(device, NamedCompiler),
        tg_allocator=part_for(device, MallocAllocator),
        tg_runtime=part_for(device, lambda: PythonProgram),
    )



def run_devices(capsys: pytest.CaptureFixture[str]) -> list[str]:
    assert main(["devices"]) == 0
    return capsys.readouterr().out.splitlines()


def row(lines: list[str], start: str) -> str:
    return next(line for line in lines if line.startswith(start))


def details(lines: list[str], device: str) -> dict[str, str]:
    """The indented `label: text` lines under a device's row."""
    at = next(i for i, line in enumerate(lines) if line.startswith(f"{device} "))
    found = {}
    for line in lines[at + 1 :]:
        if not line.startswith(" "):
            break
        label, _, text = line.strip().partition(": ")
        found[label] = text.strip()
    return found


def test_loaded_plugin_and_its_device_details(registered, capsys):
    registered(device_plugin("goodplug", "GOODDEV"))
    lines = run_devices(capsys)
    assert row(lines, "goodplug ").endswith("loaded; devices: GOODDEV")
    assert "available" in row(lines, "GOODDEV ") and "goodplug" in row(lines, "GOODDEV ")
    assert details(lines, "GOODDEV") == {
        "about": "the GOODDEV of goodplug",
        "dtypes": "int32 float32",
        "compiler": "namedcc 9.9 -O7",
    }
    assert f"compile cache: {helpers.CACHEDB} (CACHEDB)" in lines
    major, minor = PLUGIN_API_VERSION
    assert lines[0].startswith(f"tgcore plugin API {major}.{minor} ")


def test_rejected_plugin_shows_its_name_and_why(registered, capsys):
    registered(device_plugin("oldplug", "OLDDEV", api_version=1))
    lines = run_devices(capsys)
    plugin_row = row(lines, "oldplug ")
    assert "rejected (plugin 'oldplug' is built for tgcore plugin API 1" in plugin_row
    assert "loaded" not in plugin_row
    device_row = row(lines, "OLDDEV ")
    assert device_row.split()[1] == "oldplug" and "unavailable: plugin 'oldplug'" in device_row
    assert "?" not in device_row.split()[1]


def test_failed_plugin_shows_the_error(registered, capsys):
    def boom(registry: Any) -> None:
        raise RuntimeError("no luck today")

    registered(plugin_module("brokenplug", tg_register_devices=boom))
    plugin_row = row(run_devices(capsys), "brokenplug ")
    assert "failed (tg_register_devices raised RuntimeError: no luck today)" in plugin_row


def test_device_env_naming_an_unavailable_device_is_said(registered, capsys, monkeypatch):
    registered(device_plugin("nohwplug", "NOHWDEV", probe="no such board here"))
    monkeypatch.setenv("DEVICE", "NOHWDEV")
    lines = run_devices(capsys)
    assert "default device: NOHWDEV (set by DEVICE)" in lines
    assert "warning: DEVICE=NOHWDEV names a device that is unavailable here: no such board here" in lines


def test_device_env_naming_an_available_device_has_no_warning(capsys, monkeypatch):
    monkeypatch.setenv("DEVICE", "PYTHON")
    lines = run_devices(capsys)
    assert "default device: PYTHON (set by DEVICE)" in lines
    assert not [line for line in lines if line.startswith("warning:")]
