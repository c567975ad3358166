"""Tests for tgcore.helpers: utilities, context vars, timing, the sqlite disk cache, fetch and the ctypes helpers."""

from __future__ import annotations

import array
import ctypes
import gc
import hashlib
import http.server
import math
import multiprocessing
import os
import pathlib
import platform
import pstats
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tgcore import helpers
from tgcore.helpers import (
    BEAM,
    CACHECOLLECTING,
    CI,
    DEBUG,
    GRAPH,
    GRAPHPATH,
    IMAGE,
    JIT,
    MULTIOUTPUT,
    NOOPT,
    OSX,
    RING,
    SAVE_SCHEDULE,
    THREEFRY,
    WINO,
    Context,
    ContextVar,
    GlobalCounters,
    GraphException,
    Profiling,
    T,
    Timing,
    U,
    _format_fcn,
    all_int,
    all_same,
    ansilen,
    ansistrip,
    argfix,
    argsort,
    colored,
    cpu_objdump,
    cpu_time_execution,
    db_connection,
    dedup,
    diskcache,
    diskcache_clear,
    diskcache_get,
    diskcache_put,
    fetch,
    flat_mv,
    flatten,
    from_mv,
    fromimport,
    fully_flatten,
    get_child,
    get_contraction,
    getenv,
    init_c_struct_t,
    init_c_var,
    make_pair,
    merge_dicts,
    partition,
    prod,
    round_up,
    strip_parens,
    temp,
    to_char_p_p,
    to_function_name,
    to_mv,
    unwrap,
    unwrap2,
)

_IMPORT_TIME_CACHEDB = helpers.CACHEDB


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[pathlib.Path]:
    """Point the disk cache and the download cache at a temporary folder, so no test touches the user's cache."""
    cache_root = tmp_path / "cache_root"
    monkeypatch.setattr(helpers, "CACHEDB", str(cache_root / "tgcore" / "cache.db"))
    monkeypatch.setattr(helpers, "CACHELEVEL", 2)
    monkeypatch.setattr(helpers, "_cache_dir", str(cache_root))
    monkeypatch.setattr(helpers, "_db_connection", None)
    monkeypatch.setattr(helpers, "_db_tables", set())
    yield cache_root
    if helpers._db_connection is not None:
        helpers._db_connection.close()


