"""Small helpers shared by every layer: env flags, list utilities, timing, the sqlite disk cache, downloads, ctypes."""

from __future__ import annotations

import base64
import contextlib
import cProfile
import ctypes
import functools
import hashlib
import importlib
import itertools
import json
import operator
import os
import pathlib
import platform
import pstats
import re
import secrets
import socket
import sqlite3
import stat
import string
import subprocess
import tempfile
import threading
import time
import warnings
import zlib
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, TypeGuard, TypeVar

try:
    import fcntl
except ImportError:  # (not on Windows: stale temporary files are then left for the user)
    fcntl = None  # type: ignore[assignment]

if TYPE_CHECKING:
    from typing import Self

# NOTE: this module is the bottom layer: it must not import anything from tgcore.

T = TypeVar("T")
U = TypeVar("U")

OSX: bool = platform.system() == "Darwin"
CI: bool = os.getenv("CI", "") != ""


# **************** sequences and dicts ****************


def prod(x: Iterable[T]) -> T | int:
    """Product of the items; the int 1 for an empty iterable, whatever the item type."""
    return functools.reduce(operator.mul, x, 1)


def dedup(x: Iterable[T]) -> list[T]:
    """The items without repeats, in order of first appearance."""
    return list(dict.fromkeys(x))


def argfix(*x: Any) -> tuple[Any, ...]:
    """Accept either f(a, b, c) or f((a, b, c)) / f([a, b, c]) and return (a, b, c)."""
    if x and type(x[0]) in (tuple, list):
        if len(x) != 1:
            raise ValueError(
                f"expected either one tuple/list or separate arguments, got a {type(x[0]).__name__} "
                f"followed by {len(x) - 1} more argument(s): {x!r}"
            )
        return tuple(x[0])
    return x


def argsort(x: Sequence[Any]) -> Any:
    """Indices that sort x, returned in the same sequence type as x."""
    return type(x)(sorted(range(len(x)), key=x.__getitem__))  # type: ignore[call-arg]


def all_same(items: Sequence[Any]) -> bool:
    """True when every item equals the first (and for an empty sequence)."""
    return all(item == items[0] for item in items)


def all_int(t: Sequence[Any]) -> TypeGuard[tuple[int, ...]]:
    """True when every item is an int (symbolic sizes are not)."""
    return all(isinstance(s, int) for s in t)


_COLORS: tuple[str, ...] = ("black", "red", "green", "yellow", "blue", "magenta", "cyan", "white")


def colored(st: Any, color: str | None, background: bool = False) -> str:
    """Wrap st in an ANSI color code; an UPPER CASE color name selects the bright variant, None leaves st as is."""
    if color is None:
        return st
    code = 30 + _COLORS.index(color.lower()) + 60 * (color.upper() == color) + 10 * background
    return f"\u001b[{code}m{st}\u001b[0m"


_ANSI_ESCAPE = re.compile("\x1b\\[(K|.*?m)")


def ansistrip(s: str) -> str:
    """s without its ANSI color and erase-line escape codes."""
    return _ANSI_ESCAPE.sub("", s)


def ansilen(s: str) -> int:
    """Length of s as printed, ignoring ANSI escape codes."""
    return len(ansistrip(s))


def make_pair(x: int | tuple[int, ...], cnt: int = 2) -> tuple[int, ...]:
    """Repeat an int cnt times; a tuple is returned unchanged."""
    return (x,) * cnt if isinstance(x, int) else x


def flatten(nested: Iterable[Iterable[T]]) -> list[T]:
    """Flatten one level of nesting."""
    return [item for inner in nested for item in inner]


def fully_flatten(nested: Iterable[Any]) -> list[Any]:
    """Flatten any depth of nested lists and tuples."""
    out: list[Any] = []
    for item in nested:
        if isinstance(item, (tuple, list)):
            out.extend(fully_flatten(item))
        else:
            out.append(item)
    return out


def fromimport(mod: str, frm: str) -> Any:
    """Equivalent of `from mod import frm`, returning frm (an attribute or a submodule)."""
    module = importlib.import_module(mod)
    if not hasattr(module, frm):
        importlib.import_module(f"{mod}.{frm}")
    return getattr(module, frm)


def strip_parens(fst: str) -> str:
    """Drop one pair of outer parentheses when they enclose the whole expression."""
    if len(fst) < 2 or fst[0] != "(" or fst[-1] != ")":
        return fst
    inner = fst[1:-1]
    return inner if inner.find("(") <= inner.find(")") else fst


def round_up(num: Any, amt: int) -> Any:
    """Smallest multiple of amt that is >= num."""
    return (num + amt - 1) // amt * amt


