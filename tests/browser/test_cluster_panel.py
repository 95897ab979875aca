"""The cluster panel and the launcher in a real JupyterLab and Chromium.

- Busy kernel: a cell shows the cluster (its panel), another cell calls worker 0 for 20 s; while
  that cell runs, the test clicks Kill on worker 1 and sees it dead within seconds, Restart and sees
  it idle, Pause and Resume it, and Stack on the busy worker 0 (JupyterLab sends the clicks on a
  kernel subshell, so they are handled in another thread while the cell runs).
- Idle kernel: a cell starts training in the background (run_with_recovery(..., wait=False)); Kill
  on worker 1 in the panel; the panel shows the run's restart and run.result() reports it.
- The launcher: Start turns the form into the new cluster's panel.
Nothing the kernel started is left after it shuts down; screenshots of each go to .pt/screenshots/
and the best ones to docs/screenshots/."""
import json
import re
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

pytestmark = [pytest.mark.browser, pytest.mark.timeout(180)]

REPO = Path(__file__).resolve().parents[2]
SCREENSHOTS = REPO / ".pt" / "screenshots"
DOCS_SHOTS = REPO / "docs" / "screenshots"
W0, W1 = "/job:worker/task:0", "/job:worker/task:1"
NAME = "cluster_panel_kill.ipynb"
CELLS = [
    """import flowlab as fl

def train(seconds):
    import time
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(0.02)
    return "trained"

cluster = fl.cluster.LocalCluster(workers=2)
cluster.show()
run = fl.distribute.run_with_recovery(cluster, train, 6, wait=False)""",
    """results = run.result(timeout=120)
print("restarts:", len(run.restarts), results)
print(run.restarts[0])""",
    "cluster.close()",
]


def _notebook(cells=CELLS):
    cells = [{"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [], "source": src}
             for src in cells]
    return {"cells": cells, "nbformat": 4, "nbformat_minor": 5,
            "metadata": {"kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python",
                                        "name": "python3"}}}


def _put(lab, name, notebook):
    """Save ``notebook`` in the server's root with Jupyter's contents API (PUT /api/contents)."""
    token = urllib.parse.parse_qs(urllib.parse.urlsplit(lab.tree_url(name)).query)["token"][0]
    body = json.dumps({"type": "notebook", "format": "json", "content": notebook}).encode()
    request = urllib.request.Request(f"{lab.base}/api/contents/{name}?token={token}", data=body, method="PUT",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as reply:
        assert reply.status in (200, 201)


def _row(page, task):
    return page.locator(f".fl-cluster-view tr.fl-task[data-task='{task}']")


def _shut_down(page, status):
    page.locator("#jp-MainMenu .lm-MenuBar-itemLabel", has_text=re.compile("^Kernel$")).click()
    page.locator(".lm-Menu-item[data-command='kernelmenu:shutdown']").click()
    from playwright.sync_api import expect
    expect(status).to_contain_text("No Kernel")


def _shoot(locator, name, docs=None):
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    locator.screenshot(path=SCREENSHOTS / name)
    if docs:
        DOCS_SHOTS.mkdir(parents=True, exist_ok=True)
        locator.screenshot(path=DOCS_SHOTS / docs)


def _run_cell(page, index):
    page.locator(".jp-Notebook .jp-CodeCell").nth(index).locator(".jp-InputArea-editor").click()
    page.keyboard.press("Control+Enter")


def test_kill_from_the_panel_restarts_the_worker_and_training_finishes(lab, page):
    from playwright.sync_api import expect

    _put(lab, NAME, _notebook())
    status = page.locator("#jp-main-statusbar")
    page.goto(lab.tree_url(NAME))
    started = []
    try:
        expect(status).to_contain_text("| Idle")
        _run_cell(page, 0)
        panel = page.locator(".fl-cluster-table")
        expect(panel).to_contain_text("/job:worker/task:1")
        expect(page.locator(".fl-cluster-activity")).to_contain_text("run_with_recovery(train)")
        expect(status).to_contain_text("| Idle")              # training runs, the kernel is free
        started = lab.processes()
        _row(page, W1).locator("button.fl-act-kill").click()   # the real click, handled by the kernel
        expect(page.locator(".fl-cluster-message")).to_contain_text("kill /job:worker/task:1: done")
        expect(page.locator(".fl-cluster-activity")).to_contain_text("1 restart(s)")
        expect(page.locator(".fl-cluster-activity")).to_contain_text("restart 1: /job:worker/task:1")
        expect(page.locator(".fl-cluster-activity .fl-restarts")).to_have_text("1 restart(s)")

        _run_cell(page, 1)
        out = page.locator(".jp-Notebook .jp-CodeCell").nth(1).locator(".jp-OutputArea")
        expect(out).to_contain_text("restarts: 1 ['trained', 'trained']")
        expect(out).to_contain_text(re.compile(r"restart 1: /job:worker/task:1 \(pid \d+\): killed by signal 9"))
        expect(page.locator(".fl-cluster-table")).not_to_contain_text("dead")
        _run_cell(page, 2)
        expect(panel).to_contain_text("closed")
    finally:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=SCREENSHOTS / "cluster_panel_background_run.png")
        started = started or lab.processes()
        page.locator("#jp-MainMenu .lm-MenuBar-itemLabel", has_text=re.compile("^Kernel$")).click()
        page.locator(".lm-Menu-item[data-command='kernelmenu:shutdown']").click()
        expect(status).to_contain_text("No Kernel")
        left = lab.survivors(started)
    assert not left, f"still running after the kernel shut down (now killed): {left}"
    assert page.errors == []


