"""Chrome trace export (flowlab.cluster.trace) checked by loading the JSON back: every thread's
complete events properly nested, a flow from each send to the receive that took its message (each
end bound to the right slice), timestamps in µs from the base stored in the metadata, process and
thread names. The events are real: LocalGroup all-reduces, a pipeline run, a LocalCluster's."""
import json

import numpy as np
import pytest

import flowlab as fl
from flowlab.cluster import trace
from flowlab.cluster.collectives import LocalGroup, allreduce
from flowlab.cluster.events import Event


def _load(path):
    data = json.loads(path.read_text())
    assert set(data) >= {"traceEvents", "displayTimeUnit", "metadata"}
    return data


def _names(data, what):
    return {(e["pid"], e["tid"]) if what == "thread_name" else e["pid"]: e["args"]["name"]
            for e in data["traceEvents"] if e["ph"] == "M" and e["name"] == what}


def _slices(data):
    by_thread = {}
    for e in data["traceEvents"]:
        if e["ph"] == "X":
            by_thread.setdefault((e["pid"], e["tid"]), []).append(e)
    return by_thread


def assert_nested(data):
    """No slice outlives the slice it starts in, on any thread (times compared in whole ns)."""
    for key, slices in _slices(data).items():
        stack = []
        for e in sorted(slices, key=lambda e: (round(e["ts"] * 1e3), -round(e["dur"] * 1e3))):
            s, t = round(e["ts"] * 1e3), round((e["ts"] + e["dur"]) * 1e3)
            while stack and stack[-1] <= s:
                stack.pop()
            assert not stack or t <= stack[-1], \
                f"{e['name']} ({e['cat']}) at {e['ts']} µs outlives its parent on {key}"
            stack.append(t)


def enclosing(data, pid, tid, ts):
    """The innermost slice of that thread open at ``ts`` (the one a flow with bp 'e' binds to)."""
    around = [e for e in _slices(data).get((pid, tid), []) if e["ts"] <= ts < e["ts"] + e["dur"]]
    return min(around, key=lambda e: e["dur"]) if around else None


def flows(data):
    out = {}
    for e in data["traceEvents"]:
        if e["ph"] in "sf":
            out.setdefault(e["id"], {})[e["ph"]] = e
    return out


def _group_events(n=3, algorithm="ring", calls=2, size=3000):
    with LocalGroup(n) as group:
        group.run(lambda comm: [allreduce(np.full(size, comm.rank + 1.0, np.float32), algorithm=algorithm)
                                for _ in range(calls)])
        return group, group.events.events()


@pytest.mark.parametrize("algorithm", ["ring", "tree", "naive"])
def test_a_real_allreduce_exports_nested_slices_and_a_flow_per_message(tmp_path, algorithm):
    group, events = _group_events(algorithm=algorithm)
    info = group.events.export_trace(tmp_path / "t.json")        # EventLog.export_trace
    data = _load(tmp_path / "t.json")
    sends = [e for e in events if e.kind == "send"]
    assert (info.slices, info.flows, info.processes) == (len(events), len(sends), 3)
    assert "ui.perfetto.dev" in repr(info)

    # times: µs from the stored base, which is the first event's perf_counter start
    meta = data["metadata"]
    assert meta["base_perf_counter"] == min(e.start for e in events) == float(data["otherData"]["base_perf_counter"])
    xs = [e for e in data["traceEvents"] if e["ph"] == "X"]
    assert min(e["ts"] for e in xs) == 0.0
    last = max(e.end for e in events)
    assert max(e["ts"] + e["dur"] for e in xs) == pytest.approx((last - meta["base_perf_counter"]) * 1e6, abs=0.01)

    # one process per rank, named; every thread used is named
    assert _names(data, "process_name") == {0: "rank 0", 1: "rank 1", 2: "rank 2"}
    threads = _names(data, "thread_name")
    assert set(_slices(data)) <= set(threads)
    assert {threads[k] for k in _slices(data)} == {"main"}      # one thread per rank: everything nests
    assert_nested(data)
    # the collective holds its sends, receives and reductions
    for e in xs:
        if e["cat"] in ("send", "recv", "reduce"):
            assert enclosing(data, e["pid"], e["tid"], e["ts"] - 1e-3)["cat"] == "collective", e

    # a flow from each send to the receive of its message, each end bound to that slice
    fl_ = flows(data)
    assert len(fl_) == len(sends)
    for pair in fl_.values():
        s, f = pair["s"], pair["f"]
        assert f["bp"] == "e" and s["name"] == f["name"] == "message"
        snd, rcv = enclosing(data, s["pid"], s["tid"], s["ts"]), enclosing(data, f["pid"], f["tid"], f["ts"])
        assert snd["cat"] == "send" and rcv["cat"] == "recv"
        assert snd["args"]["peer"] == f["pid"] and rcv["args"]["peer"] == s["pid"]
        for key in ("seq", "step", "chunk", "part"):
            assert snd["args"][key] == rcv["args"][key]
        assert snd["args"]["bytes"] == rcv["args"]["bytes"]


