"""Working folders for compilers that must write files (a C compiler's shared object, an assembler's input), and the
folder where failed compiles are reported.

Everything lives under one folder of the user's own, `<tempdir>/tgcore-<uid>` (mode 0700; tempdir is $TMPDIR or the
system's). A process gets its own folder there, `proc-<pid>-<random>`, holding a lock file that it keeps locked while
it runs; each compile works in a folder of its own inside it and removes it when done. A process that is killed
(SIGKILL skips every cleanup) leaves its folder behind, unlocked: the next process that needs one removes every
unlocked process folder first, and a process that exits normally removes its own. So nothing stays but the folders of
running processes and the reports of failed compiles (`compile-errors/`, at most MAX_REPORTS of them).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import stat
import tempfile
import threading
import time
from typing import Iterator, Optional

try:  # POSIX; elsewhere process folders are removed at exit only
    import fcntl
except ImportError:  # pragma: no cover (Windows)
    fcntl = None  # type: ignore[assignment]

_PROCESS_PREFIX = "proc-"
_NEW_PREFIX = ".new-"  # a process folder being made
_UNFINISHED_S = 60  # a folder still being made after this long was left by a process that died making it
_LOCK = "lock"
MAX_REPORTS = 64
_guard = threading.Lock()
_state: dict[str, object] = {}  # "pid", "folder", "lock_fd", "user": this process's folder and the lock it holds


def user_folder() -> str:
    """The user's own folder under the temp dir, made if needed; a fresh private one where that path is not a folder
    of this user's that only they can use (another user made it, or a link: never write there)."""
    path = os.path.join(tempfile.gettempdir(), f"tgcore-{_uid()}")
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    info = os.lstat(path)
    if stat.S_ISDIR(info.st_mode) and (not hasattr(os, "getuid") or info.st_uid == os.getuid()):
        if info.st_mode & 0o077:  # the user's own, opened to others (by hand): only theirs again
            os.chmod(path, 0o700)
        return path
    cached = _state.get("user")
    if not isinstance(cached, str) or not os.path.isdir(cached):
        cached = _state["user"] = tempfile.mkdtemp(prefix=f"tgcore-{_uid()}-")
    return cached


def process_folder() -> str:
    """This process's folder (made, and the folders of processes that are gone removed, on first use)."""
    with _guard:
        folder = _state.get("folder")
        if _state.get("pid") == os.getpid() and isinstance(folder, str) and os.path.isdir(folder):
            return folder
        parent = user_folder()
        sweep(parent)
        # made under another name and renamed once locked: a sweep never sees an unlocked folder of a live process
        new = tempfile.mkdtemp(prefix=_NEW_PREFIX, dir=parent)
        fd = os.open(os.path.join(new, _LOCK), os.O_RDWR | os.O_CREAT, 0o600)
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX)
        folder = os.path.join(parent, f"{_PROCESS_PREFIX}{os.getpid()}-{os.path.basename(new)[len(_NEW_PREFIX) :]}")
        os.rename(new, folder)
        old_fd = _state.get("lock_fd")
        if isinstance(old_fd, int) and _state.get("pid") != os.getpid():  # a forked child: its parent's lock
            with contextlib.suppress(OSError):
                os.close(old_fd)
        _state.update(pid=os.getpid(), folder=folder, lock_fd=fd)
        return folder


@contextlib.contextmanager
def compile_folder(prefix: str) -> Iterator[str]:
    """A new empty folder for one compile, inside this process's folder, removed afterwards."""
    folder = tempfile.mkdtemp(prefix=prefix, dir=process_folder())
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def sweep(parent: str) -> list[str]:
    """Remove the process folders in `parent` whose process is gone (their lock is free); the ones removed."""
    if fcntl is None:
        return []
    removed = []
    for entry in os.listdir(parent):
        path = os.path.join(parent, entry)
        if not entry.startswith((_PROCESS_PREFIX, _NEW_PREFIX)) or path == _state.get("folder"):
            continue
        try:
            fd = os.open(os.path.join(path, _LOCK), os.O_RDWR)
        except OSError:  # no lock file: a folder being made (or whose process died making it, a while ago)
            with contextlib.suppress(OSError):
                if entry.startswith(_NEW_PREFIX) and time.time() - os.lstat(path).st_mtime > _UNFINISHED_S:
                    shutil.rmtree(path, ignore_errors=True)
                    removed.append(path)
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # locked: its process runs
            os.close(fd)
            continue
        shutil.rmtree(path, ignore_errors=True)
        os.close(fd)
        removed.append(path)
    return removed


def report_folder() -> Optional[str]:
    """The folder of failed compiles' reports (made if needed), None where none can be made."""
    try:
        path = os.path.join(user_folder(), "compile-errors")
        os.makedirs(path, 0o700, exist_ok=True)
    except OSError:
        return None
    return path


def write_report(name: str, text: str) -> Optional[str]:
    """Write `text` to report `name` (a file name) in report_folder, whole or not at all, keeping the newest
    MAX_REPORTS; its path, or None where it cannot be written."""
    folder = report_folder()
    if folder is None:
        return None
    path = os.path.join(folder, name)
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".report-")
        with os.fdopen(fd, "w", encoding="utf-8", errors="replace") as f:
            f.write(text)
        os.replace(tmp, path)  # renamed into place: a crash leaves no half-written report
    except OSError:
        return None
    with contextlib.suppress(OSError):  # (another process may be pruning too)
        entries = [e for e in os.scandir(folder) if e.is_file()]
        unfinished = [e for e in entries if e.name.startswith(".") and time.time() - e.stat().st_mtime > _UNFINISHED_S]
        reports = sorted((e for e in entries if not e.name.startswith(".")), key=lambda e: e.stat().st_mtime)
        for old in unfinished + reports[:-MAX_REPORTS]:
            os.unlink(old.path)
    return path


def _uid() -> str:
    return str(os.getuid()) if hasattr(os, "getuid") else os.environ.get("USERNAME", "user")


@atexit.register
def _remove_own_folder() -> None:
    folder = _state.get("folder")
    if _state.get("pid") == os.getpid() and isinstance(folder, str):
        shutil.rmtree(folder, ignore_errors=True)
    fallback = _state.get("user")  # a private folder made because the user's could not be used: gone if empty
    if isinstance(fallback, str):
        with contextlib.suppress(OSError):
            os.rmdir(fallback)
