"""bench/gpu.py keeps working where it cannot measure: without CuPy, a GPU or torch it says which
is missing and exits 0 (on a GPU machine the gpu tier's device run uses it for its figures)."""
import subprocess
import sys
from pathlib import Path

import pytest

from flowlab.core.backends import cupy_backend

GPU = Path(__file__).resolve().parents[2] / "bench" / "gpu.py"


@pytest.mark.skipif(cupy_backend.available(), reason="a GPU is visible: the gpu tier runs the real benchmark")
def test_without_a_gpu_it_says_why_and_exits_0():
    out = subprocess.run([sys.executable, str(GPU), "--quick"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.startswith("bench/gpu.py: skipped: "), out.stdout
    assert cupy_backend.why_unavailable() in out.stdout
