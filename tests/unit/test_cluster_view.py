"""The cluster panel (flowlab.widgets.cluster.ClusterView) and the launcher
(flowlab.cluster.launch_form, flowlab.widgets.launcher_view.LauncherView).

Without processes: the static HTML drawn from a snapshot dict, the launcher's checks. With a real
LocalCluster (process tier) and a recording comm: each button, sent as the front end sends it,
calls the right cluster method (kill marks the task dead with its signal, pause/resume, restart,
stack, log, delay and clear, add worker, stop), the snapshot carries what the rows draw, a
failing button answers with the error instead of raising, the refresh thread stops once the
cluster is closed, a kill during a background run shows its restart, and the launcher starts a
cluster and becomes its panel."""
import re
import time

import pytest

pytest.importorskip("anywidget")

import flowlab as fl  # noqa: E402
from flowlab.cluster.launch_form import Launcher, launcher  # noqa: E402
from flowlab.widgets.cluster import (ClusterView, describe_faults, render_activity, render_table,  # noqa: E402
                                     state_of)
from flowlab.widgets.launcher_view import LauncherView  # noqa: E402

from _processes import kill_left, wait_gone  # noqa: E402
from _widgets import click  # noqa: E402

W0, W1 = "/job:worker/task:0", "/job:worker/task:1"


# -- static HTML, from a snapshot dict ---------------------------------------------------------
def _snap(**over):
    tasks = [
        {"task": W0, "status": "alive", "activity": "busy", "pid": 101, "address": "127.0.0.1:5000",
         "exitcode": None, "faults": {"delay_ms": 200.0, "drop": 0.0, "corrupt": 0.0}},
        {"task": W1, "status": "paused", "pid": 102, "address": "127.0.0.1:5001", "exitcode": None, "faults": None},
        {"task": "/job:worker/task:2", "status": "dead", "pid": 103, "address": "127.0.0.1:5002",
         "exitcode": -9, "faults": None},
    ]
    snap = {"closed": False, "target": "flowlab://127.0.0.1:5000", "tasks": tasks}
    snap.update(over)
    return snap


def _row(table, task):
    return table.split(f"<code>{task}</code>", 1)[1].split("</tr>", 1)[0]


def test_static_table_colours_states_names_the_signal_and_lists_faults():
    table = render_table(_snap(scheduled=[(2.0, "kill", W0)]))
    assert "<th>faults</th>" in table
    assert "&#9679; busy" in _row(table, W0) and "fl-status-busy" in _row(table, W0)
    paused = _row(table, W1)
    assert "color:#1565c0" in paused and "&#9679; paused" in paused and ">paused</td>" in paused
    assert "(signal 9)" in _row(table, "/job:worker/task:2")
    assert ">delay 200 ms, kill scheduled</td>" in _row(table, W0)


def test_a_task_without_the_new_fields_still_draws():
    snap = _snap()
    for t in snap["tasks"]:
        t.pop("faults")
        t.pop("activity", None)
    table = render_table(snap)
    assert table.count("<tr>") == 4 and render_activity(snap) == ""
    assert "&#9679; alive" in _row(table, W0)          # activity not known: its status
    assert state_of({"status": "alive", "activity": "idle"}) == "idle"
    assert state_of({"status": "dead", "activity": None}) == "dead" and state_of({}) == "starting"


def test_describe_faults_in_words():
    assert describe_faults(None) == ""
    assert describe_faults({"delay_ms": 0, "drop": 0.3, "corrupt": 0.05}) == "drop 30%, corrupt 5%"
    assert describe_faults({}, paused=True, scheduled=["resume"]) == "paused, resume scheduled"


def test_activity_lists_scheduled_faults_newest_events_first_and_runs_with_restarts():
    recent = [{"name": "pause", "task": W1, "ago": 3.0, "attrs": {}},
              {"name": "kill", "task": "/job:worker/task:2", "ago": 1.0, "attrs": {"signal": "SIGKILL"}}]
    runs = [{"what": "train", "state": "restarting", "seconds": 4.2, "error": None,
             "restarts": ["restart 1: /job:worker/task:2 (pid 103): killed by signal 9 (SIGKILL)"]}]
    out = render_activity(_snap(scheduled=[(5.0, "kill", W0)], recent=recent, runs=runs))
    assert "kill /job:worker/task:0 at +5 s" in out
    assert out.index("kill /job:worker/task:2 (signal=SIGKILL)") < out.index("pause /job:worker/task:1")
    assert "run_with_recovery(train)" in out and "fl-run-restarting" in out and "1 restart(s)" in out


