"""The errors tgcore raises for bad arguments, each both what numpy raises and what torch raises for the same mistake,
so code written for either catches them."""

from __future__ import annotations

__all__ = ["ShapeError", "AxisError", "IndexOutOfRangeError", "InvalidValueError"]


class ShapeError(ValueError, RuntimeError):
    """Shapes that do not fit an operation (broadcasting, reshape, matmul, assign, cat, ...): numpy raises ValueError,
    torch RuntimeError."""


class AxisError(ValueError, IndexError):
    """An axis out of range for the tensor's dimensions, or named twice: numpy's AxisError is both a ValueError and an
    IndexError, torch raises IndexError (or RuntimeError for a repeated dim)."""


class IndexOutOfRangeError(IndexError, RuntimeError):
    """A value of an index tensor (or a class label) outside its axis, found on the device when the result is
    realized: numpy raises IndexError, torch IndexError or RuntimeError."""


class InvalidValueError(ValueError, RuntimeError):
    """Data an operation cannot take, found on the device when the result is realized (e.g. a negative multinomial
    weight): numpy raises ValueError, torch RuntimeError."""
