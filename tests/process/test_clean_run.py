"""``fl.grading.check(..., clean=...)`` grades the *saved* notebook as ``flowlab grade`` does (a fresh
kernel, the file top to bottom, every case): a notebook that works only because of a cell run and
then deleted fails there with its NameError, the same notebook saved complete passes, and a check cell
that asks for a clean run inside the grader's kernel does not start another one."""
import json

import pytest

pytest.importorskip("jupyter_client")
pytest.importorskip("ipykernel")

import flowlab as fl   # noqa: E402
from flowlab.grading.properties import no_process_left, process_snapshot   # noqa: E402

pytestmark = [pytest.mark.process, pytest.mark.timeout(300)]

MANIFEST = {"exercises": [{"id": "double-it", "notebook": "01_double.ipynb", "answer": "double", "points": 2}]}
CHECKS = '''
from flowlab.grading import Case
def cases():
    yield Case("one", args=(1,), expected=2)
### BEGIN HIDDEN TESTS
def hidden_cases():
    yield Case("negative", args=(-3,), expected=-6)
### END HIDDEN TESTS
'''


def _notebook(path, *cells):
    path.write_text(json.dumps({"cells": [{"cell_type": "code", "metadata": {}, "execution_count": None,
                                           "outputs": [], "source": c} for c in cells],
                                "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                            "language": "python"}},
                                "nbformat": 4, "nbformat_minor": 5}))
    return path


@pytest.fixture
def course(tmp_path, monkeypatch):
    (tmp_path / "checks").mkdir()
    (tmp_path / "manifest.json").write_text(json.dumps(MANIFEST))
    (tmp_path / "checks" / "double_it.py").write_text(CHECKS)
    monkeypatch.delenv("FLOWLAB_GRADER", raising=False)
    monkeypatch.delenv("JPY_SESSION_NAME", raising=False)
    return tmp_path


def helper(x):
    return 2 * x


def test_a_cell_that_is_gone_fails_the_clean_run_and_a_saved_one_passes(course):
    before = process_snapshot()
    nb = _notebook(course / "01_double.ipynb", "import flowlab as fl", "def double(x):\n    return helper(x)\n",
                   'fl.grading.check("double-it", double, clean=True)')
    # here, helper exists (a cell run and since deleted): the visible check passes...
    result = fl.grading.check("double-it", lambda x: helper(x), exercises=course, clean=nb)
    assert result.passed
    # ...but the saved file, run as the grader runs it, has no helper
    assert result.clean["status"] == "fail", result.clean
    assert result.clean["points"] == 0 and result.clean["max"] == 2
    assert "NameError: name 'helper' is not defined" in result.clean["reason"]
    assert "0/2 points" in repr(result) and "clean kernel" in repr(result)
    assert result.snapshot()["clean_passed"] is False

    _notebook(nb, "import flowlab as fl", "def helper(x):\n    return 2 * x\n",
              "def double(x):\n    return helper(x)\n", 'fl.grading.check("double-it", double, clean=True)')
    again = result.run_clean()          # what the widget's button does
    assert again["status"] == "pass" and again["points"] == 2, again
    assert again["reason"] == "all 2 cases passed"       # the hidden case too: this is the instructor's folder
    assert result.snapshot()["clean_passed"] is True
    assert no_process_left(before=before), "the clean run left a process behind"


def test_a_cell_that_raises_is_named(course):
    nb = _notebook(course / "01_double.ipynb", "import flowlab as fl", "def double(x):\n    return 2 * x\n",
                   "1 / 0")
    result = fl.grading.check("double-it", lambda x: 2 * x, exercises=course, clean=nb)
    assert result.clean["status"] == "pass"
    assert result.clean["errors"] == [(3, "ZeroDivisionError: division by zero")]
    assert "cell 3: ZeroDivisionError" in repr(result)
