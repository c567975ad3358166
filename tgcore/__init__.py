"""tgcore: a small, fast deep-learning framework whose devices are plugins."""

from tgcore.device import Device
from tgcore.dtype import dtypes
from tgcore.engine.jit import TinyJit
from tgcore.helpers import Context, GlobalCounters, fetch
from tgcore.shape.symbolic import Variable
from tgcore.tensor import Tensor

__version__ = "0.2.0"
__all__ = ["Tensor", "TinyJit", "Device", "dtypes", "Context", "GlobalCounters", "Variable", "fetch"]
