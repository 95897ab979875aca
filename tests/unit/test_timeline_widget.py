"""The Timeline widget's record (flowlab.widgets.timeline.Timeline) and its view over a recording
comm: one lane per rank, task, pipeline stage and thread, nested events one row deeper; a snapshot
that stays under its bound with 10 000 events (short bars merged and counted) and shows the real
events again when zoomed; an arrow per message; the zoom, reset and export actions as the front end
sends them; a static SVG that is well-formed XML; no widget library imported by the plain object."""
import json
import subprocess
import sys
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from flowlab.cluster.collectives import LocalGroup, allreduce
from flowlab.cluster.events import Event
from flowlab.widgets.timeline import Timeline, messages, render_svg


def _ring(n=4, calls=1, size=4096):
    with LocalGroup(n) as group:
        group.run(lambda comm: [allreduce(np.full(size, comm.rank + 1.0, np.float32), algorithm="ring")
                                for _ in range(calls)])
        return group


def _many(n=10_000, ranks=4, seconds=1.0):
    """``n`` short sends and receives spread over ``ranks`` and ``seconds``, inside one long
    collective per rank, each send received by the next rank."""
    evs = [Event("collective", "allreduce", 0.0, seconds + 0.01, rank=r) for r in range(ranks)]
    per = -(-(n - ranks) // (2 * ranks))
    dt = seconds / per
    for r in range(ranks):
        for i in range(per):
            t = i * dt
            evs.append(Event("send", "allreduce", t, t + dt * 0.2, rank=r, bytes=64,
                             attrs={"peer": (r + 1) % ranks, "step": i, "seq": 1, "chunk": 0, "part": 0}))
            evs.append(Event("recv", "allreduce", t + dt * 0.3, t + dt * 0.6, rank=(r + 1) % ranks, bytes=64,
                             attrs={"peer": r, "step": i, "seq": 1, "chunk": 0, "part": 0}))
    return evs


def test_a_lane_per_rank_with_the_collectives_work_one_row_deeper():
    group = _ring()
    tl = Timeline.from_(group, title="ring")
    snap = tl.snapshot()
    assert [lane["process"] for lane in snap["lanes"]] == ["rank 0", "rank 1", "rank 2", "rank 3"]
    assert all(lane["depth"] == 2 for lane in snap["lanes"])
    events = group.events.events()
    assert snap["events"] == len(events) == sum(b[6] for b in snap["bars"])
    for b in snap["bars"]:
        assert b[1] == (0 if b[4] == "collective" else 1), b      # sends, recvs, reduces inside the call
        assert snap["lanes"][b[0]]["process"] == f"rank {b[0]}"
    assert snap["counts"] == {"collective": 4, "send": 24, "recv": 24, "reduce": 12}
    assert snap["colours"]["send"] != snap["colours"]["recv"]
    assert repr(tl) == ("<Timeline: 64 events (collective 4, send 24, recv 24, reduce 12) "
                        "on rank 0, rank 1, rank 2, rank 3>")


def test_tasks_threads_and_pipeline_stages_get_lanes_of_their_own():
    import time

    import flowlab as fl
    ds = fl.data.Dataset.range(8).map(lambda x: time.sleep(0.001) or x, num_parallel_calls=2).batch(4)
    list(ds)
    evs = [Event("op", "train", 0.0, 1.0, task="/job:worker/task:1", rank=1),
           Event("op", "fetch", 0.5, 1.5, task="/job:worker/task:1", rank=1),     # overlaps: another thread
           Event("op", "init", 0.0, 0.1, task="/job:ps/task:0", rank=0)] + ds.stats().events()
    lanes = Timeline(evs).snapshot()["lanes"]
    got = [(lane["process"].split()[0], lane["label"]) for lane in lanes]
    assert got[:3] == [("/job:ps/task:0", ""), ("/job:worker/task:1", ""), ("/job:worker/task:1", " (overlap 1)")]
    assert {"range#0", "map#1 worker 0", "map#1 worker 1", "map#1 wait", "batch#2"} >= {label for p, label in got[3:]}
    assert got[3][1] == "range#0" and got[-1][1] == "batch#2"            # from the source to the consumer
    assert {p for p, _ in got[3:]} == {"pipeline"}


def test_ten_thousand_events_stay_under_the_bound_and_zooming_shows_them_again():
    evs = _many()
    tl = Timeline(evs)
    snap = tl.snapshot()
    assert snap["events"] == len(evs) >= 10_000
    assert len(snap["bars"]) <= Timeline.MAX_BARS
    merged = [b for b in snap["bars"] if b[6] > 1]
    assert merged and snap["merged"] == sum(b[6] for b in merged)
    assert sum(b[6] for b in snap["bars"]) == len(evs)           # every event is in one bar
    assert all(b[5].startswith(f"{b[6]} events: ") for b in merged)
    assert [b for b in snap["bars"] if b[4] == "collective"] == [
        [r, 0, 0.0, 1.01, "collective", "allreduce", 1, 0, None] for r in range(4)]   # long bars kept whole
    assert len(snap["arrows"]) <= Timeline.MAX_ARROWS
    assert snap["arrows_left_out"] == snap["messages"] - len(snap["arrows"]) > 0
    assert len(json.dumps(snap)) < 250_000

    # a window of 2 ms holds a few sends and receives per rank: each drawn as itself
    zoom = tl.snapshot(window=(0.5, 0.502))
    assert zoom["window"] == [0.5, 0.502] and zoom["merged"] == 0
    inside = [e for e in evs if e.end >= 0.5 and e.start <= 0.502]
    assert len(zoom["bars"]) == zoom["in_window"] == len(inside)
    assert sorted((b[2], b[3]) for b in zoom["bars"]) == sorted((round(e.start, 7), round(e.end, 7)) for e in inside)
    assert zoom["arrows"] and all(max(a[2], a[5]) >= 0.5 and min(a[2], a[5]) <= 0.502 for a in zoom["arrows"])
    with pytest.raises(ValueError, match="window must run forward"):
        tl.snapshot(window=(0.3, 0.2))


def test_an_arrow_joins_each_send_to_its_receive():
    group = _ring(n=3)
    tl = Timeline.from_(group)
    pairs = messages(group.events.events())
    assert len(pairs) == 3 * 4 == len(tl.snapshot()["arrows"]) == tl.snapshot()["messages"]
    lane = {i: int(lane["process"].split()[1]) for i, lane in enumerate(tl.lanes)}
    got = sorted((lane[a[0]], lane[a[3]], a[1], a[4]) for a in tl.snapshot()["arrows"])
    want = sorted((s.rank, r.rank, 1, 1) for s, r in pairs)
    assert got == want
    for s, r in pairs:
        assert r.rank == s.attrs["peer"] == (s.rank + 1) % 3    # a ring sends to the next rank


def test_zoom_reset_and_export_actions_from_the_front_end(widget_comm, tmp_path, monkeypatch):
    pytest.importorskip("anywidget")
    from flowlab.widgets.timeline_view import TimelineView

    from _widgets import click
    tl = Timeline(_many(2000))
    view = TimelineView(tl)
    assert view.snapshot["window"] is None
    reply = click(view, "zoom", t0=0.25, t1=0.26)
    assert reply["ok"] and reply["result"] == {"window": [0.25, 0.26]}
    sent = view.comm.updates("snapshot")[-1]
    assert sent["window"] == [0.25, 0.26]
    assert sent["bars"] and all(b[3] >= 0.25 and b[2] <= 0.26 for b in sent["bars"])
    assert sent["merged"] == 0 and len(sent["bars"]) == sent["in_window"] < len(tl.events)
    assert click(view, "zoom", t0=0.3, t1=0.3)["error"] == "ValueError: zoom: t1 (0.3) must be after t0 (0.3)"
    assert click(view, "reset")["ok"]
    assert view.comm.updates("snapshot")[-1]["window"] is None

    monkeypatch.chdir(tmp_path)
    reply = click(view, "export")
    assert reply["ok"] and reply["result"]["name"] == "timeline-1.json"
    data = json.loads((tmp_path / "timeline-1.json").read_text())
    assert sum(e["ph"] == "X" for e in data["traceEvents"]) == len(tl.events) == reply["result"]["slices"]
    assert click(view, "export")["result"]["name"] == "timeline-2.json"     # never overwrites

    bundle, _ = view._repr_mimebundle_()
    assert bundle["text/plain"] == repr(tl) and "<svg" in bundle["text/html"]


def test_the_static_svg_is_well_formed_and_draws_every_lane_and_bar():
    group = _ring(n=2)
    tl = Timeline.from_(group, title="ring <2 ranks>")
    html = tl._repr_html_()
    root = ET.fromstring(html)                          # well-formed: the title is escaped
    svg = root.find("{http://www.w3.org/2000/svg}svg")
    texts = [t.text for t in svg.iter("{http://www.w3.org/2000/svg}text")]
    assert "ring <2 ranks>" in texts and "rank 0" in texts and "rank 1" in texts
    assert {"send", "recv", "reduce", "collective"} <= set(texts)      # the legend
    snap = tl.snapshot(width=700, max_bars=1500)
    rects = svg.findall("{http://www.w3.org/2000/svg}rect")
    assert len(rects) == len(snap["kinds"]) + len(snap["bars"])
    assert len(svg.findall("{http://www.w3.org/2000/svg}line")) >= len(snap["arrows"])
    assert f"{snap['events']} events, {len(snap['bars'])} bars" in html
    empty = Timeline([])
    assert repr(empty) == "<Timeline: 0 events () on nothing>"
    ET.fromstring(render_svg(empty.snapshot()))


def test_the_plain_object_imports_no_widget_library():
    code = ("import sys, flowlab, flowlab.widgets.timeline as t\n"
            "t.Timeline([])._repr_html_()\n"
            "bad = [m for m in sys.modules if m.split('.')[0] in ('anywidget', 'ipywidgets', 'matplotlib')]\n"
            "assert not bad, bad\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
