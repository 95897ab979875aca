"""The real course graded end to end, as an instructor would: ``flowlab exercises release`` of
``exercises/``, then ``flowlab grade`` of two submissions, the instructor's notebooks (every
solution in place) and the released ones (untouched). Every exercise of the manifest, with its
hidden cases (which nothing else runs), must give the reference full marks and the released
notebook nothing, each with its reason; nothing a notebook started may outlive the grading.
The summary table is printed (``pytest -s`` shows it: the sample report of the closing notes)."""
import shutil
from pathlib import Path

import pytest

pytest.importorskip("jupyter_client")
pytest.importorskip("ipykernel")

from flowlab.grading import load_manifest   # noqa: E402
from flowlab.grading.grader import grade   # noqa: E402
from flowlab.grading.properties import no_process_left, process_snapshot   # noqa: E402
from flowlab.grading.release import release   # noqa: E402

pytestmark = [pytest.mark.process, pytest.mark.timeout(900)]

EXERCISES = Path(__file__).resolve().parents[2] / "exercises"


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("course")
    before = process_snapshot()
    release(EXERCISES, tmp / "release")
    manifest = load_manifest(EXERCISES)
    books = sorted({ex["notebook"] for ex in manifest.values()})
    for student, folder in (("reference", EXERCISES), ("released", tmp / "release")):
        (tmp / "subs" / student).mkdir(parents=True)
        for book in books:
            shutil.copy2(folder / book, tmp / "subs" / student / book)
    grades = grade(tmp / "subs", EXERCISES, tmp / "grades", jobs=2, echo=True)
    return manifest, grades, no_process_left(before=before, grace=5.0)


def test_the_reference_gets_full_marks_on_every_case_hidden_ones_too(graded):
    manifest, grades, _ = graded
    wrong = {ex: grades.row("reference", ex)["reason"] for ex in manifest
             if grades.row("reference", ex)["points"] != grades.row("reference", ex)["max"]}
    assert not wrong, f"the reference solutions lose points: {wrong}"
    for ex in manifest:
        assert any(c["hidden"] for c in grades.row("reference", ex)["cases"]), f"{ex} has no hidden case"


def test_the_released_notebooks_get_nothing_and_say_why(graded):
    manifest, grades, _ = graded
    for ex in manifest:
        row = grades.row("released", ex)
        assert row["points"] == 0 and row["status"] == "fail", row
        assert "NotImplementedError" in row["reason"], row


def test_nothing_is_left_running(graded):
    *_, left = graded
    assert left, left