BUSY = "cluster_panel_busy.ipynb"
BUSY_CELLS = [
    """import time
import flowlab as fl

cluster = fl.cluster.LocalCluster(workers=2)
cluster""",
    """def work(n):
    import time
    end = time.monotonic() + 0.2
    while time.monotonic() < end:
        n = (n * 31 + 7) % 1000003
    return n

calls, end = 0, time.monotonic() + 20
while time.monotonic() < end:
    cluster.call(0, work, calls)
    calls += 1
print("worker 0 answered every call:", calls > 10)""",
    "cluster.close()",
]


# The clicks below are handled on a kernel subshell (JupyterLab 4.4+, ipykernel 7) while cell 1
# runs: flowlab/widgets/_view.py keeps the subshell the front end chose (_keep_the_front_ends_subshell).
def test_the_panel_acts_while_a_cell_runs(lab, page):
    from playwright.sync_api import expect

    _put(lab, BUSY, _notebook(BUSY_CELLS))
    status = page.locator("#jp-main-statusbar")
    page.goto(lab.tree_url(BUSY))
    started = []
    busy_cell = page.locator(".jp-Notebook .jp-CodeCell").nth(1)
    prompt = busy_cell.locator(".jp-InputArea-prompt")
    try:
        expect(status).to_contain_text("| Idle")
        _run_cell(page, 0)
        view = page.locator(".fl-cluster-view")
        expect(_row(page, W1).locator(".fl-state")).to_contain_text(re.compile("idle|alive"))
        expect(status).to_contain_text("| Idle")
        # NOTE: JupyterLab asks the kernel for the widget comm's subshell a moment after the panel
        # appears; until it has one, clicks go to the main shell (a learner reads between cells too).
        page.wait_for_timeout(1000)
        _row(page, W0).locator("button.fl-act-log").click()
        expect(view.locator(".fl-cluster-message")).to_contain_text("log of /job:worker/task:0")
        started = lab.processes()

        _run_cell(page, 1)
        expect(prompt).to_have_text("[*]:")
        expect(_row(page, W0).locator(".fl-state")).to_contain_text("busy", timeout=10_000)
        expect(_row(page, W0).locator(".fl-running")).to_contain_text("work")
        t0 = time.monotonic()
        _row(page, W1).locator("button.fl-act-kill").click()
        expect(_row(page, W1).locator(".fl-state")).to_contain_text("dead (signal 9)", timeout=5_000)
        killed_after = time.monotonic() - t0
        expect(prompt).to_have_text("[*]:")                  # the cell is still running
        _shoot(view, "cluster_panel_dead.png", "cluster_panel_dead.png")

        _row(page, W1).locator("button.fl-act-restart").click()
        expect(view.locator(".fl-cluster-message")).to_contain_text("restart /job:worker/task:1: done",
                                                                    timeout=15_000)
        expect(_row(page, W1).locator(".fl-state")).to_contain_text(re.compile("idle|alive"), timeout=5_000)
        _row(page, W1).locator("button.fl-act-pause").click()
        expect(_row(page, W1).locator(".fl-state")).to_contain_text("paused", timeout=5_000)
        _row(page, W1).locator("button.fl-act-resume").click()
        expect(_row(page, W1).locator(".fl-state")).to_contain_text(re.compile("idle|alive"), timeout=5_000)
        _row(page, W0).locator("button.fl-act-stack").click()      # the busy worker's stack
        expect(view.locator(".fl-result-text")).to_contain_text("work", timeout=10_000)
        expect(prompt).to_have_text("[*]:")                  # all of it while the cell ran
        _shoot(view, "cluster_panel.png", "cluster_panel.png")

        out = busy_cell.locator(".jp-OutputArea")
        expect(out).to_contain_text("worker 0 answered every call: True", timeout=40_000)
        _run_cell(page, 2)
        expect(view.locator(".fl-target")).to_have_text("closed")
        assert killed_after < 5, killed_after
    finally:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=SCREENSHOTS / "cluster_panel_busy_page.png")
        started = started or lab.processes()
        _shut_down(page, status)
        left = lab.survivors(started)
    assert not left, f"still running after the kernel shut down (now killed): {left}"
    assert page.errors == []


