"""A disk cache that is corrupt, locked or read-only: reported once with its path, and work goes on without it.

Each condition is made for real (garbage bytes, a truncated database, chmod, a second connection holding a write
lock, sqlite's read-only open mode). The in-process tests call the cache directly; the end-to-end ones run real
kernels on PYTHON (whose BEAM search reads and writes the cache) and CLANG (whose compiler does) in a fresh process
and check their results against numpy.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import math
import os
import pathlib
import random
import shutil
import sqlite3
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from tgcore import Device, helpers
from tgcore.helpers import CacheWarning, diskcache, diskcache_clear, diskcache_get, diskcache_put


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[pathlib.Path]:
    """A cache of this test's own, and a process that has seen no broken cache yet."""
    path = tmp_path / "cache" / "cache.db"
    monkeypatch.setattr(helpers, "CACHEDB", str(path))
    monkeypatch.setattr(helpers, "CACHELEVEL", 2)
    monkeypatch.setattr(helpers, "_db_connection", None)
    monkeypatch.setattr(helpers, "_db_tables", set())
    monkeypatch.setattr(helpers, "_db_unusable", set())
    monkeypatch.setattr(helpers, "_db_unwritable", set())
    monkeypatch.setattr(helpers, "_db_locked_until", {})
    monkeypatch.setattr(helpers, "_db_reported", set())
    yield path
    if helpers._db_connection is not None:
        helpers._db_connection.close()


def cache_warnings(record: list[warnings.WarningMessage]) -> list[str]:
    """The messages of the CacheWarnings among the recorded warnings."""
    return [str(w.message) for w in record if issubclass(w.category, CacheWarning)]


def exercise(path: pathlib.Path | str, write: bool = True) -> list[str]:
    """Use the cache the ways tgcore does (reads, writes, the decorator, clear) and return its warnings."""
    helpers.CACHEDB = str(path)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        for i in range(3):
            assert diskcache_get("exercise", f"k{i}") is None
            if write:
                assert diskcache_put("exercise", f"k{i}", [i]) == [i]

        @diskcache
        def square(x: int) -> int:
            return x * x

        assert square(7) == 49 and square(7) == 49
    return cache_warnings(record)


def make_database(path: pathlib.Path, rows: int = 0, journal_mode: str = "wal") -> None:
    """A valid cache database at path holding rows entries of table "exercise", in the given journal mode."""
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute(f"PRAGMA journal_mode={journal_mode}")
    conn.execute(f'CREATE TABLE "exercise_{helpers.VERSION}" ("key" text, val blob, PRIMARY KEY ("key"))')
    with conn:  # one transaction: one sync of the file, not one per row
        conn.execute("BEGIN")
        for i in range(rows):
            conn.execute(f'INSERT INTO "exercise_{helpers.VERSION}" VALUES (?, ?)', (f"row{i}", os.urandom(2000)))
    if journal_mode == "wal":
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # every row in the main file, so copies of it are complete
    conn.close()


