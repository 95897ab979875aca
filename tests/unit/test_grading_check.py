"""``fl.grading.check(id, answer)`` against a small exercises folder made here: a right answer passes
with its points, a wrong one fails with the case, the inputs, expected and received and a hint that
escalates with each failed try; a wrong id says "did you mean"; hidden cases are counted, not run; a
case that runs too long fails with the limit; a cheating ``__eq__`` fails; the comparison runs in
another process; the manifest is validated; the result's view carries its snapshot, text and HTML."""
import json
import os
import time
from pathlib import Path

import numpy as np
import pytest

import flowlab as fl
from flowlab.grading import CheckResult, check
from flowlab.grading.check import reset_attempts
from flowlab.grading.manifest import (ExerciseError, UnknownExerciseError, find_exercises, load_checks,
                                      load_manifest)

CHECKS = '''
import time
import numpy as np
from flowlab.grading import Case

HINTS = ["Add the numbers up.", "sum() adds a list.", "Return a float: float(sum(xs))."]
TOLERANCE = {"rtol": 1e-9}

def cases():
    yield Case("three numbers", args=([1.0, 2.0, 3.0],), expected=6.0)
    yield Case("an array", args=(np.arange(4.0),), expected=lambda args: float(np.sum(args[0])))

### BEGIN HIDDEN TESTS
def hidden_cases():
    yield Case("empty", args=([],), expected=0.0)
    yield Case("negative", args=([-1.0],), expected=-1.0)
### END HIDDEN TESTS
'''

SCALE = '''
from flowlab.grading import Case
POINTS = 2
def cases():
    yield Case("double", args=(3,), kwargs={"by": 2}, expected=6)
def run(answer, case):
    return answer(*case.args, **case.kwargs)
'''

CONSTANT = '''
from flowlab.grading import Case
def cases():
    yield Case("the answer", expected=42)
'''


def _write_exercises(root: Path, manifest=None, checks=None) -> Path:
    d = root / "exercises"
    (d / "checks").mkdir(parents=True)
    manifest = manifest or [
        {"id": "add-up", "notebook": "01_add.ipynb", "answer": "add_up", "points": 3, "title": "Add up"},
        {"id": "scale", "notebook": "02_scale.ipynb", "answer": "scale"},
        {"id": "the-answer", "notebook": "02_scale.ipynb", "answer": "ANSWER"}]
    for item in manifest:
        (d / item["notebook"]).write_text('{"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}')
    (d / "manifest.json").write_text(json.dumps({"exercises": manifest}))
    for name, text in (checks or {"add_up": CHECKS, "scale": SCALE, "the_answer": CONSTANT}).items():
        (d / "checks" / f"{name}.py").write_text(text)
    return d


@pytest.fixture
def exercises(tmp_path, monkeypatch):
    d = _write_exercises(tmp_path)
    monkeypatch.setenv("FLOWLAB_EXERCISES", str(d))
    reset_attempts()
    yield d
    reset_attempts()


def right(xs):
    return float(sum(xs))


def test_a_right_answer_passes_with_its_points(exercises):
    r = check("add-up", right)
    assert isinstance(r, CheckResult) and r.passed and bool(r)
    assert (r.points, r.max_points, r.hidden, r.hint) == (3, 3, 2, None)
    assert [c["name"] for c in r.cases] == ["three numbers", "an array"]      # visible cases only
    assert all(c["passed"] and c["why"] == "" for c in r.cases)
    assert repr(r) == ("add-up: all 2 checks passed · 3/3 points if the hidden checks pass too\n"
                       "  2 hidden checks are not shown: the grader runs them")
    assert fl.grading.check is check                     # fl.grading.check is the function, not its module


def test_points_come_from_the_manifest_then_the_checks_file_then_one(exercises):
    assert check("scale", lambda x, by: x * by).points == 2          # POINTS in the checks file, own run()
    r = check("the-answer", 42)                                        # a value, not a function
    assert (r.passed, r.points, r.max_points, r.hidden) == (True, 1, 1, 0)
    assert repr(r) == "the-answer: the check passed · 1/1 points"


def test_a_wrong_answer_fails_with_the_case_and_hints_escalate(exercises):
    wrong = lambda xs: float(sum(xs[1:]))   # noqa: E731 - forgets the first number
    first = check("add-up", wrong)
    assert not first.passed and first.points == 1.5      # partial credit: 1 of 2 visible cases (flowlab.grading.check.score)
    bad = first.cases[0]
    assert bad == {"name": "three numbers", "passed": False, "why": "expected 6.0, got 5.0",
                   "inputs": "[1.0, 2.0, 3.0]", "expected": "6.0", "received": "5.0"}
    assert first.cases[1]["passed"]           # 0 + 1 + 2 + 3 = 6 = 1 + 2 + 3
    assert (first.hint, first.hint_number) == ("Add the numbers up.", 1)
    assert repr(first) == ("add-up: 1 of 2 checks passed · 1.5/3 points\n"
                           "  ✗ three numbers: expected 6.0, got 5.0 (inputs: [1.0, 2.0, 3.0])\n"
                           "  hint (1 of 3): Add the numbers up.\n"
                           "  2 hidden checks are not shown: the grader runs them")
    hints = [check("add-up", wrong).hint for _ in range(3)]
    assert hints == ["sum() adds a list.", "Return a float: float(sum(xs)).", "Return a float: float(sum(xs))."]
    assert check("add-up", right).hint is None                       # a pass shows no hint


