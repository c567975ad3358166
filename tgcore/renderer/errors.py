"""The text of a CompileError: short enough to read (a kernel's source is often 15 KB), with the path of a report
that keeps everything."""

from __future__ import annotations

import hashlib
import re

from tgcore.scratch import write_report

LOG_LINES = 20  # of the compiler's log, in the text
CONTEXT = 2  # source lines on each side of one the log points at
MAX_POINTS = 3  # source lines the log points at, shown
WIDTH = 200  # characters of one source line, shown
LOG_WIDTH = 1000  # characters of one line of the log, shown (clang echoes the line it points at: a header's are long)
# `file:12:5:` (gcc, clang, LLVM, OpenCL, Metal) and `file(12):` (NVRTC) point at line 12 of the source
_POINTER = re.compile(r"[\w>\]]:(\d+):|\w\((\d+)\):")


def compile_error_text(message: str, log: str, src: str) -> str:
    """The message, the log's first LOG_LINES lines, the source lines it points at (CONTEXT lines around each), and
    where the report with the whole log and source is (written here; none for an error without source and a short
    log)."""
    parts = [message]
    log_lines = log.strip("\n").splitlines()
    if log_lines:
        cut = f" (the first {LOG_LINES} of {len(log_lines)} lines)" if len(log_lines) > LOG_LINES else ""
        parts.append(f"--- compiler log{cut} ---")
        parts += [_clip(line, LOG_WIDTH) for line in log_lines[:LOG_LINES]]
    src_lines = src.splitlines()
    pointed: list[int] = []
    for m in _POINTER.finditer(log):
        n = int(m.group(1) or m.group(2))
        if 1 <= n <= len(src_lines) and n not in pointed:
            pointed.append(n)
    shown = sorted(
        {n for p in pointed[:MAX_POINTS] for n in range(max(1, p - CONTEXT), min(len(src_lines), p + CONTEXT) + 1)}
    )
    if shown:
        parts.append(f"--- source ({len(src_lines)} lines), where the log points ---")
        for i, n in enumerate(shown):
            if i and n != shown[i - 1] + 1:
                parts.append("   ...")
            parts.append(f"{'>' if n in pointed else ' '}{n:5d} | {_clip(src_lines[n - 1], WIDTH)}")
    if src or len(log_lines) > LOG_LINES:
        report = f"{message}\n--- compiler log ---\n{log}\n--- source ---\n{src}\n"
        digest = hashlib.sha256(report.encode(errors="replace")).hexdigest()[:16]
        path = write_report(f"compile-error-{digest}.txt", report)
        parts.append(f"--- the whole log and source: {path} ---" if path else "--- (no report could be written) ---")
    return "\n".join(parts)


def _clip(line: str, width: int) -> str:
    return line if len(line) <= width else f"{line[:width]} ... ({len(line) - width} more characters)"