def merge_dicts(ds: Iterable[dict[T, U]]) -> dict[T, U]:
    """Merge dicts into one; raise ValueError when two of them give the same key different values."""
    merged: dict[T, U] = {}
    for d in ds:
        for k, v in d.items():
            if k in merged and merged[k] is not v and merged[k] != v:
                raise ValueError(f"cannot merge dicts: key {k!r} has two different values, {merged[k]!r} and {v!r}")
            merged.setdefault(k, v)
    return merged


def partition(lst: Iterable[T], fxn: Callable[[T], bool]) -> tuple[list[T], list[T]]:
    """Split lst into (items where fxn is true, items where it is false), keeping order."""
    matching: list[T] = []
    rest: list[T] = []
    for item in lst:
        (matching if fxn(item) else rest).append(item)
    return matching, rest


def unwrap(x: T | None) -> T:
    """x, asserting that it is not None."""
    if x is None:
        raise AssertionError("unwrap: expected a value, got None")
    return x


def unwrap2(x: tuple[T, Any]) -> T:
    """The value of a (value, error) pair, raising AssertionError with the error when there is one."""
    ret, err = x
    if err is not None:
        raise AssertionError(str(err))
    return ret


def get_child(obj: Any, key: str) -> Any:
    """Follow a dotted path ("layers.0.weight") through attributes, dict keys and sequence indices."""
    for part in key.split("."):
        if part.isnumeric():
            obj = obj[int(part)]
        elif isinstance(obj, dict):
            obj = obj[part]
        else:
            obj = getattr(obj, part)
    return obj


def get_contraction(old_shape: tuple[Any, ...], new_shape: tuple[Any, ...]) -> list[list[int]] | None:
    """Group old_shape's axes so that each group multiplies to one axis of new_shape; None when impossible."""
    old_prefix_products = list(itertools.accumulate(old_shape, operator.mul))
    group_ends: list[int] = []
    for acc in itertools.accumulate(new_shape, operator.mul):
        if acc == 1:
            group_ends.append(0)
            continue
        try:
            group_ends.append(old_prefix_products.index(acc) + 1)
        except ValueError:
            return None
    starts = [0] + group_ends[:-1]
    ends = group_ends[:-1] + [len(old_shape)]
    return [list(range(start, end)) for start, end in zip(starts, ends)]


_FUNCTION_NAME_CHARS = frozenset(string.ascii_letters + string.digits + "_")


@functools.cache
def to_function_name(s: str) -> str:
    """A C identifier made from s: ANSI codes removed, other characters replaced by their hex code."""
    return "".join(c if c in _FUNCTION_NAME_CHARS else f"{ord(c):02X}" for c in ansistrip(s))


@functools.cache
def getenv(key: str, default: Any = 0) -> Any:
    """The environment variable key converted to the type of default (read once, then cached)."""
    return type(default)(os.getenv(key, default))


def temp(x: str) -> str:
    """Path of x inside the system temporary directory, as a POSIX string."""
    return (pathlib.Path(tempfile.gettempdir()) / x).as_posix()


# **************** context variables ****************


class GraphException(Exception):
    """Raised when a graph (batched) executor cannot take a set of kernels."""


class ContextVar:
    """A named int flag, read from the environment on creation; one instance per key."""

    _cache: ClassVar[dict[str, ContextVar]] = {}
    value: int
    key: str

    def __new__(cls, key: str, default_value: int) -> ContextVar:  # noqa: PYI034
        """The one ContextVar for key (shared by every caller), created from the environment on first use."""
        if key in ContextVar._cache:
            return ContextVar._cache[key]
        instance = ContextVar._cache[key] = super().__new__(cls)
        instance.value, instance.key = getenv(key, default_value), key
        return instance

    def __repr__(self) -> str:
        return f"ContextVar({self.key!r}, value={self.value!r})"

    def __bool__(self) -> bool:
        return bool(self.value)

    def __eq__(self, x: object) -> bool:
        return self is x if isinstance(x, ContextVar) else self.value == x

    __hash__ = object.__hash__

    def __ge__(self, x: Any) -> bool:
        return self.value >= x

    def __gt__(self, x: Any) -> bool:
        return self.value > x

    def __le__(self, x: Any) -> bool:
        return self.value <= x

    def __lt__(self, x: Any) -> bool:
        return self.value < x


class Context(contextlib.ContextDecorator):
    """Temporarily set ContextVar values: `with Context(DEBUG=2):` or `@Context(BEAM=1)`; restored on exit."""

    def __init__(self, **kwargs: int) -> None:
        self.kwargs = kwargs
        self._saved: list[dict[str, int]] = []

    def __enter__(self) -> Self:
        unknown = sorted(k for k in self.kwargs if k not in ContextVar._cache)
        if unknown:
            raise KeyError(f"Context got unknown ContextVar(s) {unknown}; known: {sorted(ContextVar._cache)}")
        self._saved.append({k: ContextVar._cache[k].value for k in self.kwargs})
        for k, v in self.kwargs.items():
            ContextVar._cache[k].value = v
        return self

    def __exit__(self, *exc: object) -> None:
        for k, v in self._saved.pop().items():
            ContextVar._cache[k].value = v


