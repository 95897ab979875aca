"""bench/eager.py keeps working: a --quick run exits 0 and prints every benchmark's ratios.

Nothing here looks at how fast anything is: timings are never pass/fail.
"""
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EAGER = ROOT / "bench" / "eager.py"
OP_ROWS = ["add 4x4", "add 64x64", "matmul 4x4", "matmul 64x64", "chain100 64x64"]
MLP_ROWS = ["mlp step batch 32", "mlp step batch 128"]
RATIO = r"(\d+\.\d\dx|n/a)"
HAVE_TORCH = importlib.util.find_spec("torch") is not None


def _row(output: str, name: str) -> list[str]:
    lines = [line for line in output.splitlines() if line.startswith(name + "  ")]
    assert len(lines) == 1, f"expected one table row for {name!r}, got {lines}\n{output}"
    return lines[0][len(name):].split()


@pytest.fixture(scope="module")
def quick_run():
    return subprocess.run([sys.executable, str(EAGER), "--quick"], cwd=ROOT,
                          capture_output=True, text=True, timeout=180)


def test_quick_run_exits_0(quick_run):
    assert quick_run.returncode == 0, quick_run.stdout + quick_run.stderr
    assert "CHECK FAILED" not in quick_run.stdout + quick_run.stderr


def test_prints_the_machine(quick_run):
    out = quick_run.stdout
    for label in ("machine :", "numpy   :", "flowlab :", "torch   :"):
        assert label in out, out
    assert "get_blas_threads() =" in out


def test_every_op_benchmark_prints_its_ratios(quick_run):
    out = quick_run.stdout
    for name in OP_ROWS:
        cells = _row(out, name)
        # numpy torch flowlab fl/numpy fl/torch fl+tape tape/numpy tape/torch torch+grad tape/torch+grad
        assert len(cells) == 10, (name, cells)
        for i in (3, 4, 6, 7, 9):
            assert re.fullmatch(RATIO, cells[i]), (name, i, cells)
        assert re.fullmatch(r"\d+\.\d\dx", cells[3]), cells     # flowlab/numpy is always there
        assert re.fullmatch(r"\d+\.\d\dx", cells[6]), cells     # flowlab+tape/numpy too
        if HAVE_TORCH:
            assert re.fullmatch(r"\d+\.\d\dx", cells[4]), cells
            assert re.fullmatch(r"\d+\.\d\dx", cells[7]), cells


def test_every_mlp_benchmark_prints_its_ratios_and_the_loss_check(quick_run):
    out = quick_run.stdout
    for name in MLP_ROWS:
        cells = _row(out, name)
        # numpy/s torch/s flowlab/s numpy-us torch-us flowlab-us fl/numpy fl/torch
        assert len(cells) == 8, (name, cells)
        assert re.fullmatch(r"\d+\.\d\dx", cells[6]), cells
        assert re.fullmatch(r"\d+\.\d\dx" if HAVE_TORCH else "n/a", cells[7]), cells
    for size in (32, 128):
        line = next(line for line in out.splitlines() if f"check batch {size}:" in line)
        assert line.endswith("OK") and "flowlab" in line and "numpy" in line, line
        assert ("torch" in line) == HAVE_TORCH, line


def test_targets_say_pass_or_miss(quick_run):
    out = quick_run.stdout
    assert re.search(r"add 4x4, no tape: flowlab within 2\.5x of numpy\s+\S+\s+<= 2\.50x\s+(PASS|MISS)", out), out
    for size in (32, 128):
        assert re.search(rf"MLP step batch {size}: flowlab within 1\.5x of numpy\s+\S+\s+<= 1\.50x\s+(PASS|MISS)",
                         out), out
    torch_target = re.search(r"add 4x4, no tape: flowlab faster than torch.*", out).group(0)
    assert re.search("PASS|MISS" if HAVE_TORCH else r"n/a \(torch not installed\)", torch_target), torch_target


def test_tables_without_torch_show_n_a(capsys):
    """The no-torch layout (what a machine without the bench extra prints), without running timings."""
    sys.path.insert(0, str(EAGER.parent))
    try:
        spec = importlib.util.spec_from_file_location("_bench_eager", EAGER)
        eager = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(eager)
    finally:
        sys.path.remove(str(EAGER.parent))
    ops = {name: {"numpy": 1e-6, "flowlab": 2e-6, "flowlab+tape": 5e-6} for name in OP_ROWS}
    mlp = {32: {"numpy": 1e-3, "flowlab": 1.2e-3}, 128: {"numpy": 3e-3, "flowlab": 3.3e-3}}
    mode = eager.MODES["quick"]
    eager.print_op_table(ops, mode)
    eager.print_mlp_table(mlp, ["   check batch 32: ... OK"], mode)
    eager.print_targets(ops, mlp)
    out = capsys.readouterr().out
    assert _row(out, "add 4x4")[3:5] == ["2.00x", "n/a"]
    assert _row(out, "mlp step batch 128")[6:] == ["1.10x", "n/a"]
    assert "n/a (torch not installed)" in out
    assert re.search(r"MLP step batch 32: flowlab within 1\.5x of numpy\s+1\.20x\s+<= 1\.50x\s+PASS", out), out