def test_text_from_the_cluster_is_escaped():
    runs = [{"what": "<lambda>", "state": "failed", "seconds": 0.1, "restarts": [], "error": "ValueError: a<b"}]
    out = render_activity(_snap(runs=runs))
    assert "run_with_recovery(&lt;lambda&gt;)" in out and "a&lt;b" in out and "<lambda>" not in out


def test_the_launcher_checks_its_form_and_describes_itself():
    with pytest.raises(ValueError, match="unknown transport 'udp'; choose one of unix\\+tcp, tcp"):
        launcher(transport="udp")
    with pytest.raises(ValueError, match="workers must be 1 to 16"):
        Launcher(workers=0)
    form = launcher(workers=3, ps=1)
    snap = form.snapshot()
    assert snap["defaults"] == {"workers": 3, "ps": 1, "transport": "unix+tcp"}
    assert set(snap["transports"]) == {"unix+tcp", "tcp"} and snap["current"] is None
    assert repr(form).startswith("Launcher(workers=3, ps=1, transport='unix+tcp')")
    assert "<b>Start a LocalCluster</b>" in form._repr_html_()
    with pytest.raises(ValueError, match="no open cluster #99"):
        form.show(99)


def test_the_js_is_one_module_with_one_default_export():
    exports = re.compile(r"^export default", re.M)
    assert len(exports.findall(ClusterView._esm)) == 1 and "function clusterPanel" in ClusterView._esm
    assert len(exports.findall(LauncherView._esm)) == 1 and "function launcherForm" in LauncherView._esm
    assert ".fl-state-dead" in ClusterView._css


# -- over a real LocalCluster -------------------------------------------------------------------
@pytest.fixture
def clusters():
    """``clusters.start(**kw)``: LocalClusters closed after the test, their processes checked gone."""
    class Made(list):
        def start(self, **kw):
            c = fl.cluster.LocalCluster(**kw)
            self.append(c)
            return c
    made = Made()
    yield made
    pids = []
    for c in made:
        pids += [c.pid(t) for t in c.tasks]
        c.close()
    left = wait_gone([p for p in pids if p], 10)
    kill_left(left)
    assert not left, f"processes left after close: {left}"


def _wait_for(check, limit, what):
    end = time.monotonic() + limit
    while not check():
        assert time.monotonic() < end, f"waited {limit} s for {what}"
        time.sleep(0.05)


def _task(view, task):
    view.refresh()
    return next(t for t in view.snapshot["tasks"] if t["task"] == task)


def sleepy(seconds):
    import time
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(0.02)
    return "slept"


@pytest.mark.process
def test_each_button_calls_the_cluster(widget_comm, clusters):
    cluster = clusters.start(workers=2)
    view = ClusterView(cluster, every=0)
    snap = view.snapshot
    assert snap["mode"] == "cluster" and snap["workers"] == 2 and snap["ps"] == 0
    row = _task(view, W1)
    for key in ("status", "pid", "address", "activity", "cpu", "rss", "msgs_in", "msgs_out", "bytes_in",
                "bytes_out", "history"):
        assert key in row, key
    assert row["pid"] == cluster.pid(1) and row["address"].startswith("127.0.0.1:")

    assert click(view, "pause", task=W1)["ok"] and cluster.status(1) == "paused"
    assert _task(view, W1)["status"] == "paused"
    assert click(view, "resume", task=W1)["ok"] and cluster.status(1) == "alive"

    reply = click(view, "delay", task=W1, ms=150)
    assert reply["ok"] and cluster.faults()[W1]["delay_ms"] == 150
    assert _task(view, W1)["faults"]["delay_ms"] == 150
    assert click(view, "clear_faults")["ok"] and cluster.faults() == {}

    stack = click(view, "stack", task=W0)
    assert stack["ok"] and stack["result"]["title"] == f"stack of {W0}" and "File" in stack["result"]["text"]
    log = click(view, "log", task=W0)
    assert log["ok"] and log["result"]["title"].startswith(f"log of {W0}")

    old = cluster.pid(1)
    assert click(view, "kill", task=W1)["ok"]
    _wait_for(lambda: _task(view, W1)["status"] == "dead", 5, "worker 1 shown dead")
    assert _task(view, W1)["exitcode"] == -9
    assert view.comm.updates("snapshot")[-1]["tasks"][1]["status"] == "dead"    # sent to the front end
    reply = click(view, "restart", task=W1)
    assert reply["ok"] and cluster.status(1) == "alive" and cluster.pid(1) != old
    assert _task(view, W1)["activity"] in ("idle", None)

    reply = click(view, "add_worker")
    assert reply == {"action": "add_worker", "ok": True, "result": "added /job:worker/task:2", "reply": 7}
    assert [t["task"] for t in view.snapshot["tasks"]][-1] == "/job:worker/task:2"
    assert click(view, "stop")["ok"] and cluster.closed and view.snapshot["closed"]


