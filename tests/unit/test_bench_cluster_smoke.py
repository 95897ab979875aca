"""bench/cluster.py keeps working: a --quick run (flowlab only) exits 0 and prints every section
and the targets. Nothing here looks at how fast anything is: timings are never pass/fail."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench" / "cluster.py"


@pytest.fixture(scope="module")
def quick_run():
    return subprocess.run([sys.executable, str(BENCH), "--quick", "--no-peers", "--workers", "2"], cwd=ROOT,
                          capture_output=True, text=True, timeout=240)


def test_quick_run_exits_0(quick_run):
    assert quick_run.returncode == 0, quick_run.stdout + quick_run.stderr


def test_prints_the_machine_and_every_section(quick_run):
    out = quick_run.stdout
    for label in ("machine :", "python  :", "flowlab :", "1. Time to 2 ready workers", "2. Round trip",
                  "3. 64 MiB from one worker to another", "4. Targets"):
        assert label in out, out
    assert "dask: not installed (skipped: --no-peers)" in out


def test_rows_have_figures(quick_run):
    out = quick_run.stdout
    assert re.search(r"^\s+flowlab\s+\d+\.\d{3} s$", out, re.M), out
    for row in ("bare pyzmq echo", "flowlab ping", "flowlab op", "flowlab task"):
        assert re.search(rf"^\s+{row}\s+[\d,.]+\s+[\d,.]+$", out, re.M), (row, out)
    assert re.search(r"^\s+flowlab\s+[\d.]+ ms\s+[\d.]+ GB/s$", out, re.M), out


def test_targets_say_pass_or_miss(quick_run):
    out = quick_run.stdout
    for label in ("4 workers ready in under 1.0 s", "tiny remote op round trip under 150 us",
                  "64 MiB between two workers at 1 GB/s or more"):
        assert re.search(rf"{re.escape(label)}\s+\S+( \S+)?\s+(PASS|MISS)$", out, re.M), (label, out)
