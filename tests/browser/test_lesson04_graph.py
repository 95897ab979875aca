"""Lesson 04 in a real JupyterLab and Chromium: the graph of the traced loss draws, and hovering the
node that check_numerics named (`log`) shows that it reads `sigmoid`, i.e. it is `fl.log(p)`, and
comes from the lesson's loss line; the other `log` reads the `subtract` of `1 - p`. Screenshots
land in .pt/screenshots/lesson04_graph*.png."""
import json
from pathlib import Path

import pytest

from test_lessons_in_lab import _menu, _wait_for_run

pytestmark = [pytest.mark.browser, pytest.mark.timeout(240)]

REPO = Path(__file__).resolve().parents[2]
SCREENSHOTS = REPO / ".pt" / "screenshots"
LESSON = "04_debugging_numerics.ipynb"


def test_hover_finds_the_log_that_made_the_inf(lab, page):
    from playwright.sync_api import expect

    cells = json.loads((REPO / "lessons" / LESSON).read_text())["cells"]
    to_run = {i for i, c in enumerate(cells) if c["cell_type"] == "code" and "".join(c["source"]).strip()}
    status = page.locator("#jp-main-statusbar")
    page.goto(lab.tree_url(LESSON))
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    try:
        expect(status).to_contain_text("| Idle")
        _menu(page, "Run", "runmenu:run-all")
        _wait_for_run(page, to_run, {"image/png": 0, "application/vnd.jupyter.widget-view+json": 0})
        # the message that sends the learner to the graph
        expect(page.locator(".jp-OutputArea-output").filter(has_text="(graph node log)")).to_have_count(1)

        graph = page.locator(".fl-placement").filter(has_text="function loss_fn").first
        expect(graph.locator(".fl-pg-node")).to_have_count(19)
        graph.scroll_into_view_if_needed()
        tip = graph.locator(".fl-tip")

        graph.locator('.fl-pg-node[data-name="log"]').hover()
        expect(tip).to_be_visible()
        expect(tip).to_contain_text("log  log")
        expect(tip).to_contain_text("from sigmoid (sigmoid)")
        expect(tip).to_contain_text("return -fl.reduce_mean(y * fl.log(p) + (1 - y) * fl.log(1 - p))")
        graph.screenshot(path=SCREENSHOTS / "lesson04_graph_hover.png")

        graph.locator('.fl-pg-node[data-name="log_1"]').hover()
        expect(tip).to_contain_text("log  log_1")
        expect(tip).to_contain_text("(subtract)")
        page.mouse.move(0, 0)
        graph.screenshot(path=SCREENSHOTS / "lesson04_graph.png")
    finally:
        page.screenshot(path=SCREENSHOTS / "lesson04_graph_page.png")
        started = lab.processes()
        _menu(page, "Kernel", "kernelmenu:shutdown")
        expect(status).to_contain_text("No Kernel")
        left = lab.survivors(started)
    assert not left, f"still running after the kernel shut down: {left}"
    assert page.errors == []