def same_plain(a: Any, b: Any) -> bool:
    """Equality that also requires identical types all the way down (so (1,) differs from [1] and 1 from True)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return (math.isnan(a) and math.isnan(b)) or repr(a) == repr(b)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same_plain(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return (
            list(a) == list(b)
            and all(same_plain(k1, k2) for k1, k2 in zip(a, b))
            and all(same_plain(a[k], b[k]) for k in a)
        )
    return a == b


# **************** sequences and dicts ****************


def test_platform_flags() -> None:
    assert OSX is (platform.system() == "Darwin")
    assert CI is (os.getenv("CI", "") != "")


def test_type_vars() -> None:
    assert isinstance(T, TypeVar) and T.__name__ == "T"
    assert isinstance(U, TypeVar) and U.__name__ == "U"


def test_prod() -> None:
    assert prod([2, 3, 4]) == 24
    assert prod(x for x in (5, 7)) == 35
    assert prod((1.5, 2)) == 3.0
    empty = prod([])
    assert empty == 1 and type(empty) is int
    assert prod(()) == 1


def test_dedup_keeps_first_occurrence_order() -> None:
    assert dedup([3, 1, 3, 2, 1]) == [3, 1, 2]
    assert dedup("abca") == ["a", "b", "c"]
    assert dedup([]) == []


def test_argfix() -> None:
    assert argfix(1, 2, 3) == (1, 2, 3)
    assert argfix((1, 2)) == (1, 2)
    assert argfix([4, 5]) == (4, 5)
    assert argfix() == ()
    assert argfix(7) == (7,)


def test_argfix_rejects_sequence_plus_extra_args() -> None:
    with pytest.raises(ValueError, match="one tuple/list or separate arguments"):
        argfix((1, 2), 3)
    with pytest.raises(ValueError, match="list"):
        argfix([1], [2])


def test_argsort() -> None:
    assert argsort([3, 1, 2]) == [1, 2, 0]
    assert argsort((10, 30, 20)) == (0, 2, 1)
    assert argsort([]) == []


def test_all_same_and_all_int() -> None:
    assert all_same([]) is True
    assert all_same([1, 1, 1]) is True
    assert all_same([1, 2, 1]) is False
    assert all_int((1, 2, 3)) is True
    assert all_int(()) is True
    assert all_int((1, 2.0)) is False


def test_colored() -> None:
    assert colored("hi", "red") == "\x1b[31mhi\x1b[0m"
    assert colored("hi", "RED") == "\x1b[91mhi\x1b[0m"
    assert colored("hi", "green", background=True) == "\x1b[42mhi\x1b[0m"
    assert colored("hi", "WHITE", background=True) == "\x1b[107mhi\x1b[0m"
    assert colored("hi", None) == "hi"
    with pytest.raises(ValueError):
        colored("hi", "mauve")


def test_ansistrip_and_ansilen() -> None:
    s = colored("abc", "green") + "de\x1b[K"
    assert ansistrip(s) == "abcde"
    assert ansilen(s) == 5
    assert ansilen("plain") == 5


def test_make_pair() -> None:
    assert make_pair(3) == (3, 3)
    assert make_pair(2, cnt=3) == (2, 2, 2)
    assert make_pair((1, 4)) == (1, 4)


def test_flatten_and_fully_flatten() -> None:
    assert flatten([[1, 2], [3], []]) == [1, 2, 3]
    assert flatten([[1, [2]], (3,)]) == [1, [2], 3]
    assert fully_flatten([1, [2, (3, [4])], 5]) == [1, 2, 3, 4, 5]
    assert fully_flatten([]) == []


def test_fromimport() -> None:
    assert fromimport("os.path", "join") is os.path.join
    submodule = fromimport("xmlrpc", "server")
    assert submodule.__name__ == "xmlrpc.server"
    with pytest.raises(ModuleNotFoundError):
        fromimport("os", "no_such_thing_here")


def test_strip_parens() -> None:
    assert strip_parens("(a+b)") == "a+b"
    assert strip_parens("((a))") == "(a)"
    assert strip_parens("(a)+(b)") == "(a)+(b)"
    assert strip_parens("a+b") == "a+b"
    assert strip_parens("(a") == "(a"
    assert strip_parens("") == ""


def test_round_up() -> None:
    assert round_up(5, 4) == 8
    assert round_up(8, 4) == 8
    assert round_up(0, 4) == 0
    assert round_up(1, 1) == 1


def test_merge_dicts() -> None:
    assert merge_dicts([{1: 2}, {3: 4}, {1: 2}]) == {1: 2, 3: 4}
    assert merge_dicts(d for d in ({"a": 1}, {"b": 2})) == {"a": 1, "b": 2}
    assert merge_dicts([]) == {}


def test_merge_dicts_rejects_conflicts_with_value_error() -> None:
    with pytest.raises(ValueError, match="key 'a' has two different values, 1 and 2"):
        merge_dicts([{"a": 1}, {"a": 2}])


def test_partition() -> None:
    assert partition([1, 2, 3, 4, 5], lambda x: x % 2 == 0) == ([2, 4], [1, 3, 5])
    assert partition([], bool) == ([], [])


def test_unwrap_and_unwrap2() -> None:
    assert unwrap(5) == 5
    assert unwrap(0) == 0
    with pytest.raises(AssertionError):
        unwrap(None)
    assert unwrap2((7, None)) == 7
    with pytest.raises(AssertionError, match="boom"):
        unwrap2((None, "boom"))


def test_get_child() -> None:
    model = SimpleNamespace(layers=[{"weight": 7}, SimpleNamespace(bias=9)])
    assert get_child(model, "layers.0.weight") == 7
    assert get_child(model, "layers.1.bias") == 9
    assert get_child({"a": {"b": 3}}, "a.b") == 3


@pytest.mark.parametrize(
    ("old_shape", "new_shape", "expected"),
    [
        ((2, 3, 4), (6, 4), [[0, 1], [2]]),
        ((2, 3, 4), (2, 12), [[0], [1, 2]]),
        ((2, 3, 4), (24,), [[0, 1, 2]]),
        ((2, 3, 4), (2, 3, 4), [[0], [1], [2]]),
        ((2, 1, 3), (2, 3), [[0], [1, 2]]),
        ((6,), (1, 6), [[], [0]]),
        ((2, 3, 4), (4, 6), None),
        ((2, 3, 4), (3, 8), None),
    ],
)
def test_get_contraction(old_shape: tuple, new_shape: tuple, expected: list | None) -> None:
    assert get_contraction(old_shape, new_shape) == expected


def test_to_function_name() -> None:
    assert to_function_name("E_4_4n1") == "E_4_4n1"
    assert to_function_name("a b") == "a20b"
    assert to_function_name("r_3<4") == "r_33C4"
    assert to_function_name(colored("k_2", "green")) == "k_2"
    assert to_function_name.cache_info().currsize > 0


def test_getenv(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TGCORE_TEST_GETENV_INT", "7")
    monkeypatch.setenv("TGCORE_TEST_GETENV_STR", "hello")
    assert getenv("TGCORE_TEST_GETENV_INT") == 7
    assert getenv("TGCORE_TEST_GETENV_INT", 0) == 7
    assert getenv("TGCORE_TEST_GETENV_STR", "") == "hello"
    assert getenv("TGCORE_TEST_GETENV_MISSING", 3) == 3
    assert getenv("TGCORE_TEST_GETENV_MISSING", "dflt") == "dflt"
    monkeypatch.setenv("TGCORE_TEST_GETENV_INT", "8")
    assert getenv("TGCORE_TEST_GETENV_INT") == 7  # read once, then cached
    getenv.cache_clear()
    assert getenv("TGCORE_TEST_GETENV_INT") == 8


def test_temp() -> None:
    assert temp("net") == (pathlib.Path(tempfile.gettempdir()) / "net").as_posix()


# **************** context variables ****************


@pytest.mark.parametrize(
    ("var", "key", "default"),
    [
        (DEBUG, "DEBUG", 0),
        (IMAGE, "IMAGE", 0),
        (BEAM, "BEAM", 0),
        (NOOPT, "NOOPT", 0),
        (JIT, "JIT", 1),
        (WINO, "WINO", 0),
        (THREEFRY, "THREEFRY", 0),
        (CACHECOLLECTING, "CACHECOLLECTING", 1),
        (GRAPH, "GRAPH", 0),
        (SAVE_SCHEDULE, "SAVE_SCHEDULE", 0),
        (RING, "RING", 1),
        (MULTIOUTPUT, "MULTIOUTPUT", 1),
    ],
)
def test_flag_defaults(var: ContextVar, key: str, default: int) -> None:
    assert isinstance(var, ContextVar)
    assert var.key == key
    assert var.value == int(os.environ.get(key, default))


def test_graphpath_is_a_plain_string() -> None:
    assert isinstance(GRAPHPATH, str)
    assert GRAPHPATH == os.environ.get("GRAPHPATH", temp("net"))


def test_contextvar_is_a_singleton_per_key() -> None:
    assert ContextVar("DEBUG", 5) is DEBUG
    first = ContextVar("TGCORE_TEST_SINGLETON", 4)
    assert ContextVar("TGCORE_TEST_SINGLETON", 9) is first
    assert first.value == 4


def test_contextvar_comparisons() -> None:
    three = ContextVar("TGCORE_TEST_CMP_THREE", 3)
    assert three >= 3 and three > 2 and three < 4 and three <= 3
    assert not (three > 3) and not (three < 3)
    assert three == 3 and three != 4
    assert bool(three) is True
    assert bool(ContextVar("TGCORE_TEST_CMP_ZERO", 0)) is False
    assert three in {three}
    assert repr(three) == "ContextVar('TGCORE_TEST_CMP_THREE', value=3)"


def test_context_sets_and_restores() -> None:
    debug_before, beam_before = DEBUG.value, BEAM.value
    with Context(DEBUG=3, BEAM=2):
        assert DEBUG.value == 3 and BEAM.value == 2
        with Context(DEBUG=5):
            assert DEBUG.value == 5 and BEAM.value == 2
        assert DEBUG.value == 3
    assert DEBUG.value == debug_before and BEAM.value == beam_before


def test_context_as_decorator_and_on_exception() -> None:
    noopt_before = NOOPT.value

    @Context(NOOPT=7)
    def read_noopt() -> int:
        return NOOPT.value

    assert read_noopt() == 7
    assert NOOPT.value == noopt_before
    with pytest.raises(RuntimeError), Context(NOOPT=9):
        raise RuntimeError("inside")
    assert NOOPT.value == noopt_before


def test_context_rejects_unknown_key() -> None:
    debug_before = DEBUG.value
    with pytest.raises(KeyError, match="NOT_A_FLAG"), Context(DEBUG=4, NOT_A_FLAG=1):
        pass
    assert DEBUG.value == debug_before


def test_graph_exception() -> None:
    assert issubclass(GraphException, Exception)
    with pytest.raises(GraphException, match="no graph"):
        raise GraphException("no graph")


# **************** counters, timing, profiling ****************


def test_global_counters_reset_keeps_mem_used(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in [("global_ops", 10), ("global_mem", 20), ("time_sum_s", 1.5), ("kernel_count", 3)]:
        monkeypatch.setattr(GlobalCounters, name, value)
    monkeypatch.setattr(GlobalCounters, "mem_used", 1234)
    GlobalCounters.reset()
    assert (GlobalCounters.global_ops, GlobalCounters.global_mem, GlobalCounters.kernel_count) == (0, 0, 0)
    assert GlobalCounters.time_sum_s == 0.0 and type(GlobalCounters.time_sum_s) is float
    assert GlobalCounters.mem_used == 1234


def test_timing(capsys: pytest.CaptureFixture[str]) -> None:
    with Timing("step ") as timing:
        pass
    out = capsys.readouterr().out
    assert out.startswith("step ") and out.endswith(" ms\n")
    assert float(out[len("step ") : -len(" ms\n")]) == pytest.approx(timing.et * 1e-6, abs=0.01)
    with Timing("x", on_exit=lambda et: f" (et is {type(et).__name__})"):
        pass
    assert capsys.readouterr().out.endswith(" ms (et is int)\n")
    with Timing("quiet", enabled=False):
        pass
    assert capsys.readouterr().out == ""


def test_timing_as_decorator(capsys: pytest.CaptureFixture[str]) -> None:
    @Timing("deco ")
    def work() -> int:
        return 5

    assert work() == 5
    assert capsys.readouterr().out.startswith("deco ")


def _profiled_busy_function() -> int:
    return sum(i * i for i in range(2000))


def test_profiling(capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path) -> None:
    stats_file = tmp_path / "prof.out"
    with Profiling(sort="tottime", frac=1.0, fn=str(stats_file)):
        _profiled_busy_function()
    out = capsys.readouterr().out
    assert "_profiled_busy_function" in out
    assert out.lstrip().startswith("n:")
    assert any("_profiled_busy_function" in fcn[2] for fcn in pstats.Stats(str(stats_file)).stats)  # type: ignore[attr-defined]
    with Profiling(enabled=False):
        _profiled_busy_function()
    assert capsys.readouterr().out == ""


def test_format_fcn() -> None:
    assert _format_fcn(("file.py", 3, "f")) == "file.py:3:f"


# **************** disk cache ****************


def test_cache_settings() -> None:
    assert isinstance(helpers.VERSION, int)
    assert helpers.CACHELEVEL == 2  # set by the fixture
    if "CACHEDB" not in os.environ:
        cache_home = os.getenv("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
        assert os.path.abspath(os.path.join(cache_home, "tgcore", "cache.db")) == _IMPORT_TIME_CACHEDB


def test_db_connection_is_reused_and_follows_cachedb(
    isolated_cache: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    conn = db_connection()
    assert db_connection() is conn
    assert (isolated_cache / "tgcore" / "cache.db").is_file()
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    other = isolated_cache / "other" / "cache.db"
    monkeypatch.setattr(helpers, "CACHEDB", str(other))
    assert db_connection() is not conn
    assert other.is_file()


PLAIN_VALUES = [
    b"\x00\xffraw bytes",
    b"",
    "text",
    "",
    "ünïcødé",
    0,
    -5,
    2**70,
    1.5,
    -0.0,
    float("inf"),
    True,
    False,
    None,
    [1, "a", None],
    (1, 2),
    ((1, [2, (3,)]),),
    [(1, 2), [3, 4]],
    [],
    (),
    {},
    {"a": 1, "b": [1, 2], "c": (b"x",)},
    {1: "int key", (1, 2): "tuple key", "s": {"nested": True}},
]


@pytest.mark.parametrize("value", PLAIN_VALUES, ids=repr)
def test_diskcache_round_trip(value: Any) -> None:
    assert diskcache_put("roundtrip", "k", value) is value
    got = diskcache_get("roundtrip", "k")
    assert same_plain(got, value), f"{value!r} came back as {got!r}"


def test_diskcache_round_trip_nan() -> None:
    diskcache_put("roundtrip", "nan", [float("nan")])
    got = diskcache_get("roundtrip", "nan")
    assert type(got) is list and math.isnan(got[0])


def test_diskcache_keeps_tuples_and_lists_apart() -> None:
    diskcache_put("shapes", "t", (1, [2, 3], (4,)))
    diskcache_put("shapes", "l", [1, (2, 3), [4]])
    t, lst = diskcache_get("shapes", "t"), diskcache_get("shapes", "l")
    assert type(t) is tuple and type(t[1]) is list and type(t[2]) is tuple
    assert type(lst) is list and type(lst[1]) is tuple and type(lst[2]) is list
    assert t == (1, [2, 3], (4,)) and lst == [1, (2, 3), [4]]


@pytest.mark.parametrize(
    ("value", "type_name"),
    [({1, 2}, "set"), (bytearray(b"x"), "bytearray"), (object(), "object"), ([1, {"a": frozenset()}], "frozenset")],
)
def test_diskcache_rejects_unsupported_types(value: Any, type_name: str) -> None:
    with pytest.raises(TypeError, match=type_name):
        diskcache_put("bad", "k", value)
    assert diskcache_get("bad", "k") is None


def test_diskcache_rejects_self_referencing_values() -> None:
    loop: list = [1]
    loop.append(loop)
    with pytest.raises(ValueError, match="self-referencing"):
        diskcache_put("bad", "loop", loop)


def test_diskcache_stores_plain_data_not_pickles() -> None:
    diskcache_put("raw", "blob", b"\x01\x02")
    diskcache_put("raw", "data", (1, "a"))
    rows = dict(db_connection().execute(f'SELECT key, val FROM "raw_{helpers.VERSION}"').fetchall())
    assert rows["blob"] == b"\x01\x02"
    assert rows["data"] == '{"t":[1,"a"]}'


def test_diskcache_missing_table_and_key() -> None:
    assert diskcache_get("never_written", "k") is None
    diskcache_put("written", "k", 1)
    assert diskcache_get("written", "other") is None


def test_diskcache_tables_are_versioned() -> None:
    diskcache_put("mytable", "k", 1)
    names = {row[0] for row in db_connection().execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert f"mytable_{helpers.VERSION}" in names


def test_diskcache_key_forms() -> None:
    diskcache_put("keys", {"name": "conv", "size": 3, "fast": True, "scale": 0.5, "raw": b"\x00"}, "dict key")
    assert diskcache_get("keys", {"name": "conv", "size": 3, "fast": True, "scale": 0.5, "raw": b"\x00"}) == "dict key"
    assert diskcache_get("keys", {"name": "conv", "size": 4, "fast": True, "scale": 0.5, "raw": b"\x00"}) is None
    diskcache_put("intkeys", 42, "int key")
    assert diskcache_get("intkeys", 42) == "int key"


def test_diskcache_put_replaces() -> None:
    diskcache_put("replace", "k", "old")
    diskcache_put("replace", "k", "new")
    assert diskcache_get("replace", "k") == "new"


@pytest.mark.parametrize("table", ["bad name", "t; DROP TABLE x", "1abc", "", "quote'd", 'dq"'])
def test_diskcache_validates_table_names(table: str) -> None:
    with pytest.raises(ValueError, match="invalid cache table name"):
        diskcache_put(table, "k", 1)
    with pytest.raises(ValueError, match="invalid cache table name"):
        diskcache_get(table, "k")


def test_diskcache_validates_keys() -> None:
    with pytest.raises(ValueError, match="invalid cache key column name"):
        diskcache_put("t", {"a b": 1}, 1)
    with pytest.raises(ValueError, match="'val'"):
        diskcache_put("t", {"val": 1}, 1)
    with pytest.raises(ValueError, match="non-empty dict"):
        diskcache_put("t", {}, 1)
    with pytest.raises(TypeError, match="list"):
        diskcache_put("t", {"a": [1]}, 1)


def test_diskcache_clear() -> None:
    diskcache_put("clear_a", "k", 1)
    diskcache_put("clear_b", "k", 2)
    diskcache_clear()
    assert diskcache_get("clear_a", "k") is None
    assert db_connection().execute("SELECT count(*) FROM sqlite_master WHERE type='table'").fetchone()[0] == 0
    diskcache_put("clear_a", "k", 3)
    assert diskcache_get("clear_a", "k") == 3


def test_diskcache_put_recreates_a_table_dropped_by_someone_else() -> None:
    diskcache_put("dropped", "k", 1)
    db_connection().execute(f'DROP TABLE "dropped_{helpers.VERSION}"')
    diskcache_put("dropped", "k", 2)
    assert diskcache_get("dropped", "k") == 2


def test_cachelevel_zero_disables_the_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(helpers, "CACHELEVEL", 0)
    value = ["v"]
    assert diskcache_put("off", "k", value) is value
    assert diskcache_get("off", "k") is None
    monkeypatch.setattr(helpers, "CACHELEVEL", 2)
    assert diskcache_get("off", "k") is None


def test_diskcache_decorator_caches_calls() -> None:
    calls: list[tuple] = []

    @diskcache
    def compile_source(src: str, opt: int = 0, flags: tuple = ()) -> tuple:
        calls.append((src, opt, flags))
        return (src.upper(), opt, b"\x7fELF")

    assert compile_source("abc", opt=2) == ("ABC", 2, b"\x7fELF")
    assert compile_source("abc", opt=2) == ("ABC", 2, b"\x7fELF")
    assert len(calls) == 1
    assert compile_source("abc", opt=3) == ("ABC", 3, b"\x7fELF")
    assert compile_source("abc", flags=("x",), opt=1) == ("ABC", 1, b"\x7fELF")
    assert compile_source("abc", opt=1, flags=("x",)) == ("ABC", 1, b"\x7fELF")  # kwargs order does not matter
    assert compile_source("abc", opt=1, flags=["x"]) == ("ABC", 1, b"\x7fELF")  # a list is a different argument
    assert len(calls) == 4
    assert compile_source.__name__ == "compile_source"
    with pytest.raises(TypeError, match="set"):
        compile_source("abc", flags={1})


def test_diskcache_decorator_caches_falsy_results_and_distinguishes_arg_types() -> None:
    calls: list[Any] = []

    @diskcache
    def identity_none(x: Any) -> None:
        calls.append(x)

    assert identity_none(1) is None
    assert identity_none(1) is None
    assert identity_none(1.0) is None
    assert identity_none(True) is None
    assert calls == [1, 1.0, True]


def test_diskcache_decorator_respects_cachelevel_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(helpers, "CACHELEVEL", 0)
    calls: list[int] = []

    @diskcache
    def double(x: int) -> int:
        calls.append(x)
        return 2 * x

    assert double(2) == 4 and double(2) == 4
    assert calls == [2, 2]


_plain_data = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text() | st.binary(),
    lambda children: (
        st.lists(children, max_size=4)
        | st.lists(children, max_size=4).map(tuple)
        | st.dictionaries(st.text(max_size=5) | st.integers(), children, max_size=4)
    ),
    max_leaves=12,
)


@settings(max_examples=40, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_plain_data)
def test_diskcache_round_trips_any_plain_data(value: Any) -> None:
    diskcache_put("hypothesis", "k", value)
    assert same_plain(diskcache_get("hypothesis", "k"), value)


def _concurrent_cache_writer(db_path: str, writer: int, count: int) -> None:
    """Runs in a spawned process: write count own keys and overwrite count shared keys."""
    helpers.CACHEDB = db_path
    for i in range(count):
        helpers.diskcache_put("concurrent", f"w{writer}_{i}", [writer, i])
        helpers.diskcache_put("concurrent_shared", {"slot": i}, writer)


def test_diskcache_two_processes_write_concurrently(isolated_cache: pathlib.Path) -> None:
    count = 150
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_concurrent_cache_writer, args=(helpers.CACHEDB, w, count)) for w in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    assert [p.exitcode for p in procs] == [0, 0]
    for w in range(2):
        for i in range(count):
            assert diskcache_get("concurrent", f"w{w}_{i}") == [w, i]
    assert {diskcache_get("concurrent_shared", {"slot": i}) for i in range(count)} <= {0, 1}
    assert diskcache_get("concurrent_shared", {"slot": count - 1}) in (0, 1)


def _forked_cache_writer() -> None:
    """Runs in a forked child, which inherited the parent's open connection and must not use it."""
    helpers.diskcache_put("forked", "child", os.getpid())


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_diskcache_after_fork_uses_a_new_connection() -> None:
    diskcache_put("forked", "parent", 1)
    parent_conn = db_connection()
    child = multiprocessing.get_context("fork").Process(target=_forked_cache_writer)
    child.start()
    child.join(timeout=60)
    assert child.exitcode == 0
    assert db_connection() is parent_conn
    assert diskcache_get("forked", "child") == child.pid
    assert diskcache_get("forked", "parent") == 1


