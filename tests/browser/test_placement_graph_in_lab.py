"""The placement graph in a real JupyterLab and Chromium: lesson 03 runs top to bottom; in its
graph of model_loss, hovering the layer-2 matmul shows a tooltip naming its op, its device and the
lesson's own source line; clicking it lists its inputs (relu, copied from GPU:0 with its 512 B, and
w2) and its consumer; the copies carry their bytes. Screenshots land in .pt/screenshots and the
widget's in docs/screenshots/placement_graph.png."""

import pytest

from _lab import REPO, cells_to_run, open_notebook, run_all, shoot, shut_down_and_reap, to_docs

pytestmark = [pytest.mark.browser, pytest.mark.timeout(240)]

LESSON = "03_devices_and_placement.ipynb"


def test_hover_and_click_a_node_of_lesson_03(lab, page):
    from playwright.sync_api import expect

    status = open_notebook(lab, page, LESSON)
    try:
        run_all(page, status, cells_to_run(REPO / "lessons" / LESSON))
        graph = page.locator(".fl-placement").filter(has_text="function model_loss").first
        expect(graph.locator(".fl-pg-node")).to_have_count(13)
        expect(graph.locator(".fl-pg-bytes")).to_have_count(3)
        expect(graph.locator(".fl-pg-bytes").filter(has_text="512 B")).to_have_count(1)
        graph.scroll_into_view_if_needed()

        # the matmul of layer 2: the one filled with GPU:1's colour
        node = graph.locator('.fl-pg-node[data-name="matmul_1"]')
        node.hover()
        tip = graph.locator(".fl-tip")
        expect(tip).to_be_visible()
        expect(tip).to_contain_text("matmul  matmul_1")
        expect(tip).to_contain_text("device: /job:localhost/replica:0/task:0/device:GPU:1")
        expect(tip).to_contain_text("logits = h @ w2 + b2")
        shoot(graph, "placement_graph_hover.png")

        node.click()
        details = graph.locator(".fl-pg-details")
        expect(details).to_contain_text("matmul_1")
        inputs = details.locator(".fl-pg-inputs")
        expect(inputs).to_contain_text("relu")
        expect(inputs.locator("tr.cross")).to_contain_text("512 B")
        expect(inputs).to_contain_text("w2")
        expect(details.locator(".fl-pg-consumers")).to_contain_text("add")
        expect(graph.locator(".fl-pg-node.selected")).to_have_count(1)
        page.mouse.move(0, 0)
        shoot(graph, "placement_graph.png")

        tasks = page.locator(".fl-placement").filter(has_text="/job:worker/replica:0/task:1").first
        expect(tasks.locator(".fl-pg-bytes")).to_have_text("8.00 KiB")
        shoot(tasks, "placement_graph_tasks.png")
    finally:
        shoot(page, "placement_graph_lesson03.png")
        left = shut_down_and_reap(lab, page, status)
    assert not left, f"still running after the kernel shut down: {left}"
    assert page.errors == []
    to_docs("placement_graph.png", "placement_graph.png")
