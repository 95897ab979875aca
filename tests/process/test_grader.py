"""``flowlab grade`` against hostile submissions: each gets the grade it deserves, with its reason,
and nothing a submission started is left running. A tiny exercise folder (manifest, checks, the
instructor's notebook) and the submissions are written by the tests into their tmp dir."""
import csv
import json
import shutil
import subprocess
import sys
import textwrap

import pytest

psutil = pytest.importorskip("psutil")
pytest.importorskip("jupyter_client")
pytest.importorskip("ipykernel")

from flowlab.grading.grader import grade   # noqa: E402

pytestmark = pytest.mark.process

CHECKS_SCALE = '''
import numpy as np
from flowlab.grading import Case
HINTS = ["multiply every element by k"]
TIME_LIMIT = 2
def cases():
    yield Case("small", args=(np.array([1.0, 2.0]), 3.0), expected=lambda a: a[0] * a[1])
    yield Case("negative", args=(np.array([-1.5, 0.0, 4.0]), -2.0), expected=lambda a: a[0] * a[1])
### BEGIN HIDDEN TESTS
def hidden_cases():
    yield Case("matrix", args=(np.arange(6.0).reshape(2, 3), 0.5), expected=lambda a: a[0] * a[1])
    yield Case("zero", args=(np.ones(4), 0.0), expected=lambda a: a[0] * a[1])
### END HIDDEN TESTS
'''

CHECKS_EVENS = '''
from flowlab.grading import Case
TIME_LIMIT = 2
def cases():
    yield Case("few", args=([1, 2, 3, 4],), expected=2)
### BEGIN HIDDEN TESTS
def hidden_cases():
    yield Case("none", args=([1, 3],), expected=0)
    yield Case("empty", args=([],), expected=0)
### END HIDDEN TESTS
'''

SCALE = "import numpy as np\ndef scale(x, k):\n    return np.asarray(x) * k\n"
EVENS = "def count_evens(xs):\n    return sum(1 for x in xs if x % 2 == 0)\n"


def notebook(*cells, markdown=()):
    """A notebook (JSON text) of code cells; ``markdown`` cells go first."""
    nb = {"cells": [{"cell_type": "markdown", "metadata": {}, "source": m} for m in markdown]
          + [{"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [],
              "source": textwrap.dedent(c)} for c in cells],
          "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
          "nbformat": 4, "nbformat_minor": 5}
    return json.dumps(nb)


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    d = tmp_path_factory.mktemp("exercises")
    (d / "checks").mkdir()
    (d / "checks" / "scale_it.py").write_text(CHECKS_SCALE)
    (d / "checks" / "count_evens.py").write_text(CHECKS_EVENS)
    (d / "manifest.json").write_text(json.dumps({"exercises": [
        {"id": "scale-it", "notebook": "01_tiny.ipynb", "answer": "scale", "points": 4, "title": "Scale"},
        {"id": "count-evens", "notebook": "01_tiny.ipynb", "answer": "count_evens", "points": 3,
         "title": "Evens"}]}))
    (d / "01_tiny.ipynb").write_text(notebook(
        "import flowlab as fl",
        "import numpy as np\ndef scale(x, k):\n    ### BEGIN SOLUTION\n    return np.asarray(x) * k\n"
        "    ### END SOLUTION\n",
        'fl.grading.check("scale-it", scale)',
        "def count_evens(xs):\n    ### BEGIN SOLUTION\n    return sum(1 for x in xs if x % 2 == 0)\n"
        "    ### END SOLUTION\n",
        'fl.grading.check("count-evens", count_evens)'))
    return d