def test_overlapping_slices_move_to_another_thread_and_children_stay_with_their_parent(tmp_path):
    evs = [Event("op", "train_step", 0.0, 1.0, rank=0),
           Event("collective", "allreduce", 0.2, 0.6, rank=0),
           Event("send", "allreduce", 0.3, 0.4, rank=0, attrs={"peer": 1}),
           Event("op", "fetch", 0.5, 1.5, rank=0),             # overlaps train_step: another thread
           Event("op", "read", 0.7, 0.8, rank=0),               # fits inside train_step
           Event("fault", "kill", 0.9, 0.9, task="/job:worker/task:1")]
    info = trace.export_trace(evs, tmp_path / "o.json", base=0.0)
    data = _load(tmp_path / "o.json")
    assert_nested(data)
    tid = {e["name"]: (e["pid"], e["tid"]) for e in data["traceEvents"] if e["ph"] in "Xi"}
    assert tid["train_step"] == tid["allreduce"] == tid["read"] != tid["fetch"]
    threads = _names(data, "thread_name")
    assert threads[tid["fetch"]] == "main (overlap 1)"
    assert (info.slices, info.instants, info.threads) == (5, 1, 3)
    kill = next(e for e in data["traceEvents"] if e["name"] == "kill")
    assert kill["ph"] == "i" and kill["ts"] == 900000.0 and kill["args"]["kind"] == "fault"
    assert _names(data, "process_name")[kill["pid"]] == "/job:worker/task:1"
    fetch = next(e for e in data["traceEvents"] if e["name"] == "fetch")
    assert (fetch["ts"], fetch["dur"]) == (500000.0, 1000000.0)


def test_a_pipeline_gets_a_thread_per_stage_and_worker(tmp_path):
    import time
    ds = fl.data.Dataset.range(12).map(lambda x: time.sleep(0.001) or x, num_parallel_calls=2).batch(4).prefetch(1)
    assert len(list(ds)) == 3
    events = ds.stats().events()
    info = trace.export_trace(ds.stats(), tmp_path / "p.json")
    data = _load(tmp_path / "p.json")
    assert_nested(data)
    assert info.slices + info.instants == len(events)
    assert [n.split()[0] for n in _names(data, "process_name").values()] == ["pipeline"]    # "pipeline <run id>"
    names = [n.split(" (overlap")[0] for n in _names(data, "thread_name").values()]     # in tid order
    order = ["range#0", "map#1 worker 0", "map#1 worker 1", "map#1 wait", "batch#2", "prefetch#3", "prefetch#3 wait"]
    assert {"range#0", "map#1 worker 0", "map#1 worker 1", "batch#2", "prefetch#3"} <= set(names)
    assert list(dict.fromkeys(names)) == [n for n in order if n in names]    # source first ("wait": if one waited)


def test_events_of_accepts_what_holds_events_and_names_what_does_not(tmp_path):
    group, events = _group_events(n=2, calls=1, size=4)
    assert trace.events_of(group) == events == trace.events_of(group.events) == trace.events_of(events)
    with pytest.raises(TypeError, match="no events in int"):
        trace.export_trace(3, tmp_path / "x.json")
    empty = trace.export_trace([], tmp_path / "e.json")
    assert (empty.slices, empty.flows) == (0, 0)
    assert _load(tmp_path / "e.json")["traceEvents"] == []


@pytest.mark.process
def test_a_local_clusters_allreduce_has_a_process_per_task_and_flows_between_them(tmp_path):
    def work():
        import numpy as np
        import flowlab.horovod as hvd
        hvd.init()
        for _ in range(3):
            hvd.allreduce(np.ones(1000, np.float32) * hvd.rank())
        return hvd.rank()

    with fl.cluster.LocalCluster(workers=2) as cluster:
        assert cluster.run(work, timeout=60) == [0, 1]
        events = cluster.events()
    info = trace.export_trace(events, tmp_path / "c.json")
    data = _load(tmp_path / "c.json")
    assert _names(data, "process_name") == {0: "/job:worker/task:0", 1: "/job:worker/task:1"}
    assert_nested(data)
    sends = [e for e in events if e.kind == "send" and e.name == "allreduce"]
    assert info.flows == len(sends) == 12
    for pair in flows(data).values():
        assert pair["s"]["pid"] != pair["f"]["pid"]
        assert enclosing(data, pair["f"]["pid"], pair["f"]["tid"], pair["f"]["ts"])["cat"] == "recv"
    # the collective runs inside the function cluster.run ran: an "op" slice on the same thread
    for e in data["traceEvents"]:
        if e["ph"] == "X" and e["cat"] == "collective":
            assert enclosing(data, e["pid"], e["tid"], e["ts"] - 1e-3)["cat"] == "op"


def test_processes_in_order_and_each_tasks_pipeline_apart():
    """Pipeline ids count per process: two workers' "pipeline 1" are two processes, each right after
    its task; ranks sort as numbers."""
    evs = [Event("produce", "map#1", 0.0, 0.1, task=f"/job:worker/task:{t}", attrs={"pipeline": 1})
           for t in (1, 0)]
    evs += [Event("op", "train", 0.0, 1.0, task=f"/job:worker/task:{t}", rank=t) for t in (1, 0)]
    evs += [Event("send", "x", 0.0, 0.1, rank=r) for r in (10, 2)]
    procs = list(dict.fromkeys(p.process for p in trace.layout(evs)))
    assert procs == ["rank 2", "rank 10", "/job:worker/task:0", "/job:worker/task:0 pipeline 1",
                     "/job:worker/task:1", "/job:worker/task:1 pipeline 1"]
    data = trace.trace_events(evs)
    assert list(_names(data, "process_name").values()) == procs
