"""Every lesson runs top to bottom in JupyterLab in a real Chromium, without an error, and renders
the images and widgets its stored copy holds; from lesson 03 on, at least one of flowlab's own
views draws. A screenshot of each lands in .pt/screenshots/."""
import json
import re
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.browser, pytest.mark.timeout(180)]

SCREENSHOTS = Path(__file__).resolve().parents[2] / ".pt" / "screenshots"
RUN_TIMEOUT_S = 120
IMAGE = "image/png"
WIDGET = "application/vnd.jupyter.widget-view+json"
# NOTE: anywidget's front end rejects a model's "ready" promise (an uncaught page error) when loading
# it took over 2 s (AbortSignal.timeout(2000) in its runtime), which a lesson that measures with every
# core busy can cause; the view still draws, and the view count above checks that it did.
SLOW_INIT = {"Error: [anywidget] Failed to initialize model.", "[anywidget] Failed to initialize model."}
FIRST_WITH_WIDGETS = 3    # every lesson from 03 on shows at least one of flowlab's widgets

# Per code cell (by its index among all cells): its prompt ("[3]:", "[*]:", "[ ]:") and the text
# of every output that shows an error: a traceback (also SyntaxError's, which has none), or a
# widget that could not be displayed.
PAGE_STATE_JS = """(IMAGE) => {
  const cells = [...document.querySelectorAll('.jp-Notebook .jp-Cell')];
  const code = cells.map((node, index) => ({node, index}))
                    .filter(({node}) => node.classList.contains('jp-CodeCell'));
  const isError = out => {
    const text = out.innerText;
    return (out.dataset.mimeType === 'application/vnd.jupyter.stderr'
            && (text.includes('Traceback') || /^\\w*(Error|Exception)\\b/m.test(text)))
        || text.includes('Error displaying widget');
  };
  return {
    status: document.querySelector('#jp-main-statusbar')?.innerText ?? '',
    prompts: code.map(({node, index}) =>
      [index, node.querySelector('.jp-InputArea-prompt')?.innerText.trim() ?? '']),
    errors: code.flatMap(({node, index}) =>
      [...node.querySelectorAll('.jp-OutputArea-output')].filter(isError)
        .map(out => [index, out.innerText])),
    images: [...document.querySelectorAll(
        `.jp-Notebook .jp-OutputArea-output[data-mime-type="${IMAGE}"] img`)]
      .filter(img => img.complete && img.naturalWidth > 0).length,
    // A widget view has no data-mime-type: count the views themselves.
    widgets: document.querySelectorAll(
      '.jp-Notebook .jp-OutputArea-output:not([data-mime-type]) > .lm-Widget').length,
    // flowlab's own views (flowlab/widgets/*.js) that drew something
    views: [...document.querySelectorAll('.jp-Notebook .jp-OutputArea-output .fl-view')]
      .filter(el => el.childElementCount > 0).length,
  };
}"""


def test_lesson_runs_in_lab(lab, page, lesson):
    from playwright.sync_api import expect

    cells = json.loads(lesson.read_text())["cells"]
    to_run = {i for i, cell in enumerate(cells)
              if cell["cell_type"] == "code" and "".join(cell["source"]).strip()}
    may_raise = {i for i in to_run if "raises-exception" in cells[i]["metadata"].get("tags", [])}
    stored = {mime: sum(mime in out.get("data", {}) for cell in cells if cell["cell_type"] == "code"
                        for out in cell["outputs"]) for mime in (IMAGE, WIDGET)}
    status = page.locator("#jp-main-statusbar")

    page.goto(lab.tree_url(lesson.name))
    try:
        expect(status).to_contain_text("| Idle")  # Run All before this silently does nothing
        _menu(page, "Run", "runmenu:run-all")
        state = _wait_for_run(page, to_run, stored)
    finally:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=SCREENSHOTS / f"{lesson.stem}.png")
        started = lab.processes()  # the kernel and whatever the lesson started
        _menu(page, "Kernel", "kernelmenu:shutdown")
        expect(status).to_contain_text("No Kernel")
        left = lab.survivors(started)

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


def _menu(page, top, command):
    page.locator("#jp-MainMenu .lm-MenuBar-itemLabel", has_text=re.compile(f"^{top}$")).click()
    page.locator(f".lm-Menu-item[data-command='{command}']").click()


def _wait_for_run(page, to_run, stored):
    """Wait until the kernel is idle, no cell is queued or running, and every cell has run (or one
    raised, which stops Run All); then give images and widgets a moment to render."""
    def finished(state):
        prompts = dict(state["prompts"])
        executed = {i for i, prompt in prompts.items() if re.fullmatch(r"\[\d+\]:", prompt)}
        settled = "| Idle" in state["status"] and not any("*" in p for p in prompts.values())
        return settled and (executed >= to_run or bool(state["errors"]))

    def rendered(state):
        return state["images"] >= stored[IMAGE] and state["widgets"] >= stored[WIDGET]

    state = _poll(page, finished, RUN_TIMEOUT_S)
    if finished(state) and not state["errors"]:
        state = _poll(page, rendered, 10)
    return state


def _poll(page, ready, timeout):
    deadline = time.monotonic() + timeout
    while True:
        state = page.evaluate(PAGE_STATE_JS, IMAGE)
        if ready(state) or time.monotonic() > deadline:
            return state
        time.sleep(0.5)


def _tail(text, lines=12):
    return "\n".join(text.strip().splitlines()[-lines:])
