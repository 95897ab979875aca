"""bench/pipeline.py keeps working: a --quick run exits 0 and prints every row, ratio and target.

Nothing here looks at how fast anything is: timings are never pass/fail.
"""
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
PIPELINE = ROOT / "bench" / "pipeline.py"
RATIO = r"\d+\.\d\dx"
HAVE_TF = importlib.util.find_spec("tensorflow") is not None
ROWS = ["consumer alone", "producer alone", "sequential", "parallel AUTOTUNE"]


def _row(output: str, name: str) -> list[str]:
    lines = [line for line in output.splitlines() if line.startswith(name + "  ")]
    assert len(lines) == 1, f"expected one table row for {name!r}, got {lines}\n{output}"
    return lines[0][len(name):].split()


def _load():
    sys.path.insert(0, str(PIPELINE.parent))
    try:
        spec = importlib.util.spec_from_file_location("_bench_pipeline", PIPELINE)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(PIPELINE.parent))
    return module


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "pipeline.json"
    run = subprocess.run([sys.executable, str(PIPELINE), "--quick", "--json", str(out)], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    return run, out


def test_quick_run_exits_0(quick_run):
    run, _ = quick_run
    assert run.returncode == 0, run.stdout + run.stderr
    assert "CHECK FAILED" not in run.stdout + run.stderr


def test_prints_the_machine_and_the_work(quick_run):
    out = quick_run[0].stdout
    for label in ("machine :", "numpy   :", "flowlab :", "work    : tanh over"):
        assert label in out, out
    assert re.search(r"2,000 elements, map ~\d+ us each, batch 64, consumer 5 ms per batch \(32 batches\)", out), out
    assert re.search(r"ideal = max\(producer alone, consumer alone\) = \d+\.\d{3} s", out), out


def test_every_row_prints_its_time_and_ratios(quick_run):
    out = quick_run[0].stdout
    cores = int(re.search(r"(\d+) usable cores", out).group(1))
    for name in [*ROWS, f"parallel k={cores}", f"parallel k={cores}, stats off"]:
        seconds, rate, over_ideal, speedup = _row(out, name)
        assert re.fullmatch(r"\d+\.\d{3}", seconds) and re.fullmatch(r"[\d,]+", rate), (name, seconds, rate)
        assert re.fullmatch(RATIO, over_ideal) and re.fullmatch(RATIO, speedup), (name, over_ideal, speedup)
    assert re.search(rf"recording: stats and events on cost {RATIO} of the time", out), out


def test_tf_data_row_and_target_say_what_happened(quick_run):
    out = quick_run[0].stdout
    cells = _row(out, "tf.data AUTOTUNE")
    target = re.search(r"no slower than tf\.data.*", out).group(0)
    if HAVE_TF:
        assert re.fullmatch(RATIO, cells[2]) and re.search(r"(PASS|MISS)$", target), (cells, target)
    else:
        assert cells == ["n/a"] * 4 and target.endswith("n/a (TensorFlow not installed)"), (cells, target)
        assert "tf.data : not installed" in out


def test_targets_and_autotune_decisions_are_printed(quick_run):
    out = quick_run[0].stdout
    assert re.search(rf"within 10% of the ideal\s+{RATIO}\s+<= 1\.10x\s+(PASS|MISS)", out), out
    assert re.search(r"AUTOTUNE \(parallel AUTOTUNE row, last round\): \d+ decisions", out), out
    assert re.search(r"map#1: workers \d+, buffer None, consumer waited", out), out


def test_json_holds_every_time(quick_run):
    run, path = quick_run
    data = json.loads(path.read_text())
    assert set(ROWS) | {"ideal"} <= set(data["times"]) and data["mode"]["elements"] == 2000
    assert data["autotune"]["stages"][1]["name"] == "map#1"


def test_target_table_with_tf_data_present(capsys):
    """The layout a machine with TensorFlow prints, without running timings."""
    bench = _load()
    bench.print_targets({"parallel AUTOTUNE": 2.2, "ideal": 2.1, "tf.data AUTOTUNE": 2.0})
    out = capsys.readouterr().out
    assert re.search(r"within 10% of the ideal\s+1\.05x\s+<= 1\.10x\s+PASS", out), out
    assert re.search(r"no slower than tf\.data\s+1\.10x\s+<= 1\.00x\s+MISS", out), out


def test_different_data_fails_the_check():
    bench = _load()
    same = [np.ones((2, 3))]
    bench.check_same(same, [np.ones((2, 3))], "x")
    with pytest.raises(SystemExit) as info:
        bench.check_same(same, [np.zeros((2, 3))], "parallel AUTOTUNE")
    assert info.value.code == 1