def test_diskcache_threads_share_the_connection_safely() -> None:
    def write(thread: int) -> None:
        for i in range(50):
            diskcache_put("threads", f"{thread}_{i}", [thread, i])

    threads = [threading.Thread(target=write, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert all(diskcache_get("threads", f"{t}_{i}") == [t, i] for t in range(4) for i in range(50))


# **************** fetch ****************


def _files_in(folder: pathlib.Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def test_fetch_returns_local_paths_as_is() -> None:
    assert fetch("/does/not/exist.bin") == pathlib.Path("/does/not/exist.bin")
    assert fetch("./relative.bin") == pathlib.Path("./relative.bin")


def test_fetch_file_url(tmp_path: pathlib.Path) -> None:
    src = tmp_path / "src.bin"
    payload = os.urandom(100_000)
    src.write_bytes(payload)
    dest = tmp_path / "out" / "dl.bin"
    assert fetch(src.as_uri(), name=dest) == dest
    assert dest.read_bytes() == payload
    assert _files_in(dest.parent) == ["dl.bin"]


def test_fetch_removes_what_a_killed_download_left_and_nothing_of_a_live_one(tmp_path: pathlib.Path) -> None:
    from tgcore.helpers import machine_tag

    src = tmp_path / "src.bin"
    src.write_bytes(b"weights")
    dest = tmp_path / "out" / "dl.bin"
    dest.parent.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # a pid that no process has now: its temporary file is a leftover
    stale = dest.parent / f".dl.bin.{machine_tag()}-{dead.pid}.0a1b2c3d.tmp"
    live = dest.parent / f".dl.bin.{machine_tag()}-{os.getpid()}.0a1b2c3d.tmp"  # a writer still running
    other = dest.parent / ".other.bin.0a1b2c3d.tmp"  # not this target's
    for leftover in (stale, live, other):
        leftover.write_bytes(b"half a download")
    assert fetch(src.as_uri(), name=dest) == dest
    assert dest.read_bytes() == b"weights"
    assert _files_in(dest.parent) == sorted([live.name, other.name, "dl.bin"])


def test_fetch_default_cache_location_and_caching(tmp_path: pathlib.Path, isolated_cache: pathlib.Path) -> None:
    src = tmp_path / "src.txt"
    src.write_bytes(b"version 1")
    url = src.as_uri()
    path = fetch(url)
    assert path == isolated_cache / "tgcore" / "downloads" / hashlib.md5(url.encode("utf-8")).hexdigest()
    assert path.read_bytes() == b"version 1"
    src.write_bytes(b"version 2")
    assert fetch(url, allow_caching=True).read_bytes() == b"version 1"
    assert fetch(url, allow_caching=False).read_bytes() == b"version 2"
    named = fetch(url, name="named.txt")
    assert named == isolated_cache / "tgcore" / "downloads" / "named.txt"
    assert named.read_bytes() == b"version 2"
    assert fetch(url, name=str(tmp_path / "str_path.txt")) == tmp_path / "str_path.txt"


class _Handler(http.server.BaseHTTPRequestHandler):
    """Serves /ok (full body), /short (fewer bytes than Content-Length) and 404 for anything else."""

    body = b"0123456789" * 3000

    def do_GET(self) -> None:
        if self.path == "/ok":
            self.send_response(200)
            self.send_header("Content-Length", str(len(self.body)))
            self.end_headers()
            self.wfile.write(self.body)
        elif self.path == "/short":
            self.send_response(200)
            self.send_header("Content-Length", str(len(self.body)))
            self.end_headers()
            self.wfile.write(self.body[:1000])
        else:
            self.send_error(404)

    def log_message(self, format: str, *args: Any) -> None:
        """Keep test output quiet."""


@pytest.fixture
def http_server() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_fetch_http(http_server: str, tmp_path: pathlib.Path) -> None:
    dest = tmp_path / "dl" / "ok.bin"
    assert fetch(f"{http_server}/ok", name=dest) == dest
    assert dest.read_bytes() == _Handler.body
    assert _files_in(dest.parent) == ["ok.bin"]


def test_fetch_short_response_leaves_no_partial_file(http_server: str, tmp_path: pathlib.Path) -> None:
    dest = tmp_path / "dl" / "short.bin"
    with pytest.raises(RuntimeError, match="incomplete: got 1000 bytes, Content-Length said 30000"):
        fetch(f"{http_server}/short", name=dest)
    assert not dest.exists()
    assert _files_in(dest.parent) == []


def test_fetch_failure_keeps_existing_file(http_server: str, tmp_path: pathlib.Path) -> None:
    dest = tmp_path / "dl" / "keep.bin"
    dest.parent.mkdir()
    dest.write_bytes(b"old")
    with pytest.raises(RuntimeError, match="incomplete"):
        fetch(f"{http_server}/short", name=dest, allow_caching=False)
    with pytest.raises(urllib.error.HTTPError):
        fetch(f"{http_server}/missing", name=dest, allow_caching=False)
    assert dest.read_bytes() == b"old"
    assert _files_in(dest.parent) == ["keep.bin"]


# **************** exec helpers ****************


def test_cpu_time_execution() -> None:
    calls: list[int] = []
    elapsed = cpu_time_execution(lambda: (calls.append(1), time.sleep(0.01)), enable=True)
    assert isinstance(elapsed, float) and elapsed >= 0.009
    assert cpu_time_execution(lambda: calls.append(2), enable=False) is None
    assert calls == [1, 2]


def test_cpu_objdump_runs_objdump_with_an_argument_list(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    seen: list[tuple[list[str], bytes]] = []

    def fake_check_output(args: list[str], **kwargs: Any) -> bytes:
        assert "shell" not in kwargs
        seen.append((args, pathlib.Path(args[-1]).read_bytes()))
        return b"fake disassembly"

    monkeypatch.setattr(subprocess, "check_output", fake_check_output)
    cpu_objdump(b"\x7fELF-bytes")
    assert capsys.readouterr().out == "fake disassembly\n"
    ((args, content),) = seen
    assert args[:2] == ["objdump", "-d"] and content == b"\x7fELF-bytes"
    assert not pathlib.Path(args[2]).exists()


@pytest.mark.skipif(shutil.which("objdump") is None or shutil.which("as") is None, reason="needs binutils")
def test_cpu_objdump_real(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "ret.s").write_text(".text\nret\n")
    subprocess.run(["as", str(tmp_path / "ret.s"), "-o", str(tmp_path / "ret.o")], check=True)
    cpu_objdump((tmp_path / "ret.o").read_bytes())
    out = capsys.readouterr().out
    assert "Disassembly of section .text" in out and "ret" in out
    with pytest.raises(subprocess.CalledProcessError):
        cpu_objdump(b"not an object file")


# **************** ctypes helpers ****************


def test_from_mv_shares_memory() -> None:
    buf = bytearray(b"hello")
    arr = from_mv(memoryview(buf))
    assert isinstance(arr, ctypes.Array) and len(arr) == 5
    assert bytes(arr) == b"hello"
    arr[0] = b"J"
    assert buf == bytearray(b"Jello")
    as_uint8 = from_mv(memoryview(buf), ctypes.c_uint8)
    assert list(as_uint8) == list(b"Jello")


def test_to_mv_views_foreign_memory() -> None:
    src = ctypes.create_string_buffer(b"abcdef", 6)
    mv = to_mv(ctypes.addressof(src), 6)
    assert mv.format == "B" and mv.nbytes == 6 and bytes(mv) == b"abcdef"
    mv[0] = ord("z")
    assert src.raw == b"zbcdef"
    assert bytes(to_mv(ctypes.cast(src, ctypes.c_void_p), 3)) == b"zbc"


def test_to_char_p_p() -> None:
    options = [b"-O2", b"--fast-math", b""]
    arr = to_char_p_p(options)
    gc.collect()
    assert len(arr) == 3
    assert [ctypes.string_at(p) for p in arr] == options
    arr_u8 = to_char_p_p([b"xy"], ctypes.c_uint8)
    assert [arr_u8[0][i] for i in range(2)] == [ord("x"), ord("y")]


def test_init_c_struct_t_is_packed_and_cached() -> None:
    fields = (("a", ctypes.c_uint8), ("b", ctypes.c_uint32))
    struct_t = init_c_struct_t(fields)
    assert init_c_struct_t(fields) is struct_t
    assert ctypes.sizeof(struct_t) == 5
    value = struct_t(1, 2)
    assert bytes(value) == b"\x01\x02\x00\x00\x00"
    back = struct_t.from_buffer_copy(b"\x07\x08\x00\x00\x00")
    assert (back.a, back.b) == (7, 8)


def test_init_c_var() -> None:
    def fill(var: ctypes.c_int) -> int:
        var.value = 42
        return 0

    var = ctypes.c_int()
    assert init_c_var(var, fill) is var
    assert var.value == 42


def test_flat_mv() -> None:
    ints = memoryview(array.array("i", [1, 2, 3]))
    flat = flat_mv(ints)
    assert flat.format == "B" and flat.shape == (12,) and flat.tobytes() == ints.tobytes()
    grid = memoryview(bytes(range(6))).cast("B", shape=(2, 3))
    assert flat_mv(grid).shape == (6,) and flat_mv(grid).tobytes() == bytes(range(6))
    empty = memoryview(b"")
    assert flat_mv(empty) is empty