# one thread at a time schedules and runs lazy graphs (kernels themselves may use many threads): graphs of several
# threads share nodes (a model's weights), and scheduling marks nodes realized; Tensor.realize holds it
ENGINE_LOCK = threading.RLock()

DEBUG = ContextVar("DEBUG", 0)
IMAGE = ContextVar("IMAGE", 0)
BEAM = ContextVar("BEAM", 0)
NOOPT = ContextVar("NOOPT", 0)
JIT = ContextVar("JIT", 1)
WINO = ContextVar("WINO", 0)
THREEFRY = ContextVar("THREEFRY", 0)
CACHECOLLECTING = ContextVar("CACHECOLLECTING", 1)
GRAPH = ContextVar("GRAPH", 0)
GRAPHPATH: str = getenv("GRAPHPATH", temp("net"))
SAVE_SCHEDULE = ContextVar("SAVE_SCHEDULE", 0)
RING = ContextVar("RING", 1)
MULTIOUTPUT = ContextVar("MULTIOUTPUT", 1)


# **************** global counters ****************


class GlobalCounters:
    """Process-wide counters of the work done; reset() clears all but mem_used."""

    global_ops: ClassVar[int] = 0
    global_mem: ClassVar[int] = 0
    time_sum_s: ClassVar[float] = 0.0
    kernel_count: ClassVar[int] = 0
    mem_used: ClassVar[int] = 0  # tracks live allocations, so reset() leaves it alone
    # kernels whose rendered source came from the disk table of rendered kernels (engine/realize.py)
    program_cache_hits: ClassVar[int] = 0

    @staticmethod
    def reset() -> None:
        """Zero the per-run counters."""
        GlobalCounters.global_ops, GlobalCounters.global_mem = 0, 0
        GlobalCounters.time_sum_s, GlobalCounters.kernel_count = 0.0, 0
        GlobalCounters.program_cache_hits = 0


# **************** timer and profiler ****************


class Timing(contextlib.ContextDecorator):
    """Print the wall time of a block as "<prefix>  1.23 ms", plus on_exit(elapsed_ns) if given."""

    def __init__(self, prefix: str = "", on_exit: Callable[[int], str] | None = None, enabled: bool = True) -> None:
        self.prefix, self.on_exit, self.enabled = prefix, on_exit, enabled

    def __enter__(self) -> Self:
        self.st = time.perf_counter_ns()
        return self

    def __exit__(self, *exc: object) -> None:
        self.et = time.perf_counter_ns() - self.st
        if self.enabled:
            print(f"{self.prefix}{self.et * 1e-6:6.2f} ms" + (self.on_exit(self.et) if self.on_exit else ""))


def _format_fcn(fcn: tuple[str, int, str]) -> str:
    """A pstats function key (file, line, name) as "file:line:name"."""
    return f"{fcn[0]}:{fcn[1]}:{fcn[2]}"


class Profiling(contextlib.ContextDecorator):
    """cProfile a block and print the top `frac` of functions by `sort`; optionally dump the stats to fn."""

    def __init__(
        self, enabled: bool = True, sort: str = "cumtime", frac: float = 0.2, fn: str | None = None, ts: float = 1
    ) -> None:
        self.enabled, self.sort, self.frac, self.fn, self.time_scale = enabled, sort, frac, fn, 1e3 / ts

    def __enter__(self) -> Self:
        self.pr = cProfile.Profile()
        if self.enabled:
            self.pr.enable()
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.enabled:
            return
        self.pr.disable()
        if self.fn:
            self.pr.dump_stats(self.fn)
        stats = pstats.Stats(self.pr).strip_dirs().sort_stats(self.sort)
        fcn_list = stats.fcn_list  # type: ignore[attr-defined]
        for fcn in fcn_list[: int(len(fcn_list) * self.frac)]:
            _primitive_calls, num_calls, tottime, cumtime, callers = stats.stats[fcn]  # type: ignore[attr-defined]
            top_callers = sorted(callers.items(), key=lambda caller: -caller[1][2])
            caller_text = ""
            if top_callers:
                share = top_callers[0][1][2] / tottime * 100 if tottime else 0.0
                caller_text = colored(f"<- {share:3.0f}% {_format_fcn(top_callers[0][0])}", "BLACK")
            name = _format_fcn(fcn)
            print(
                f"n:{num_calls:8d}  tm:{tottime * self.time_scale:7.2f}ms  tot:{cumtime * self.time_scale:7.2f}ms",
                colored(name, "yellow") + " " * (50 - len(name)),
                caller_text,
            )


