"""The pipeline observatory (``PipelineView`` over what ``dataset.stats()`` returns) over a recording
comm: per-stage series over time that add up to the totals, bounded however long the run; the view's
thread re-reads the stats while the main thread iterates and stops once the run has finished; the
display bundle carries the widget, the table as text and a static SVG; AUTOTUNE's decisions travel
with their reasons."""
from __future__ import annotations

import json
import time

import pytest

pytest.importorskip("anywidget")

import flowlab as fl  # noqa: E402
import flowlab._display as display  # noqa: E402
from flowlab.data import stats as stats_mod  # noqa: E402
from flowlab.widgets.pipeline import PipelineView  # noqa: E402
from _widgets import display_in_kernel  # noqa: E402

D = fl.data.Dataset


def slow(x):
    time.sleep(0.002)
    return x


def test_series_add_up_to_the_totals_and_the_run_knows_when_it_finished():
    ds = D.range(120).map(slow, num_parallel_calls=2).batch(8).prefetch(2)
    it = iter(ds)
    for _ in range(3):
        next(it)
    snap = it.stats().snapshot()
    assert snap["running"] and not snap["closed"]
    for _ in it:
        pass
    stats = ds.stats()
    assert stats.finished
    snap = json.loads(json.dumps(stats.snapshot(), allow_nan=False))
    assert not snap["running"] and snap["closed"]
    stages = {s["name"]: s for s in snap["stages"]}
    assert list(stages) == ["range#0", "map#1", "batch#2", "prefetch#3"]
    lengths = {len(s["series"]["elements"]) for s in snap["stages"]}
    assert len(lengths) == 1 and lengths.pop() <= stats_mod.BUCKETS      # one time axis for all stages
    for s in snap["stages"]:
        assert sum(s["series"]["elements"]) == s["elements"]
    assert stages["batch#2"]["elements"] == 15 and "requests" not in stages["batch#2"]["series"]   # sequential
    m = stages["map#1"]["series"]
    assert sum(m["requests"]) == stages["map#1"]["requests"] == 120
    assert abs(sum(m["wait_s"]) - stages["map#1"]["wait_s"]) < 1e-4      # each bucket rounded to 1 us
    assert all(f is None or 0 <= f <= c for f, c in zip(m["fill"], m["capacity"]))
    assert max(m["capacity"]) == 2 * 2 * 1 or max(m["capacity"]) >= 4     # 2 workers x 2 chunks of >= 1
    assert snap["seconds"] >= 120 * 0.002 / 2 * 0.9


def test_a_long_run_stays_within_the_buckets():
    series = stats_mod._Series(0.0)
    spans = [(t * 0.001, t * 0.001 + 0.0005) for t in range(100_000)]          # 100 s of elements
    for k in range(0, len(spans), 256):
        series.add_spans(spans[k:k + 256])
    assert len(series.elements) == stats_mod.BUCKETS and sum(series.elements) == 100_000
    assert series.width == stats_mod.BUCKET_S * 2 ** 8                           # 0.01 s doubled to 2.56 s
    assert series.elements[0] == 2560 and series.elements[-1] == 0


def test_the_view_is_live_while_the_main_thread_iterates_and_stops_when_the_run_ends(widget_comm):
    ds = D.range(200).map(slow, num_parallel_calls=1).prefetch(fl.data.AUTOTUNE)
    it = iter(ds)
    view = PipelineView(it.stats(), every=0.05)
    for _ in it:                               # about 0.4 s: the view's thread reads meanwhile
        pass
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not view.snapshot.get("closed"):
        time.sleep(0.02)
    updates = view.comm.updates("snapshot")
    running = [u for u in updates if u["running"]]
    assert len(running) >= 3, "updates arrive while the pipeline runs"
    counts = [u["stages"][-1]["elements"] for u in running]
    assert counts == sorted(counts) and counts[-1] > counts[0]
    assert updates[-1]["closed"] and updates[-1]["stages"][-1]["elements"] == 200
    sent = len(view.comm.sent)
    time.sleep(0.3)
    assert len(view.comm.sent) == sent, "the refresh thread stopped once the run finished"


def test_a_stats_object_displays_as_the_observatory_with_its_table_and_a_static_picture(widget_comm, monkeypatch):
    ds = D.range(50).map(slow, num_parallel_calls=fl.data.AUTOTUNE).batch(5)
    list(ds)
    stats = ds.stats()
    assert stats._repr_mimebundle_() is None                  # outside a kernel: text and HTML
    monkeypatch.setattr(display, "in_kernel", lambda: True)
    data, _ = stats._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in data
    assert data["text/plain"] == repr(stats) and "map#1" in data["text/plain"]
    html = data["text/html"]
    assert '<svg xmlns="http://www.w3.org/2000/svg" class="fl-pipeline-static"' in html and "<table>" in html
    assert html.count("<rect") > 10
    view = display.view(stats)
    assert isinstance(view, PipelineView) and view.snapshot["closed"]


def test_autotune_decisions_reach_the_view_with_their_reasons(widget_comm):
    ds = D.range(200).map(slow, num_parallel_calls=fl.data.AUTOTUNE)
    list(ds)
    stats = ds.stats()
    view = PipelineView(stats)
    decisions = view.snapshot["autotune"]
    assert decisions, "a map whose consumer waits on it grows"       # 1 core is enough: the work sleeps
    d = decisions[0]
    assert d["stage"] == "map#1" and d["parameter"] == "parallelism" and "waited" in d["reason"]
    stage = view.snapshot["stages"][1]
    assert stage["autotune"][0] == d and stage["parallelism"] == decisions[-1]["new"]
    assert "dashed" not in stats._repr_html_() and 'stroke-dasharray="3 2"' in stats._repr_html_()


def test_with_stats_off_the_observatory_says_so_and_does_not_tick(widget_comm):
    options = fl.data.Options()
    options.stats.enabled = False
    ds = D.range(10).map(slow).with_options(options)
    list(ds)
    snap = PipelineView(ds.stats(), every=0.05).snapshot
    assert snap["counting"] is False and snap["closed"]


def test_displayed_before_the_loop_the_display_ends_showing_the_finished_run(widget_comm, monkeypatch):
    import IPython.display
    handles = display_in_kernel(monkeypatch)
    ds = D.range(60).map(slow, num_parallel_calls=2).batch(6).prefetch(2)
    it = iter(ds)
    IPython.display.display(it.stats())            # as a lesson does: display(epoch.stats())
    (handle,) = handles
    assert "since it started" in handle.shown["text/plain"] and not handle.updates
    for _ in it:
        pass
    assert len(handle.updates) == 1, "updated once, when the run finished (on this thread)"
    final = handle.updates[0]
    assert final["text/plain"].startswith(f"pipeline {ds.stats().id}: 4 stages, finished after ")
    assert "application/vnd.jupyter.widget-view+json" in final and "fl-pipeline-static" in final["text/html"]
    assert display.view(ds.stats()).snapshot["closed"]


def test_an_idle_run_is_not_sent_again(widget_comm):
    ds = D.range(1000).map(slow, num_parallel_calls=2).prefetch(2)
    it = iter(ds)
    next(it)
    view = PipelineView(it.stats(), every=0.05)
    time.sleep(0.3)                 # the map fills its buffer, then nothing happens
    sent = len(view.comm.updates("snapshot"))
    time.sleep(0.3)
    assert len(view.comm.updates("snapshot")) == sent, "an unchanged snapshot is not sent"
    assert not view.snapshot["closed"]
    it.close()
    assert it.stats().finished
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not view.snapshot.get("closed"):
        time.sleep(0.02)
    assert view.snapshot["closed"]
