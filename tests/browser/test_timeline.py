"""The timeline widget in a real JupyterLab and Chromium: a cell records 20 ring all-reduces on a
LocalGroup of 3 ranks and shows their Timeline; the test checks the lanes, hovers a send bar and
reads its tooltip, zooms with the wheel (and checks the kernel now holds the zoomed window), pans by
dragging, hides a kind from the legend and the arrows and shows them again, then clicks Export trace and loads the written file back:
properly nested slices per thread, a flow per message. Screenshots land in .pt/screenshots/ (and
the zoomed one in docs/screenshots/timeline.png)."""
import json
import re
from pathlib import Path

import pytest

from _lab import SCREENSHOTS, code_notebook, open_notebook, run_cell, shoot, shut_down, to_docs

pytestmark = [pytest.mark.browser, pytest.mark.timeout(180)]

NAME = "timeline_widget.ipynb"
CELLS = [
    """import numpy as np
from flowlab.cluster.collectives import LocalGroup, allreduce
from flowlab.widgets.timeline import Timeline

with LocalGroup(3) as group:
    group.run(lambda comm: [allreduce(np.full(30000, comm.rank + 1.0, np.float32), algorithm="ring")
                            for _ in range(20)])
timeline = Timeline.from_(group, title="20 ring all-reduces on 3 ranks")
timeline""",
    "print('window', timeline._live_view.window)",
]


def _check_trace(data):
    """Nested slices on every thread, and each flow from a send slice to a receive slice."""
    slices = {}
    for e in data["traceEvents"]:
        if e["ph"] == "X":
            slices.setdefault((e["pid"], e["tid"]), []).append(e)
    for thread in slices.values():
        stack = []
        for e in sorted(thread, key=lambda e: (e["ts"], -e["dur"])):
            while stack and stack[-1] <= e["ts"]:
                stack.pop()
            assert not stack or e["ts"] + e["dur"] <= stack[-1] + 1e-6, e
            stack.append(e["ts"] + e["dur"])
    ends = {}
    for e in data["traceEvents"]:
        if e["ph"] in "sf":
            inner = min((x for x in slices[(e["pid"], e["tid"])] if x["ts"] <= e["ts"] < x["ts"] + x["dur"]),
                        key=lambda x: x["dur"])
            ends.setdefault(e["id"], {})[e["ph"]] = inner["cat"]
    return ends


