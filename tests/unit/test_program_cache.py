"""The disk table of rendered kernels: a new process with a warm cache skips lowering and gets the same bits."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tgcore import Device

# the table serves devices whose compiler has a cache key (the PYTHON interpreter's has none): CLANG here, which the
# clang tox env installs and runs this file on
pytestmark = pytest.mark.skipif(
    "CLANG" not in Device.available(), reason="needs the CLANG device (tg-clang): the clang tox env runs this file"
)

_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import tgcore.codegen.program as program
    import tgcore.engine.realize as realize
    from tgcore import Tensor, dtypes
    from tgcore.helpers import GlobalCounters

    calls = []
    real = realize.to_program

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    realize.to_program = counted
    dtype = getattr(dtypes, sys.argv[1])
    a = Tensor(np.arange(48, dtype=np.float64).reshape(6, 8) / 7 - 2.5, dtype=dtype)
    b = Tensor(np.linspace(-1, 1, 64).reshape(8, 8), dtype=dtype)
    out = ((a @ b).relu() + a.sum(1, keepdim=True) * -0.0).exp().numpy()
    print(json.dumps({"bits": out.tobytes().hex(), "lowered": len(calls), "hits": GlobalCounters.program_cache_hits}))
    """
)


def _run(db: str, dtype: str = "float32", **env: str) -> dict:
    full = {**os.environ, "CACHEDB": db, "CACHELEVEL": "2", "DEVICE": "CLANG", **env}
    full.pop("DISABLE_PROGRAM_CACHE", None)
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT, dtype], env=full, capture_output=True, text=True, timeout=300, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture
def db(tmp_path) -> str:
    return str(tmp_path / "cache.db")


def test_new_process_skips_lowering_with_same_bits(db: str) -> None:
    first = _run(db)
    assert first["lowered"] >= 1 and first["hits"] == 0
    second = _run(db)
    assert second["lowered"] == 0
    assert second["hits"] == first["lowered"]
    assert second["bits"] == first["bits"]


def test_other_dtype_misses(db: str) -> None:
    _run(db)
    other = _run(db, "float64")
    assert other["hits"] == 0 and other["lowered"] >= 1


def test_noopt_misses_and_then_hits(db: str) -> None:
    base = _run(db)
    noopt = _run(db, NOOPT="1")
    assert noopt["hits"] == 0 and noopt["lowered"] >= 1
    again = _run(db, NOOPT="1")
    assert again["lowered"] == 0 and again["bits"] == noopt["bits"]
    assert _run(db)["bits"] == base["bits"]


def test_corrupt_entry_falls_back(db: str) -> None:
    import sqlite3

    first = _run(db)
    conn = sqlite3.connect(db)
    tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'") if "program" in r[0]]
    assert tables
    for t in tables:
        conn.execute(f'UPDATE "{t}" SET val = ?', (json.dumps({"d": [["name", 3]]}),))
    conn.commit()
    conn.close()
    again = _run(db)
    assert again["hits"] == 0 and again["lowered"] == first["lowered"]
    assert again["bits"] == first["bits"]