def digest(path: pathlib.Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# **************** in-process: the cache functions ****************


@pytest.mark.parametrize(
    "content",
    [os.urandom(4096), b"SQLite format 3\x00" + os.urandom(4000), b"a text file\n" * 300],
    ids=["random-bytes", "sqlite-header-then-garbage", "text"],
)
def test_a_file_that_is_not_a_database_is_reported_once_and_left_alone(
    isolated_cache: pathlib.Path, content: bytes
) -> None:
    isolated_cache.parent.mkdir(parents=True)
    isolated_cache.write_bytes(content)
    messages = exercise(isolated_cache)
    assert len(messages) == 1, messages
    assert str(isolated_cache) in messages[0]
    assert "not a usable sqlite database" in messages[0] and "delete the file" in messages[0]
    assert "CACHEDB" in messages[0] and "CACHELEVEL=0" in messages[0]
    assert isolated_cache.read_bytes() == content  # a broken cache is reported, never overwritten


def test_a_truncated_database_is_reported_once(isolated_cache: pathlib.Path) -> None:
    make_database(isolated_cache, rows=200, journal_mode="delete")
    whole = isolated_cache.read_bytes()
    isolated_cache.write_bytes(whole[: len(whole) // 3])
    messages = exercise(isolated_cache)
    assert len(messages) == 1, messages
    assert str(isolated_cache) in messages[0] and "truncated" in messages[0]
    assert "malformed" in messages[0]  # sqlite's own words are passed on


def test_a_damaged_entry_is_a_miss_reported_once(isolated_cache: pathlib.Path) -> None:
    diskcache_put("entries", "good", [1, 2])
    diskcache_put("entries", "bad", [3])
    diskcache_put("entries", "bad2", [4])
    helpers.db_connection().execute(f"""UPDATE "entries_{helpers.VERSION}" SET val='{{"t": [1' WHERE key!='good'""")
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        assert diskcache_get("entries", "bad") is None
        assert diskcache_get("entries", "bad2") is None
    messages = cache_warnings(record)
    assert len(messages) == 1 and str(isolated_cache) in messages[0], messages


def test_a_read_only_database_is_read_but_not_written(isolated_cache: pathlib.Path) -> None:
    diskcache_put("exercise", "kept", b"\x7fELF kernel")
    helpers.db_connection().close()
    helpers._db_connection = None
    before = digest(isolated_cache)
    uri = f"file:{isolated_cache}?mode=ro"  # sqlite refuses every write, whoever runs the test (root included)
    helpers.CACHEDB = uri
    assert diskcache_get("exercise", "kept") == b"\x7fELF kernel"
    messages = exercise(uri)
    assert diskcache_get("exercise", "kept") == b"\x7fELF kernel"  # reads still hit after the report
    assert len(messages) == 1, messages
    assert uri in messages[0] and "cannot be written" in messages[0] and "still used" in messages[0]
    assert "attempt to write a readonly database" in messages[0]
    assert digest(isolated_cache) == before


class HeldLock:
    """A second connection to a database that holds its write lock (BEGIN EXCLUSIVE) until released."""

    def __init__(self, path: pathlib.Path) -> None:
        self.conn = sqlite3.connect(path, isolation_level=None)
        self.conn.execute("BEGIN EXCLUSIVE")
        self.conn.execute(f'INSERT INTO "exercise_{helpers.VERSION}" VALUES (?, ?)', ("uncommitted", b""))

    def release(self) -> None:
        self.conn.rollback()
        self.conn.close()


def test_a_locked_database_costs_one_short_wait_and_one_report(
    isolated_cache: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_database(isolated_cache, journal_mode="delete")  # in this mode an exclusive lock stops reads too
    lock = HeldLock(isolated_cache)
    try:
        start = time.perf_counter()
        messages = exercise(isolated_cache)
        took = time.perf_counter() - start
    finally:
        lock.release()
    assert len(messages) == 1, messages
    assert str(isolated_cache) in messages[0] and "stayed locked" in messages[0] and "database is locked" in messages[0]
    assert helpers._DB_LOCK_TIMEOUT_S <= took < helpers._DB_LOCK_TIMEOUT_S + 2.0  # one wait, not one per call
    # within the back-off the cache is skipped; after it, it is used again, with no new report
    assert diskcache_put("exercise", "later", 1) == 1 and diskcache_get("exercise", "later") is None
    monkeypatch.setattr(helpers, "_db_locked_until", {})
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        diskcache_put("exercise", "later", 1)
        assert diskcache_get("exercise", "later") == 1
    assert cache_warnings(record) == []


class BusyWalSwitch:
    """A connection whose first `busy` requests for WAL mode answer "database is locked" at once, as sqlite does while
    another process is opening the same new database (it does not wait for that lock as for others)."""

    def __init__(self, conn: sqlite3.Connection, busy: float) -> None:
        self.conn, self.busy, self.asked = conn, busy, 0

    def execute(self, sql: str, *args: object) -> sqlite3.Cursor:
        if sql.upper().startswith("PRAGMA JOURNAL_MODE=WAL"):
            self.asked += 1
            if self.asked <= self.busy:
                raise sqlite3.OperationalError("database is locked")
        return self.conn.execute(sql, *args)

    def __getattr__(self, name: str) -> object:
        return getattr(self.conn, name)


@pytest.mark.parametrize("busy", [1, 5])
def test_a_new_database_another_process_is_opening_is_asked_again(
    isolated_cache: pathlib.Path, monkeypatch: pytest.MonkeyPatch, busy: int
) -> None:
    # two processes that open a new cache at once: the one whose switch to WAL is answered "locked" at once asks again
    # (it had run 60 s without the cache, reporting a lock held for more than 2 s)
    made: list[BusyWalSwitch] = []
    connect = sqlite3.connect

    def connect_busy(*args: object, **kwargs: object) -> BusyWalSwitch:
        made.append(BusyWalSwitch(connect(*args, **kwargs), busy))  # type: ignore[arg-type]
        return made[-1]

    monkeypatch.setattr(helpers.sqlite3, "connect", connect_busy)
    assert exercise(isolated_cache) == []
    assert made and made[0].asked == busy + 1
    assert diskcache_get("exercise", "k2") == [2]
    assert helpers.db_connection().execute("PRAGMA journal_mode").fetchone()[0].lower() == "wal"


def test_a_new_database_that_stays_busy_is_reported_after_the_usual_wait(
    isolated_cache: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    connect = sqlite3.connect
    monkeypatch.setattr(helpers.sqlite3, "connect", lambda *a, **k: BusyWalSwitch(connect(*a, **k), math.inf))
    monkeypatch.setattr(helpers, "_DB_LOCK_TIMEOUT_S", 0.3)
    start = time.perf_counter()
    messages = exercise(isolated_cache)
    took = time.perf_counter() - start
    assert len(messages) == 1 and "stayed locked" in messages[0] and "database is locked" in messages[0], messages
    assert 0.3 <= took < 2.0  # one bounded wait, then the cache is skipped


def test_a_write_lock_on_a_wal_database_does_not_stop_reads(isolated_cache: pathlib.Path) -> None:
    diskcache_put("exercise", "kept", "v")
    lock = HeldLock(isolated_cache)
    try:
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            start = time.perf_counter()
            assert diskcache_put("exercise", "new", "w") == "w"
            assert diskcache_put("exercise", "new2", "w") == "w"
            took = time.perf_counter() - start
            assert diskcache_get("exercise", "kept") == "v"
    finally:
        lock.release()
    messages = cache_warnings(record)
    assert len(messages) == 1 and "stayed locked" in messages[0], messages
    assert took < helpers._DB_LOCK_TIMEOUT_S + 2.0
    assert diskcache_get("exercise", "new") is None  # skipped, not queued


def test_each_broken_cache_is_reported_once_per_problem(tmp_path: pathlib.Path) -> None:
    first, second = tmp_path / "first.db", tmp_path / "second.db"
    first.write_bytes(b"not a database" * 100)
    second.write_bytes(b"not a database either" * 100)
    assert len(exercise(first)) == 1
    assert exercise(first) == []
    messages = exercise(second)
    assert len(messages) == 1 and str(second) in messages[0]


def test_a_healthy_cache_and_a_disabled_one_say_nothing(
    isolated_cache: pathlib.Path, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert exercise(isolated_cache) == []
    broken = tmp_path / "broken.db"
    broken.write_bytes(b"garbage" * 100)
    monkeypatch.setattr(helpers, "CACHELEVEL", 0)
    assert exercise(broken) == []  # CACHELEVEL=0: the file is never opened


def test_clear_of_a_broken_cache_reports_and_keeps_the_file(isolated_cache: pathlib.Path) -> None:
    isolated_cache.parent.mkdir(parents=True)
    isolated_cache.write_bytes(b"garbage" * 100)
    with pytest.warns(CacheWarning, match="not a usable sqlite database"):
        diskcache_clear()
    assert isolated_cache.read_bytes() == b"garbage" * 100


def test_api_mistakes_still_raise_on_a_broken_cache(isolated_cache: pathlib.Path) -> None:
    isolated_cache.parent.mkdir(parents=True)
    isolated_cache.write_bytes(b"garbage" * 100)
    with pytest.raises(ValueError, match="invalid cache table name"):
        diskcache_get("bad name", "k")
    with pytest.raises(TypeError, match="set"):
        diskcache_put("t", "k", {1})


# **************** end to end: real kernels in a fresh process ****************

# run in a child process: the kernels' results, what the cache saved, the CacheWarnings and the time spent in it
_WORKLOAD = r"""
import json, sys, time, warnings
import numpy as np
import tgcore.plugin, tgcore.engine.search
from tgcore import Device, Tensor
from tgcore.helpers import CacheWarning, Context

warnings.simplefilter("always")  # a second report must not be hidden by Python's own once-per-place rule
record = warnings.catch_warnings(record=True)
caught = record.__enter__()
cache_seconds = [0.0]

def timed(fn):
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            cache_seconds[0] += time.perf_counter() - start
    return wrapper

for module in (tgcore.plugin, tgcore.engine.search):
    module.diskcache_get, module.diskcache_put = timed(module.diskcache_get), timed(module.diskcache_put)

work = [0]  # what a cache hit saves: a compile on CLANG, a BEAM search on PYTHON
def counted(fn):
    def wrapper(*args, **kwargs):
        work[0] += 1
        return fn(*args, **kwargs)
    return wrapper

tgcore.engine.search._random_buffers = counted(tgcore.engine.search._random_buffers)
fresh = float(sys.argv[1])
a = np.linspace(-2, 2, 12, dtype=np.float32).reshape(3, 4)
out = {}
for device in sys.argv[2].split(","):
    compiler = Device[device].compiler
    if compiler.cachekey is not None:  # a compiler whose output the disk cache keeps
        compiler.compile = counted(compiler.compile)
    with Context(BEAM=1 if device == "PYTHON" else 0):
        work[0] = 0
        fixed = (Tensor(a, device=device) * 3 + 1).exp().sum(1).numpy()
        fixed_work = work[0]
        new = ((Tensor(a, device=device) + fresh).relu() * 2).numpy()
    out[device] = {"fixed": fixed.tolist(), "new": new.tolist(), "fixed_work": fixed_work}
print(json.dumps({"devices": out, "cache_seconds": cache_seconds[0],
                  "warnings": [str(w.message) for w in caught if issubclass(w.category, CacheWarning)]}))
"""

_TGCORE_SWITCHES = ("CACHELEVEL", "DISABLE_COMPILER_CACHE", "BEAM", "DEBUG", "IGNORE_BEAM_CACHE", "NOOPT", "JIT")


def _drop_file_capabilities() -> None:
    """In a child of root, before exec: drop the capabilities that let root write where the mode bits say no."""
    libc = ctypes.CDLL(None, use_errno=True)
    for capability in (1, 2, 3):  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER
        if libc.prctl(24, capability, 0, 0, 0) != 0:  # PR_CAPBSET_DROP: gone from the bounding set at exec
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP) failed")


def run_workload(cachedb: str, devices: list[str], unprivileged: bool = False) -> dict[str, Any]:
    """Run _WORKLOAD in a fresh process on devices with CACHEDB=cachedb; check its results against numpy."""
    env = {k: v for k, v in os.environ.items() if k not in _TGCORE_SWITCHES}
    env.update(CACHEDB=cachedb, BEAM_BAR="0", BEAM_TIMEOUT="5")
    fresh = 0.25 + random.randrange(1, 2**20) / 2**21  # exact in float32, and new to every run: a kernel no cache has
    preexec: Callable[[], None] | None = None
    if unprivileged and os.geteuid() == 0:
        preexec = _drop_file_capabilities
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _WORKLOAD, repr(fresh), ",".join(devices)],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            preexec_fn=preexec,
        )
    except subprocess.SubprocessError as e:
        pytest.skip(f"running as root, and root's file capabilities cannot be dropped here ({e}): chmod stops no write")
    assert proc.returncode == 0, f"the workload failed:\n{proc.stderr}"
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    a = np.linspace(-2, 2, 12, dtype=np.float32).reshape(3, 4)
    for device in devices:
        got = result["devices"][device]
        np.testing.assert_allclose(got["fixed"], np.exp(a * 3 + 1).sum(1), rtol=1e-5, err_msg=device)
        np.testing.assert_allclose(got["new"], np.maximum(a + np.float32(fresh), 0) * 2, rtol=1e-6, err_msg=device)
    return result


@pytest.fixture(scope="module")
def devices() -> list[str]:
    """PYTHON, and CLANG where it is installed and works here (the clang tox env runs this file with it)."""
    return ["PYTHON"] + (["CLANG"] if Device.status("CLANG") is None else [])


@pytest.fixture(scope="module")
def populated(tmp_path_factory: pytest.TempPathFactory, devices: list[str]) -> pathlib.Path:
    """A healthy cache database that holds the workload's fixed kernels; a second run hits them and says nothing."""
    path = tmp_path_factory.mktemp("populated") / "cache.db"
    first = run_workload(str(path), devices)
    assert first["warnings"] == [] and all(first["devices"][d]["fixed_work"] > 0 for d in devices), first
    second = run_workload(str(path), devices)
    assert second["warnings"] == [], second
    assert all(second["devices"][d]["fixed_work"] == 0 for d in devices), second  # served from the cache
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # all of it in the main file, so a copy of the file is all of it
    conn.close()
    return path


def _copy(populated: pathlib.Path, folder: pathlib.Path, journal_mode: str = "wal") -> pathlib.Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "cache.db"
    shutil.copyfile(populated, path)
    if journal_mode != "wal":
        conn = sqlite3.connect(path)
        conn.execute(f"PRAGMA journal_mode={journal_mode}")
        conn.close()
    return path


# condition -> (what the warning says, whether the cached kernels are still used)
_CONDITIONS = {
    "garbage": ("not a usable sqlite database", False),
    "sqlite-header-then-garbage": ("not a usable sqlite database", False),
    "truncated": ("not a usable sqlite database", False),
    "locked-rollback": ("stayed locked", False),
    "locked-wal": ("stayed locked", True),
    "read-only-uri": ("cannot be written", True),
    "read-only-file": ("cannot be written", True),
    "read-only-folder-rollback": ("cannot be written", True),
    "read-only-folder-wal": ("cannot be read from its read-only folder", False),
    "read-only-folder-new": ("cannot be opened or created", False),
}


@pytest.mark.parametrize("condition", list(_CONDITIONS))
def test_kernels_run_right_through_a_broken_cache(
    condition: str, populated: pathlib.Path, devices: list[str], tmp_path: pathlib.Path
) -> None:
    expected, hits = _CONDITIONS[condition]
    folder = tmp_path / "cache"
    path = _copy(populated, folder, "delete" if condition.endswith("rollback") else "wal")
    cachedb, unprivileged, lock, read_only = str(path), False, None, []
    if condition == "garbage":
        path.write_bytes(os.urandom(path.stat().st_size))
    elif condition == "sqlite-header-then-garbage":
        path.write_bytes(path.read_bytes()[:100] + os.urandom(path.stat().st_size - 100))
    elif condition == "truncated":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 3])
    elif condition == "read-only-uri":
        cachedb = f"file:{path}?mode=ro"
    elif condition == "read-only-file":
        read_only, unprivileged = [path], True
    elif condition == "read-only-folder-new":
        path.unlink()
        read_only, unprivileged = [folder], True
    elif condition.startswith("read-only-folder"):
        read_only, unprivileged = [folder], True
    before = path.read_bytes() if path.exists() else None
    if condition.startswith("locked"):
        # held by this process while the child runs; taken after the read above, as closing any file of a
        # database drops the POSIX locks this process holds on it
        lock = sqlite3.connect(path, isolation_level=None)
        lock.execute("BEGIN EXCLUSIVE")
    for p in read_only:
        p.chmod(0o555 if p.is_dir() else 0o444)
    try:
        result = run_workload(cachedb, devices, unprivileged=unprivileged)
    finally:
        for p in read_only:
            p.chmod(0o755 if p.is_dir() else 0o644)
        if lock is not None:
            lock.close()
    messages = result["warnings"]
    assert len(messages) == 1, messages
    assert cachedb in messages[0] and expected in messages[0] and "CACHEDB" in messages[0], messages[0]
    for device in devices:
        saved = result["devices"][device]["fixed_work"] == 0
        assert saved == hits, f"{device}: cached kernels {'not ' * hits}used through a {condition} cache: {result}"
    if condition.startswith("locked"):
        assert result["cache_seconds"] < helpers._DB_LOCK_TIMEOUT_S + 2.0, result  # one bounded wait in all
    else:
        assert (path.read_bytes() if path.exists() else None) == before  # nothing written, nothing repaired
