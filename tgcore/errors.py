"""The errors tgcore raises for bad arguments, each both what numpy raises and what torch raises for the same mistake,
so code written for either catches them."""

from __future__ import annotations

__all__ = ["ShapeError", "AxisError"]


class ShapeError(ValueError, RuntimeError):
    """Shapes that do not fit an operation (broadcasting, reshape, matmul, assign, cat, ...): numpy raises ValueError,
    torch RuntimeError."""


class AxisError(ValueError, IndexError):
    """An axis out of range for the tensor's dimensions, or named twice: numpy's AxisError is both a ValueError and an
    IndexError, torch raises IndexError (or RuntimeError for a repeated dim)."""
