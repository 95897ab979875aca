"""Real workers: interrupting a call that waits on them cancels their work (or says plainly what
still runs and how to end it), a dead worker says how to restart it, and %%px cells have fl, np
and the worker's rank at hand."""
import _thread
import io
import os
import signal
import threading
import time

import pytest

from flowlab.cluster.errors import Interrupted, WorkerBusyError, WorkerDiedError
from flowlab.cluster.magic import px

pytestmark = pytest.mark.process

LONG = 60.0       # what the workers are asked to sleep; an interrupted call must return long before


def interrupt_main_after(seconds):
    """Deliver a real KeyboardInterrupt to the main thread (the notebook's Interrupt button)."""
    timer = threading.Timer(seconds, _thread.interrupt_main)
    timer.start()
    return timer


def sleep_long():
    time.sleep(LONG)
    return "slept"


def sleep_long_rank_1_deaf():
    """Worker 1 sleeps with SIGINT blocked, as code stuck in C that never returns to Python would."""
    from flowlab.cluster.server import rank
    if rank() == 1:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    time.sleep(LONG)


def allreduce_against_a_sleeper():
    """Worker 0 waits in a collective for worker 1, which sleeps: a collective driven from here."""
    import numpy as np

    import flowlab as fl
    if fl.cluster.rank() == 1:
        time.sleep(LONG)
    return fl.cluster.allreduce(np.ones(3, np.float32)).tolist()


def interrupted_run(cluster, fn):
    timer = interrupt_main_after(1.0)
    start = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt) as info:
            cluster.run(fn)
    finally:
        timer.cancel()
    assert time.monotonic() - start < LONG / 2, "the interrupted call waited for the workers' sleep"
    assert isinstance(info.value, Interrupted)
    return info.value


def test_interrupting_run_cancels_the_sleep_on_every_worker(make_cluster):
    cluster = make_cluster(workers=2)
    pids = [cluster.pid(t) for t in cluster.workers]
    err = interrupted_run(cluster, sleep_long)
    assert sorted(err.cancelled) == cluster.workers and err.still_running == []
    assert "cancelled on /job:worker/task:0, /job:worker/task:1" in str(err)
    assert cluster.run(lambda: 1, timeout=20) == [1, 1]     # nothing left running on them
    assert [cluster.pid(t) for t in cluster.workers] == pids  # the same processes: cancelled, not killed
    err = interrupted_run(cluster, sleep_long)                # and again: the workers still take a cancel
    assert err.still_running == []
    assert cluster.run(lambda: 2, timeout=20) == [2, 2]


def test_interrupting_a_collective_driven_from_here_frees_both_workers(make_cluster):
    cluster = make_cluster(workers=2)
    err = interrupted_run(cluster, allreduce_against_a_sleeper)
    assert sorted(err.cancelled) == cluster.workers
    assert cluster.run(lambda: 1, timeout=20) == [1, 1]


def test_a_worker_that_does_not_stop_is_named_with_how_to_end_it(make_cluster):
    cluster = make_cluster(workers=2)
    err = interrupted_run(cluster, sleep_long_rank_1_deaf)
    assert err.cancelled == ["/job:worker/task:0"] and err.still_running == ["/job:worker/task:1"]
    assert "STILL RUNNING" in str(err) and "cluster.restart(1)" in str(err)
    with pytest.raises(WorkerBusyError) as busy:      # never a silent wait behind the old call
        cluster.run(lambda: 1, timeout=20)
    assert busy.value.task == "/job:worker/task:1" and "cluster.restart(1)" in str(busy.value)
    assert cluster.call(0, lambda: "free", timeout=20) == "free"   # the other worker is not held up
    cluster.restart(1)
    assert cluster.run(lambda: 1, timeout=20) == [1, 1]


def test_a_dead_worker_says_how_it_died_and_how_to_restart_it(make_cluster):
    cluster = make_cluster(workers=2)
    cluster.kill(1)
    deadline = time.monotonic() + 10
    while cluster.status(1) != "dead" and time.monotonic() < deadline:
        time.sleep(0.05)
    with pytest.raises(WorkerDiedError) as info:
        cluster.run(lambda: 1, timeout=20)
    text = str(info.value)
    assert "/job:worker/task:1" in text and "killed by signal 9 (SIGKILL)" in text and "cluster.restart(1)" in text
    assert info.value.restart == "cluster.restart(1)"
    line = next(ln for ln in repr(cluster).splitlines() if "/job:worker/task:1" in ln)
    assert "dead" in line and "SIGKILL" in line and "cluster.restart(1)" in line
    cluster.restart(1)
    assert cluster.status(1) == "alive" and cluster.run(lambda: 1, timeout=20) == [1, 1]

    with pytest.raises(WorkerDiedError) as info:      # an exit code, on another worker
        cluster.call(0, os._exit, 3, timeout=20)
    assert "exit code 3" in str(info.value) and "cluster.restart(0)" in str(info.value)


def test_px_cells_have_fl_np_and_the_rank_at_hand(make_cluster):
    make_cluster(workers=2)
    out = io.StringIO()
    px("", "print(rank, world_size, size, fl.__name__, np.__name__)\nfl.constant(np.arange(3)).numpy().sum() + rank", out=out)
    assert out.getvalue() == ("[worker 0]\n0 2 2 flowlab numpy\nnp.int64(3)\n"
                              "[worker 1]\n1 2 2 flowlab numpy\nnp.int64(4)\n")


def test_a_task_the_cluster_lacks_gets_a_did_you_mean(make_cluster):
    import flowlab as fl
    from flowlab.core.device import RemoteDeviceError

    make_cluster(workers=2)
    with pytest.raises(RemoteDeviceError) as info:
        with fl.device("/job:worker/task:5"):
            fl.constant([1.0]) + 1.0
    text = str(info.value)
    assert "/job:worker/task:5" in text and "'/job:worker/task:0', '/job:worker/task:1'" in text
    assert "did you mean '/job:worker/task:1'?" in text
    with pytest.raises(RemoteDeviceError, match=r"/job:wroker/task:0.*did you mean '/job:worker/task:0'\?"):
        with fl.device("/job:wroker/task:0"):
            fl.constant([1.0]) + 1.0
    with fl.device("/job:worker/task:1"):
        assert (fl.constant([1.0]) + 1.0).numpy().tolist() == [2.0]
