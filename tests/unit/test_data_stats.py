"""Pipeline stats and events: every stage is named, counted and timed; the events of one run can be
told apart in a shared log, drawn as a timeline, and switched off."""
import json
import threading
import time

import numpy as np
import pytest

import flowlab as fl
from flowlab.cluster.events import EventLog, default_log
from flowlab.data._parallel import MAX_CHUNK

Dataset = fl.data.Dataset
pytestmark = pytest.mark.timeout(60)


def private_log(**stats):
    log = EventLog(maxlen=1 << 20)
    options = fl.data.Options()
    options.stats.log = log
    for name, value in stats.items():
        setattr(options.stats, name, value)
    return log, options


def by_stage(events, kind):
    out = {}
    for e in events:
        if e.kind == kind:
            out.setdefault(e.name, []).append(e)
    return out


def test_stages_are_named_by_kind_and_position_from_the_source():
    ds = Dataset.range(10).map(lambda x: x, num_parallel_calls=2).batch(3).with_options(fl.data.Options()).prefetch(1)
    list(ds)
    assert [s.name for s in ds.stats().stages] == ["range#0", "map#1", "batch#2", "prefetch#3"]
    zipped = Dataset.zip(Dataset.range(3), Dataset.from_tensor_slices([1, 2, 3]).map(lambda x: x)).enumerate()
    list(zipped)
    assert [s.name for s in zipped.stats().stages] == ["range#0", "from_tensor_slices#1", "map#2", "zip#3",
                                                      "enumerate#4"]


