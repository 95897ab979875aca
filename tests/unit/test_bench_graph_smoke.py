"""bench/graph.py keeps working: a --quick run exits 0 and prints every table, the pass report
and the targets.

Nothing here looks at how fast anything is: timings are never pass/fail.
"""
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GRAPH = ROOT / "bench" / "graph.py"
CHAIN_ROWS = ["chain100 tanh 64x64", "chain100 cheap 64x64"]
RATIO = r"\d+\.\d\dx"
US = r"[\d,]+(\.\d+)?"
HAVE_TORCH = importlib.util.find_spec("torch") is not None


def _row(output: str, name: str, prefix: str = "") -> list[str]:
    lines = [line for line in output.splitlines() if line.startswith(prefix + name + "  ")]
    assert len(lines) == 1, f"expected one table row for {name!r}, got {lines}\n{output}"
    return lines[0][len(prefix + name):].split()


def _load():
    sys.path.insert(0, str(GRAPH.parent))
    try:
        spec = importlib.util.spec_from_file_location("_bench_graph", GRAPH)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(GRAPH.parent))
    return module


@pytest.fixture(scope="module")
def quick_run():
    return subprocess.run([sys.executable, str(GRAPH), "--quick"], cwd=ROOT, capture_output=True, text=True,
                          timeout=180)


def test_quick_run_exits_0(quick_run):
    assert quick_run.returncode == 0, quick_run.stdout + quick_run.stderr
    assert "CHECK FAILED" not in quick_run.stdout + quick_run.stderr


def test_prints_the_machine_and_why_torch_compile_is_skipped(quick_run):
    out = quick_run.stdout
    for label in ("machine :", "numpy   :", "flowlab :", "torch   :"):
        assert label in out, out
    assert re.search(r"torch\.compile: skipped( in --quick mode|: torch is not installed)", out), out


def test_every_chain_prints_its_times_and_ratios(quick_run):
    out = quick_run.stdout
    for name in CHAIN_ROWS:
        # numpy torch torch.compile eager no-passes graph eager/graph no-passes/graph
        cells = _row(out, name)
        assert len(cells) == 8, (name, cells)
        assert cells[2] == "n/a", cells                            # no torch.compile in --quick
        assert re.fullmatch(US if HAVE_TORCH else "n/a", cells[1]), cells
        for i in (0, 3, 4, 5):
            assert re.fullmatch(US, cells[i]), (name, i, cells)
        assert re.fullmatch(RATIO, cells[6]) and re.fullmatch(RATIO, cells[7]), cells
    assert re.search(r"chain100 tanh 64x64: 100 nodes, 1 after the passes", out), out


def test_the_mlp_step_prints_its_check_and_ratios(quick_run):
    out = quick_run.stdout
    cells = _row(out, "mlp step batch 32")
    # numpy torch.compile eager no-passes graph eager/graph no-passes/graph graph/numpy
    assert len(cells) == 8, cells
    assert all(re.fullmatch(RATIO, c) for c in cells[5:]), cells
    check = next(line for line in out.splitlines() if "check: after 3 steps" in line)
    assert check.endswith("OK") and "bit for bit" in check, check


def test_the_pass_report_shows_nodes_after_each_pass(quick_run):
    out = quick_run.stdout
    for section in ("   mlp step batch 32", "   chain100 tanh 64x64"):
        assert section in out.splitlines(), out
    labels = ["traced", "+ constant folding", "+ common subexpressions", "+ dead-node pruning",
              "+ elementwise fusion", "+ buffer reuse"]
    tail = out[out.index("3. What each pass does"):]
    chain = tail[tail.index("   chain100 tanh 64x64"):]
    for label in labels:
        cells = _row(chain, label, prefix="   ")
        assert len(cells) == 4 and re.fullmatch(RATIO, cells[3]), (label, cells)
    assert _row(chain, "traced", prefix="   ")[0] == "100"
    assert _row(chain, "+ elementwise fusion", prefix="   ")[0] == "1"


def test_targets_say_pass_or_miss(quick_run):
    out = quick_run.stdout
    assert re.search(r"MLP step batch 32: @fl\.function at least 1\.5x faster than eager\s+\S+\s+>= 1\.50x\s+"
                     r"(PASS|MISS)", out), out
    assert re.search(r"chain100 tanh 64x64: fused graph at least 3x faster than eager\s+\S+\s+>= 3\.00x\s+"
                     r"(PASS|MISS)", out), out


def test_targets_and_skips_without_running_timings(capsys):
    graph = _load()
    chains = {name: {"eager": 3e-3, "graph": 1e-3} for name in CHAIN_ROWS}
    graph.print_targets(chains, {"eager": 1.2e-3, "graph": 1e-3})
    out = capsys.readouterr().out
    assert re.search(r"chain100 tanh 64x64: .*\s3\.00x\s+>= 3\.00x\s+PASS", out), out
    assert re.search(r"MLP step batch 32: .*\s1\.20x\s+>= 1\.50x\s+MISS", out), out
    assert graph.torch_compile_results(None, graph.MODES["full"]) == "skipped: torch is not installed"
