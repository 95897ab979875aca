"""The collective replay (flowlab.widgets.replay): its frames are the recorded events of a real
ring, tree and naive all-reduce step by step (arrows = send events of that step, matched to their
receives; holds = what the events show each rank has summed), the model's numbers sit beside the
measured ones, the snapshot stays bounded with thousands of events, the static HTML does not
depend on the clock, and the view's Re-run action records a fresh all-reduce."""
import json
import time

import numpy as np
import pytest

from flowlab.cluster.collectives import LocalGroup, allreduce, barrier
from flowlab.cluster.events import EventLog
from flowlab.widgets import replay as rp
from flowlab.widgets.replay import CollectiveReplay, record_allreduce, replay

AB = (2e-5, 5e-10)     # a fixed alpha/beta: no fit in tests that do not need one


def _sends_by_step(events):
    out = {}
    for e in events:
        if e.kind == "send" and e.name == "allreduce":
            out.setdefault(e.attrs["step"], []).append(e)
    return out


@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize("algorithm", ["ring", "tree", "naive"])
def test_frames_are_the_recorded_steps(algorithm, n):
    events = record_allreduce(algorithm, nbytes=12 * 1024, world_size=n)
    snap = CollectiveReplay(events, alpha_beta=AB).snapshot()
    sends = _sends_by_step(events)
    assert [f["step"] for f in snap["frames"]] == sorted(sends)
    assert snap["total_frames"] == len(sends) and snap["folded_frames"] == 0
    for f in snap["frames"]:
        evs = sends[f["step"]]
        assert sorted((m["src"], m["dst"]) for m in f["messages"]) == sorted({(e.rank, e.attrs["peer"]) for e in evs})
        assert f["bytes"] == sum(e.bytes for e in evs)
        assert not any(m.get("lost") for m in f["messages"])
        if algorithm == "ring":      # a ring chunk is one block: the arrow names the event's chunk
            assert sorted((m["src"], m["chunks"]) for m in f["messages"]) == sorted((e.rank, [e.attrs["chunk"]]) for e in evs)
    assert snap["initial"] == [[1] * n for _ in range(n)]
    assert snap["frames"][-1]["holds"] == [[n] * n for _ in range(n)]      # everyone has every sum
    assert snap["ranks"] == n and snap["nbytes"] == 12 * 1024 and snap["alg"] == algorithm
    assert snap["layout"] == {"ring": "ring", "tree": "tree", "naive": "star"}[algorithm]


def test_holds_follow_the_algorithm():
    """Half way through a ring all-reduce rank r has exactly chunk r summed (ring.py's docstring);
    the naive one has everything summed on rank 0 after its first step, nothing elsewhere."""
    n = 4
    ring = CollectiveReplay.record("ring", nbytes=4096, world_size=n, alpha_beta=AB).snapshot()
    half = ring["frames"][n - 2]
    assert half["phase"] == "reduce-scatter" and ring["frames"][n - 1]["phase"] == "all-gather"
    for r in range(n):
        assert [b for b, v in enumerate(half["holds"][r]) if v == n] == [r]
    naive = CollectiveReplay.record("naive", nbytes=4096, world_size=n, alpha_beta=AB).snapshot()
    assert naive["frames"][0]["holds"] == [[n] * n] + [[1] * n] * (n - 1)
    assert all(m["reduce"] for m in naive["frames"][0]["messages"])
    assert not any(m["reduce"] for m in naive["frames"][1]["messages"])
    tree = CollectiveReplay.record("tree", nbytes=4096, world_size=n, alpha_beta=AB).snapshot()
    after_halving = tree["frames"][1]
    assert [[b for b, v in enumerate(row) if v == n] for row in after_halving["holds"]] == [[r] for r in range(n)]


def test_model_and_measurement_sit_side_by_side():
    replay_ = CollectiveReplay.record("ring", nbytes=64 * 1024, world_size=4, alpha_beta=AB)
    snap = replay_.snapshot()
    model, measured = snap["model"], snap["measured"]
    assert model["steps"] == snap["recorded"]["steps"] == 6
    assert model["bytes"] == snap["recorded"]["bytes"] == 3 * 64 * 1024 // 2
    assert model["seconds"] == pytest.approx(6 * AB[0] + model["bytes"] * AB[1])
    calls = [e for e in replay_.events if e.kind == "collective"]
    assert len(calls) == 4
    assert measured["seconds"] == pytest.approx(max(e.end for e in calls) - min(e.start for e in calls), abs=2e-6)
    measured = dict(measured, seconds=max(e.end for e in calls) - min(e.start for e in calls))
    assert model["ratio"] == pytest.approx(measured["seconds"] / model["seconds"], rel=1e-3)
    assert measured["factor"] == 1.5 and measured["factor_formula"] == "2(n-1)/n"
    assert measured["busbw"] == pytest.approx(measured["algbw"] * 1.5)
    assert measured["algbw"] == pytest.approx(64 * 1024 / measured["seconds"], rel=1e-3)