def test_counts_and_events_match_what_each_stage_did():
    log, options = private_log()
    n, size = 1000, 64                    # more events than one chunk, so chunked hand-over is exercised
    ds = Dataset.range(n).map(lambda x: x * 2, num_parallel_calls=3).batch(size).prefetch(2).with_options(options)
    out = [b.numpy().tolist() for b in ds]
    assert [x for b in out for x in b] == [2 * i for i in range(n)]
    stats = ds.stats()
    batches = -(-n // size)
    assert {s.name: s.elements for s in stats.stages} == {"range#0": n, "map#1": n, "batch#2": batches,
                                                          "prefetch#3": batches}
    assert stats.stage("map#1").requests == n and stats.stage("prefetch#3").requests == batches
    events = stats.events()
    assert all(e.attrs["pipeline"] == stats.id for e in events)
    produce, wait = by_stage(events, "produce"), by_stage(events, "wait")
    assert {k: len(v) for k, v in produce.items()} == {"range#0": n, "map#1": n, "batch#2": batches,
                                                       "prefetch#3": batches}
    # a wait event for every request that had to wait; the stats count every request
    assert len(wait.get("map#1", [])) == stats.stage("map#1").blocked <= n
    assert len(wait.get("prefetch#3", [])) == stats.stage("prefetch#3").blocked <= batches
    assert all(e.duration > 20e-6 for e in wait.get("map#1", []))
    assert {e.attrs["worker"] for e in produce["map#1"]} <= {0, 1, 2}
    assert all(e.start <= e.end for e in events)
    for e in wait.get("map#1", []):      # 2 chunks in flight per worker, a chunk of 1 to MAX_CHUNK elements
        assert 0 <= e.attrs["fill"] <= e.attrs["capacity"] and e.attrs["capacity"] in range(6, 6 * MAX_CHUNK + 1, 6)
    for e in wait.get("prefetch#3", []):
        assert e.attrs["fill"] == 0 and e.attrs["capacity"] == 2
    assert abs(sum(e.duration for e in produce["map#1"]) - stats.stage("map#1").produce_s) < 1e-6
    assert sum(e.duration for e in wait.get("map#1", [])) <= stats.stage("map#1").wait_s + 1e-9


def test_sequential_produce_spans_nest_like_a_call_stack():
    log, options = private_log()
    ds = Dataset.range(12).map(lambda x: x + 1).batch(4).with_options(options)
    list(ds)
    produce = by_stage(ds.stats().events(), "produce")
    maps = sorted(produce["map#1"], key=lambda e: e.start)
    for i, batch in enumerate(sorted(produce["batch#2"], key=lambda e: e.start)):
        inside = [m for m in maps if batch.start <= m.start and m.end <= batch.end]
        assert len(inside) == 4, i
    for m in maps:                                   # each map call contains its pull from range
        assert sum(1 for r in produce["range#0"] if m.start <= r.start and r.end <= m.end) == 1


def test_runs_are_kept_apart_in_a_shared_log():
    ds = Dataset.range(20).map(lambda x: x, num_parallel_calls=2)
    list(ds)
    first = ds.stats()
    list(ds)
    second = ds.stats()
    assert first is not second and first.id != second.id
    assert len(first.events("produce")) == len(second.events("produce")) == 40
    assert {e.attrs.get("pipeline") for e in default_log().events()} >= {first.id, second.id}   # other tests log there too


def test_stats_can_be_switched_off():
    log, options = private_log(events=False)
    ds = Dataset.range(50).map(lambda x: x, num_parallel_calls=2).prefetch(2).with_options(options)
    list(ds)
    assert ds.stats().stage("map#1").elements == 50 and len(log) == 0
    log, options = private_log(enabled=False)
    ds = Dataset.range(50).map(lambda x: x, num_parallel_calls=2).prefetch(2).with_options(options)
    assert sorted(int(x) for x in ds) == list(range(50))
    stats = ds.stats()
    assert all(s.elements == 0 and s.requests == 0 for s in stats.stages) and len(log) == 0
    assert "stats off" in repr(stats)
    assert stats.stage("map#1").parallelism == 2          # what the stage is still shows


def test_stats_read_while_running_and_flushed_events():
    log, options = private_log()
    with iter(Dataset.range(10**6).map(lambda x: x, num_parallel_calls=2).with_options(options)) as it:
        for _ in range(10):
            next(it)
        stats = it.stats()
        assert stats.stage("map#1").requests == 10         # buffered requests are counted on demand...
        before = len(log)
        stats.events()
        assert len(log) > before                           # ...and their events flushed to the log


def test_stats_before_iterating_and_spec_peeks_are_not_runs():
    ds = Dataset.range(5).map(lambda x: x)
    with pytest.raises(ValueError, match="not been iterated yet"):
        ds.stats()
    ds.element_spec                                        # iterates one element, records nothing
    with pytest.raises(ValueError, match="not been iterated yet"):
        ds.stats()
    with pytest.raises(KeyError, match="no stage 'map#9'.*range#0, map#1"):
        list(ds) and ds.stats().stage("map#9")


def test_stats_print_as_a_table_and_snapshot_as_json():
    ds = Dataset.range(30).map(lambda x: x, num_parallel_calls=2).batch(4).prefetch(fl.data.AUTOTUNE)
    list(ds)
    text = repr(ds.stats())
    for word in ("range#0", "map#1", "batch#2", "prefetch#3", "elements", "wait s", "workers", "buffer"):
        assert word in text
    assert "<table>" in ds.stats()._repr_html_()
    snap = json.loads(json.dumps(ds.stats().snapshot()))
    stages = {s["name"]: s for s in snap["stages"]}
    assert stages["map#1"]["elements"] == 30 and stages["map#1"]["parallelism"] == 2
    assert stages["prefetch#3"]["buffer_size"] >= 1 and stages["batch#2"]["elements"] == 8


def test_timeline_from_real_events():
    log, options = private_log()
    ds = Dataset.range(40).map(lambda x: time.sleep(0.001) or x, num_parallel_calls=2).batch(8).prefetch(1)
    ds = ds.with_options(options)
    list(ds)
    tl = fl.data.timeline(ds.stats())
    assert tl.rows == ["range#0", "map#1 worker 0", "map#1 worker 1", "map#1 wait", "batch#2", "prefetch#3",
                       "prefetch#3 wait"]
    assert sum(1 for b in tl.bars if b.row.startswith("map#1 worker")) == 40
    assert min(b.start for b in tl.bars) == 0.0 and all(b.end >= b.start for b in tl.bars)
    assert all(0.0 <= share <= 1.0 for share in tl.busy().values())
    assert {b.kind for b in tl.bars if b.row.endswith("wait")} == {"wait"}
    assert all(b.fill is not None for b in tl.bars if b.kind == "wait")
    assert "Timeline" in repr(tl)
    other = Dataset.range(3).with_options(options)
    list(other)
    both = fl.data.timeline(log.events())                  # two runs in one log: rows say which
    assert f"p{ds.stats().id} map#1 worker 0" in both.rows and f"p{other.stats().id} range#0" in both.rows


def test_plot_timeline_draws_bars_and_a_line_per_autotune_decision():
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    options = fl.data.Options()
    options.autotune.cpu_budget = 4
    ds = Dataset.range(60).map(lambda x: time.sleep(0.004) or x, num_parallel_calls=fl.data.AUTOTUNE)
    ds = ds.with_options(options)
    list(ds)
    stats = ds.stats()
    ax = fl.data.plot_timeline(stats, title="slow map")
    try:
        assert len(ax.collections) >= 2 and ax.get_xlabel() == "seconds" and ax.get_title(loc="left") == "slow map"
        assert len(ax.lines) == len(stats.decisions)
        assert [t.get_text() for t in ax.get_yticklabels()][0] == "range#0"
    finally:
        plt.close(ax.figure)


def test_recording_keeps_no_thread_and_needs_no_lock_per_element():
    log, options = private_log()
    before = threading.active_count()
    ds = Dataset.range(300).map(lambda x: x, num_parallel_calls=2).prefetch(2).with_options(options)
    assert sum(int(x) for x in ds) == sum(range(300))
    deadline = time.monotonic() + 5
    while threading.active_count() > before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert threading.active_count() == before
    lanes = ds.stats().stage("map#1")._producers
    assert len(lanes) == 2 and sum(lane.totals()[0] for lane in lanes) == 300   # one lane per worker thread


def test_event_payload_is_plain_numbers():
    log, options = private_log()
    list(Dataset.range(3).map(lambda x: np.float32(x), num_parallel_calls=1).with_options(options))
    for e in log.events():
        json.dumps(e.to_dict())


def test_timeline_takes_other_events_as_rows_below_the_pipeline():
    log, options = private_log()
    ds = Dataset.range(6).map(lambda x: time.sleep(0.003) or x).batch(2).prefetch(1).with_options(options)
    for batch in ds:                 # a batch takes 6 ms to make, a step 1 ms: the step waits for each
        with log.span("step", "train step"):
            time.sleep(0.001)
    tl = fl.data.timeline(ds.stats().events() + log.events(kind="step"))
    assert tl.rows == ["range#0", "map#1", "batch#2", "prefetch#3", "prefetch#3 wait", "train step"]
    assert [b.kind for b in tl.bars if b.row == "train step"] == ["step"] * 3