# **************** disk cache (sqlite, plain data only: never pickle) ****************

_cache_dir: str = os.getenv("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
CACHEDB: str = getenv("CACHEDB", os.path.abspath(os.path.join(_cache_dir, "tgcore", "cache.db")))
CACHELEVEL: int = getenv("CACHELEVEL", 2)
VERSION: int = 1

_DB_LOCK_TIMEOUT_S = 2.0  # the longest one cache operation waits for another connection's lock
_DB_LOCK_BACKOFF_S = 60.0  # after a lock outlasted that wait, the cache is skipped this long before trying again
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_KEY_SQL_TYPES: dict[type, str] = {str: "text", bool: "integer", int: "integer", float: "numeric", bytes: "blob"}

_db_lock = threading.RLock()
_db_connection: sqlite3.Connection | None = None
_db_owner: tuple[int, str] = (0, "")  # (pid, path) the open connection belongs to
_db_tables: set[tuple[str, str]] = set()  # (path, table) pairs whose table this process has created
_forked_connections: list[sqlite3.Connection] = []  # inherited across fork: kept unclosed, never used


class CacheWarning(UserWarning):
    """The disk cache at CACHEDB cannot be used as it is (corrupt, locked or read-only); work goes on without it."""


# what this process learnt about the cache databases it used, by path: they are not tried again (or, for a lock,
# not before the back-off has passed), so one bad cache costs one warning and at most one lock wait
_db_unusable: set[str] = set()  # neither read nor written
_db_unwritable: set[str] = set()  # read, never written
_db_locked_until: dict[tuple[str, bool], float] = {}  # (path, is_write) -> time.monotonic() the back-off ends
_db_reported: set[tuple[str, str]] = set()  # (path, problem) pairs already warned about

_NO_CACHE_FIX = "CACHELEVEL=0 runs without a disk cache"


def _reset_after_fork() -> None:
    """In a forked child, drop the parent's lock and connection (SQLite connections must not cross a fork)."""
    global _db_lock, _db_connection
    _db_lock = threading.RLock()
    if _db_connection is not None:
        _forked_connections.append(_db_connection)
    _db_connection = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)


def _is_uri(path: str) -> bool:
    """Whether CACHEDB is an sqlite URI (`file:cache.db?mode=ro` opens a shared cache read-only)."""
    return path.startswith("file:")


def db_connection() -> sqlite3.Connection:
    """This process's connection to CACHEDB, (re)opened when the process or CACHEDB changed."""
    global _db_connection, _db_owner
    with _db_lock:
        owner = (os.getpid(), CACHEDB)
        if _db_connection is not None and _db_owner == owner:
            return _db_connection
        if _db_connection is not None:
            if _db_owner[0] == owner[0]:
                _db_connection.close()
            else:
                _forked_connections.append(_db_connection)
            _db_connection = None
        if CACHEDB != ":memory:" and not _is_uri(CACHEDB):
            os.makedirs(os.path.dirname(os.path.abspath(CACHEDB)), exist_ok=True)
        conn = sqlite3.connect(
            CACHEDB, timeout=_DB_LOCK_TIMEOUT_S, isolation_level=None, check_same_thread=False, uri=_is_uri(CACHEDB)
        )
        try:
            if _journal_mode_wal(conn).lower() == "wal":
                conn.execute("PRAGMA synchronous=NORMAL")
        except sqlite3.OperationalError as e:
            if _problem(e, write=False) in ("locked", "unopenable"):  # the cache cannot be used now
                conn.close()
                raise
            # otherwise WAL is only an optimisation (a read-only file, a file system without shared memory)
        except BaseException:
            conn.close()
            raise
        if DEBUG >= 7:
            conn.set_trace_callback(print)
        _db_connection, _db_owner = conn, owner
        return conn


def _journal_mode_wal(conn: sqlite3.Connection) -> str:
    """Ask for WAL mode; the journal mode the database is in. Switching a new database to WAL answers "locked" at once
    while another connection is opening it too, without waiting as other statements do (two processes that opened a
    new cache together: one of them found it locked in 1 of 6-30 tries, and ran 60 s without it), so a "locked" answer
    is asked again until the lock's usual wait has passed."""
    deadline = time.monotonic() + _DB_LOCK_TIMEOUT_S
    while True:
        try:
            return str(conn.execute("PRAGMA journal_mode=WAL").fetchone()[0])
        except sqlite3.OperationalError as e:
            if _problem(e, write=False) != "locked" or time.monotonic() >= deadline:
                raise
            time.sleep(0.005)


