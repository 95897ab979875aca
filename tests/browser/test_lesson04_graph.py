"""Lesson 04 in a real JupyterLab and Chromium: the graph of the traced loss draws, and hovering the
node that check_numerics named (`log`) shows that it reads `sigmoid`, i.e. it is `fl.log(p)`, and
comes from the lesson's loss line; the other `log` reads the `subtract` of `1 - p`. Screenshots
land in .pt/screenshots/lesson04_graph*.png."""
import pytest

from _lab import REPO, cells_to_run, open_notebook, run_all, shoot, shut_down_and_reap

pytestmark = [pytest.mark.browser, pytest.mark.timeout(240)]

LESSON = "04_debugging_numerics.ipynb"


def test_hover_finds_the_log_that_made_the_inf(lab, page):
    from playwright.sync_api import expect

    status = open_notebook(lab, page, LESSON)
    try:
        run_all(page, status, cells_to_run(REPO / "lessons" / LESSON))
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
        shoot(graph, "lesson04_graph_hover.png")

        graph.locator('.fl-pg-node[data-name="log_1"]').hover()
        expect(tip).to_contain_text("log  log_1")
        expect(tip).to_contain_text("(subtract)")
        page.mouse.move(0, 0)
        shoot(graph, "lesson04_graph.png")
    finally:
        shoot(page, "lesson04_graph_page.png")
        left = shut_down_and_reap(lab, page, status)
    assert not left, f"still running after the kernel shut down: {left}"
    assert page.errors == []
