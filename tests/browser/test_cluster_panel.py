"""The cluster panel in a real JupyterLab and Chromium: a cell shows the panel and starts training
in the background (run_with_recovery(..., wait=False)), so the kernel is idle; the test picks worker
1 in the panel and clicks its Kill button; the panel then shows the run's restart, and the next
cell's run.result() reports it. Nothing the kernel started is left after it shuts down."""
import json
import re
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

pytestmark = [pytest.mark.browser, pytest.mark.timeout(180)]

SCREENSHOTS = Path(__file__).resolve().parents[2] / ".pt" / "screenshots"
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
panel = cluster.show()
run = fl.distribute.run_with_recovery(cluster, train, 6, wait=False)""",
    """results = run.result(timeout=120)
print("restarts:", len(run.restarts), results)
print(run.restarts[0])""",
    "cluster.close()",
]


def _notebook():
    cells = [{"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [], "source": src}
             for src in CELLS]
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
        page.locator(".widget-dropdown select").select_option("/job:worker/task:1")
        page.locator("button.fl-cluster-kill").click()        # the real click, handled by the kernel
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
        page.screenshot(path=SCREENSHOTS / "cluster_panel.png")
        started = started or lab.processes()
        page.locator("#jp-MainMenu .lm-MenuBar-itemLabel", has_text=re.compile("^Kernel$")).click()
        page.locator(".lm-Menu-item[data-command='kernelmenu:shutdown']").click()
        expect(status).to_contain_text("No Kernel")
        left = lab.survivors(started)
    assert not left, f"still running after the kernel shut down (now killed): {left}"
    assert page.errors == []