def _problem(e: BaseException, write: bool) -> str:
    """What an error from the cache database says is wrong with it: corrupt, locked, read-only, unopenable, failed."""
    msg = str(e).lower()
    if isinstance(e, OSError):  # from creating the cache's folder
        return "unopenable"
    if "locked" in msg or "busy" in msg:
        return "locked"
    if "malformed" in msg or "not a database" in msg or type(e) is sqlite3.DatabaseError:  # SQLITE_CORRUPT, _NOTADB
        return "corrupt"
    if "readonly" in msg or "read-only" in msg:
        return "readonly"
    if "unable to open" in msg:
        return "unopenable"
    if write and ("disk is full" in msg or "disk i/o" in msg):
        return "readonly"  # what is stored can still be read
    return "failed"


def _report(path: str, problem: str, error: BaseException) -> None:
    """Warn once per process about one problem with one cache database: what is wrong, what happens now, the fix."""
    if (path, problem) in _db_reported:
        return
    _db_reported.add((path, problem))
    what, then, fix = {
        "corrupt": (
            "is not a usable sqlite database (corrupt, truncated or not a database at all)",
            "running without the disk cache",
            "It holds nothing but a cache: delete the file to start a new one, or set CACHEDB to another path",
        ),
        "readonly": (
            "cannot be written",
            "what it holds is still used, new entries are not stored",
            "Make the file and its folder writable, or set CACHEDB to a writable path",
        ),
        "unreadable": (
            "cannot be read from its read-only folder (a database in WAL mode keeps an index file beside it)",
            "running without the disk cache",
            "Make its folder writable, or set CACHEDB to a writable path",
        ),
        "unopenable": (
            "cannot be opened or created",
            "running without the disk cache",
            "Make its folder writable, or set CACHEDB to a writable path",
        ),
        "locked": (
            f"stayed locked by another connection for more than {_DB_LOCK_TIMEOUT_S:g} s",
            f"running without it for {_DB_LOCK_BACKOFF_S:g} s at a time until it is free",
            "A process holding a transaction open on it (an sqlite3 shell, a stuck program) is the usual cause: "
            "end it, or set CACHEDB to another path",
        ),
        "failed": (
            "failed",
            "running without the disk cache",
            "Delete the file, or set CACHEDB to another path",
        ),
    }[problem]
    shown = path if path == ":memory:" or _is_uri(path) else os.path.abspath(path)
    warnings.warn(
        f"the tgcore disk cache {shown} {what} ({type(error).__name__}: {error}); {then}. {fix}; {_NO_CACHE_FIX}.",
        CacheWarning,
    )


def _run_db(op: Callable[[sqlite3.Connection], T], write: bool) -> tuple[bool, T | None]:
    """(True, op(connection)), or (False, None) when the cache database cannot be used now, reported once.
    No error of the database reaches the caller, and a lock held elsewhere costs at most one bounded wait."""
    with _db_lock:
        path = CACHEDB
        if path in _db_unusable or (write and path in _db_unwritable):
            return False, None
        if time.monotonic() < _db_locked_until.get((path, write), 0.0):
            return False, None
        try:
            return True, op(db_connection())
        except (sqlite3.Error, OSError) as e:
            problem = _problem(e, write)
            if problem == "readonly" and not write:
                problem = "unreadable"  # a read that must write: the WAL index of a file in a read-only folder
            if problem == "locked":
                until = time.monotonic() + _DB_LOCK_BACKOFF_S
                _db_locked_until[(path, True)] = until
                if not write:  # a write lock held elsewhere does not stop reads: a lock that stops reads does
                    _db_locked_until[(path, False)] = until
            elif problem == "readonly":
                _db_unwritable.add(path)
            else:
                _db_unusable.add(path)
            _report(path, problem, e)
            return False, None


def _check_identifier(name: str, what: str) -> str:
    """name, if it is a plain SQL identifier; ValueError otherwise (names are put into SQL text)."""
    if not isinstance(name, str) or not _IDENTIFIER.fullmatch(name):
        raise ValueError(
            f"invalid cache {what} name {name!r}: expected letters, digits and _ (not starting with a digit)"
        )
    return name


def _quote_identifier(name: str) -> str:
    """name as a double-quoted SQL identifier, for names read back from sqlite_master."""
    return '"' + name.replace('"', '""') + '"'


def _normalize_key(key: dict[str, Any] | str | int) -> dict[str, Any]:
    """The cache key as {column: value}, with column names and value types validated."""
    columns = {"key": key} if isinstance(key, (str, int)) else key
    if not isinstance(columns, dict) or not columns:
        raise ValueError(f"cache key must be a str, an int or a non-empty dict of columns, got {key!r}")
    for column, value in columns.items():
        if _check_identifier(column, "key column") == "val":
            raise ValueError("cache key column cannot be named 'val': that column holds the value")
        if type(value) not in _KEY_SQL_TYPES:
            raise TypeError(
                f"cache key column {column!r} has unsupported type {type(value).__name__}; "
                f"expected one of {', '.join(t.__name__ for t in _KEY_SQL_TYPES)}"
            )
    return columns