def test_replay_picks_a_call_from_a_group_a_log_or_a_list():
    def body(comm):
        allreduce(np.ones(64, np.float32), algorithm="ring")
        allreduce(np.ones(64, np.float32), algorithm="tree")
    with LocalGroup(3) as group:
        group.run(body)
        assert replay(group, alpha_beta=AB).snapshot()["alg"] == "tree"            # the last call
        first = min(e.attrs["seq"] for e in group.events.events() if e.kind == "collective")
        assert replay(group.events, seq=first, alpha_beta=AB).snapshot()["alg"] == "ring"
        dicts = [e.to_dict() for e in group.events.events()]
        assert replay(dicts, alpha_beta=AB).snapshot()["frames"] == replay(group, alpha_beta=AB).snapshot()["frames"]
    with pytest.raises(ValueError, match="no recorded allreduce events"):
        replay(EventLog(), op="allreduce")
    with pytest.raises(ValueError, match="op='gather'"):
        replay([], op="gather")
    with pytest.raises(TypeError, match="got int"):
        replay(3)


def test_the_static_picture_does_not_depend_on_the_clock():
    a = CollectiveReplay.record("tree", nbytes=8192, world_size=3, alpha_beta=AB)
    b = CollectiveReplay.record("tree", nbytes=8192, world_size=3, alpha_beta=(1.0, 1.0))
    assert a._repr_html_() == b._repr_html_()
    page = a._repr_html_()
    assert page.count("<svg") == 4 and "fold" in page and "2(n-1)/n" in page
    assert repr(a) == "CollectiveReplay(tree allreduce, 3 ranks, 8 KiB, 4 steps)"
    assert a._repr_mimebundle_() is None           # outside a kernel: IPython uses the HTML above


def test_thousands_of_events_make_a_bounded_snapshot():
    events = record_allreduce("ring", nbytes=64 * 1024, world_size=8, segment_bytes=1024)
    assert len(events) > 2000
    snap = CollectiveReplay(events, alpha_beta=AB).snapshot()
    assert all(m["parts"] == 8 for f in snap["frames"] for m in f["messages"])   # parts merged into one arrow
    assert len(json.dumps(snap)) < 60_000
    # many ranks: frames decimated, blocks folded, and the snapshot says so
    big = CollectiveReplay(record_allreduce("ring", nbytes=4096, world_size=16), alpha_beta=AB).snapshot()
    assert big["total_frames"] == 30 and big["folded_frames"] == 0
    with LocalGroup(40) as group:
        group.run(lambda comm: allreduce(np.ones(80, np.float32)))
        many = replay(group, alpha_beta=AB).snapshot()
    assert many["total_frames"] == 78 and len(many["frames"]) == rp.MAX_FRAMES
    assert many["folded_frames"] == 78 - rp.MAX_FRAMES
    assert many["blocks"] <= rp.MAX_BLOCKS and many["block_ranks"] == 3
    assert all(len(row) == many["blocks"] for row in many["frames"][-1]["holds"])
    assert many["frames"][-1]["holds"][0] == [40] * many["blocks"]
    assert len(json.dumps(many)) < 300_000      # 48 frames x (24 arrows + 40 ranks x 14 squares)


def test_bad_rerun_settings_are_named():
    for kwargs, match in [({"world_size": 99}, "world_size must be between 2 and 16"),
                          ({"algorithm": "butterfly"}, "algorithm must be one of"),
                          ({"slow_rank": 4, "world_size": 4}, "slow_rank must be between 0 and 3"),
                          ({"delay_ms": 5000}, "delay_ms must be between"),
                          ({"nbytes": 1 << 30}, "nbytes must be between")]:
        with pytest.raises(ValueError, match=match):
            record_allreduce(**kwargs)


def test_the_rerun_action_records_a_fresh_allreduce_with_a_slow_rank(widget_comm):
    pytest.importorskip("anywidget")
    from flowlab.widgets.replay_view import ReplayView
    from _widgets import click

    view = ReplayView(CollectiveReplay.record("ring", nbytes=4096, world_size=2, alpha_beta=AB))
    assert view.snapshot["alg"] == "ring" and view.snapshot["ranks"] == 2
    started = time.perf_counter()
    reply = click(view, "rerun", algorithm="ring", nbytes=65536, world_size=4, slow_rank=2, delay_ms=20)
    took = time.perf_counter() - started
    assert reply["ok"], reply
    assert reply["result"] == {"alg": "ring", "ranks": 4, "nbytes": 65536, "frames": 6}
    assert took < 3.0                                 # about a second: 6 steps x 20 ms and the fit
    sent = view.comm.updates("snapshot")[-1]
    assert sent["ranks"] == 4 and sent["slow"] == {"rank": 2, "delay_ms": 20.0}
    waits = {p["rank"]: p["wait"] for p in sent["per_rank"]}
    assert waits[3] > 0.05                             # rank 3 receives from the slow rank 6 times
    assert max(waits, key=waits.get) != 2              # the slow rank itself is not the one waiting most
    bad = click(view, "rerun", world_size=1)
    assert "world_size must be between 2 and 16" in bad["error"]
    assert view.snapshot["ranks"] == 4                 # a bad request leaves the recording as it was
