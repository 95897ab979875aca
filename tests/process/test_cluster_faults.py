"""Fault injection on a real LocalCluster (pause/resume, delay, drop, corrupt, a schedule) and the
root-cause table that a failed call's error ends with. Every cluster comes from ``make_cluster``,
which closes it and checks its processes are gone even when a test fails."""
import time

import pytest

from flowlab.cluster.errors import ClusterTimeoutError, WorkerDiedError, WorkerPausedError

pytestmark = pytest.mark.process

W0, W1 = "/job:worker/task:0", "/job:worker/task:1"


def _rank():
    import flowlab.cluster as c
    return c.rank()


def _wait_for(cond, limit=10.0):
    end = time.monotonic() + limit
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.02)
    return cond()


def _ping_seconds(c, task, timeout=10.0):
    t0 = time.perf_counter()
    c.client.request(task, "ping", {"x": 1}, timeout=timeout)
    return time.perf_counter() - t0


def test_pause_shows_paused_fails_naming_it_and_resume_answers(make_cluster):
    c = make_cluster(workers=2, unresponsive_after=0.5)
    c.pause(1)
    assert c.status(1) == "paused"
    time.sleep(1.2)   # well past unresponsive_after: still paused, never unresponsive or dead
    assert c.status(1) == "paused"
    assert c.snapshot()["tasks"][1]["status"] == "paused"
    t0 = time.monotonic()
    with pytest.raises(WorkerPausedError) as info:
        c.run(_rank, timeout=20)
    assert time.monotonic() - t0 < 10, "a paused task must fail the call at once, not at its deadline"
    text = str(info.value)
    assert W1 in text and "paused" in text and "cluster.resume(1)" in text
    assert "root cause (first failure first):" in text
    first_row = text.split("root cause (first failure first):")[1].splitlines()[2]
    assert W1 in first_row and "paused" in first_row and "SIGSTOP" in first_row and "run _rank" in first_row
    c.resume(1)
    assert c.status(1) == "alive"
    assert c.run(_rank, timeout=20) == [0, 1]
    time.sleep(1.0)
    assert c.status(1) == "alive"


def test_delay_makes_every_message_wait(make_cluster):
    c = make_cluster(workers=1)
    _ping_seconds(c, W0)
    state = c.delay(0, 300)
    assert state["delay_ms"] == 300
    assert c.faults()[W0]["delay_ms"] == 300
    assert all(_ping_seconds(c, W0) >= 0.3 for _ in range(3))
    c.delay(0, 0)
    assert W0 not in c.faults()
    assert _ping_seconds(c, W0) < 0.3   # generous: it did not wait for the 300 ms any more


def test_drop_everything_times_out_clearly_and_clear_faults_restores(make_cluster):
    c = make_cluster(workers=2)
    c.drop(1, 1.0, seed=7)
    with pytest.raises(ClusterTimeoutError) as info:
        c.call(1, _rank, timeout=1.5)
    text = str(info.value)
    assert f"{W1}" in text and "did not answer" in text and "root cause" in text
    assert c.call(0, _rank, timeout=10) == 0     # the other task is untouched
    c.clear_faults()
    assert c.faults() == {}
    assert c.call(1, _rank, timeout=10) == 1
    stats = c.client.request(W1, "stats", {}).body
    assert stats["faults"] is None


def test_corrupt_is_caught_by_the_signature_check(make_cluster):
    c = make_cluster(workers=1)
    before = c.client.request(W0, "stats", {}).body["dropped"]
    c.corrupt(0, 1.0, seed=3)
    with pytest.raises(ClusterTimeoutError) as info:
        c.client.request(W0, "ping", {}, timeout=1.0)
    assert W0 in str(info.value)
    c.clear_faults()
    stats = c.client.request(W0, "stats", {}).body
    assert stats["dropped"] >= before + 1, stats     # rejected by the receiver's own verification
    drops = [e for e in c.events() if e.kind == "drop" and e.task == W0]
    assert drops and "signature" in drops[-1].attrs["reason"]
    assert _ping_seconds(c, W0) < 5


