"""The cluster panel (flowlab.widgets.cluster.ClusterView) over a real LocalCluster, its buttons
pressed as a click would (``Button.click()`` runs the same handlers): pause shows blue ``paused``,
delay shows in the faults column, kill during a background run shows the run's restart, and a
button that fails says why in the view instead of raising."""
import time

import pytest

import flowlab as fl

pytest.importorskip("ipywidgets")
from flowlab.widgets.cluster import ClusterView  # noqa: E402

pytestmark = pytest.mark.process


def sleepy(seconds):
    import time
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(0.02)
    return "slept"


def _row(view, task):
    return view.table.value.split(f"<code>{task}</code>", 1)[1].split("</tr>", 1)[0]


def _wait_for(check, limit, what):
    end = time.monotonic() + limit
    while not check():
        assert time.monotonic() < end, f"waited {limit} s for {what}"
        time.sleep(0.05)


def test_pause_resume_delay_and_schedule_show_in_the_panel(make_cluster):
    cluster = make_cluster(workers=2)
    view = ClusterView(cluster, every=0)
    try:
        w1 = "/job:worker/task:1"
        view.task.value = w1
        view.pause_button.click()
        assert cluster.status(1) == "paused"
        assert "&#9679; paused" in _row(view, w1) and "#1565c0" in _row(view, w1)
        assert "pause /job:worker/task:1" in view.activity.value          # the fault event, newest first
        view.resume_button.click()
        assert cluster.status(1) == "alive" and "done" in view.message.value

        view.delay_ms.value = 150
        view.delay_button.click()
        assert cluster.faults()[w1]["delay_ms"] == 150
        assert "delay 150 ms" in _row(view, w1)

        cluster.schedule_fault(60, "kill", 0)
        view.refresh()
        assert "kill scheduled" in _row(view, "/job:worker/task:0")
        assert "kill /job:worker/task:0 at +60 s" in view.activity.value
        view.clear_button.click()
        assert cluster.faults() == {} and "delay" not in _row(view, w1) and "scheduled" not in view.activity.value
    finally:
        view.close()


def test_kill_from_the_panel_during_a_background_run_shows_its_restart(make_cluster):
    cluster = make_cluster(workers=2)
    view = ClusterView(cluster, every=0.1)     # refreshed by its own thread, as in a notebook
    try:
        run = fl.distribute.run_with_recovery(cluster, sleepy, 2, wait=False)
        _wait_for(lambda: "run_with_recovery(sleepy)" in view.activity.value, 10, "the run in the panel")
        old_pid = cluster.pid(1)
        view.task.value = "/job:worker/task:1"
        view.kill_button.click()
        _wait_for(lambda: "1 restart(s)" in view.activity.value, 30, "the restart in the panel")
        assert f"restart 1: /job:worker/task:1 (pid {old_pid})" in view.activity.value
        assert run.result(timeout=60) == ["slept", "slept"]
        _wait_for(lambda: "fl-run-done" in view.activity.value, 5, "the run shown done")
        assert "kill /job:worker/task:1 (signal=SIGKILL)" in view.activity.value
    finally:
        view.close()


def test_a_failing_button_says_why_in_the_view(make_cluster):
    cluster = make_cluster(workers=2)
    view = ClusterView(cluster, every=0)
    try:
        view.task.value = "/job:worker/task:1"
        view.kill_button.click()
        _wait_for(lambda: cluster.status(1) == "dead", 5, "worker 1 to be seen dead")
        view.pause_button.click()                       # a dead task cannot be paused: no exception here
        assert "Pause /job:worker/task:1 failed: ClusterError" in view.message.value
        assert "not running" in view.message.value
        view.restart_button.click()
        assert cluster.status(1) == "alive" and "restart" in view.message.value
        cluster.close()
        view.refresh()
        assert view.kill_button.disabled and "closed" in view.table.value
    finally:
        view.close()