def test_hover_zoom_pan_and_export_a_trace(lab, page):
    from playwright.sync_api import expect

    status = open_notebook(lab, page, NAME, code_notebook(CELLS))
    view = page.locator(".fl-view.fl-timeline")
    info = view.locator(".fl-tl-info")
    try:
        expect(status).to_contain_text("| Idle")
        run_cell(page, 0)
        expect(info).to_contain_text("660 events")          # 20 calls x 11 events x 3 ranks
        expect(info).to_contain_text("240 messages")       # 2(n-1) sends per rank and call
        labels = view.locator(".fl-tl-labels text")
        expect(labels).to_have_text(["rank 0", "rank 1", "rank 2"])
        assert view.locator(".fl-tl-arrow").count() > 0
        expect(view.locator(".fl-tl-legend")).to_contain_text("send 240")
        whole = info.inner_text()
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        view.screenshot(path=SCREENSHOTS / "timeline_whole.png")

        # zoom in with the wheel around a send in the middle (it stays under the pointer)
        plot = view.locator(".fl-tl-plot")
        box = plot.bounding_box()
        sends = view.locator(".fl-tl-bar.fl-tl-kind-send")
        target = sends.nth(sends.count() // 2).bounding_box()
        page.mouse.move(target["x"] + target["width"] / 2, target["y"] + target["height"] / 2)
        for _ in range(6):
            page.mouse.wheel(0, -300)
            page.wait_for_timeout(60)
        expect(info).not_to_have_text(whole)
        expect(info).not_to_contain_text("merged")           # the kernel sent the window's every event
        run_cell(page, 1)                                    # and holds the window
        out = page.locator(".jp-Notebook .jp-CodeCell").nth(1).locator(".jp-OutputArea")
        expect(out).to_contain_text(re.compile(r"window \(\d\.\d+(e-\d+)?, \d\.\d+(e-\d+)?\)"))

        # hover a send bar: its tooltip
        assert sends.count() > 0
        bar = sends.nth(sends.count() // 2)
        bar.hover(force=True)
        tip = view.locator(".fl-tip")
        expect(tip).to_be_visible()
        expect(tip).to_contain_text(re.compile(r"allreduce\nsend on rank \d"))
        expect(tip).to_contain_text("peer ")
        expect(tip).to_contain_text("39.1 KiB")             # a third of 30000 float32s
        expect(tip).to_contain_text("duration ")
        view.screenshot(path=SCREENSHOTS / "timeline.png")

        # pan: drag to the right moves the window to earlier times
        zoomed = info.inner_text()
        page.mouse.move(box["x"] + 400, box["y"] + 40)
        page.mouse.down()
        page.mouse.move(box["x"] + 600, box["y"] + 40, steps=5)
        page.mouse.up()
        expect(info).not_to_have_text(zoomed)

        # arrows off and on again
        toggle = view.locator(".fl-tl-arrows-toggle")
        toggle.uncheck()
        expect(view.locator(".fl-tl-arrow")).to_have_count(0)
        toggle.check()
        view.locator(".fl-tl-reset").click()
        expect(info).to_have_text(whole)
        assert view.locator(".fl-tl-arrow").count() > 0

        # a kind hidden from the legend, then shown again
        reduces = view.locator(".fl-tl-bar.fl-tl-kind-reduce")
        assert reduces.count() > 0
        view.locator(".fl-tl-key[data-kind=reduce]").click()
        expect(reduces).to_have_count(0)
        view.locator(".fl-tl-key[data-kind=reduce]").click()
        expect(reduces).not_to_have_count(0)

        # export: the file the kernel wrote, loaded back
        view.locator(".fl-tl-export").click()
        message = view.locator(".fl-tl-message")
        expect(message).to_contain_text("open it in https://ui.perfetto.dev")
        path = Path(re.search(r"wrote (\S+timeline-\d+\.json)", message.inner_text()).group(1))
        data = json.loads(path.read_text())
        assert {e["args"]["name"] for e in data["traceEvents"] if e["name"] == "process_name"} == \
            {"rank 0", "rank 1", "rank 2"}
        assert sum(e["ph"] == "X" for e in data["traceEvents"]) == 660
        ends = _check_trace(data)
        assert len(ends) == 240 and all(v == {"s": "send", "f": "recv"} for v in ends.values())
        assert data["metadata"]["base_perf_counter"] > 0
    finally:
        shoot(page, "timeline_page.png")
        to_docs("timeline.png", "timeline.png")
        shut_down(page, status)
    assert page.errors == []


BIG = """from flowlab.cluster.events import Event
from flowlab.widgets.timeline import Timeline

events = []
for rank in range(4):
    events.append(Event("collective", "allreduce", 0.0, 2.0, rank=rank))
    for i in range(5000):
        t = i * 4e-4
        events.append(Event("send", "allreduce", t, t + 1e-4, rank=rank, bytes=64,
                            attrs={"peer": (rank + 1) % 4, "step": i, "seq": 1, "chunk": 0, "part": 0}))
        events.append(Event("recv", "allreduce", t + 1.5e-4, t + 3e-4, rank=(rank + 1) % 4, bytes=64,
                            attrs={"peer": rank, "step": i, "seq": 1, "chunk": 0, "part": 0}))
big = Timeline(events, title="40 004 events")
big"""


def test_forty_thousand_events_draw_bounded_and_zoom_quickly(lab, page):
    """A timeline of 40 004 events draws at most Timeline.MAX_BARS bars, and a wheel zoom redraws
    at once (the detail of the window follows from the kernel)."""
    from playwright.sync_api import expect

    status = open_notebook(lab, page, "timeline_big.ipynb", code_notebook([BIG]))
    view = page.locator(".fl-view.fl-timeline")
    info = view.locator(".fl-tl-info")
    try:
        expect(status).to_contain_text("| Idle")
        run_cell(page, 0)
        expect(info).to_contain_text("40004 events")
        expect(info).to_contain_text("short events merged")
        bars = view.locator(".fl-tl-bar")
        assert 0 < bars.count() <= 2000
        before = info.inner_text()
        box = view.locator(".fl-tl-plot").bounding_box()
        page.mouse.move(box["x"] + box["width"] / 2, box["y"] + 40)
        # time the local redraw of one wheel step, in the page
        ms = page.evaluate("""() => new Promise((done) => {
            const plot = document.querySelector('.fl-timeline .fl-tl-plot');
            const box = plot.getBoundingClientRect();
            const t0 = performance.now();
            plot.dispatchEvent(new WheelEvent('wheel', {deltaY: -300, clientX: box.left + box.width / 2,
                                                        clientY: box.top + 40, bubbles: true, cancelable: true}));
            requestAnimationFrame(() => requestAnimationFrame(() => done(performance.now() - t0)));
        })""")
        assert ms < 500, f"one wheel step took {ms:.0f} ms to redraw"
        expect(info).not_to_have_text(before)
        for _ in range(8):
            page.mouse.wheel(0, -300)
            page.wait_for_timeout(50)
        expect(info).not_to_contain_text("merged")          # the kernel sent the window's real events
        assert 0 < bars.count() <= 2000
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        view.screenshot(path=SCREENSHOTS / "timeline_big_zoomed.png")
    finally:
        shut_down(page, status)
    assert page.errors == []
