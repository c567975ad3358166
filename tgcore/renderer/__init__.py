"""The Renderer base (what a device's code generator declares and does) and ProgramSpec (one rendered kernel).

Both are part of the plugin contract and defined there (tgcore/plugin.py); this package keeps their old import path
and holds the C-family base (cstyle.py) that several plugins subclass."""

from __future__ import annotations

from tgcore.plugin import ProgramSpec, Renderer

__all__ = ["ProgramSpec", "Renderer"]
