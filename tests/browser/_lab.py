"""What the browser tests do in JupyterLab, written once: a notebook of code cells saved through the
server's contents API, a cell run, a menu command, Run All and waiting for it to finish, the kernel
shut down (and what it started reaped), screenshots. The ``lab`` and ``page`` fixtures that these
take stay in conftest.py. Imported by base name (tests/browser is on sys.path, as for every folder
of tests without an __init__.py): ``from _lab import put, run_cell``."""
import json
import os
import re
import shutil
import time
import urllib.parse
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCREENSHOTS = REPO / ".pt" / "screenshots"          # every screenshot a test takes
DOCS_SHOTS = REPO / "docs" / "screenshots"          # the best ones, committed
RUN_TIMEOUT_S = 120
IMAGE = "image/png"
WIDGET = "application/vnd.jupyter.widget-view+json"

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


def code_notebook(cells):
    """A notebook (nbformat 4 dict) of one unrun code cell per source string in ``cells``, on the
    python3 kernel."""
    cells = [{"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [], "source": src}
             for src in cells]
    return {"cells": cells, "nbformat": 4, "nbformat_minor": 5,
            "metadata": {"kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python",
                                        "name": "python3"}}}


def cells_to_run(path):
    """Indices (among all cells) of the code cells of the notebook at ``path`` that have source:
    those Run All executes and gives a prompt number."""
    cells = json.loads(Path(path).read_text())["cells"]
    return {i for i, cell in enumerate(cells) if cell["cell_type"] == "code" and "".join(cell["source"]).strip()}


def put(lab, name, notebook):
    """Save ``notebook`` in the server's root as ``name`` with Jupyter's contents API (PUT /api/contents)."""
    token = urllib.parse.parse_qs(urllib.parse.urlsplit(lab.tree_url(name)).query)["token"][0]
    body = json.dumps({"type": "notebook", "format": "json", "content": notebook}).encode()
    request = urllib.request.Request(f"{lab.base}/api/contents/{name}?token={token}", data=body, method="PUT",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as reply:
        assert reply.status in (200, 201)


def open_notebook(lab, page, name, notebook=None):
    """Open ``name`` (in the server's root) in ``page``, saving ``notebook`` there first when given
    one; returns the locator of JupyterLab's status bar (it shows the kernel's state)."""
    if notebook is not None:
        put(lab, name, notebook)
    status = page.locator("#jp-main-statusbar")
    page.goto(lab.tree_url(name))
    return status


def run_cell(page, index):
    """Run the ``index``-th code cell of the open notebook (click into its editor, Ctrl+Enter)."""
    page.locator(".jp-Notebook .jp-CodeCell").nth(index).locator(".jp-InputArea-editor").click()
    page.keyboard.press("Control+Enter")


def menu(page, top, command):
    """Click ``command`` (a data-command, e.g. "runmenu:run-all") in the main menu ``top`` ("Run")."""
    page.locator("#jp-MainMenu .lm-MenuBar-itemLabel", has_text=re.compile(f"^{top}$")).click()
    page.locator(f".lm-Menu-item[data-command='{command}']").click()


def run_all(page, status, to_run=None, stored=None):
    """Wait for the kernel to be idle (Run All before that silently does nothing), then Run All;
    given ``to_run``, also wait for the run to finish (wait_for_run) and return the page's state."""
    from playwright.sync_api import expect

    expect(status).to_contain_text("| Idle")
    menu(page, "Run", "runmenu:run-all")
    if to_run is not None:
        return wait_for_run(page, to_run, stored)


def wait_for_run(page, to_run, stored=None):
    """Wait until the kernel is idle, no cell is queued or running, and every cell in ``to_run`` has
    run (or one raised, which stops Run All); then give images and widgets a moment to render, as
    many as ``stored`` ({IMAGE: n, WIDGET: n}; none by default) counts. Returns the page's state
    (PAGE_STATE_JS)."""
    stored = stored or {IMAGE: 0, WIDGET: 0}
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


def shut_down(page, status):
    """Shut the notebook's kernel down from the Kernel menu and wait until the status bar says so."""
    from playwright.sync_api import expect

    menu(page, "Kernel", "kernelmenu:shutdown")
    expect(status).to_contain_text("No Kernel")


def shut_down_and_reap(lab, page, status, started=None):
    """shut_down, then wait for ``started`` (by default: what the server runs now, the kernel and
    whatever it started) to exit; returns {pid: command line} of those that had not (now killed)."""
    started = started or lab.processes()
    shut_down(page, status)
    return lab.survivors(started)


def shoot(locator, name, docs=None):
    """Screenshot ``locator`` (or a whole ``page``) to .pt/screenshots/``name`` and, given ``docs``
    and ``FLOWLAB_DOCS_SCREENSHOTS=1`` (to refresh the pictures the docs show), to
    docs/screenshots/``docs``: a plain test run leaves the checkout as it was."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    locator.screenshot(path=SCREENSHOTS / name)
    if docs:
        to_docs(name, docs)


def to_docs(name, docs):
    """Copy .pt/screenshots/``name`` to docs/screenshots/``docs`` when ``FLOWLAB_DOCS_SCREENSHOTS=1``."""
    if os.environ.get("FLOWLAB_DOCS_SCREENSHOTS") == "1" and (SCREENSHOTS / name).exists():
        DOCS_SHOTS.mkdir(parents=True, exist_ok=True)
        shutil.copy(SCREENSHOTS / name, DOCS_SHOTS / docs)
