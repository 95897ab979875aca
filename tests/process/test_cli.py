"""The installed ``flowlab`` command runs in a fresh process."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

import flowlab

pytestmark = pytest.mark.process
SCRIPT = Path(sys.executable).with_name("flowlab")


def _run(*args):
    cmd = [str(SCRIPT), *args] if SCRIPT.exists() else [sys.executable, "-m", "flowlab", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=dict(os.environ))


def test_info_reports_versions_blas_and_gpu():
    r = _run("info")
    assert r.returncode == 0, r.stderr
    assert f"flowlab      {flowlab.__version__}" in r.stdout
    assert "thread(s)" in r.stdout          # BLAS and its thread count
    assert "GPU (CuPy)" in r.stdout
    assert f"{len(flowlab.core.list_ops())} in the op table" in r.stdout


def test_no_command_prints_help_and_fails():
    r = _run()
    assert r.returncode == 2
    assert "info" in r.stdout


def test_version():
    r = _run("--version")
    assert r.returncode == 0 and r.stdout.strip() == flowlab.__version__
