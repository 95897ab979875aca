"""Lesson 07's panel in JupyterLab, clicked as its "Try it" section tells a learner, while the
lesson's busy cell runs: Stack shows the function a busy worker is in, Pause stops the running cell
with WorkerPausedError within seconds, Resume wakes the worker, Kill marks it dead and stops the cell
with WorkerDiedError, Restart brings it back, and the next run finishes on both workers. The busy
cell runs 25 s here (3 s in the stored lesson), so every click lands while it runs."""
import json
import re
import time

import pytest
from _lab import REPO, menu, open_notebook, shoot, shut_down_and_reap

pytestmark = [pytest.mark.browser, pytest.mark.timeout(240)]

W0, W1 = "/job:worker/task:0", "/job:worker/task:1"
NAME = "lesson07_try_it.ipynb"


def _lesson_with_a_long_busy_cell():
    nb = json.loads((REPO / "lessons/07_local_cluster.ipynb").read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    for c in code:
        c["outputs"], c["execution_count"] = [], None
    nb["metadata"].pop("widgets", None)
    busy = next(i for i, c in enumerate(code) if "SECONDS = 3" in "".join(c["source"]))
    code[busy]["source"] = "".join(code[busy]["source"]).replace("SECONDS = 3 ", "SECONDS = 25")
    return nb, busy


def test_lesson07_panel_acts_while_its_busy_cell_runs(lab, page):
    from playwright.sync_api import expect

    nb, busy_i = _lesson_with_a_long_busy_cell()
    status = open_notebook(lab, page, NAME, nb)
    cells = page.locator(".jp-Notebook .jp-CodeCell")
    busy = cells.nth(busy_i)
    prompt = busy.locator(".jp-InputArea-prompt")
    out = busy.locator(".jp-OutputArea")
    started = []
    try:
        expect(status).to_contain_text("| Idle")
        busy.locator(".jp-InputArea-editor").click()
        menu(page, "Run", "notebook:run-all-above")
        view = page.locator(".fl-cluster-view").nth(1)          # the copy in "The panel"
        expect(view.locator(f"tr.fl-task[data-task='{W1}'] .fl-state")).to_contain_text(re.compile("idle|alive"))
        expect(cells.nth(busy_i - 1).locator(".jp-InputArea-prompt")).to_have_text(re.compile(r"\[\d+\]:"))
        expect(status).to_contain_text("| Idle")
        page.wait_for_timeout(1500)      # the comm's kernel subshell is made a moment after the panel appears
        started = lab.processes()

        def row(task):
            return view.locator(f"tr.fl-task[data-task='{task}']")

        def run_busy():
            busy.locator(".jp-InputArea-editor").click()
            page.keyboard.press("Control+Enter")
            expect(prompt).to_have_text("[*]:")
            expect(row(W1).locator(".fl-state")).to_contain_text("busy", timeout=10_000)

        run_busy()
        expect(row(W0).locator(".fl-running")).to_contain_text("spin")
        row(W0).locator("button.fl-act-stack").click()
        expect(view.locator(".fl-result-text")).to_contain_text("spin", timeout=10_000)
        page.wait_for_timeout(1200)                             # a few sparkline samples
        view.scroll_into_view_if_needed()
        shoot(view, "lesson07_panel_busy.png")
        t0 = time.monotonic()
        row(W1).locator("button.fl-act-pause").click()
        expect(out).to_contain_text("WorkerPausedError", timeout=10_000)
        paused_after = time.monotonic() - t0
        expect(prompt).to_have_text(re.compile(r"\[\d+\]:"))
        expect(row(W1).locator(".fl-state")).to_contain_text("paused")
        row(W1).locator("button.fl-act-resume").click()
        expect(row(W1).locator(".fl-state")).to_contain_text(re.compile("idle|alive"), timeout=5_000)

        run_busy()
        t0 = time.monotonic()
        row(W1).locator("button.fl-act-kill").click()
        expect(row(W1).locator(".fl-state")).to_contain_text("dead (signal 9)", timeout=5_000)
        expect(out).to_contain_text("WorkerDiedError", timeout=10_000)
        killed_after = time.monotonic() - t0
        expect(prompt).to_have_text(re.compile(r"\[\d+\]:"))
        shoot(page.locator(".jp-Notebook"), "lesson07_killed_page.png")
        row(W1).locator("button.fl-act-restart").click()
        expect(row(W1).locator(".fl-state")).to_contain_text(re.compile("idle|alive"), timeout=20_000)
        run_busy()
        page.wait_for_timeout(2500)
        shoot(view, "lesson07_panel.png", "lesson07_panel.png")
        expect(out).to_contain_text("['done', 'done']", timeout=40_000)
        assert paused_after < 5 and killed_after < 5, (paused_after, killed_after)
    finally:
        shoot(page, "lesson07_try_it_page.png")
        left = shut_down_and_reap(lab, page, status, started)
    assert not left, f"still running after the kernel shut down (now killed): {left}"
    assert [e for e in page.errors if "Failed to initialize model" not in e] == []