def test_types_are_checked_exactly_and_errors_are_results(exercises):
    r = check("add-up", lambda xs: int(sum(xs)))
    assert r.cases[0]["why"] == "expected a float, got an int (6.0 vs 6)"

    def unfinished(xs):
        raise NotImplementedError()
    r = check("add-up", unfinished)
    assert not r.passed and r.cases[0]["why"].startswith("raised NotImplementedError")
    assert "replace `raise NotImplementedError()`" in r.cases[0]["why"]
    r = check("add-up", lambda xs: 1 / 0)
    assert r.cases[0]["why"] == "raised ZeroDivisionError: division by zero"


class AlwaysEqual:
    def __eq__(self, other):
        return True


class Six(float):
    def __eq__(self, other):
        return True


def test_a_cheating_eq_fails(exercises):
    for cheat in (lambda xs: AlwaysEqual(), lambda xs: Six(6.0)):
        r = check("add-up", cheat)
        assert not r.passed
        assert all("only plain values are checked" in c["why"] for c in r.cases)


def test_an_answer_that_changes_its_inputs_does_not_change_the_expected_value(exercises):
    def sneaky(xs):
        xs[:] = np.zeros(len(xs)) if isinstance(xs, np.ndarray) else [0.0] * len(xs)
        return 0.0
    r = check("add-up", sneaky)
    assert not r.passed and r.cases[1]["why"] == "expected 6.0, got 0.0"


def test_the_comparison_runs_in_another_process(exercises):
    r = check("add-up", right)
    assert isinstance(r.compared_in, int) and r.compared_in != os.getpid()


def test_a_case_that_runs_too_long_fails_with_the_limit(exercises):
    def slow(xs):
        time.sleep(5)
        return float(sum(xs))
    t0 = time.perf_counter()
    r = check("add-up", slow, timeout=0.3)
    assert time.perf_counter() - t0 < 4
    assert not r.passed and [c["why"] for c in r.cases] == ["took longer than 0.3 s"] * 2


def test_a_wrong_id_says_did_you_mean(exercises):
    with pytest.raises(KeyError) as e:
        check("add_up", right)
    assert isinstance(e.value, UnknownExerciseError)
    assert str(e.value) == ("no exercise 'add_up' in the manifest; did you mean 'add-up'? "
                            "(exercises: 'add-up', 'scale', 'the-answer')")


def test_the_static_html_and_snapshot_show_the_cases(exercises):
    r = check("add-up", lambda xs: float(sum(xs[1:])))
    page = r._repr_html_()
    for text in ("✗ add-up: 1 of 2 checks passed · 1.5/3 points", "three numbers", "expected 6.0, got 5.0",
                 "Add the numbers up.", "2 hidden checks are not shown"):
        assert text in page
    snap = r.snapshot()
    assert json.loads(json.dumps(snap)) == snap
    assert (snap["passed"], snap["n_passed"], snap["n_cases"], snap["hidden"]) == (False, 1, 2, 2)
    assert snap["cases"][0]["received"] == "5.0"
    assert r._repr_mimebundle_() is None          # outside a kernel: IPython falls back to the HTML and text


def test_the_html_escapes_what_the_answer_returned(exercises):
    r = check("the-answer", "<script>alert(1)</script>")
    assert "<script>" not in r._repr_html_() and "&lt;script&gt;" in r._repr_html_()


# -- the manifest ---------------------------------------------------------------------------------
def test_find_exercises_env_then_upwards_then_the_repo(tmp_path, monkeypatch):
    d = _write_exercises(tmp_path / "course")
    monkeypatch.delenv("FLOWLAB_EXERCISES", raising=False)
    deep = tmp_path / "course" / "work" / "week1"
    deep.mkdir(parents=True)
    assert find_exercises(deep) == d.resolve()
    assert find_exercises(d) == d.resolve()                   # a notebook that runs inside exercises/
    monkeypatch.chdir(deep)
    assert find_exercises() == d.resolve()
    other = _write_exercises(tmp_path / "other")
    monkeypatch.setenv("FLOWLAB_EXERCISES", str(other))
    assert find_exercises(deep) == other.resolve()
    monkeypatch.setenv("FLOWLAB_EXERCISES", str(tmp_path))
    with pytest.raises(ExerciseError, match="has no manifest.json"):
        find_exercises()


