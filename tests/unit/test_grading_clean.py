"""What ran against what will be graded (ANCHORS G8), without a kernel: ``saved_note`` reads the
saved notebook and says when it defines no answer, or when the function that ran is not the one in
the cell that defines it last; ``check`` shows that note where Jupyter's server told the kernel its
notebook (``JPY_SESSION_NAME``), and never in the grader's own kernel."""
import json
import linecache

import pytest

import flowlab as fl
from flowlab.grading._clean import notebook_path, saved_note

MANIFEST = {"exercises": [{"id": "double-it", "notebook": "01_double.ipynb", "answer": "double", "points": 2}]}
CHECKS = '''
from flowlab.grading import Case
def cases():
    yield Case("one", args=(1,), expected=2)
'''


def _notebook(path, *cells):
    path.write_text(json.dumps({"cells": [{"cell_type": "code", "metadata": {}, "execution_count": None,
                                           "outputs": [], "source": c} for c in cells],
                                "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    return path


def _in_a_cell(source, name, number=[0]):
    """``name`` defined by ``source`` as IPython defines a cell's code (its source in linecache)."""
    number[0] += 1
    filename = f"/tmp/ipykernel_4242/{number[0]}.py"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    ns = {}
    exec(compile(source, filename, "exec"), ns)
    return ns[name]


@pytest.fixture
def course(tmp_path, monkeypatch):
    (tmp_path / "checks").mkdir()
    (tmp_path / "manifest.json").write_text(json.dumps(MANIFEST))
    (tmp_path / "checks" / "double_it.py").write_text(CHECKS)
    monkeypatch.delenv("FLOWLAB_GRADER", raising=False)
    return tmp_path


def test_the_same_function_as_saved_has_no_note(course):
    nb = _notebook(course / "01_double.ipynb", "import flowlab as fl", "def double(x):\n    return 2 * x\n")
    double = _in_a_cell("def double(x):\n    return 2 * x\n", "double")
    assert saved_note("double", double, nb) == ""


def test_an_edit_that_was_not_saved_is_named_with_its_cell(course):
    nb = _notebook(course / "01_double.ipynb", "import flowlab as fl", "def double(x):\n    return x + x\n")
    double = _in_a_cell("def double(x):\n    return 2 * x\n", "double")
    note = saved_note("double", double, nb)
    assert "the double that ran is not the one in the saved 01_double.ipynb (cell 2)" in note
    assert "save it (Ctrl+S)" in note


def test_the_last_definition_counts_as_it_does_for_the_grader(course):
    nb = _notebook(course / "01_double.ipynb", "def double(x):\n    return 2 * x\n",
                   "def double(x):\n    return 3 * x\n")
    first = _in_a_cell("def double(x):\n    return 2 * x\n", "double")
    assert "(cell 2)" in saved_note("double", first, nb)


def test_no_cell_defines_the_answer(course):
    nb = _notebook(course / "01_double.ipynb", "import flowlab as fl", "x = 1")
    note = saved_note("double", lambda x: 2 * x, nb)
    assert note.startswith("the saved 01_double.ipynb has no cell that defines double")


def test_a_function_from_a_module_is_not_compared(course):
    nb = _notebook(course / "01_double.ipynb", "from mymodule import double")
    assert saved_note("double", json.dumps, nb) == ""


def test_check_shows_the_note_where_the_kernel_knows_its_notebook(course, monkeypatch):
    nb = _notebook(course / "01_double.ipynb", "def double(x):\n    return x + x\n")
    double = _in_a_cell("def double(x):\n    return 2 * x\n", "double")
    monkeypatch.setenv("JPY_SESSION_NAME", str(nb))
    assert notebook_path() == nb
    result = fl.grading.check("double-it", double, exercises=course)
    assert result.passed
    assert "⚠ the double that ran is not the one in the saved 01_double.ipynb (cell 1)" in repr(result)
    snap = result.snapshot()
    assert snap["can_clean"] is True and len(snap["notes"]) == 1
    assert "the double that ran" in result._repr_html_()


def test_no_note_in_the_graders_kernel_or_without_a_notebook(course, monkeypatch):
    nb = _notebook(course / "01_double.ipynb", "x = 1")
    monkeypatch.setenv("JPY_SESSION_NAME", str(nb))
    monkeypatch.setenv("FLOWLAB_GRADER", "1")
    result = fl.grading.check("double-it", lambda x: 2 * x, exercises=course)
    assert result.notes == [] and result.snapshot()["can_clean"] is False
    monkeypatch.delenv("FLOWLAB_GRADER")
    monkeypatch.delenv("JPY_SESSION_NAME")
    result = fl.grading.check("double-it", lambda x: 2 * x, exercises=course)
    assert result.notes == [] and result.clean is None
    with pytest.raises(RuntimeError, match="no saved notebook is known"):
        result.run_clean()


def test_clean_without_a_known_notebook_says_how(course, monkeypatch):
    _notebook(course / "01_double.ipynb", "x = 1")
    monkeypatch.delenv("JPY_SESSION_NAME", raising=False)
    result = fl.grading.check("double-it", lambda x: 2 * x, exercises=course, clean=True)
    assert "pass the path instead" in result.notes[0]
