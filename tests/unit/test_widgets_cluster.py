"""The cluster panel's drawing: plain functions from a snapshot dict to HTML (no kernel, no
cluster). The live view over a real cluster is tested in tests/process/test_cluster_panel_live.py."""
import pytest

pytest.importorskip("ipywidgets")
from flowlab.widgets.cluster import describe_faults, render_activity, render_table  # noqa: E402


def _snap(**over):
    tasks = [
        {"task": "/job:worker/task:0", "status": "alive", "pid": 101, "address": "127.0.0.1:5000",
         "exitcode": None, "faults": {"delay_ms": 200.0, "drop": 0.0, "corrupt": 0.0}},
        {"task": "/job:worker/task:1", "status": "paused", "pid": 102, "address": "127.0.0.1:5001",
         "exitcode": None, "faults": None},
        {"task": "/job:worker/task:2", "status": "dead", "pid": 103, "address": "127.0.0.1:5002",
         "exitcode": -9, "faults": None},
    ]
    snap = {"closed": False, "target": "flowlab://127.0.0.1:5000", "tasks": tasks}
    snap.update(over)
    return snap


def _row(table, task):
    return table.split(f"<code>{task}</code>", 1)[1].split("</tr>", 1)[0]


def test_paused_is_blue_dead_names_its_signal_and_faults_are_listed_per_task():
    table = render_table(_snap(scheduled=[(2.0, "kill", "/job:worker/task:0")]))
    assert "<th>faults</th>" in table
    paused = _row(table, "/job:worker/task:1")
    assert "color:#1565c0" in paused and "&#9679; paused" in paused and ">paused</td>" in paused
    assert "(signal 9)" in _row(table, "/job:worker/task:2")
    assert ">delay 200 ms, kill scheduled</td>" in _row(table, "/job:worker/task:0")


def test_a_plain_cluster_snapshot_still_draws():
    snap = _snap()
    for t in snap["tasks"]:
        t.pop("faults")
    table = render_table(snap)
    assert table.count("<tr>") == 4 and render_activity(snap) == ""


def test_describe_faults_in_words():
    assert describe_faults(None) == ""
    assert describe_faults({"delay_ms": 0, "drop": 0.3, "corrupt": 0.05}) == "drop 30%, corrupt 5%"
    assert describe_faults({}, paused=True, scheduled=["resume"]) == "paused, resume scheduled"


def test_activity_lists_scheduled_faults_newest_events_first_and_runs_with_restarts():
    recent = [{"name": "pause", "task": "/job:worker/task:1", "ago": 3.0, "attrs": {}},
              {"name": "kill", "task": "/job:worker/task:2", "ago": 1.0, "attrs": {"signal": "SIGKILL"}}]
    runs = [{"what": "train", "state": "restarting", "seconds": 4.2, "error": None,
             "restarts": ["restart 1: /job:worker/task:2 (pid 103): killed by signal 9 (SIGKILL)"]}]
    out = render_activity(_snap(scheduled=[(5.0, "kill", "/job:worker/task:0")], recent=recent, runs=runs))
    assert "kill /job:worker/task:0 at +5 s" in out
    assert out.index("kill /job:worker/task:2 (signal=SIGKILL)") < out.index("pause /job:worker/task:1")
    assert "run_with_recovery(train)" in out and "fl-run-restarting" in out and "1 restart(s)" in out
    assert "restart 1: /job:worker/task:2 (pid 103)" in out


def test_text_from_the_cluster_is_escaped():
    runs = [{"what": "<lambda>", "state": "failed", "seconds": 0.1, "restarts": [], "error": "ValueError: a<b"}]
    out = render_activity(_snap(runs=runs))
    assert "run_with_recovery(&lt;lambda&gt;)" in out and "a&lt;b" in out and "<lambda>" not in out