def _encode_plain(obj: Any, active: set[int] | None = None) -> Any:
    """obj as JSON-ready data: scalars stay, containers and bytes become one-key tagged objects."""
    if obj is None or type(obj) in (bool, int, float, str):
        return obj
    if type(obj) is bytes:
        return {"b": base64.b64encode(obj).decode("ascii")}
    if type(obj) not in (list, tuple, dict):
        raise TypeError(
            f"cannot store a value of type {type(obj).__name__} in the disk cache: expected bytes, str, "
            "int, float, bool, None or lists/tuples/dicts of those"
        )
    active = set() if active is None else active
    if id(obj) in active:
        raise ValueError("cannot store a self-referencing container in the disk cache")
    active.add(id(obj))
    try:
        if type(obj) is dict:
            return {"d": [[_encode_plain(k, active), _encode_plain(v, active)] for k, v in obj.items()]}
        return {"l" if type(obj) is list else "t": [_encode_plain(item, active) for item in obj]}
    finally:
        active.discard(id(obj))


def _decode_plain(data: Any) -> Any:
    """Inverse of _encode_plain."""
    if not isinstance(data, dict):
        return data
    ((tag, payload),) = data.items()
    if tag == "b":
        return base64.b64decode(payload)
    if tag == "l":
        return [_decode_plain(item) for item in payload]
    if tag == "t":
        return tuple(_decode_plain(item) for item in payload)
    if tag == "d":
        return {_decode_plain(k): _decode_plain(v) for k, v in payload}
    raise ValueError(f"corrupt disk cache entry: unknown tag {tag!r}")


def _serialize(val: Any) -> bytes | str:
    """A cache value as what sqlite stores: bytes as a raw blob, anything else as tagged JSON text."""
    if type(val) is bytes:
        return val
    return json.dumps(_encode_plain(val), separators=(",", ":"))


def _deserialize(stored: bytes | str) -> Any:
    """Inverse of _serialize."""
    if isinstance(stored, bytes):
        return stored
    return _decode_plain(json.loads(stored))


def _is_missing(e: sqlite3.OperationalError) -> bool:
    """Whether an error says a table or column does not exist (nothing was stored there yet), not a broken cache."""
    msg = str(e)
    return "no such table" in msg or "no such column" in msg


def _lookup(table: str, key: dict[str, Any] | str | int) -> tuple[bool, Any]:
    """(found, value) for key in table; (False, None) when the cache is off, unusable or has no such entry."""
    if CACHELEVEL == 0:
        return False, None
    columns = _normalize_key(key)
    sql_table = f"{_check_identifier(table, 'table')}_{VERSION}"
    where = " AND ".join(f'"{c}"=?' for c in columns)

    def select(conn: sqlite3.Connection) -> tuple[Any, ...] | None:
        try:
            return conn.execute(f'SELECT val FROM "{sql_table}" WHERE {where}', tuple(columns.values())).fetchone()
        except sqlite3.OperationalError as e:
            if _is_missing(e):
                return None  # nothing was ever stored there
            raise

    ok, row = _run_db(select, write=False)
    if not ok or row is None:
        return False, None
    try:
        return True, _deserialize(row[0])
    except (ValueError, TypeError, KeyError) as e:  # bytes of a damaged file that sqlite did not notice
        with _db_lock:
            _db_unusable.add(CACHEDB)
            _report(CACHEDB, "corrupt", e)
        return False, None


def diskcache_get(table: str, key: dict[str, Any] | str | int) -> Any:
    """The value stored under key in table, or None when there is none (or the cache cannot be read)."""
    return _lookup(table, key)[1]


def diskcache_put(table: str, key: dict[str, Any] | str | int, val: T) -> T:
    """Store val (plain data or bytes) under key in table and return it; a cache that cannot be written is skipped."""
    if CACHELEVEL == 0:
        return val
    columns = _normalize_key(key)
    sql_table = f"{_check_identifier(table, 'table')}_{VERSION}"
    stored = _serialize(val)
    names = ", ".join(f'"{c}"' for c in columns)
    column_types = ", ".join(f'"{c}" {_KEY_SQL_TYPES[type(v)]}' for c, v in columns.items())
    create_sql = f'CREATE TABLE IF NOT EXISTS "{sql_table}" ({column_types}, val blob, PRIMARY KEY ({names}))'
    insert_sql = f'REPLACE INTO "{sql_table}" ({names}, val) VALUES ({", ".join("?" * (len(columns) + 1))})'
    path = CACHEDB

    def create(conn: sqlite3.Connection) -> None:
        try:
            conn.execute(create_sql)
        except sqlite3.OperationalError as e:
            if "already exists" not in str(e):  # another process created it between our check and our create
                raise
        _db_tables.add((path, sql_table))

    def insert(conn: sqlite3.Connection) -> None:
        if (path, sql_table) not in _db_tables:
            create(conn)
        try:
            conn.execute(insert_sql, (*columns.values(), stored))
        except sqlite3.OperationalError as e:
            if "no such table" not in str(e):
                raise
            create(conn)  # another process cleared the cache since we created the table
            conn.execute(insert_sql, (*columns.values(), stored))

    _run_db(insert, write=True)
    return val


