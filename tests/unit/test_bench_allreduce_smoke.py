"""bench/allreduce.py keeps working: a --quick run exits 0 and prints both tables with every row,
and each peer that cannot run says why. Nothing here looks at how fast anything is."""
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench" / "allreduce.py"
ROWS = ["flowlab threads ring", "flowlab threads tree", "flowlab threads naive", "flowlab mpi ring",
        "flowlab mpi tree", "flowlab mpi naive", "flowlab mpi native", "mpi4py Allreduce", "torch gloo",
        "flowlab zmq ring", "flowlab zmq tree", "flowlab zmq naive"]
TIME = r"(\d+ us|\d+\.\d\d ms|\d+\.\d\d s|n/a)"
GBPS = r"(\d+\.\d{3}|n/a)"


def _load():
    sys.path.insert(0, str(BENCH.parent))
    try:
        spec = importlib.util.spec_from_file_location("_bench_allreduce", BENCH)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCH.parent))
    return module


@pytest.fixture(scope="module")
def quick_run():
    return subprocess.run([sys.executable, str(BENCH), "--quick"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)


def _section(out, title):
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(title))
    return lines[start:start + 2 + len(ROWS)]


def test_quick_run_exits_0_and_checks_every_result(quick_run):
    out = quick_run.stdout + quick_run.stderr
    assert quick_run.returncode == 0, out
    assert "CHECK FAILED" not in out and "every row's result was verified" in out, out
    for label in ("machine :", "python  :", "mpi     :", "torch   :"):
        assert label in quick_run.stdout, quick_run.stdout


def test_both_tables_show_every_row_for_each_size(quick_run):
    out = quick_run.stdout
    assert "== 2 ranks ==" in out
    for title, cell in (("latency", TIME), ("bus bandwidth (GB/s)", GBPS)):
        table = _section(out, title)
        assert table[0].split()[-4:] == ["4", "KiB", "1", "MiB"], table[0]
        for row, line in zip(ROWS, table[2:]):
            assert line.startswith(row + " "), (row, line)
            cells = re.findall(cell, line[len(row):])
            assert len(cells) == 2, (row, line)
        for line in table[2:5]:       # flowlab on threads always runs
            assert "n/a" not in line, line


def test_a_peer_that_cannot_run_says_why(quick_run):
    out = quick_run.stdout
    for row, peer in (("mpi4py Allreduce", "mpi"), ("torch gloo", "torch gloo")):
        line = next(line for line in _section(out, "latency") if line.startswith(row))
        if "n/a" in line:
            assert re.search(rf"^{peer}: skipped: \S", out, re.M), out


def test_report_helpers_without_timing():
    bench = _load()
    assert bench.busbw(1 << 20, 4, 1.0) == pytest.approx((1 << 20) * 1.5 / 1e9)
    assert bench.busbw(4096, 2, None) is None
    assert [bench.fmt_time(s) for s in (5e-6, 2.5e-3, 3.0, None)] == ["5 us", "2.50 ms", "3.00 s", "n/a"]
    assert bench.slowest_median([[1.0, 5.0, 2.0], [3.0, 1.0, 2.5]]) == 3.0    # per-iteration max, then median
    lines = bench.report(2, ["4 KiB"], {("flowlab threads ring", "4 KiB"): (1e-3, True)},
                         {"torch gloo": "torch is not installed"})
    text = "\n".join(lines)
    assert re.search(r"^flowlab threads ring +1\.00 ms$", text, re.M), text
    assert re.search(r"^flowlab threads ring +0\.004$", text, re.M), text     # 4096 B * 2(1)/2 / 1 ms
    assert "torch gloo: skipped: torch is not installed" in text
