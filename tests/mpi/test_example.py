"""examples/ddp_digits.py on two ranks: it learns (> 90% test accuracy), and a run stopped after epoch 3 and resumed
from its checkpoint prints the very losses of a run that never stopped."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

pytest.importorskip("mpi4py", reason="tgcore.distributed needs mpi4py: pip install './[mpi]'")
pytest.importorskip("sklearn", reason="the example loads scikit-learn's bundled digits: pip install scikit-learn")

from test_distributed import _mpiexec  # noqa: E402

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "ddp_digits.py")


def _run(*args: str) -> list[tuple[int, str, float]]:
    out = subprocess.run(
        [_mpiexec(), "-n", "2", sys.executable, EXAMPLE, *args], capture_output=True, text=True, timeout=240
    )
    assert out.returncode == 0, out.stdout + out.stderr
    epochs = re.findall(r"epoch +(\d+) +loss ([\d.]+) +test accuracy ([\d.]+)", out.stdout)
    return [(int(e), loss, float(acc)) for e, loss, acc in epochs]


def test_two_ranks_learn_and_resume_exactly(tmp_path) -> None:  # noqa: ANN001
    whole = _run("--epochs", "5")
    assert [e for e, _, _ in whole] == [1, 2, 3, 4, 5]  # printed once, by rank 0
    assert whole[-1][2] > 0.9
    ckpt = str(tmp_path / "ckpt.safetensors")
    first = _run("--epochs", "3", "--checkpoint", ckpt)
    resumed = _run("--epochs", "5", "--checkpoint", ckpt)
    assert [e for e, _, _ in resumed] == [4, 5]
    assert first + resumed == whole