# name -> cells of 01_tiny.ipynb
SUBMISSIONS = {
    "correct": ["import flowlab as fl", SCALE, EVENS],
    "wrong": ["import numpy as np\ndef scale(x, k):\n    return np.asarray(x) + k\n",
              "def count_evens(xs):\n    return sum(1 for x in xs if x % 2 == 1)\n"],
    "crashing": ["1 / 0", "name = input('your name? ')", "def scale(x, k):\n    raise ValueError('oops')\n", EVENS],
    "exits": ["import os\n" + SCALE + "os._exit(3)\n", EVENS],
    "dies-checked": ["import os\ndef scale(x, k):\n    os._exit(5)\n", EVENS],
    "loops": ["def scale(x, k):\n    while True:\n        pass\n", "while True:\n    pass\n", EVENS],
    "stubborn": [SCALE + "import time\nwhile True:\n    try:\n        time.sleep(0.01)\n"
                 "    except KeyboardInterrupt:\n        pass\n", EVENS],
    "empty": [],
    "hides": ["get_ipython().showtraceback = lambda *a, **k: None",
              "import numpy as np\ndef scale(x, k):\n    return np.asarray(x) - k\n",
              "def count_evens(xs):\n    raise RuntimeError('hidden')\n", "count_evens([1])"],
    "cheats": ["import numpy as np\nclass Yes:\n    def __eq__(self, other):\n        return True\n"
               "    __hash__ = None\ndef scale(x, k):\n    return Yes()\n",
               "class Sneaky(int):\n    def __eq__(self, other):\n        return True\n"
               "def count_evens(xs):\n    return Sneaky(7)\n"],
    "duplicated": ["import numpy as np\ndef scale(x, k):\n    return np.asarray(x) * 0\n", EVENS,
                   SCALE],
    "leaks": ["import subprocess, flowlab as fl\nsleeper = subprocess.Popen(['sleep', '600'])\n"
              "open(PIDS, 'w').write(str(sleeper.pid))\n",
              "import flowlab.cluster as fc\ncluster = fc.LocalCluster(workers=1)\n"
              "open(PIDS, 'a').write(' ' + ' '.join(str(cluster.pid(t)) for t in cluster.tasks))\n",
              SCALE, EVENS],
}


@pytest.fixture(scope="module")
def graded(course, tmp_path_factory):
    subs = tmp_path_factory.mktemp("submissions")
    pids = tmp_path_factory.mktemp("leaked") / "pids.txt"
    for name, cells in SUBMISSIONS.items():
        cells = [c.replace("PIDS", repr(str(pids))) for c in cells]
        (subs / name).mkdir()
        (subs / name / "01_tiny.ipynb").write_text(notebook(*cells, markdown=["# My answers"]))
    # a one-notebook submission, named after the student, a little renamed
    (subs / "solo.ipynb").write_text(notebook(SCALE, EVENS))
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    out = tmp_path_factory.mktemp("grades")
    grades = grade(subs, course, out, jobs=2, cell_timeout=5, notebook_timeout=60, echo=False)
    return grades, out, subs, before, pids


def row(grades, student, exercise):
    return grades.row(student, exercise)


def test_correct_gets_full_marks(graded):
    grades = graded[0]
    for student in ("correct", "solo"):
        assert row(grades, student, "scale-it")["points"] == 4, row(grades, student, "scale-it")
        assert row(grades, student, "scale-it")["status"] == "pass"
        assert row(grades, student, "count-evens")["points"] == 3


def test_wrong_fails_with_the_difference(graded):
    r = row(graded[0], "wrong", "scale-it")
    assert r["points"] == 0 and r["status"] == "fail"
    assert "expected" in r["reason"] and "got" in r["reason"], r
    assert row(graded[0], "wrong", "count-evens")["status"] != "pass"


def test_crash_costs_only_its_exercise(graded):
    r = row(graded[0], "crashing", "scale-it")
    assert r["points"] == 0 and "raised ValueError: oops" in r["reason"], r
    assert row(graded[0], "crashing", "count-evens")["points"] == 3
    # stdin is closed: input() fails at once instead of waiting for a deadline
    notes = graded[0].students[[s["student"] for s in graded[0].students].index("crashing")]["notebooks"]
    book = notes["01_tiny.ipynb"]
    assert [(e["cell"], e["error"].split(":")[0]) for e in book["errors"]] == [
        (2, "ZeroDivisionError"), (3, "StdinNotImplementedError")], book
    assert book["incidents"] == [] and book["kernel_restarts"] == 0

def test_os_exit_costs_only_its_exercise_and_says_the_exit_code(graded):
    r = row(graded[0], "exits", "scale-it")
    assert r["points"] == 0
    assert "kernel died in cell 2 (exit code 3)" in r["reason"], r
    assert row(graded[0], "exits", "count-evens")["points"] == 3


def test_kernel_killed_by_the_answer_while_checked(graded):
    r = row(graded[0], "dies-checked", "scale-it")
    assert r["points"] == 0
    assert "no result: the kernel died while the checks ran (exit code 5)" in r["reason"], r
    assert row(graded[0], "dies-checked", "count-evens")["points"] == 3   # a fresh kernel, cells replayed


def test_endless_loops_are_stopped(graded):
    grades = graded[0]
    r = row(grades, "loops", "scale-it")     # the answer loops: each case stops at its time limit
    assert r["points"] == 0 and "took longer than 2 s" in r["reason"], r
    assert "cell 3" not in r["reason"]       # the loop of cell 3 has nothing to do with scale (cell 2)
    assert row(grades, "loops", "count-evens")["points"] == 3
    notes = grades.students[[s["student"] for s in grades.students].index("loops")]["notebooks"]
    assert [i["what"] for i in notes["01_tiny.ipynb"]["incidents"]] == ["cell 3 ran past 5 s: interrupted"]

