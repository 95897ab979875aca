"""Every lesson runs top to bottom in JupyterLab in a real Chromium, without an error, and renders
the images and widgets its stored copy holds; from lesson 03 on, at least one of flowlab's own
views draws. A screenshot of each lands in .pt/screenshots/."""
import json
import re

import pytest

from _lab import IMAGE, RUN_TIMEOUT_S, WIDGET, cells_to_run, open_notebook, run_all, shoot, shut_down_and_reap

pytestmark = [pytest.mark.browser, pytest.mark.timeout(180)]

# NOTE: anywidget's front end rejects a model's "ready" promise (an uncaught page error) when loading
# it took over 2 s (AbortSignal.timeout(2000) in its runtime), which a lesson that measures with every
# core busy can cause; the view still draws, and the view count below checks that it did.
SLOW_INIT = {"Error: [anywidget] Failed to initialize model.", "[anywidget] Failed to initialize model."}
FIRST_WITH_WIDGETS = 3    # every lesson from 03 on shows at least one of flowlab's widgets


def test_lesson_runs_in_lab(lab, page, lesson):
    cells = json.loads(lesson.read_text())["cells"]
    to_run = cells_to_run(lesson)
    may_raise = {i for i in to_run if "raises-exception" in cells[i]["metadata"].get("tags", [])}
    stored = {mime: sum(mime in out.get("data", {}) for cell in cells if cell["cell_type"] == "code"
                        for out in cell["outputs"]) for mime in (IMAGE, WIDGET)}

    status = open_notebook(lab, page, lesson.name)
    try:
        state = run_all(page, status, to_run, stored)
    finally:
        shoot(page, f"{lesson.stem}.png")
        left = shut_down_and_reap(lab, page, status)  # the kernel and whatever the lesson started

    errors = [f"cell {i}:\n{_tail(text)}" for i, text in state["errors"] if i not in may_raise]
    if errors:
        pytest.fail(f"{lesson.name} raised in JupyterLab:\n" + "\n".join(errors))
    assert not left, f"{lesson.name}: still running after its kernel shut down (now killed): {left}"
    prompts = dict(state["prompts"])
    not_run = {i: prompts.get(i, "missing") for i in sorted(to_run)
               if not re.fullmatch(r"\[\d+\]:", prompts.get(i, ""))}
    assert not not_run, (f"{lesson.name}: cells not executed after {RUN_TIMEOUT_S} s "
                         f"(cell: prompt): {not_run}; status bar: {state['status']!r}")
    assert state["images"] >= stored[IMAGE], (
        f"{lesson.name}: {state['images']} images rendered, the stored notebook has {stored[IMAGE]}")
    assert state["widgets"] >= stored[WIDGET], (
        f"{lesson.name}: {state['widgets']} widgets rendered, the stored notebook has {stored[WIDGET]}")
    if _number(lesson) >= FIRST_WITH_WIDGETS:
        assert stored[WIDGET] >= 1, f"{lesson.name}: the stored notebook shows no widget"
        assert state["views"] >= 1, f"{lesson.name}: no flowlab view drew anything in JupyterLab"
    assert [e for e in page.errors if e not in SLOW_INIT] == []


def _number(lesson):
    match = re.match(r"(\d+)_", lesson.name)
    return int(match.group(1)) if match else 0


def _tail(text, lines=12):
    return "\n".join(text.strip().splitlines()[-lines:])