def test_the_manifest_is_validated(tmp_path):
    d = _write_exercises(tmp_path)
    m = load_manifest(d)
    assert list(m) == ["add-up", "scale", "the-answer"]
    assert m["scale"]["points"] is None and m["add-up"]["points"] == 3 and m["scale"]["title"] == "scale"

    def manifest_error(items):
        (d / "manifest.json").write_text(json.dumps({"exercises": items}))
        with pytest.raises(ExerciseError) as e:
            load_manifest(d)
        return str(e.value)
    one = {"id": "a", "notebook": "01_add.ipynb", "answer": "f"}
    why = manifest_error([one, {"id": "b", "notebook": "01_add.ipynb", "answer": "g"},
                          {**one, "notebook": "02_scale.ipynb"}])
    assert "the id 'a' is used twice: by exercise #1 (notebook '01_add.ipynb') and by exercise #3 " \
           "(notebook '02_scale.ipynb')" in why
    assert "does not exist" in manifest_error([{**one, "notebook": "nope.ipynb"}])
    assert "is not a Python name" in manifest_error([{**one, "answer": "my answer"}])
    assert "has no id" in manifest_error([{"notebook": "01_add.ipynb", "answer": "f"}])
    assert "points must be" in manifest_error([{**one, "points": -1}])
    (d / "manifest.json").write_text("{oops")
    with pytest.raises(ExerciseError, match="not valid JSON"):
        load_manifest(d)


def test_load_checks(tmp_path):
    d = _write_exercises(tmp_path)
    c = load_checks(d, "add-up")
    assert [x.name for x in c.cases()] == ["three numbers", "an array"]
    assert [(x.name, x.hidden) for x in c.hidden_cases()] == [("empty", True), ("negative", True)]
    assert c.n_hidden() == 2 and c.TOLERANCE == {"rtol": 1e-9} and len(c.HINTS) == 3 and c.POINTS is None
    assert c.run(right, c.cases()[0]) == 6.0
    released = CHECKS.split("### BEGIN HIDDEN TESTS")[0] + "HIDDEN_COUNT = 2\n"
    (d / "checks" / "add_up.py").write_text(released)
    assert load_checks(d, "add-up").n_hidden() == 2                  # the student's copy only counts them
    with pytest.raises(ExerciseError, match="has no checks file"):
        load_checks(d, "nothing")
    (d / "checks" / "the_answer.py").write_text(CONSTANT.replace("def cases", "def hidden_cases").replace(
        'yield Case("the answer"', 'yield Case("x"); yield Case("x"'))
    with pytest.raises(ExerciseError, match="two cases are named 'x'"):
        load_checks(d, "the-answer").all_cases()


def test_fl_grading_is_lazy_and_imports_no_widget_library():
    import subprocess
    import sys
    code = ("import sys, flowlab as fl; assert 'flowlab.grading' not in sys.modules; fl.grading.check; "
            "print(sorted(m for m in ('anywidget', 'ipywidgets', 'IPython', 'zmq') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stderr


# -- the view -------------------------------------------------------------------------------------
def test_the_view_carries_the_snapshot_text_and_html(exercises, widget_comm):
    pytest.importorskip("anywidget")
    from flowlab._display import view
    from flowlab.widgets.check import CheckView
    r = check("add-up", lambda xs: float(sum(xs[1:])))
    v = view(r)
    assert isinstance(v, CheckView) and view(r) is v
    assert v.snapshot == r.snapshot()
    data, _ = v._repr_mimebundle_()
    assert data["text/plain"] == repr(r) and data["text/html"] == r._repr_html_()
    assert "application/vnd.jupyter.widget-view+json" in data
    assert v.refresh() == r.snapshot() and widget_comm[-1].updates("snapshot") == []   # static: nothing resent
    assert "drawCheck" in v._esm and ".fl-check" in v._css


VERDICTS = '''
from flowlab.grading import Case
from flowlab.grading.properties import every_rank_holds

def cases():
    yield Case("three ranks", args=(3,), expected={"sum on rank 0": 6.0, "every rank": "holds"})

def run(answer, case):
    results = [answer(rank, case.args[0]) for rank in range(case.args[0])]
    return {"sum on rank 0": results[0], "every rank": every_rank_holds(results, 6.0)}
'''


def test_a_verdict_that_a_checks_file_returns_is_compared_as_holds_or_why(tmp_path, monkeypatch):
    """A property (here every_rank_holds) returned by run() is recorded as "holds" or
    "does not hold: <why>", so rank 0 alone being right is not enough, and the reason shows."""
    d = _write_exercises(tmp_path, manifest=[{"id": "all-ranks", "notebook": "01.ipynb", "answer": "f"}],
                         checks={"all_ranks": VERDICTS})
    monkeypatch.setenv("FLOWLAB_EXERCISES", str(d))
    assert check("all-ranks", lambda rank, n: 6.0).passed
    r = check("all-ranks", lambda rank, n: 6.0 if rank == 0 else 0.0)
    assert not r.passed
    why = r.cases[0]["why"]
    assert 'does not hold: ranks 1, 2 of 3 do not hold the right result' in why, why
    assert "checking rank 0 alone would have missed this" in why
