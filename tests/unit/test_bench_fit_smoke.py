"""bench/fit.py keeps working: a --quick run exits 0, checks that every implementation trains to the
same losses and weights, and prints samples per second, ratios and targets. Without torch (as in
CI) the torch columns say n/a.

Nothing here looks at how fast anything is: timings are never pass/fail.
"""
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIT = ROOT / "bench" / "fit.py"
RATE = r"[\d,]+"
RATIO = r"\d+\.\d\dx"
HAVE_TORCH = importlib.util.find_spec("torch") is not None


def _row(output: str, name: str) -> list[str]:
    lines = [line for line in output.splitlines() if line.startswith(name + "  ")]
    assert len(lines) == 1, f"expected one table row for {name!r}, got {lines}\n{output}"
    return lines[0][len(name):].split()


def _load():
    sys.path.insert(0, str(FIT.parent))
    try:
        spec = importlib.util.spec_from_file_location("_bench_fit", FIT)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(FIT.parent))
    return module


@pytest.fixture(scope="module")
def quick_run():
    return subprocess.run([sys.executable, str(FIT), "--quick"], cwd=ROOT, capture_output=True, text=True, timeout=180)


def test_quick_run_exits_0_and_checks_the_implementations_agree(quick_run):
    assert quick_run.returncode == 0, quick_run.stdout + quick_run.stderr
    out = quick_run.stdout
    assert "CHECK FAILED" not in out + quick_run.stderr
    for batch in (32, 128):
        line = next(line for line in out.splitlines() if f"check batch {batch}:" in line)
        assert line.endswith("OK") and "flowlab eager" in line and "numpy" in line, line
        assert ("torch" in line) == HAVE_TORCH, line


def test_prints_the_machine_and_the_blas_warm_up(quick_run):
    out = quick_run.stdout
    for label in ("machine :", "numpy   :", "flowlab :", "torch   :", "blas    : warmed"):
        assert label in out, out


def test_every_batch_size_prints_rates_and_ratios(quick_run):
    out = quick_run.stdout
    for batch in (32, 128):
        cells = _row(out, f"fit batch {batch}")
        # numpy/s torch/s flowlab/s eager/s fl/numpy fl/torch eager/graph
        assert len(cells) == 7, cells
        for i in (0, 2, 3):
            assert re.fullmatch(RATE, cells[i]), (i, cells)
        assert re.fullmatch(RATE if HAVE_TORCH else "n/a", cells[1]), cells
        assert re.fullmatch(RATIO, cells[4]) and re.fullmatch(RATIO, cells[6]), cells
        assert re.fullmatch(RATIO if HAVE_TORCH else "n/a", cells[5]), cells


def test_targets_say_pass_or_miss(quick_run):
    out = quick_run.stdout
    for batch in (32, 128):
        assert re.search(rf"fit batch {batch}: flowlab within 1\.2x of numpy\s+{RATIO}\s+<= 1\.20x\s+(PASS|MISS)", out), out
    torch_target = re.search(r"fit batch 128: flowlab at least as fast as torch.*", out).group(0)
    assert re.search(r"(PASS|MISS)$" if HAVE_TORCH else r"n/a \(torch not installed\)$", torch_target), torch_target


def test_without_torch_the_table_and_targets_show_n_a(capsys):
    """The layout a machine without torch prints (CI's), from made-up rates: no timing runs."""
    fit = _load()
    results = {32: {"numpy": 40000.0, "flowlab": 36000.0, "flowlab eager": 18000.0},
               128: {"numpy": 50000.0, "flowlab": 40000.0, "flowlab eager": 30000.0}}
    fit.print_table(results, ["   check batch 32: ... OK"], fit.MODES["quick"])
    fit.print_targets(results)
    out = capsys.readouterr().out
    assert _row(out, "fit batch 32") == ["40,000", "n/a", "36,000", "18,000", "1.11x", "n/a", "2.00x"]
    assert _row(out, "fit batch 128")[4:6] == ["1.25x", "n/a"]
    assert re.search(r"fit batch 32: flowlab within 1\.2x of numpy\s+1\.11x\s+<= 1\.20x\s+PASS", out), out
    assert re.search(r"fit batch 128: flowlab within 1\.2x of numpy\s+1\.25x\s+<= 1\.20x\s+MISS", out), out
    assert "n/a (torch not installed)" in out
    assert fit.make("torch", None, None, None, None, 32) is None


def test_the_bench_imports_without_torch():
    """A child whose import of torch fails (as where it is not installed) still runs to the end."""
    code = ("import sys; sys.modules['torch'] = None; sys.argv = ['fit.py', '--quick']; "
            f"sys.path.insert(0, {str(FIT.parent)!r}); import runpy; runpy.run_path({str(FIT)!r}, run_name='__main__')")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "torch   : not installed" in r.stdout and "n/a (torch not installed)" in r.stdout