def test_loop_that_catches_the_interrupt_is_killed(graded):
    r = row(graded[0], "stubborn", "scale-it")
    assert r["points"] == 0
    assert "cell 2 ran past 5 s: interrupted, then killed" in r["reason"], r
    assert row(graded[0], "stubborn", "count-evens")["points"] == 3


def test_empty_notebook_fails_closed(graded):
    for ex in ("scale-it", "count-evens"):
        r = row(graded[0], "empty", ex)
        assert r["points"] == 0 and r["status"] == "fail" and "is not defined" in r["reason"]


def test_hiding_tracebacks_gains_nothing(graded):
    r = row(graded[0], "hides", "scale-it")
    assert r["points"] == 0 and "expected" in r["reason"]
    r = row(graded[0], "hides", "count-evens")
    assert r["points"] == 0 and "raised RuntimeError: hidden" in r["reason"], r

def test_eq_cheats_are_objects_not_values(graded):
    r = row(graded[0], "cheats", "scale-it")
    assert r["points"] == 0 and "Yes" in r["reason"], r
    r = row(graded[0], "cheats", "count-evens")
    assert r["points"] == 0 and "Sneaky" in r["reason"], r


def test_duplicated_cell_last_definition_wins_graded_once(graded):
    grades = graded[0]
    r = row(grades, "duplicated", "scale-it")
    assert r["points"] == 4 and "cells 2, 4" in r.get("note", ""), r
    assert sum(1 for x in grades.rows if x["student"] == "duplicated" and x["exercise"] == "scale-it") == 1


def test_leaks_are_graded_and_nothing_is_left(graded):
    grades, out, subs, before, pids_file = graded
    assert row(grades, "leaks", "scale-it")["points"] == 4
    assert row(grades, "leaks", "count-evens")["points"] == 3
    pids = [int(p) for p in pids_file.read_text().split()]
    assert len(pids) == 2, pids     # the sleep, and the cluster's worker
    left = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert not left, f"processes the submission started are still running: {left}"
    now = {p.pid for p in psutil.Process().children(recursive=True)} - before
    assert not now, f"processes left under the test: {now}"

def test_reports(graded):
    grades, out, subs, *_ = graded
    with open(out / "grades.csv", newline="") as f:
        table = list(csv.DictReader(f))
    assert len(table) == 2 * (len(SUBMISSIONS) + 1)
    assert set(table[0]) == {"student", "exercise", "points", "max", "status", "reason"}
    doc = json.loads((out / "grades.json").read_text())
    assert {s["student"] for s in doc["students"]} == set(SUBMISSIONS) | {"solo"}
    gs = json.loads((out / "correct" / "results.json").read_text())
    assert gs["score"] == 7
    assert {t["visibility"] for t in gs["tests"]} == {"visible", "hidden"}
    assert len(gs["tests"]) == 4 + 3 and sum(t["max_score"] for t in gs["tests"]) == pytest.approx(7)
    assert "correct" in grades.summary and "7/7" in grades.summary
    bad = json.loads((out / "wrong" / "results.json").read_text())
    assert bad["score"] == 2      # count_evens counts odd numbers: right only for the empty list
    assert "expected 0, got 2" not in bad["output"], "a hidden case's values must not reach the student"
    assert "1 hidden case failed" in bad["output"], bad["output"]