LAUNCH = "cluster_launcher.ipynb"
LAUNCH_CELLS = [
    """import flowlab as fl

fl.cluster.launcher()""",
    """import flowlab as fl
[len(c.workers) for c in fl.cluster.clusters()]""",
]


def test_the_launcher_starts_a_cluster_and_becomes_its_panel(lab, page):
    from playwright.sync_api import expect

    _put(lab, LAUNCH, _notebook(LAUNCH_CELLS))
    status = page.locator("#jp-main-statusbar")
    page.goto(lab.tree_url(LAUNCH))
    started = []
    try:
        expect(status).to_contain_text("| Idle")
        _run_cell(page, 0)
        view = page.locator(".fl-launcher")
        expect(view.locator(".fl-launch-list")).to_contain_text("no cluster is open")
        view.locator(".fl-launch-workers").fill("3")
        view.locator(".fl-launch-transport").select_option("tcp")
        expect(view.locator(".fl-launch-note")).to_contain_text("ZeroMQ over TCP")
        _shoot(view, "launcher_form.png", "launcher.png")
        view.locator("button.fl-act-start").click()
        expect(view.locator("tr.fl-task")).to_have_count(3, timeout=30_000)
        expect(view.locator(".fl-launcher-form")).to_be_hidden()
        expect(view.locator("tr.fl-task[data-task='/job:worker/task:2'] .fl-state")).to_contain_text(
            re.compile("idle|alive"))
        started = lab.processes()
        _shoot(view, "launcher_panel.png", "cluster_panel.png")
        view.locator("button.fl-act-back").click()
        expect(view.locator(".fl-launch-cluster")).to_have_count(1)
        expect(view.locator(".fl-launch-cluster")).to_contain_text("tcp")
        view.locator(".fl-launch-cluster button.fl-act-show").click()
        expect(view.locator("tr.fl-task")).to_have_count(3)
        _run_cell(page, 1)
        expect(page.locator(".jp-Notebook .jp-CodeCell").nth(1).locator(".jp-OutputArea")).to_contain_text("[3]")
        view.locator("button.fl-act-stop").click()
        expect(view.locator(".fl-target")).to_have_text("closed", timeout=15_000)
    finally:
        started = started or lab.processes()
        _shut_down(page, status)
        left = lab.survivors(started)
    assert not left, f"still running after the kernel shut down (now killed): {left}"
    assert page.errors == []