def test_corrupted_replies_are_dropped_by_the_client(make_cluster):
    c = make_cluster(workers=1)
    # half of what the task receives or sends is corrupted, chosen by the seed: some pings are lost
    c.corrupt(0, 0.5, seed=11)
    lost = 0
    for _ in range(8):
        try:
            c.client.request(W0, "ping", {}, timeout=0.5)
        except ClusterTimeoutError:
            lost += 1
    c.clear_faults()
    assert 0 < lost < 8
    assert c.client.dropped + c.client.request(W0, "stats", {}).body["dropped"] >= lost


def test_scheduled_kill_happens_and_the_log_holds_the_faults(make_cluster):
    c = make_cluster(workers=2)
    c.delay(0, 1)
    handle = c.schedule_fault(0.3, "kill", 1)
    assert c.faults()["scheduled"] == [(0.3, "kill", W1)]
    assert handle.wait(10) and handle.error is None
    assert _wait_for(lambda: c.status(1) == "dead")
    faults = [e for e in c.events() if e.kind == "fault"]
    names = [(e.name, e.task) for e in faults]
    assert ("kill", W1) in names and ("set", W0) in names and ("inject", W0) in names, names
    kill = next(e for e in faults if e.name == "kill")
    assert kill.attrs["signal"] == "SIGKILL"


def test_clear_faults_cancels_what_is_scheduled(make_cluster):
    c = make_cluster(workers=1)
    handle = c.schedule_fault(1.0, "kill", 0)
    c.clear_faults()
    assert handle.done
    time.sleep(1.3)
    assert c.status(0) == "alive"


def _talk_then_wait(marker):
    import sys
    import time as t

    import flowlab.cluster as cl
    print(f"{marker} from rank {cl.rank()}", flush=True)
    print("about to wait", file=sys.stderr, flush=True)
    t.sleep(30)


def test_root_cause_table_names_the_dead_task_signal_and_log(make_cluster):
    c = make_cluster(workers=2)
    c.schedule_fault(1.0, "kill", 1)
    t0 = time.monotonic()
    with pytest.raises(WorkerDiedError) as info:
        c.run(_talk_then_wait, "hello-root-cause", timeout=25)
    assert time.monotonic() - t0 < 15
    text = str(info.value)
    table = text.split("root cause (first failure first):", 1)[1]
    rows = table.splitlines()
    assert rows[1].split()[:6] == ["#", "task", "pid", "state", "exit", "/"]
    assert rows[2].split()[1:4] == [W1, str(c.pid(1)), "dead"] and "SIGKILL" in rows[2]
    assert "run _talk_then_wait" in rows[2]
    assert W0 in rows[3] and ("cancelled" in rows[3] or "finished" in rows[3])
    assert f"last lines of {W1}'s log:" in table
    assert "| hello-root-cause from rank 1" in table
    assert text.count("hello-root-cause from rank 1") == 1    # the log shown once, in the table
    assert info.value.root_cause[0]["task"] == W1


def _timed_allreduce():
    import time as t

    import numpy as np

    import flowlab.cluster as cl
    x = np.ones(1000, dtype=np.float32)
    t0 = t.perf_counter()
    out = cl.allreduce(x, timeout=20)
    return float(out[0]), t.perf_counter() - t0


def test_faults_reach_traffic_between_workers(make_cluster):
    import numpy as np

    from flowlab.cluster.errors import RemoteError

    # without shared memory the collectives travel as messages between the workers' servers
    c = make_cluster(workers=2, env={"FLOWLAB_SHM": "0"})
    assert [r[0] for r in c.run(_timed_allreduce, timeout=30)] == [2.0, 2.0]   # the group forms
    c.delay(1, 250)
    results = c.run(_timed_allreduce, timeout=30)
    assert [r[0] for r in results] == [2.0, 2.0]
    assert max(r[1] for r in results) >= 0.25, results
    c.clear_faults()

    c.client.request(W0, "put", {"key": "v"}, [np.arange(4.0)])
    c.drop(1, 1.0, seed=1)
    with pytest.raises(RemoteError) as info:     # worker 0's push to worker 1 is lost on the way
        c.client.request(W0, "push", {"key": "v", "to": W1, "timeout": 1.0}, timeout=20)
    assert W1 in str(info.value) and "did not answer" in str(info.value)
    c.clear_faults()
    c.client.request(W0, "push", {"key": "v", "to": W1, "timeout": 10.0}, timeout=20)
    assert list(np.frombuffer(c.client.request(W1, "get", {"key": "v"}).buffers[0], dtype=np.float64)) == [0, 1, 2, 3]