def diskcache_clear() -> None:
    """Drop every table in the disk cache (a cache that cannot be written is reported and left as it is)."""

    def drop_all(conn: sqlite3.Connection) -> None:
        names = [row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        for name in names:
            if not name.startswith("sqlite_"):
                conn.execute(f"DROP TABLE IF EXISTS {_quote_identifier(name)}")

    _run_db(drop_all, write=True)
    _db_tables.clear()


def _call_key(func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """sha256 hex digest of the plain-data encoding of (function, args, kwargs)."""
    ident = f"{getattr(func, '__module__', '')}.{getattr(func, '__qualname__', repr(func))}"
    encoded = json.dumps(
        _encode_plain([ident, list(args), [[k, kwargs[k]] for k in sorted(kwargs)]]), separators=(",", ":")
    )
    return hashlib.sha256(encoded.encode("utf-8")).hexdigest()


def diskcache(func: Callable[..., T]) -> Callable[..., T]:
    """Cache func's results on disk, keyed by its arguments (which, like the result, must be plain data)."""
    table = f"cache_{to_function_name(func.__name__)}"

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> T:
        key = _call_key(func, args, kwargs)
        found, value = _lookup(table, key)
        if found:
            return value
        return diskcache_put(table, key, func(*args, **kwargs))

    return wrapper


# **************** files written beside their target, and the ones killed writers leave ****************
# (safe_save and fetch write a temporary file beside the target and rename it into place when it is complete)

# after the prefix ".<target's name>.": <machine tag>-<pid>.<random part>.tmp
_TEMP_NAME = re.compile(r"([0-9a-f]{8})-([0-9]{1,10})\.[A-Za-z0-9_]+\.tmp")


def machine_tag() -> str:
    """A short tag of this machine: a writer's process id is only looked up on the machine that wrote it."""
    return f"{zlib.crc32(socket.gethostname().encode()):08x}"


def temp_beside(path: str) -> tuple[int, str]:
    """(an open descriptor, the path) of a new, empty temporary file beside `path`, named for this writer.

    Created with mode 0o666 so that the umask gives it the permissions open() would give the file (mkstemp makes it
    private, and reading the umask means setting it, which races with other threads)."""
    folder = os.path.dirname(path) or "."
    prefix = f".{os.path.basename(path)}.{machine_tag()}-{os.getpid()}."
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
    for _ in range(100):
        tmp = os.path.join(folder, f"{prefix}{secrets.token_hex(4)}.tmp")
        try:
            return os.open(tmp, flags, 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary file name beside {path!r} after 100 tries")


def process_alive(pid: int) -> bool:
    """Whether process `pid` exists on this machine (in this process's view of it); True when unsure."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)  # signal 0: only checks that the process exists (POSIX; never called without fcntl)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True  # someone else's process, or no pid this system can have: left alone
    return True


def remove_stale_temps(path: str) -> None:
    """Remove the temporary files (temp_beside) of `path` that writers on this machine left when they were killed:
    those of a process that no longer exists and whose lock no process holds. Never one of a live writer."""
    if fcntl is None:
        return
    folder, lead, tag = os.path.dirname(path) or ".", f".{os.path.basename(path)}.", machine_tag()
    try:
        entries = os.scandir(folder)
    except OSError:
        return  # (no folder, or one we cannot list: nothing of ours to clean)
    with entries:
        for entry in entries:
            if not entry.name.startswith(lead):
                continue
            m = _TEMP_NAME.fullmatch(entry.name[len(lead) :])
            if m is None or m[1] != tag or process_alive(int(m[2])):
                continue
            try:
                if entry.is_file(follow_symlinks=False):
                    _remove_if_unlocked(entry.path)
            except OSError:
                continue  # (removed by another cleaner meanwhile, or a read-only folder: left as it is)


def _remove_if_unlocked(path: str) -> None:
    """Remove a temporary file unless a writer holds its lock (a writer in another pid namespace of this machine)."""
    assert fcntl is not None
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return  # a live writer holds it
        except OSError:
            pass  # a file system without locks: the writer could not lock it either, and its pid is gone
        now = os.stat(path, follow_symlinks=False)
        if (now.st_dev, now.st_ino) == (info.st_dev, info.st_ino):  # still the file that was locked
            os.unlink(path)
    finally:
        os.close(fd)


def lock_temp(fd: int) -> None:
    """Lock a temporary file while it is written, so that a cleaner in another pid namespace sees a live writer."""
    if fcntl is None:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # held until the file is in place (the descriptor is closed after the rename)
    except OSError:
        pass  # a file system without locks (some network ones): the pid in the name still tells live writers


# **************** downloads ****************


def fetch(
    url: str, name: pathlib.Path | str | None = None, allow_caching: bool = not getenv("DISABLE_HTTP_CACHE")
) -> pathlib.Path:
    """Download url (http(s):// or file://) to the cache or to name, returning the local path; complete files only."""
    if url.startswith(("/", ".")):
        return pathlib.Path(url)
    if name is not None and (isinstance(name, pathlib.Path) or "/" in name):
        fp = pathlib.Path(name)
    else:
        file_name = name if name else hashlib.md5(url.encode("utf-8"), usedforsecurity=False).hexdigest()
        fp = pathlib.Path(_cache_dir) / "tgcore" / "downloads" / file_name
    if fp.is_file() and allow_caching:
        return fp
    # (imported here: http.client, ssl and tqdm cost every `import tgcore` ~50 ms otherwise)
    import urllib.request

    from tqdm import tqdm

    with urllib.request.urlopen(url, timeout=10) as response:
        status = getattr(response, "status", None)
        if status not in (None, 200):
            raise RuntimeError(f"fetch {url} failed: HTTP status {status}, expected 200")
        total_length = int(response.headers.get("content-length", 0) or 0)
        fp.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temps(str(fp))  # what a download of this file that was killed left
        fd, tmp_name = temp_beside(str(fp))
        try:
            lock_temp(fd)
            with os.fdopen(fd, "wb") as f, tqdm(total=total_length, unit="B", unit_scale=True, desc=url) as progress:
                while chunk := response.read(16384):
                    progress.update(f.write(chunk))
            if total_length and (file_size := os.stat(tmp_name).st_size) != total_length:
                raise RuntimeError(f"fetch {url} incomplete: got {file_size} bytes, Content-Length said {total_length}")
            os.replace(tmp_name, fp)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp_name)
            raise
    return fp


# **************** exec helpers ****************


def cpu_time_execution(cb: Callable[[], Any], enable: bool) -> float | None:
    """Run cb; return its wall time in seconds when enable, else None."""
    st = time.perf_counter()
    cb()
    return time.perf_counter() - st if enable else None


def cpu_objdump(lib: bytes) -> None:
    """Print `objdump -d` of a compiled binary."""
    with tempfile.TemporaryDirectory() as tmp_dir:
        path = pathlib.Path(tmp_dir) / "lib.o"
        path.write_bytes(lib)
        print(subprocess.check_output(["objdump", "-d", str(path)]).decode("utf-8"))


# **************** ctypes helpers ****************


def from_mv(mv: memoryview, to_type: Any = ctypes.c_char) -> ctypes.Array:
    """A ctypes array of len(mv) to_type items sharing mv's (writable) memory."""
    return (to_type * len(mv)).from_buffer(mv)


def to_mv(ptr: Any, sz: int) -> memoryview:
    """A byte memoryview of sz bytes at the address ptr (an int or a ctypes pointer)."""
    return memoryview(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_uint8 * sz)).contents).cast("B")


def to_char_p_p(options: list[bytes], to_type: Any = ctypes.c_char) -> ctypes.Array:
    """A C `char**` array of NUL-terminated copies of options (the array keeps the copies alive)."""
    pointer_type = ctypes.POINTER(to_type)
    return (pointer_type * len(options))(*[ctypes.cast(ctypes.create_string_buffer(o), pointer_type) for o in options])


@functools.cache
def init_c_struct_t(fields: tuple[tuple[str, Any], ...]) -> type:
    """A packed (no padding) ctypes Structure type with the given (name, type) fields; one class per fields tuple."""

    class CStruct(ctypes.Structure):
        _pack_, _fields_ = 1, fields

    return CStruct


def init_c_var(ctypes_var: T, creat_cb: Callable[[T], Any]) -> T:
    """Call creat_cb(ctypes_var) (usually a C function filling it in) and return ctypes_var."""
    creat_cb(ctypes_var)
    return ctypes_var


def flat_mv(mv: memoryview) -> memoryview:
    """mv as a flat byte view (empty views are returned as they are)."""
    if len(mv) == 0:
        return mv
    return mv.cast("B", shape=(mv.nbytes,))
