"""``flowlab exercises release``: the student version keeps nothing of the solutions or hidden tests
(not in sources, outputs or metadata), and an unbalanced marker is an error that says where."""
import json

import pytest

from flowlab.grading.release import ReleaseError, release, strip_solutions

SECRET = "return sorted(xs)[len(xs) // 2]  # the secret median"
HIDDEN_SECRET = "yield Case('odd length secret', args=([3, 1, 2],), expected=2)"


def _cell(source, kind="code", **extra):
    cell = {"cell_type": kind, "metadata": extra.pop("metadata", {}), "source": source}
    if kind == "code":
        cell.update(execution_count=extra.pop("execution_count", None), outputs=extra.pop("outputs", []))
    return cell


def _course(d, cells, checks=None):
    (d / "checks").mkdir(parents=True, exist_ok=True)
    (d / "manifest.json").write_text(json.dumps({"exercises": [
        {"id": "median", "notebook": "01_median.ipynb", "answer": "median", "points": 2}]}))
    nb = {"cells": cells, "nbformat": 4, "nbformat_minor": 5,
          "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
                       "widgets": {"application/vnd.jupyter.widget-state+json": {"state": {"m": SECRET}}},
                       "solution_notes": SECRET}}
    (d / "01_median.ipynb").write_text(json.dumps(nb))
    (d / "checks" / "median.py").write_text(checks if checks is not None else (
        "from flowlab.grading import Case\n"
        "def cases():\n"
        "    yield Case('three', args=([1, 2, 3],), expected=2)\n"
        "### BEGIN HIDDEN TESTS\n"
        "def hidden_cases():\n"
        f"    {HIDDEN_SECRET}\n"
        "    yield Case('one', args=([5],), expected=5)\n"
        "### END HIDDEN TESTS\n"))
    (d / "data.csv").write_text("a,b\n1,2\n")
    return d


SOLVED = [
    _cell("# Median\n### BEGIN SOLUTION\nSort, then take the centre one.\n### END SOLUTION\n", kind="markdown"),
    _cell(["def median(xs):\n", "    \"\"\"The middle value.\"\"\"\n", "    ### BEGIN SOLUTION\n",
           f"    {SECRET}\n", "    ### END SOLUTION\n"],
          execution_count=3, metadata={"tags": ["exercise"], "nbgrader": {"solution": True}, "scrolled": True},
          outputs=[{"output_type": "stream", "name": "stdout", "text": SECRET}]),
    _cell('fl.grading.check("median", median)', execution_count=4,
          outputs=[{"output_type": "display_data", "data": {"text/plain": SECRET}, "metadata": {}}]),
]


def test_release_removes_every_trace(tmp_path):
    src = _course(tmp_path / "src", SOLVED)
    written = release(src, tmp_path / "out")
    assert sorted(written) == ["01_median.ipynb", "checks/median.py", "data.csv", "manifest.json"]
    out = tmp_path / "out"
    raw = (out / "01_median.ipynb").read_text()
    assert "secret" not in raw.lower() and "centre one" not in raw
    assert "BEGIN SOLUTION" not in raw and "END SOLUTION" not in raw
    nb = json.loads(raw)
    assert set(nb["metadata"]) == {"kernelspec"}
    code = nb["cells"][1]
    assert code["source"] == ('def median(xs):\n    """The middle value."""\n    # YOUR CODE HERE\n'
                              '    raise NotImplementedError()\n')
    assert code["outputs"] == [] and code["execution_count"] is None
    assert code["metadata"] == {"tags": ["exercise"]}
    assert nb["cells"][0]["source"] == "# Median\nYOUR ANSWER HERE\n"
    assert nb["cells"][2]["outputs"] == []
    checks = (out / "checks" / "median.py").read_text()
    assert "hidden_cases" not in checks and "secret" not in checks and "BEGIN HIDDEN" not in checks
    assert "HIDDEN_COUNT = 2" in checks
    ns = {}
    exec(compile(checks, "median.py", "exec"), ns)     # still a working checks file
    assert [c.name for c in ns["cases"]()] == ["three"] and ns["HIDDEN_COUNT"] == 2
    from flowlab.grading.manifest import load_checks
    assert load_checks(out, "median").n_hidden() == 2      # what a check in place reports
    assert (out / "manifest.json").read_text() == (src / "manifest.json").read_text()
    assert (out / "data.csv").read_text() == "a,b\n1,2\n"


def test_released_stub_raises_not_implemented(tmp_path):
    src = _course(tmp_path / "src", SOLVED)
    release(src, tmp_path / "out")
    nb = json.loads((tmp_path / "out" / "01_median.ipynb").read_text())
    ns = {}
    exec(nb["cells"][1]["source"], ns)
    with pytest.raises(NotImplementedError):
        ns["median"]([1, 2, 3])


@pytest.mark.parametrize("source, where", [
    ("def f():\n    ### BEGIN SOLUTION\n    return 1\n", "cell 2, line 2: '### BEGIN SOLUTION' is never closed"),
    ("def f():\n    return 1\n    ### END SOLUTION\n", "cell 2, line 3: '### END SOLUTION' without"),
    ("### BEGIN SOLUTION\nx = 1\n### BEGIN SOLUTION\n### END SOLUTION\n",
     "cell 2, line 3: '### BEGIN SOLUTION' inside"),
])
def test_unbalanced_markers_name_notebook_cell_and_line(tmp_path, source, where):
    src = _course(tmp_path / "src", [_cell("# title", kind="markdown"), _cell(source)])
    with pytest.raises(ReleaseError) as err:
        release(src, tmp_path / "out")
    assert f"01_median.ipynb, {where}" in str(err.value)
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.partial").exists()


def test_unbalanced_hidden_marker_in_checks(tmp_path):
    src = _course(tmp_path / "src", SOLVED, checks="def cases():\n    return []\n### BEGIN HIDDEN TESTS\n")
    with pytest.raises(ReleaseError, match=r"checks/median.py, line 3: '### BEGIN HIDDEN TESTS' is never closed"):
        release(src, tmp_path / "out")


def test_strip_keeps_indentation_and_everything_else():
    text = "a = 1\nif a:\n        ### BEGIN SOLUTION\n        b = 2\n        ### END SOLUTION\nprint(a)"
    assert strip_solutions(text) == ("a = 1\nif a:\n        # YOUR CODE HERE\n        raise NotImplementedError()\n"
                                     "print(a)")


def test_not_an_exercises_folder(tmp_path):
    with pytest.raises(ReleaseError, match="no manifest.json"):
        release(tmp_path, tmp_path / "out")
