"""What a LocalCluster's panel reads from it, on a real cluster: each task's activity and what it
runs, CPU, memory, message and byte counts and an activity history in ``snapshot()``; a busy
worker's Python stack from ``stack()`` (also in C code that holds the GIL) and the errors for a
dead or paused one; ``fl.cluster.clusters()``; snapshots from a thread while the main thread runs
calls; and, in a real kernel, a cluster shown once as its panel."""
import json
import os
import threading
import time

import pytest

import flowlab.cluster as fc
from flowlab.cluster.errors import ClusterError, WorkerDiedError, WorkerPausedError

pytestmark = pytest.mark.process


def sleepy(seconds):
    import time
    time.sleep(seconds)
    return "slept"


def spin_for(seconds):
    import time
    end = time.monotonic() + seconds
    n = 0
    while time.monotonic() < end:
        n += 1
    return n


def stuck_in_c():
    return sum(range(10 ** 13))     # one C call that holds the GIL for hours (ended by a restart)


def _wait_for(check, limit, what):
    end = time.monotonic() + limit
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < end, f"waited {limit} s for {what}"
        time.sleep(0.05)


def _row(cluster, task):
    return next(t for t in cluster.snapshot()["tasks"] if t["task"] == cluster.tasks[task])


class _Background:
    """``fn(*args)`` on a thread; ``join()`` returns its result or raises what it raised."""

    def __init__(self, fn, *args):
        self.out = []
        self.thread = threading.Thread(target=self._run, args=(fn, args), daemon=True)
        self.thread.start()

    def _run(self, fn, args):
        try:
            self.out.append((True, fn(*args)))
        except BaseException as e:   # noqa: BLE001 - handed to join()
            self.out.append((False, e))

    def join(self, timeout=60):
        self.thread.join(timeout)
        assert self.out, "the background call did not end"
        ok, value = self.out[0]
        if not ok:
            raise value
        return value


def test_busy_while_a_run_sleeps_with_what_it_runs_and_the_counters_grow(make_cluster):
    c = make_cluster(workers=2)
    before = c.snapshot()
    json.dumps(before)
    keys = {"activity", "running", "cpu", "rss", "msgs_in", "msgs_out", "bytes_in", "bytes_out", "history"}
    for t in before["tasks"]:
        assert keys <= set(t) and t["status"] == "alive" and t["activity"] == "idle" and t["running"] is None
    assert before["history_unit"] == "cpu %"
    run = _Background(c.run, sleepy, 1.5)
    busy = _wait_for(lambda: all(t["activity"] == "busy" for t in c.snapshot()["tasks"]) and c.snapshot(), 10,
                     "both workers busy")
    assert [t["running"] for t in busy["tasks"]] == ["sleepy", "sleepy"]
    assert run.join() == ["slept", "slept"]
    after = c.snapshot()
    for b, a in zip(before["tasks"], after["tasks"]):
        assert a["activity"] == "idle" and a["running"] is None
        assert a["msgs_out"] == b["msgs_out"] + 1 and a["msgs_in"] == b["msgs_in"] + 1
        assert a["bytes_out"] > b["bytes_out"] + 100 and a["bytes_in"] > b["bytes_in"]
    # a call on one task: only that one is busy, and an eager op placed on a task counts too
    one = _Background(c.call, 1, sleepy, 1.0)
    row = _wait_for(lambda: _row(c, 1)["activity"] == "busy" and _row(c, 1), 10, "worker 1 busy")
    assert row["running"] == "sleepy" and _row(c, 0)["activity"] == "idle"
    one.join()
    import flowlab as fl
    n = _row(c, 1)["msgs_out"]
    with fl.device("/job:worker/task:1"):
        y = fl.constant([1.0, 2.0]) * 3.0
    assert list(y.numpy()) == [3.0, 6.0]
    assert _row(c, 1)["msgs_out"] > n and _row(c, 1)["activity"] == "idle"


def test_cpu_memory_and_history_of_a_spinning_worker(make_cluster):
    c = make_cluster(workers=2)
    c.snapshot()
    spin = _Background(c.call, 1, spin_for, 2.5)
    _wait_for(lambda: _row(c, 1)["activity"] == "busy", 10, "worker 1 busy")
    samples = []
    end = time.monotonic() + 2.0
    while time.monotonic() < end:
        samples.append(c.snapshot())
        time.sleep(0.1)
    spin.join()
    busy = [s["tasks"][1]["cpu"] for s in samples if s["tasks"][1]["cpu"] is not None]
    idle = [s["tasks"][0]["cpu"] for s in samples if s["tasks"][0]["cpu"] is not None]
    # a whole core, less what a loaded machine takes (2 shared cores here), against heartbeats only
    assert busy and idle and max(busy) > max(10.0, 2 * max(idle)), (busy, idle)
    last = samples[-1]["tasks"]
    assert last[1]["rss"] > 5 * 2 ** 20 and last[0]["rss"] > 5 * 2 ** 20
    # one sample per 0.5 s at most however often it is asked: about 4 in 2 s, not 20
    grew = len(last[1]["history"]) - len(samples[0]["tasks"][1]["history"])
    assert 2 <= grew <= 5, (grew, last[1]["history"])
    assert max(last[1]["history"]) >= max(busy) and all(isinstance(v, float) for v in last[1]["history"])


