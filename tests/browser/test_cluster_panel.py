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
import re
import time

import pytest

from _lab import code_notebook, open_notebook, run_cell, shoot, shut_down_and_reap

pytestmark = [pytest.mark.browser, pytest.mark.timeout(180)]

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


def _row(page, task):
    return page.locator(f".fl-cluster-view tr.fl-task[data-task='{task}']")


def test_kill_from_the_panel_restarts_the_worker_and_training_finishes(lab, page):
    from playwright.sync_api import expect

    status = open_notebook(lab, page, NAME, code_notebook(CELLS))
    started = []
    try:
        expect(status).to_contain_text("| Idle")
        run_cell(page, 0)
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

        run_cell(page, 1)
        out = page.locator(".jp-Notebook .jp-CodeCell").nth(1).locator(".jp-OutputArea")
        expect(out).to_contain_text("restarts: 1 ['trained', 'trained']")
        expect(out).to_contain_text(re.compile(r"restart 1: /job:worker/task:1 \(pid \d+\): killed by signal 9"))
        expect(page.locator(".fl-cluster-table")).not_to_contain_text("dead")
        run_cell(page, 2)
        expect(panel).to_contain_text("closed")
    finally:
        shoot(page, "cluster_panel_background_run.png")
        left = shut_down_and_reap(lab, page, status, started)
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

    status = open_notebook(lab, page, BUSY, code_notebook(BUSY_CELLS))
    started = []
    busy_cell = page.locator(".jp-Notebook .jp-CodeCell").nth(1)
    prompt = busy_cell.locator(".jp-InputArea-prompt")
    try:
        expect(status).to_contain_text("| Idle")
        run_cell(page, 0)
        view = page.locator(".fl-cluster-view")
        expect(_row(page, W1).locator(".fl-state")).to_contain_text(re.compile("idle|alive"))
        expect(status).to_contain_text("| Idle")
        # NOTE: JupyterLab asks the kernel for the widget comm's subshell a moment after the panel
        # appears; until it has one, clicks go to the main shell (a learner reads between cells too).
        page.wait_for_timeout(1000)
        _row(page, W0).locator("button.fl-act-log").click()
        expect(view.locator(".fl-cluster-message")).to_contain_text("log of /job:worker/task:0")
        started = lab.processes()

        run_cell(page, 1)
        expect(prompt).to_have_text("[*]:")
        expect(_row(page, W0).locator(".fl-state")).to_contain_text("busy", timeout=10_000)
        expect(_row(page, W0).locator(".fl-running")).to_contain_text("work")
        t0 = time.monotonic()
        _row(page, W1).locator("button.fl-act-kill").click()
        expect(_row(page, W1).locator(".fl-state")).to_contain_text("dead (signal 9)", timeout=5_000)
        killed_after = time.monotonic() - t0
        expect(prompt).to_have_text("[*]:")                  # the cell is still running
        shoot(view, "cluster_panel_dead.png", "cluster_panel_dead.png")

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
        shoot(view, "cluster_panel.png", "cluster_panel.png")

        out = busy_cell.locator(".jp-OutputArea")
        expect(out).to_contain_text("worker 0 answered every call: True", timeout=40_000)
        run_cell(page, 2)
        expect(view.locator(".fl-target")).to_have_text("closed")
        assert killed_after < 5, killed_after
    finally:
        shoot(page, "cluster_panel_busy_page.png")
        left = shut_down_and_reap(lab, page, status, started)
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

    status = open_notebook(lab, page, LAUNCH, code_notebook(LAUNCH_CELLS))
    started = []
    try:
        expect(status).to_contain_text("| Idle")
        run_cell(page, 0)
        view = page.locator(".fl-launcher")
        expect(view.locator(".fl-launch-list")).to_contain_text("no cluster is open")
        view.locator(".fl-launch-workers").fill("3")
        view.locator(".fl-launch-transport").select_option("tcp")
        expect(view.locator(".fl-launch-note")).to_contain_text("ZeroMQ over TCP")
        shoot(view, "launcher_form.png", "launcher.png")
        view.locator("button.fl-act-start").click()
        expect(view.locator("tr.fl-task")).to_have_count(3, timeout=30_000)
        expect(view.locator(".fl-launcher-form")).to_be_hidden()
        expect(view.locator("tr.fl-task[data-task='/job:worker/task:2'] .fl-state")).to_contain_text(
            re.compile("idle|alive"))
        started = lab.processes()
        shoot(view, "launcher_panel.png")
        view.locator("button.fl-act-back").click()
        expect(view.locator(".fl-launch-cluster")).to_have_count(1)
        expect(view.locator(".fl-launch-cluster")).to_contain_text("tcp")
        view.locator(".fl-launch-cluster button.fl-act-show").click()
        expect(view.locator("tr.fl-task")).to_have_count(3)
        run_cell(page, 1)
        expect(page.locator(".jp-Notebook .jp-CodeCell").nth(1).locator(".jp-OutputArea")).to_contain_text("[3]")
        view.locator("button.fl-act-stop").click()
        expect(view.locator(".fl-target")).to_have_text("closed", timeout=15_000)
    finally:
        left = shut_down_and_reap(lab, page, status, started)
    assert not left, f"still running after the kernel shut down (now killed): {left}"
    assert page.errors == []
