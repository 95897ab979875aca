"""``fl.grading.check`` in a real JupyterLab and Chromium: a small exercises folder written by the
notebook itself, a wrong answer (red banner, the failing case with its inputs, expected and received
values, the first hint, the hidden checks counted, and a warning that the saved notebook's last
definition is another one), a second wrong try (the second hint), then the right answer (green
banner, full points), and its button that grades the saved notebook in a fresh kernel as the grader
does (every case, hidden ones too). Screenshots go to .pt/screenshots/ and docs/screenshots/."""
import pytest

from _lab import code_notebook, open_notebook, run_cell, shoot, shut_down_and_reap

pytestmark = [pytest.mark.browser, pytest.mark.timeout(180)]

NAME = "check_widget.ipynb"
CELLS = [
    '''import json, os, tempfile
import flowlab as fl

root = tempfile.mkdtemp()
os.makedirs(f"{root}/checks")
open(f"{root}/01_mean.ipynb", "w").write("{}")
json.dump({"exercises": [{"id": "weighted-mean", "notebook": "01_mean.ipynb", "answer": "weighted_mean",
                          "points": 2, "title": "A size-weighted mean"}]}, open(f"{root}/manifest.json", "w"))
open(f"{root}/checks/weighted_mean.py", "w").write("""
import numpy as np
from flowlab.grading import Case
HINTS = ["Weigh each slice's mean by its size.", "sum(m * n) / sum(n)"]
def cases():
    yield Case("equal sizes", args=([1.0, 3.0], [10, 10]), expected=2.0)
    yield Case("different sizes", args=([1.0, 3.0], [30, 10]), expected=1.5)
    yield Case("one slice", args=([4.0], [7]), expected=4.0)
def hidden_cases():
    yield Case("many slices", args=([1.0] * 8, list(range(1, 9))), expected=1.0)
    yield Case("zero-size slice", args=([1.0, 5.0], [4, 0]), expected=1.0)
""")
os.environ["FLOWLAB_EXERCISES"] = root''',
    '''def weighted_mean(means, sizes):
    return sum(means) / len(means)            # forgets the sizes

fl.grading.check("weighted-mean", weighted_mean)''',
    '''fl.grading.check("weighted-mean", weighted_mean)''',
    '''def weighted_mean(means, sizes):
    return sum(m * n for m, n in zip(means, sizes)) / sum(sizes)

fl.grading.check("weighted-mean", weighted_mean)''',
]


def test_check_shows_the_failing_case_a_hint_then_a_pass(lab, page):
    from playwright.sync_api import expect

    status = open_notebook(lab, page, NAME, code_notebook(CELLS))
    started = []
    try:
        expect(status).to_contain_text("| Idle")
        started = lab.processes()
        run_cell(page, 0)
        expect(status).to_contain_text("| Idle")
        run_cell(page, 1)
        first = page.locator(".jp-Notebook .jp-CodeCell").nth(1).locator(".fl-view.fl-check")
        expect(first).to_have_class("fl-view fl-check fl-check-failed", timeout=60_000)
        expect(first.locator(".fl-check-count")).to_have_text("2 of 3 checks passed")
        expect(first.locator(".fl-check-points")).to_have_text("1.33/2 points")     # 2 of 3 cases
        failing = first.locator("tr.fl-case-fail")
        expect(failing).to_have_count(1)
        expect(failing.locator(".fl-case-name")).to_have_text("different sizes")
        expect(failing).to_contain_text("[1.0, 3.0], [30, 10]")
        expect(failing.locator(".fl-case-why")).to_have_text("expected 1.5, got 2.0")
        expect(first.locator("tr.fl-case-pass")).to_have_count(2)
        expect(first.locator(".fl-check-hint")).to_have_text("Hint 1 of 2: Weigh each slice's mean by its size.")
        expect(first.locator(".fl-check-hidden")).to_have_text("2 hidden checks are not shown: the grader runs them")
        # the grader takes the saved notebook's last definition (cell 4), not this one
        expect(first.locator(".fl-check-note")).to_contain_text(
            f"the weighted_mean that ran is not the one in the saved {NAME} (cell 4)")
        shoot(first, "check_failed.png", "check.png")

        expect(status).to_contain_text("| Idle")
        run_cell(page, 2)
        second = page.locator(".jp-Notebook .jp-CodeCell").nth(2).locator(".fl-view.fl-check")
        expect(second.locator(".fl-check-hint")).to_have_text("Hint 2 of 2: sum(m * n) / sum(n)", timeout=60_000)

        expect(status).to_contain_text("| Idle")
        run_cell(page, 3)
        passed = page.locator(".jp-Notebook .jp-CodeCell").nth(3).locator(".fl-view.fl-check")
        expect(passed).to_have_class("fl-view fl-check fl-check-passed", timeout=60_000)
        expect(passed.locator(".fl-check-count")).to_have_text("3 of 3 checks passed")
        expect(passed.locator(".fl-check-points")).to_have_text("2/2 points if the hidden checks pass too")
        expect(passed.locator("tr.fl-case-pass")).to_have_count(3)
        expect(passed.locator(".fl-check-hint")).to_have_count(0)
        expect(passed.locator(".fl-check-note")).to_have_count(0)
        shoot(passed, "check_passed.png")

        expect(status).to_contain_text("| Idle")
        button = page.locator(".jp-Notebook .jp-CodeCell").nth(3).locator(".fl-check-clean-button")
        button.click()
        clean = passed.locator("pre.fl-check-clean")
        expect(clean).to_contain_text("clean kernel, the saved notebook run top to bottom as the grader does: "
                                      "2/2 points (all 5 cases passed)", timeout=120_000)
        expect(clean).to_have_class("fl-check-clean fl-case-pass")
        shoot(page.locator(".jp-Notebook .jp-CodeCell").nth(3), "check_clean.png")
    finally:
        shoot(page, "check_page.png")
        left = shut_down_and_reap(lab, page, status, started)
    assert not left, f"still running after the kernel shut down (now killed): {left}"
    assert page.errors == []
