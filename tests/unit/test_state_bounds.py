"""torch_load, safe_load and safe_save under hostile files and killed writers.

Each hostile file is built here for real (a pickle written opcode by opcode, a zip of a highly compressed member, a
safetensors header of 1.75M entries) and loaded in a child process under a hard limit on its address space and time,
so that a regression fails the test instead of taking the machine down. The child reports the error it got, how long
the load took and how much its peak memory grew.
"""

from __future__ import annotations

import collections
import json
import os
import pickle
import random
import re
import signal
import struct
import subprocess
import sys
import textwrap
import time
import zipfile
from pathlib import Path
from typing import Any, Optional

import numpy as np
import pytest

from tgcore import Tensor
from tgcore.nn import Linear
from tgcore.nn.state import load_state_dict, safe_load, safe_save, torch_load

CHILD_MEMORY = 1 << 30  # the address space of a child that loads a hostile file (tgcore and numpy take ~170 MB)
CHILD_TIMEOUT_S = 120  # generous: a hang fails the test, a slow but finished load is reported, never timed

# ***** pickles written opcode by opcode (protocol 2, as torch.save writes them) *****


def _int(n: int) -> bytes:
    if -(2**31) <= n < 2**31:
        return pickle.BININT + struct.pack("<i", n)
    raw = n.to_bytes((n.bit_length() + 8) // 8, "little", signed=True)
    return pickle.LONG1 + bytes([len(raw)]) + raw


def _str(s: str) -> bytes:
    raw = s.encode()
    return pickle.BINUNICODE + struct.pack("<I", len(raw)) + raw


def _global(module: str, name: str) -> bytes:
    return pickle.GLOBAL + f"{module}\n{name}\n".encode()


def _tuple(*items: bytes) -> bytes:
    return pickle.MARK + b"".join(items) + pickle.TUPLE


def _put(i: int) -> bytes:
    return pickle.BINPUT + bytes([i]) if i < 256 else pickle.LONG_BINPUT + struct.pack("<I", i)


def _get(i: int) -> bytes:
    return pickle.BINGET + bytes([i]) if i < 256 else pickle.LONG_BINGET + struct.pack("<I", i)


def _tensor(numel: int, offset: int, size: tuple[int, ...], stride: tuple[int, ...], key: str = "0") -> bytes:
    """A float32 tensor of storage `key` (numel elements), as torch writes it: _rebuild_tensor_v2 of a persistent id."""
    return _REBUILD + _tensor_args(numel, offset, size, stride, key) + pickle.REDUCE


_REBUILD = _global("torch._utils", "_rebuild_tensor_v2")


def _tensor_args(numel: int, offset: int, size: tuple[int, ...], stride: tuple[int, ...], key: str = "0") -> bytes:
    """The arguments of _rebuild_tensor_v2: (storage, offset, size, stride, requires_grad, hooks)."""
    pid = _tuple(_str("storage"), _global("torch", "FloatStorage"), _str(key), _str("cpu"), _int(numel))
    hooks = _global("collections", "OrderedDict") + pickle.EMPTY_TUPLE + pickle.REDUCE
    return _tuple(
        pid + pickle.BINPERSID,
        _int(offset),
        _tuple(*map(_int, size)),
        _tuple(*map(_int, stride)),
        pickle.NEWFALSE,
        hooks,
    )


def _pickle(body: bytes, name: str = "x") -> bytes:
    """A pickle of {name: body}."""
    return pickle.PROTO + b"\x02" + pickle.EMPTY_DICT + _str(name) + body + pickle.SETITEM + pickle.STOP


def _zip_checkpoint(
    path: Path, data_pkl: bytes, storages: dict[str, bytes], compress: int = zipfile.ZIP_STORED
) -> None:
    with zipfile.ZipFile(path, "w", compression=compress, compresslevel=9 if compress else None) as zf:
        zf.writestr("ckpt/data.pkl", data_pkl)
        zf.writestr("ckpt/byteorder", "little")
        for key, raw in storages.items():
            zf.writestr(f"ckpt/data/{key}", raw)
        zf.writestr("ckpt/version", "3\n")


def _legacy_checkpoint(path: Path, data_pkl: bytes, storages: dict[str, tuple[int, bytes]]) -> None:
    """The format of torch.save(..., _use_new_zipfile_serialization=False): five pickles, then each storage."""
    parts = [
        pickle.dumps(0x1950A86A20F9469CFC6C, 2),
        pickle.dumps(1001, 2),
        pickle.dumps({"little_endian": True}, 2),
        data_pkl,
        pickle.dumps(list(storages), 2),
    ]
    for numel, raw in storages.values():
        parts += [struct.pack("<q", numel), raw]
    path.write_bytes(b"".join(parts))


def billion_laughs(path: Path, levels: int = 20, copies: int = 8) -> None:
    """A tensor, then a tuple of `copies` references to it, then a tuple of copies of that, `levels` deep (8**20
    tensors when expanded)."""
    body = _tensor(2, 0, (2,), (1,)) + _put(0) + pickle.POP
    for level in range(1, levels + 1):
        body += pickle.MARK + _get(level - 1) * copies + pickle.TUPLE + _put(level) + pickle.POP
    body += _get(levels)
    _zip_checkpoint(path, _pickle(body), {"0": np.array([1.5, -2.0], np.float32).tobytes()})


def deep_lists(path: Path, depth: int = 200_000) -> None:
    """A list in a list in a list ..., `depth` deep (two bytes a level)."""
    body = pickle.EMPTY_LIST * depth + pickle.APPEND * (depth - 1)
    _zip_checkpoint(path, _pickle(body), {})


def deep_tuple_key(path: Path, depth: int = 200_000) -> None:
    """A dict whose key is a tuple in a tuple ..., `depth` deep: hashing the key recurses `depth` levels in C."""
    body = pickle.EMPTY_DICT + pickle.EMPTY_TUPLE + pickle.TUPLE1 * depth + pickle.NONE + pickle.SETITEM
    _zip_checkpoint(path, _pickle(body), {})


def stride0_view(path: Path, numel: int = 1 << 28) -> None:
    """One float32 of storage, read as a tensor of `numel` elements (stride 0): 1 GiB from a few hundred bytes."""
    _legacy_checkpoint(path, _pickle(_tensor(1, 0, (numel,), (0,))), {"0": (1, np.float32(3.25).tobytes())})


def overlapping_view(path: Path, n: int = 1 << 16) -> None:
    """A (n, n) tensor of strides (1, 1) over 2n floats: every row starts one element after the last, n*n elements."""
    _legacy_checkpoint(path, _pickle(_tensor(2 * n, 0, (n, n), (1, 1))), {"0": (2 * n, bytes(8 * n))})


def zip_bomb(path: Path, nbytes: int = 256 << 20) -> None:
    """A checkpoint whose one storage is `nbytes` of zeros, deflated (about 1000 to 1)."""
    numel = nbytes // 4
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("ckpt/data.pkl", _pickle(_tensor(numel, 0, (numel,), (1,))))
        info = zipfile.ZipInfo("ckpt/data/0")
        info.compress_type = zipfile.ZIP_DEFLATED
        with zf.open(info, "w") as f:
            chunk = bytes(1 << 20)
            for _ in range(nbytes >> 20):
                f.write(chunk)


def pickle_bomb(path: Path, nbytes: int = 256 << 20) -> None:
    """A checkpoint whose pickle is `nbytes` long (one string of zeros), deflated."""
    numel = nbytes - 64
    with zipfile.ZipFile(path, "w") as zf:
        info = zipfile.ZipInfo("ckpt/data.pkl")
        info.compress_type = zipfile.ZIP_DEFLATED
        with zf.open(info, "w") as f:
            f.write(pickle.PROTO + b"\x02" + pickle.BINBYTES + struct.pack("<I", numel))
            chunk = bytes(1 << 20)
            left = numel
            while left:
                f.write(chunk[: min(left, len(chunk))])
                left -= min(left, len(chunk))
            f.write(pickle.STOP)


def copies_of_a_dict(path: Path, entries: int = 2000, copies: int = 2000) -> None:
    """One list of `entries` pairs, then `copies` OrderedDicts made from it: a few bytes each, of `entries` entries."""
    pairs = (
        pickle.MARK
        + b"".join(_tuple(_int(i), pickle.NONE) for i in range(entries))
        + pickle.LIST
        + _put(0)
        + pickle.POP
    )
    od = _global("collections", "OrderedDict") + _put(1) + pickle.POP
    body = pairs + od + pickle.EMPTY_LIST
    for _ in range(copies):
        body += _get(1) + _get(0) + pickle.TUPLE1 + pickle.REDUCE + pickle.APPEND
    _zip_checkpoint(path, _pickle(body), {})


def tensors_of_one_call(path: Path, copies: int = 1_000_000) -> None:
    """One tensor's function and arguments, memoized, then called `copies` times (7 bytes each), deflated."""
    body = pickle.EMPTY_LIST + _REBUILD + _put(0) + pickle.POP + _tensor_args(1, 0, (1,), (1,)) + _put(1) + pickle.POP
    body += (_get(0) + _get(1) + pickle.REDUCE + pickle.APPEND) * copies
    _zip_checkpoint(path, _pickle(body), {"0": bytes(4)}, zipfile.ZIP_DEFLATED)


def many_entries(path: Path, entries: int = 1_750_000) -> None:
    """A safetensors file of `entries` empty tensors: a header of about 93 MB, under the format's 100 MB."""
    names = (np.base_repr(i, 36) for i in range(entries))
    text = b"{" + b",".join(b'"%s":{"dtype":"U8","shape":[0],"data_offsets":[0,0]}' % n.encode() for n in names) + b"}"
    path.write_bytes(struct.pack("<Q", len(text)) + text)


HOSTILE = {
    "billion_laughs": billion_laughs,
    "deep_lists": deep_lists,
    "deep_tuple_key": deep_tuple_key,
    "stride0_view": stride0_view,
    "overlapping_view": overlapping_view,
    "zip_bomb": zip_bomb,
    "pickle_bomb": pickle_bomb,
    "copies_of_a_dict": copies_of_a_dict,
    "tensors_of_one_call": tensors_of_one_call,
    "many_entries": many_entries,
}

# ***** loading in a child process, with its address space and time bounded *****

_CHILD = """
import json, resource, sys, time
resource.setrlimit(resource.RLIMIT_AS, ({memory}, {memory}))
from tgcore.nn import state


def peak() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


before, start = peak(), time.perf_counter()
report = {{"error": None, "message": "", "is_value_error": False, "summary": None}}
try:
    result = getattr(state, sys.argv[1])(sys.argv[2])
    report["seconds"] = time.perf_counter() - start
    summary = None
{check}
    report["summary"] = summary
except BaseException as e:
    report["seconds"] = time.perf_counter() - start
    report["error"], report["message"], report["is_value_error"] = type(e).__name__, str(e), isinstance(e, ValueError)
report["growth"] = peak() - before
print(json.dumps(report))
"""


def load_in_child(loader: str, path: Path, check: str = "", env: Optional[dict[str, str]] = None) -> dict[str, Any]:
    """Run tgcore.nn.state.<loader>(path) in a child process under CHILD_MEMORY and CHILD_TIMEOUT_S; its report:
    error (the exception's type, or None), message, is_value_error, seconds, growth (of its peak memory, in bytes)
    and summary, which `check` (code run on the loaded `result`) sets."""
    code = _CHILD.format(memory=CHILD_MEMORY, check=textwrap.indent(check or "pass", "    "))
    child_env = {**os.environ, "DEVICE": "PYTHON", **(env or {})}
    proc = subprocess.run(
        [sys.executable, "-c", code, loader, str(path)],
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT_S,
        env=child_env,
    )
    assert proc.returncode == 0, f"the child died (status {proc.returncode}): {proc.stderr[-3000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _limit(path: Path) -> int:
    """The default budget of a file: 8 times its size, at least 64 MiB."""
    return max(8 * path.stat().st_size, 64 << 20)


REFUSED = [
    ("deep_lists", "torch_load", "nest containers more than 100 levels deep"),
    ("deep_tuple_key", "torch_load", "nests tuples more than 100 levels deep"),
    ("overlapping_view", "torch_load", r"a tensor of size (65536, 65536), stride (1, 1) of storage '0'"),
    ("zip_bomb", "torch_load", "storage '0' of 67108864 float32 elements"),
    ("pickle_bomb", "torch_load", "the archive's entry 'ckpt/data.pkl' of 268435400 bytes"),
    ("copies_of_a_dict", "torch_load", "an OrderedDict of 2000 entries"),
    ("tensors_of_one_call", "torch_load", "a tensor of size (1,), stride (1,) of storage '0'"),
    ("many_entries", "safe_load", "parsing its header (96,"),
]


@pytest.mark.parametrize("name,loader,problem", REFUSED, ids=[r[0] for r in REFUSED])
def test_a_hostile_file_is_refused_with_a_clear_error_in_bounded_memory(
    tmp_path: Path, name: str, loader: str, problem: str
) -> None:
    path = tmp_path / f"{name}.bin"
    HOSTILE[name](path)
    report = load_in_child(loader, path)
    assert report["is_value_error"], report
    message = report["message"]
    assert message.startswith(f"{loader}: {str(path)!r}: "), message  # names the file
    assert problem in message, message  # and the problem
    if "levels deep" not in message:  # the budget's refusals name the limit and the knob
        assert f"past its limit of {_limit(path):,} (TGCORE_LOAD_LIMIT=8 times the file's" in message, message
    assert report["growth"] < 2 * _limit(path), report


def test_a_billion_laughs_loads_as_one_object_per_memo_entry(tmp_path: Path) -> None:
    path = tmp_path / "laughs.pt"
    billion_laughs(path)  # 8**20 tensors if every reference were expanded
    check = """
node, shared = result["x"], True
for _ in range(20):
    shared = shared and len(node) == 8 and all(c is node[0] for c in node)
    node = node[0]
summary = [shared, type(node).__name__, node.numpy().tolist()]
"""
    report = load_in_child("torch_load", path, check)
    assert report["error"] is None, report
    assert report["summary"] == [True, "Tensor", [1.5, -2.0]]
    assert report["growth"] < _limit(path), report


def test_a_stride0_view_loads_as_a_broadcast_of_its_storage(tmp_path: Path) -> None:
    path = tmp_path / "stride0.pt"
    stride0_view(path)  # 1 GiB of float32 if it were copied out
    check = 'x = result["x"]\nsummary = [list(x.shape), x[:3].numpy().tolist(), x[-2:].numpy().tolist()]'
    report = load_in_child("torch_load", path, check)
    assert report["error"] is None, report
    assert report["summary"] == [[1 << 28], [3.25] * 3, [3.25] * 2]
    assert report["growth"] < _limit(path), report


def test_the_limit_is_raised_by_the_environment_variable(tmp_path: Path) -> None:
    path = tmp_path / "zeros.pt"
    zip_bomb(path, 80 << 20)  # a trusted checkpoint that compresses well: 80 MiB of zeros in ~80 kB
    refused = load_in_child("torch_load", path)
    assert refused["is_value_error"] and "TGCORE_LOAD_LIMIT" in refused["message"], refused
    check = 'x = result["x"]\nsummary = [list(x.shape), bool((x.numpy() == 0).all())]'
    for limit in ("0", "5000"):
        report = load_in_child("torch_load", path, check, env={"TGCORE_LOAD_LIMIT": limit})
        assert report["error"] is None, report
        assert report["summary"] == [[20 << 20], True]


# ***** safetensors headers: the length, the nesting, and every field's type *****


def _safetensors(path: Path, header: Any, data: bytes = b"") -> Path:
    text = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)
    return path