def test_cli_grades_one_notebook(course, tmp_path):
    (tmp_path / "ann.ipynb").write_text(notebook(SCALE, "def count_evens(xs):\n    return 1\n"))
    proc = subprocess.run([sys.executable, "-m", "flowlab", "grade", str(tmp_path / "ann.ipynb"), "--source",
                           str(course), "--out", str(tmp_path / "g"), "-j", "1", "--cell-timeout", "5"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "ann" in proc.stdout and "4/4" in proc.stdout
    doc = json.loads((tmp_path / "g" / "grades.json").read_text())
    evens = [r for r in doc["students"][0]["exercises"] if r["exercise"] == "count-evens"][0]
    # 'few' expects 2 (fails), 'none' and 'empty' expect 0 (fail): 1 is never right here
    assert evens["points"] == 0 and evens["status"] == "fail"
    nowhere = subprocess.run([sys.executable, "-m", "flowlab", "grade", str(tmp_path / "ann.ipynb"), "--source",
                              str(tmp_path / "nothing")], capture_output=True, text=True, timeout=60)
    assert nowhere.returncode == 2 and "manifest.json" in nowhere.stderr


def test_notebook_deadline_stops_the_rest(course, tmp_path):
    (tmp_path / "subs" / "slow").mkdir(parents=True)
    (tmp_path / "subs" / "slow" / "01_tiny.ipynb").write_text(notebook(
        "import time\ntime.sleep(2)", "time.sleep(2)", "x = 1", SCALE, EVENS))
    grades = grade(tmp_path / "subs", course, tmp_path / "g", jobs=1, cell_timeout=3, notebook_timeout=3.5,
                   echo=False)
    r = grades.row("slow", "scale-it")
    assert r["points"] == 0 and "the notebook ran past 3.5 s: cell 3 and those after it were not run" in r["reason"], r
    what = [i["what"] for i in grades.students[0]["notebooks"]["01_tiny.ipynb"]["incidents"]]
    assert what[0].startswith("cell 2 was still running when the notebook reached its 3.5 s deadline: interrupted")


def test_reference_gets_full_marks_and_its_release_none(course, tmp_path):
    """The instructor's notebook (solutions and check cells in place) as a submission: full marks;
    the released notebook, untouched: nothing, because its stubs raise NotImplementedError."""
    from flowlab.grading.release import release
    release(course, tmp_path / "release")
    for student, folder in (("teacher", course), ("newbie", tmp_path / "release")):
        (tmp_path / "subs" / student).mkdir(parents=True)
        (tmp_path / "subs" / student / "01_tiny.ipynb").write_text((folder / "01_tiny.ipynb").read_text())
    grades = grade(tmp_path / "subs", course, tmp_path / "g", jobs=2, cell_timeout=20, echo=False)
    for ex, points in (("scale-it", 4), ("count-evens", 3)):
        assert grades.row("teacher", ex)["points"] == points, grades.row("teacher", ex)
        r = grades.row("newbie", ex)
        assert r["points"] == 0 and "NotImplementedError" in r["reason"], r


def test_cli_release(course, tmp_path):
    ok = subprocess.run([sys.executable, "-m", "flowlab", "exercises", "release", "--source", str(course),
                         "--out", str(tmp_path / "rel")], capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0 and "released 4 files" in ok.stdout, ok.stderr
    assert "BEGIN SOLUTION" not in (tmp_path / "rel" / "01_tiny.ipynb").read_text()
    bad = tmp_path / "bad"
    shutil.copytree(course, bad)
    (bad / "01_tiny.ipynb").write_text(notebook("x = 1", "    ### END SOLUTION\n"))
    fail = subprocess.run([sys.executable, "-m", "flowlab", "exercises", "release", "--source", str(bad),
                           "--out", str(tmp_path / "rel2")], capture_output=True, text=True, timeout=60)
    assert fail.returncode == 2 and "01_tiny.ipynb, cell 2, line 1: '### END SOLUTION' without" in fail.stderr


def test_scoring_partial_and_all_or_nothing():
    """Points are the fraction of cases passed, unless the manifest says all or nothing; a case the
    probe did not report fails; hidden cases' values never reach the student's output."""
    from flowlab.grading import Case, to_plain
    from flowlab.grading.grader import _score
    from flowlab.grading.reports import gradescope
    tol = {"rtol": 1e-6, "atol": 0.0, "loose_types": False}
    expected = [(Case("a", expected=1), to_plain(1), tol), (Case("b", expected=2, hidden=True), to_plain(2), tol),
                (Case("c", expected=3, hidden=True), to_plain(3), tol)]
    record = {"cases": [{"name": "a", "received": to_plain(1)}, {"name": "b", "received": to_plain(5)}]}
    ex = {"id": "x", "points": 3}
    row = _score(ex, None, expected, record, "", [])
    assert (row["points"], row["status"]) == (1.0, "partial")
    assert "hidden case 'b': expected 2, got 5" in row["reason"]
    assert [c["why"] for c in row["cases"]][2] == "no result for this case"
    row_aon = _score({**ex, "all_or_nothing": True}, None, expected, record, "", [])
    assert (row_aon["points"], row_aon["status"]) == (0.0, "fail")
    gs = gradescope({"student": "s", "seconds": 1.2, "rows": [{**row, "title": "X"}]})
    assert gs["score"] == 1.0 and "expected 2, got 5" not in gs["output"] and "2 hidden cases failed" in gs["output"]
    assert [t["visibility"] for t in gs["tests"]] == ["visible", "hidden", "hidden"]
