"""Objects that cache their hash (dtypes, symbolic Nodes, Views, ShapeTrackers, LazyOps) pickled in one process and
loaded in another: the hash of a string differs between processes, so a pickled cached hash would make the loaded
object miss every dict and set it belongs in (a renderer's type map, a kernel cache)."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys

from tgcore.dtype import PtrDType, dtypes
from tgcore.ops import BinaryOps, BufferOps, LazyOp, MemBuffer
from tgcore.shape.shapetracker import ShapeTracker
from tgcore.shape.symbolic import NumNode, Variable
from tgcore.shape.view import View


def objects() -> dict:
    """The same objects in any process: each kind that caches its hash."""
    n = Variable("n", 1, 64)
    st = ShapeTracker.from_shape((n, 4)).permute((1, 0))
    load = LazyOp(BufferOps.LOAD, (), MemBuffer(1, dtypes.float32, st))
    return {
        "dtypes": [dtypes.float32, dtypes.uint32, dtypes.float16.vec(4), PtrDType.of(dtypes.int8)],
        "nodes": [n, n * 3 + 2, (n + 5) // 4, (n % 3) < 2],
        "view": st.views[-1],
        "st": st,
        "ast": LazyOp(BinaryOps.ADD, (load, load)),
    }


# another process builds them, hashes every one (so each caches its hash) and pickles them
MAKE = f"""
import pickle, sys
sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})
from test_pickle import objects
objs = objects()
for value in objs.values():
    [hash(v) for v in (value if isinstance(value, list) else [value])]
sys.stdout.buffer.write(pickle.dumps(objs))
"""


def test_pickled_objects_hash_as_this_process_builds_them() -> None:
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    got = pickle.loads(subprocess.run([sys.executable, "-c", MAKE], env=env, capture_output=True, check=True).stdout)
    want = objects()
    n = want["nodes"][0]
    for key, value in want.items():
        assert got[key] == value, key
        values = value if isinstance(value, list) else [value]
        loaded = got[key] if isinstance(got[key], list) else [got[key]]
        for a, b in zip(loaded, values):
            assert hash(a) == hash(b), (key, b)
            assert a in {b: 1}, (key, b)
    assert type(got["dtypes"][3]) is PtrDType and got["dtypes"][3].base == dtypes.int8
    assert got["nodes"][1].substitute({n: NumNode(2)}) == NumNode(8)  # a loaded Node still computes
    assert isinstance(got["view"], View) and got["ast"].src[0] is got["ast"].src[1]