@pytest.mark.process
def test_a_failing_button_answers_with_the_error(widget_comm, clusters):
    cluster = clusters.start(workers=2)
    view = ClusterView(cluster, every=0)
    cluster.kill(1)
    _wait_for(lambda: cluster.status(1) == "dead", 5, "worker 1 dead")
    reply = click(view, "pause", task=W1)                  # a dead task cannot be paused
    assert "ClusterError" in reply["error"] and "not running" in reply["error"]
    assert "no task" in click(view, "kill", task="/job:worker/task:9")["error"]
    assert "whole number" in click(view, "delay", task=W0, ms="soon")["error"]
    assert "has no action 'format_disk'" in click(view, "format_disk")["error"]


@pytest.mark.process
def test_the_refresh_thread_follows_the_cluster_and_stops_when_it_closes(widget_comm, clusters):
    cluster = clusters.start(workers=1)
    view = ClusterView(cluster)                            # every = 0.5, as in a notebook
    thread = next(t for t in __import__("threading").enumerate() if t.name == "flowlab-ClusterView")
    cluster.kill(0)
    _wait_for(lambda: view.snapshot["tasks"][0]["status"] == "dead", 5, "the thread to send the death")
    cluster.close()
    thread.join(3)
    assert not thread.is_alive() and view.snapshot["closed"]


@pytest.mark.process
def test_kill_during_a_background_run_shows_its_restart(widget_comm, clusters):
    cluster = clusters.start(workers=2)
    view = ClusterView(cluster, every=0.1)
    run = fl.distribute.run_with_recovery(cluster, sleepy, 2, wait=False)
    _wait_for(lambda: any(r["what"] == "sleepy" for r in view.snapshot["runs"]), 10, "the run in the panel")
    old = cluster.pid(1)
    assert click(view, "kill", task=W1)["ok"]
    _wait_for(lambda: view.snapshot["runs"] and view.snapshot["runs"][-1]["restarts"], 30, "the restart")
    assert f"restart 1: {W1} (pid {old})" in view.snapshot["runs"][-1]["restarts"][0]
    assert run.result(timeout=60) == ["slept", "slept"]
    _wait_for(lambda: view.snapshot["runs"][-1]["state"] == "done", 5, "the run shown done")
    assert any(e["name"] == "kill" and e["task"] == W1 for e in view.snapshot["recent"])
    view.close()


@pytest.mark.process
def test_the_launcher_starts_a_cluster_and_becomes_its_panel(widget_comm, clusters):
    earlier = clusters.start(workers=1)
    form = launcher(workers=1)
    view = LauncherView(form, every=0)
    snap = view.snapshot
    assert snap["mode"] == "launcher" and any(c["target"] == earlier.target for c in snap["clusters"])
    assert "no cluster is shown" in click(view, "kill", task=W0)["error"]

    reply = click(view, "start", workers=2, ps=1, transport="tcp")
    assert reply["ok"] and reply["result"] == "started 2 worker(s), 1 ps"
    started = form.current
    clusters.append(started)
    try:
        assert view.snapshot["mode"] == "cluster" and view.snapshot["target"] == started.target
        assert [t["task"] for t in view.snapshot["tasks"]] == [W0, W1, "/job:ps/task:0"]
        assert started.client.lane(W0) == "tcp"                  # the transport chosen in the form
        assert click(view, "pause", task=W1)["ok"] and started.status(1) == "paused"   # acts on it
        assert click(view, "back")["ok"] and view.snapshot["mode"] == "launcher"
        listed = view.snapshot["clusters"]
        mine = next(i for i, c in enumerate(listed) if c["target"] == started.target)
        assert listed[mine]["transport"] == "tcp" and listed[mine]["ps"] == 1
        first = next(i for i, c in enumerate(listed) if c["target"] == earlier.target)
        assert click(view, "show", index=first)["ok"] and view.snapshot["target"] == earlier.target
    finally:
        started.close()
