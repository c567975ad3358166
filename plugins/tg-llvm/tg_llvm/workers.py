"""Processes that compile LLVM IR: llvmlite holds one lock around every call into LLVM, so in one process kernels
compile one at a time whatever the threads; a schedule's new kernels (LLVMCompiler.compile_many) are compiled by
these instead, one kernel per process at a time, as many processes as cores.

A worker is `python -m tg_llvm.workers OPT`: a plain program (not multiprocessing, which would run the user's main
script again in each child), started on first need and kept for the life of this process. It reads a source (8
bytes of little-endian length, then UTF-8 IR) and answers a status byte (0: object code, 1: CompileError's message
and log, 2: another error's text), 8 bytes of length and the payload; it ends when its input closes (this process
exited, however), and never writes anything else on its output (it prints to stderr)."""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import sys
import threading
from typing import Any, Optional

from tgcore.plugin import CompileError

_OK, _COMPILE_ERROR, _ERROR = 0, 1, 2


class WorkerError(RuntimeError):
    """A worker process failed (did not start, or died): the caller compiles in this process instead."""


class _Worker:
    """One worker process and its pipes."""

    def __init__(self, opt: int) -> None:
        # this process's module path, so that the worker imports the tg_llvm (and tgcore) this process runs, even
        # one found through a path the program added
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tg_llvm.workers", str(opt)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                env=env,
            )
        except OSError as e:
            raise WorkerError(f"could not start an LLVM compile worker: {e}") from e
        self.answered = False  # (a worker that fails before its first answer cannot start here: see Workers)

    def compile(self, src: str) -> bytes:
        data = src.encode()
        stdin, stdout = self.proc.stdin, self.proc.stdout
        assert stdin is not None and stdout is not None
        try:
            stdin.write(len(data).to_bytes(8, "little") + data)
            stdin.flush()
            head = stdout.read(9)
            if len(head) < 9:
                raise WorkerError(f"an LLVM compile worker ended (exit status {self.proc.poll()})")
            payload = stdout.read(int.from_bytes(head[1:], "little"))
        except OSError as e:  # (a broken pipe: the worker is gone)
            raise WorkerError(f"an LLVM compile worker failed: {e}") from e
        self.answered = True
        if head[0] == _OK:
            return payload
        text = payload.decode(errors="replace")
        if head[0] == _COMPILE_ERROR:
            message, _, log = text.partition("\0")
            raise CompileError(message, log=log, src=src)
        raise WorkerError(f"an LLVM compile worker failed: {text}")

    def close(self) -> None:
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()  # (the worker ends at the end of its input)
            self.proc.wait(timeout=5)
        except Exception:  # already gone, or stuck: it ends with this process's exit anyway
            self.proc.kill()


class Workers:
    """Up to `count` workers for one optimization level, each lent to one thread at a time."""

    def __init__(self, opt: int, count: int) -> None:
        self.opt, self.count = opt, count
        self.lock = threading.Lock()
        self.free: list[_Worker] = []
        self.started = 0  # workers running (or starting)
        self.compiled = 0  # sources they compiled
        self.ready = threading.Semaphore(count)
        # a worker failed before its first answer (no Python to run it, tg_llvm not importable by it): none is
        # started again, every kernel compiles in this process (one that died after answering is replaced)
        self.broken = False

    def compile(self, src: str) -> bytes:
        """The object code of `src`, compiled by a free worker (started if fewer than `count` run)."""
        with self.ready:  # (at most `count` compiles at once: one a worker)
            if self.broken:
                raise WorkerError("the LLVM compile workers cannot start here")
            with self.lock:
                worker = self.free.pop() if self.free else None
                if worker is None:
                    self.started += 1
            if worker is None:
                try:
                    worker = _Worker(self.opt)
                except WorkerError:
                    with self.lock:
                        self.started -= 1
                        self.broken = True
                    raise
            try:
                lib = worker.compile(src)
            except CompileError:
                with self.lock:
                    self.free.append(worker)
                raise
            except WorkerError:
                worker.close()
                with self.lock:
                    self.started -= 1
                    self.broken = self.broken or not worker.answered
                raise
            with self.lock:
                self.free.append(worker)
                self.compiled += 1
            return lib

    def close(self) -> None:
        with self.lock:
            workers, self.free = self.free, []
        for worker in workers:
            worker.close()


_pools: dict[tuple[int, int], Workers] = {}
_pools_lock = threading.Lock()


def workers(opt: int, count: int) -> Optional[Workers]:
    """The workers of optimization level `opt`: at most `count`, or TGCORE_LLVM_WORKERS where set; None where they
    are not used: with a count of 0, and on hosts whose objects are not ELF (the worker's renaming of the kernels'
    symbols is ELF's: tg_llvm/compiler.py)."""
    if (env := os.environ.get("TGCORE_LLVM_WORKERS", "")).isdigit():
        count = int(env)
    if count < 1 or not sys.platform.startswith("linux") or not sys.executable:
        return None
    with _pools_lock:
        if (pool := _pools.get((opt, count))) is None:
            pool = _pools[(opt, count)] = Workers(opt, count)
        return pool


def _close_all() -> None:
    for pool in list(_pools.values()):
        pool.close()


def _forget_after_fork() -> None:  # a forked child shares its parent's pipes: it starts workers of its own
    _pools.clear()


atexit.register(_close_all)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)


def main() -> None:
    """A worker: compile each source read from stdin, answer on stdout (see the module docstring)."""
    from tg_llvm.compiler import LLVMCompiler

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # (Ctrl-C is for the process it serves; it ends with its input)
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # anything printed (by LLVM or Python) goes to stderr, never into the answers
    stdin = sys.stdin.buffer
    compiler = LLVMCompiler(int(sys.argv[1]), workers=0)
    while len(head := stdin.read(8)) == 8:
        src = stdin.read(int.from_bytes(head, "little")).decode()
        status: int
        payload: Any
        try:
            payload, status = compiler.compile(src), _OK
        except CompileError as e:
            payload, status = f"{e.message}\0{e.log}".encode(), _COMPILE_ERROR
        except Exception as e:  # (reported to the caller, which compiles the source itself)
            payload, status = f"{type(e).__name__}: {e}".encode(), _ERROR
        out.write(bytes([status]) + len(payload).to_bytes(8, "little") + payload)
        out.flush()


if __name__ == "__main__":
    main()