def test_stack_of_a_busy_worker_shows_the_function_it_is_in(make_cluster):
    c = make_cluster(workers=2)
    spin = _Background(c.call, 1, spin_for, 3.0)
    _wait_for(lambda: _row(c, 1)["activity"] == "busy", 10, "worker 1 busy")
    # busy from the moment the request is sent: the worker may still be unpacking the function
    text = _wait_for(lambda: (lambda t: "in spin_for" in t and t)(c.stack(1)), 10, "spin_for in the stack")
    assert text.startswith(f"/job:worker/task:1 (pid {c.pid(1)})")
    main = text.split("\n\n")[1]
    assert main.startswith("Main thread") and "in spin_for" in main and "in serve_exec" in main
    assert "Thread 0x" in text                    # the other threads too (message loop, heartbeat)
    assert "in spin_for" not in c.stack(0)        # the idle worker waits for work
    spin.join()
    # again, stuck in one C call that holds the GIL: the signal handler still writes the stack
    stuck = _Background(c.call, 0, stuck_in_c)
    _wait_for(lambda: _row(c, 0)["activity"] == "busy", 10, "worker 0 busy")
    _wait_for(lambda: "in stuck_in_c" in c.stack(0, timeout=5.0), 10, "stuck_in_c in the stack")
    c.restart(0)
    with pytest.raises(ClusterError):     # died, or "is being restarted", as the race goes
        stuck.join()
    assert "in serve_exec" in c.stack(0)          # the new process answers too


def test_stack_errors_for_a_dead_a_paused_and_a_closed_task(make_cluster):
    c = make_cluster(workers=2)
    c.pause(1)
    with pytest.raises(WorkerPausedError, match=r"task:1 .*is paused .*cannot show its stack.*cluster\.resume\(1\)"):
        c.stack(1)
    c.resume(1)
    assert "Main thread" in c.stack(1)
    c.kill(1)
    _wait_for(lambda: c.status(1) == "dead", 10, "worker 1 dead")
    with pytest.raises(WorkerDiedError, match=r"no stack to show: .*task:1 .*SIGKILL.*cluster\.restart\(1\)"):
        c.stack(1)
    dead = _row(c, 1)
    assert dead["activity"] is None and dead["cpu"] is None and dead["rss"] is None and dead["msgs_out"] > 0
    with pytest.raises(ValueError, match="no task"):
        c.stack(5)
    c.close()
    with pytest.raises(ClusterError, match="closed"):
        c.stack(0)


def test_counts_go_on_over_a_restart(make_cluster):
    c = make_cluster(workers=1)
    c.run(sleepy, 0)
    before = _row(c, 0)
    c.restart(0)
    after = _row(c, 0)
    assert after["msgs_out"] > before["msgs_out"] and after["bytes_in"] >= before["bytes_in"]
    assert after["activity"] == "idle" and after["pid"] != before["pid"]


def test_clusters_lists_the_open_ones_oldest_first(make_cluster):
    mine = lambda: [x for x in fc.clusters() if x in (a, b)]   # noqa: E731 - others' may be open
    a = make_cluster(workers=1)
    b = make_cluster(workers=1)
    assert mine() == [a, b]
    a.close()
    assert mine() == [b] and a not in fc.clusters()
    b.close()
    assert mine() == []


def test_snapshots_from_a_thread_while_the_main_thread_runs(make_cluster):
    c = make_cluster(workers=2)
    start = c.snapshot()
    stop, seen, errors = threading.Event(), [], []

    def watch():
        while not stop.is_set():
            try:
                snap = c.snapshot()
                json.dumps(snap)
                seen.append(snap)
            except BaseException as e:   # noqa: BLE001 - reported below
                errors.append(e)
            time.sleep(0.005)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        for _ in range(150):
            assert c.run(spin_for, 0.002) and True
    finally:
        stop.set()
        watcher.join(10)
    assert not errors, errors
    assert len(seen) > 20
    assert any(t["activity"] == "busy" for s in seen for t in s["tasks"])
    for k in range(2):
        counts = [s["tasks"][k]["msgs_out"] for s in seen]
        assert counts == sorted(counts)               # never goes back
        assert _row(c, k)["msgs_out"] >= start["tasks"][k]["msgs_out"] + 150
    assert all(t["activity"] == "idle" for t in c.snapshot()["tasks"])


def test_a_cluster_is_shown_once_as_its_panel_in_a_kernel(tmp_path):
    """In a real kernel: the cluster as a cell's last expression is one widget view (with its text
    and HTML), ``show()`` displays one and returns None, ``panel()`` displays nothing."""
    pytest.importorskip("anywidget")
    jupyter_client = pytest.importorskip("jupyter_client")
    km, kc = jupyter_client.manager.start_new_kernel(
        kernel_name="python3", env={**os.environ, "IPYTHONDIR": str(tmp_path / "ipy")})

    def run(code):
        msg_id = kc.execute(code)
        out = []
        while True:
            msg = kc.get_iopub_msg(timeout=60)
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind = msg["msg_type"]
            if kind in ("execute_result", "display_data"):
                out.append((kind, msg["content"]["data"]))
            elif kind == "error":
                raise AssertionError("\n".join(msg["content"]["traceback"]))
            elif kind == "status" and msg["content"]["execution_state"] == "idle":
                return out

    widget = "application/vnd.jupyter.widget-view+json"
    try:
        run("import flowlab as fl\ncluster = fl.cluster.LocalCluster(workers=1)")
        last = run("cluster")
        assert [k for k, _ in last] == ["execute_result"] and widget in last[0][1]
        assert "LocalCluster(1 worker(s)" in last[0][1]["text/plain"]
        assert "/job:worker/task:0" in last[0][1]["text/html"]
        shown = run("cluster.show()")
        assert [k for k, _ in shown] == ["display_data"] and widget in shown[0][1]
        assert shown[0][1][widget]["model_id"] == last[0][1][widget]["model_id"]     # the same panel
        assert run("panel = cluster.panel()") == []
        model = last[0][1][widget]["model_id"]
        assert run(f"assert panel is cluster.panel() and panel.model_id == {model!r}\n"
                   "assert fl.cluster.clusters() == [cluster]") == []
        run("cluster.close()")
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