def _entry(**fields: Any) -> dict[str, Any]:
    """A header of one tensor "a" (float32, 1 element) with some fields replaced."""
    return {"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4], **fields}}


BAD_FIELDS = [
    (_entry(dtype=["F32"]), "unknown dtype, expected a string"),
    (_entry(dtype=4), "unknown dtype, expected a string"),
    (_entry(dtype={"name": "F32"}), "unknown dtype, expected a string"),
    (_entry(shape=[True]), "the shape must be a list of non-negative integers"),
    (_entry(shape=[1.0]), "the shape must be a list of non-negative integers"),
    (_entry(shape=["1"]), "the shape must be a list of non-negative integers"),
    (_entry(shape=[[1]]), "the shape must be a list of non-negative integers"),
    (_entry(shape="1"), "the shape must be a list of non-negative integers"),
    (_entry(shape=None), "the shape must be a list of non-negative integers"),
    (_entry(shape=[1] * 65), "65 dimensions, more than the 64"),
    (_entry(data_offsets=[0]), "data_offsets must be [begin, end], two integers"),
    (_entry(data_offsets=[0, 4, 8]), "data_offsets must be [begin, end], two integers"),
    (_entry(data_offsets=[0, "4"]), "data_offsets must be [begin, end], two integers"),
    (_entry(data_offsets=[0, 4.0]), "data_offsets must be [begin, end], two integers"),
    (_entry(data_offsets=[False, 4]), "data_offsets must be [begin, end], two integers"),
    (_entry(data_offsets={"begin": 0, "end": 4}), "data_offsets must be [begin, end], two integers"),
    (_entry(data_offsets=[4, 0]), "0 <= begin <= end <= 4"),
    (_entry(data_offsets=[0, 2**70]), "0 <= begin <= end <= 4"),
    ({"a": [0, 4]}, "expected an object with dtype, shape and data_offsets"),
    ({**_entry(), "__metadata__": ["x"]}, "__metadata__ must be an object of strings to strings"),
    ({**_entry(), "__metadata__": {"epoch": 3}}, "__metadata__ must be an object of strings to strings"),
    ({**_entry(), "__metadata__": {"k": {"nested": "v"}}}, "__metadata__ must be an object of strings to strings"),
    ({**_entry(), "__metadata__": "text"}, "__metadata__ must be an object of strings to strings"),
]


@pytest.mark.parametrize("header,problem", BAD_FIELDS, ids=[f"bad{i}" for i in range(len(BAD_FIELDS))])
def test_safe_load_checks_the_type_of_every_field(tmp_path: Path, header: dict, problem: str) -> None:
    path = _safetensors(tmp_path / "bad.safetensors", header, bytes(4))
    with pytest.raises(ValueError, match=re.escape(problem)) as info:
        safe_load(path)
    assert repr(str(path)) in str(info.value)


def test_safe_load_accepts_null_metadata_and_unknown_fields(tmp_path: Path) -> None:
    header = {"__metadata__": None, "a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4], "note": "extra"}}
    path = _safetensors(tmp_path / "ok.safetensors", header, struct.pack("<f", 2.5))
    assert safe_load(path)["a"].numpy().tolist() == [2.5]


def test_safe_save_refuses_metadata_that_safe_load_would_refuse(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="__metadata__ must be an object of strings to strings"):
        safe_save({"a": Tensor([1.0])}, tmp_path / "m.safetensors", metadata={"epoch": 3})
    assert os.listdir(tmp_path) == []


def test_safe_load_refuses_a_header_longer_than_the_format_allows(tmp_path: Path) -> None:
    path = tmp_path / "long.safetensors"
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", 100_000_001))
        f.truncate(8 + 100_000_001)  # sparse: the file is long enough, and nothing of it is read
    with pytest.raises(ValueError, match=r"claims 100,000,001 bytes, more than the 100,000,000 that the safetensors"):
        safe_load(path)


def test_safe_load_refuses_json_nested_too_deep(tmp_path: Path) -> None:
    path = _safetensors(tmp_path / "deep.safetensors", b'{"a":' + b"[" * 200_000 + b"]" * 200_000 + b"}")
    with pytest.raises(ValueError, match="nests JSON deeper than Python can parse"):
        safe_load(path)


def test_safe_load_of_many_tensors_is_bounded_and_the_limit_can_be_raised(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "many.safetensors"
    n = 17_000  # at about 4 KiB each, more than the 64 MiB that any file may build
    header = {f"t{i}": {"dtype": "I32", "shape": [1], "data_offsets": [4 * i, 4 * i + 4]} for i in range(n)}
    _safetensors(path, header, np.arange(n, dtype=np.int32).tobytes())
    with pytest.raises(ValueError, match=r"its header's tensors \(about 4 KiB each.*TGCORE_LOAD_LIMIT=8 times"):
        safe_load(path)
    monkeypatch.setenv("TGCORE_LOAD_LIMIT", "100")
    loaded = safe_load(path)
    assert len(loaded) == n and loaded["t16999"].numpy().tolist() == [16999]


def test_a_bad_limit_in_the_environment_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _safetensors(tmp_path / "ok.safetensors", _entry(), bytes(4))
    monkeypatch.setenv("TGCORE_LOAD_LIMIT", "lots")
    with pytest.raises(ValueError, match="TGCORE_LOAD_LIMIT='lots' is not a limit: expected a whole number >= 0"):
        safe_load(path)


# ***** torch_load: plain data through the pickle machine, and what it refuses *****


def _zip_of(path: Path, data_pkl: bytes) -> Path:
    _zip_checkpoint(path, data_pkl, {})
    return path


def _plain_data(protocol: int) -> Any:
    shared = [1, "two"]
    obj: dict[Any, Any] = {
        "ints": [0, 1, -1, 255, 256, 65535, 65536, -(2**31), 2**31 - 1, 2**100, -(2**70)],
        "floats": [0.0, -1.5, 1e300, float("inf")],
        "strings": ["", "a", "héllo ☃", "x" * 300],
        "nested": {"t": (1, (2, (3,))), "empty": ((), [], {})},
        "flags": [True, False, None],
        "shared": (shared, shared),
        (1, "key"): "a tuple key",
        7: "an int key",
    }
    state_dict = collections.OrderedDict([("w", 1), ("b", 2)])
    state_dict._metadata = collections.OrderedDict([("", {"version": 1})])  # type: ignore[attr-defined]
    obj["state_dict"] = state_dict  # as torch pickles a module's state dict: REDUCE, SETITEMS, then BUILD
    if protocol >= 3:
        obj["bytes"] = [b"", b"\x00\xff", bytes(300)]
    if protocol >= 4:
        obj["sets"] = [set(), {1, 2}, frozenset({"a", (1, 2)})]
        obj["bytearray"] = bytearray(b"ab") if protocol >= 5 else None
    return obj


@pytest.mark.parametrize("protocol", range(6))
def test_torch_load_reads_plain_data_of_every_pickle_protocol(tmp_path: Path, protocol: int) -> None:
    obj = _plain_data(protocol)
    got = torch_load(_zip_of(tmp_path / "plain.pt", pickle.dumps(obj, protocol)))
    assert got == obj
    assert got["shared"][0] is got["shared"][1]  # a memoized object stays one object
    assert type(got["state_dict"]) is collections.OrderedDict and list(got["state_dict"]) == ["w", "b"]
    assert got["state_dict"]._metadata == {"": {"version": 1}}


def test_torch_load_keeps_cycles(tmp_path: Path) -> None:
    loop: list[Any] = [1]
    loop.append(loop)
    got = torch_load(_zip_of(tmp_path / "loop.pt", pickle.dumps({"loop": loop}, 2)))
    assert got["loop"][0] == 1 and got["loop"][1] is got["loop"]


def _state(key: str, value: bytes) -> bytes:
    return pickle.EMPTY_DICT + _str(key) + value + pickle.SETITEM


REFUSED_PICKLES = [
    (_global("collections", "OrderedDict") + pickle.EMPTY_TUPLE + pickle.NEWOBJ, "uses the opcode NEWOBJ"),
    (pickle.MARK + pickle.INST + b"collections\nOrderedDict\n", "uses the opcode INST"),
    (pickle.EXT1 + b"\x01", "uses the opcode EXT1"),
    (b"\xff", "is no pickle opcode"),
    (_get(7), "refers to memo entry 7, which it never stored"),
    (_global("torch", "FloatStorage") + pickle.EMPTY_TUPLE + pickle.REDUCE, "which builds no tensor or container"),
    # before, BUILD could rewrite a checked tensor's size after the check
    (_tensor(2, 0, (2,), (1,)) + _state("size", _tuple(_int(1 << 30))) + pickle.BUILD, "sets the state of a"),
    (_tensor(2, 0, (1,) * 65, (1,) * 65), "65 dimensions, more than the 64"),
    (_tensor(2, 0, (1 << 62, 4), (0, 0)), "more than an int64 can count"),
    (_tensor(2, 1, (2,), (1,)), "reads element 2 of storage '0', which has 2"),
    (pickle.EMPTY_DICT + _tensor(2, 0, (2,), (1,)) + pickle.NONE + pickle.SETITEM, "a tensor is used as a dict key"),
    (_global("collections", "OrderedDict") + _tuple(_int(1)) + pickle.REDUCE, "expected () or (a list of pairs,)"),
    (pickle.EMPTY_LIST + pickle.MARK + _int(1) + _int(2) + pickle.SETITEMS, "adds items to a list, not a dict"),
]


@pytest.mark.parametrize("body,problem", REFUSED_PICKLES, ids=[f"pickle{i}" for i in range(len(REFUSED_PICKLES))])
def test_torch_load_refuses_what_a_checkpoint_does_not_need(tmp_path: Path, body: bytes, problem: str) -> None:
    path = tmp_path / "odd.pt"
    _zip_checkpoint(path, _pickle(body), {"0": np.array([1.0, 2.0], np.float32).tobytes()})
    with pytest.raises(ValueError, match=re.escape(problem)) as info:
        torch_load(path)
    assert str(info.value).startswith(f"torch_load: {str(path)!r}: ")


def test_torch_load_refuses_a_truncated_pickle(tmp_path: Path) -> None:
    whole = _pickle(_str("abcdefgh"))  # ... BINUNICODE, its length, 8 characters, SETITEM, STOP
    for cut, problem in ((len(whole) - 2, "ends before its STOP opcode"), (len(whole) - 6, "ends inside an opcode")):
        path = tmp_path / f"cut{cut}.pt"
        _zip_checkpoint(path, whole[:cut], {})
        with pytest.raises(ValueError, match=problem):
            torch_load(path)


def test_torch_load_names_a_storage_without_data(tmp_path: Path) -> None:
    path = tmp_path / "nodata.pt"
    _legacy_checkpoint(path, _pickle(_tensor(2, 0, (2,), (1,))), {})  # the list of storages with data is empty
    with pytest.raises(ValueError, match=rf"torch_load: {re.escape(repr(str(path)))}: .*no data for storage '0'"):
        torch_load(path)


def test_torch_load_refuses_compression_it_does_not_read(tmp_path: Path) -> None:
    path = tmp_path / "bz.pt"
    _zip_checkpoint(path, _pickle(_tensor(2, 0, (2,), (1,))), {"0": bytes(8)}, zipfile.ZIP_BZIP2)
    with pytest.raises(ValueError, match="uses zip compression method 12; torch writes entries uncompressed"):
        torch_load(path)


def test_torch_load_refuses_an_encrypted_entry(tmp_path: Path) -> None:
    path = tmp_path / "locked.pt"
    _zip_checkpoint(path, _pickle(_int(1)), {})
    raw = bytearray(path.read_bytes())
    at = raw.index(b"PK\x01\x02")  # the directory's entry of ckpt/data.pkl; its flags are at byte 8
    raw[at + 8] |= 0x1
    path.write_bytes(raw)
    with pytest.raises(ValueError, match="entry 'ckpt/data.pkl' is encrypted"):
        torch_load(path)


def test_a_deflated_checkpoint_loads(tmp_path: Path) -> None:
    path = tmp_path / "deflated.pt"
    values = np.linspace(-1, 1, 1000, dtype=np.float32)
    _zip_checkpoint(path, _pickle(_tensor(1000, 0, (10, 100), (100, 1))), {"0": values.tobytes()}, zipfile.ZIP_DEFLATED)
    np.testing.assert_array_equal(torch_load(path)["x"].numpy(), values.reshape(10, 100))


# ***** broadcast tensors *****


def test_a_broadcast_tensor_loads_into_a_model_whose_rows_stay_apart(tmp_path: Path) -> None:
    path = tmp_path / "expanded.pt"
    # a (2, 3) tensor of strides (0, 1): both rows are the storage's three elements
    _legacy_checkpoint(path, _pickle(_tensor(3, 0, (2, 3), (0, 1))), {"0": (3, struct.pack("<3f", 1, 2, 3))})
    weight = torch_load(path)["x"]
    np.testing.assert_array_equal(weight.numpy(), [[1, 2, 3], [1, 2, 3]])
    model = Linear(3, 2, bias=False)
    load_state_dict(model, {"weight": weight}, verbose=False)
    model.weight[0] = Tensor([9.0, 9.0, 9.0])  # the broadcast's rows are one storage: writing one must not write both
    np.testing.assert_array_equal(model.weight.numpy(), [[9, 9, 9], [1, 2, 3]])
    np.testing.assert_array_equal(weight.numpy(), [[1, 2, 3], [1, 2, 3]])


# ***** safe_save's temporary files, when writers are killed *****

_WRITER = """
import sys, time
import numpy as np
import tgcore.nn.state as state
from tgcore import Tensor

plain = state._tensor_to_file_bytes


def stall(t):  # the second tensor stalls the write: the temporary file is there, half written
    if t.shape == (2,):
        print("writing", flush=True)
        time.sleep(600)
    return plain(t)


if sys.argv[2] == "stall":
    state._tensor_to_file_bytes = stall
tensors = {"a": Tensor(np.arange(1 << int(sys.argv[3]), dtype=np.float32)), "b": Tensor([1.0, 2.0])}
if sys.argv[2] == "loop":
    print("writing", flush=True)
    while True:
        state.safe_save(tensors, sys.argv[1])
state.safe_save(tensors, sys.argv[1])
"""


def _writer(target: Path, mode: str, log2_size: int = 10) -> subprocess.Popen:
    """A child that safe_saves to target: "stall" stops inside the write, "loop" saves again and again."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _WRITER, str(target), mode, str(log2_size)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "DEVICE": "PYTHON"},
    )
    assert proc.stdout is not None and proc.stdout.readline() == "writing\n", "the writer died before writing"
    return proc


def _kill(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)  # reaped: a zombie would still count as a live writer
    assert proc.stdout is not None
    proc.stdout.close()


def _temps(folder: Path) -> list[str]:
    return sorted(n for n in os.listdir(folder) if n.endswith(".tmp"))


@pytest.mark.parametrize("cleaner", ["safe_save", "safe_load"])
def test_a_killed_writer_leaves_a_temporary_file_that_the_next_run_removes(tmp_path: Path, cleaner: str) -> None:
    target = tmp_path / "model.safetensors"
    writer = _writer(target, "stall")
    try:
        (live,) = _temps(tmp_path)
        assert live.startswith(".model.safetensors.") and f"-{writer.pid}." in live  # the writer's pid in the name
        safe_save({"w": Tensor([5.0])}, target)  # another writer meanwhile: the live one's file is not touched
        assert safe_load(target)["w"].numpy().tolist() == [5.0]
        assert _temps(tmp_path) == [live]
    finally:
        _kill(writer)
    assert _temps(tmp_path) == [live]  # SIGKILL runs no cleanup: the file stays until the next run
    if cleaner == "safe_save":
        safe_save({"w": Tensor([6.0])}, target)
    assert safe_load(target)["w"].numpy().tolist() == [6.0 if cleaner == "safe_save" else 5.0]
    assert os.listdir(tmp_path) == ["model.safetensors"]


def test_writers_killed_at_any_moment_leave_nothing_after_the_next_save(tmp_path: Path) -> None:
    target = tmp_path / "ckpt.safetensors"
    rng, left = random.Random(0), []
    for _ in range(5):
        writer = _writer(target, "loop", log2_size=20)  # 4 MiB a save: killed before, inside or after one
        time.sleep(rng.uniform(0.0, 0.5))
        _kill(writer)
        left.append(len(_temps(tmp_path)))
    # each writer's first save removed what the one killed before it left; most kills leave one half-written
    assert max(left) == 1, left
    safe_save({"w": Tensor([1.0, 2.0])}, target)
    assert os.listdir(tmp_path) == ["ckpt.safetensors"]
    assert safe_load(target)["w"].numpy().tolist() == [1.0, 2.0]


def test_temporary_files_of_others_are_left_alone(tmp_path: Path) -> None:
    import fcntl

    from tgcore.helpers import machine_tag

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = int(gone.stdout)  # a process that has exited and been reaped
    tag = machine_tag()
    other_tag = "0" * 8 if tag != "0" * 8 else "1" * 8
    keep = [
        f".m.safetensors.{tag}-{os.getpid()}.abc.tmp",  # a live writer (this process)
        f".m.safetensors.{other_tag}-{dead}.abc.tmp",  # a writer on another machine: its pid means nothing here
        f".m.safetensors.{tag}-{dead}.locked.tmp",  # a dead pid here, but its lock is held (another pid namespace)
        f".other.safetensors.{tag}-{dead}.abc.tmp",  # a temporary file of another target
        f".m.safetensors.{dead}.abc.tmp",  # not named by safe_save
    ]
    for name in keep:
        (tmp_path / name).write_bytes(b"partial")
    os.symlink(tmp_path / "elsewhere", tmp_path / f".m.safetensors.{tag}-{dead}.link.tmp")
    stale = tmp_path / f".m.safetensors.{tag}-{dead}.stale.tmp"
    stale.write_bytes(b"partial")
    with open(tmp_path / keep[2], "rb") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        safe_save({"w": Tensor([1.0])}, tmp_path / "m.safetensors")
    assert not stale.exists()
    assert sorted(os.listdir(tmp_path)) == sorted([*keep, f".m.safetensors.{tag}-{dead}.link.tmp", "m.safetensors"])
