"""Real workers: when one worker of a call fails (raises, dies, or the call's deadline passes), the
others' work is cancelled at once, the error names the worker that failed first and what became
of the others, and the workers' collectives stay usable for the next call (or, after a death,
for the call after ``cluster.restart(i)``)."""
import os
import time

import numpy as np
import pytest

import flowlab as fl
from flowlab.cluster.errors import ClusterTimeoutError, RemoteError, WorkerDiedError

pytestmark = pytest.mark.process

LONG = 60.0       # what a worker is asked to sleep or wait; a failed call must return long before


def rank_1_raises_rank_0_sleeps():
    if fl.cluster.rank() == 1:
        raise ValueError("rank 1 found a bad batch")
    time.sleep(LONG)
    return "slept"


def last_rank_raises_before_an_allreduce_the_others_entered(algorithm="ring"):
    """As a training step whose last worker fails before its gradients are reduced."""
    if fl.cluster.rank() == fl.cluster.world_size() - 1:
        raise ValueError("no gradients on the last rank")
    return fl.cluster.allreduce(np.ones(3, np.float32), algorithm=algorithm, timeout=LONG).tolist()


def ranked_sum(algorithm="ring", n=3):
    """Each rank contributes rank + 1: the sum over w workers is w * (w + 1) / 2 everywhere."""
    x = np.full(n, fl.cluster.rank() + 1, np.float32)
    return fl.cluster.allreduce(x, algorithm=algorithm, timeout=30).tolist()


def rank_1_dies_rank_0_sleeps():
    if fl.cluster.rank() == 1:
        os._exit(7)
    time.sleep(LONG)


def rank_1_dies_rank_0_reduces():
    if fl.cluster.rank() == 1:
        os._exit(5)
    return ranked_sum()


def failing_call(cluster, fn, expected, **kw):
    start = time.monotonic()
    with pytest.raises(expected) as info:
        cluster.run(fn, **kw)
    assert time.monotonic() - start < LONG / 2, "the failed call waited for the other workers' work"
    return info.value


def test_a_raise_on_one_worker_cancels_the_sleep_on_the_other(make_cluster):
    cluster = make_cluster(workers=2)
    pids = [cluster.pid(t) for t in cluster.workers]
    err = failing_call(cluster, rank_1_raises_rank_0_sleeps, ValueError)
    text = str(err)
    assert isinstance(err, RemoteError) and err.task == "/job:worker/task:1"
    assert text.startswith("/job:worker/task:1") and "ValueError: rank 1 found a bad batch" in text
    assert "/job:worker/task:1 failed first" in text
    assert "cancelled on /job:worker/task:0: free for the next call" in text
    assert err.cancelled == ["/job:worker/task:0"] and err.still_running == []
    assert cluster.run(lambda: 1, timeout=20) == [1, 1]          # nothing left running behind the error
    assert [cluster.pid(t) for t in cluster.workers] == pids      # cancelled, not killed


@pytest.mark.parametrize("algorithm", ["ring", "native"])
def test_a_raise_before_an_allreduce_frees_the_ranks_waiting_in_it_and_the_next_one_sums(make_cluster, algorithm):
    cluster = make_cluster(workers=3)
    assert cluster.run(ranked_sum, algorithm) == [[6.0] * 3] * 3     # the group is formed, counts at 1
    err = failing_call(cluster, last_rank_raises_before_an_allreduce_the_others_entered, ValueError,
                       algorithm=algorithm)
    assert err.task == "/job:worker/task:2" and "no gradients on the last rank" in str(err)
    assert err.still_running == [] and "/job:worker/task:0" in str(err) and "/job:worker/task:1" in str(err), str(err)
    # ranks 0 and 1 had entered allreduce #2, rank 2 never did: the counts were put back in step
    assert cluster.run(ranked_sum, algorithm, timeout=40) == [[6.0] * 3] * 3
    big = cluster.run(ranked_sum, algorithm, 1 << 17, timeout=40)    # past the one-shot size: the windows
    assert all(r == [6.0] * (1 << 17) for r in big)
    assert cluster.run(ranked_sum, "tree", timeout=40) == [[6.0] * 3] * 3


def test_a_raise_before_the_first_allreduce_leaves_the_group_formable(make_cluster):
    cluster = make_cluster(workers=2)       # rank 0 is stopped while it forms the group (rank 1 never comes)
    err = failing_call(cluster, last_rank_raises_before_an_allreduce_the_others_entered, ValueError)
    assert err.cancelled == ["/job:worker/task:0"]
    assert cluster.run(ranked_sum, timeout=40) == [[3.0] * 3] * 2


def test_a_worker_that_dies_is_named_first_and_the_sleeper_is_cancelled(make_cluster):
    cluster = make_cluster(workers=2)
    err = failing_call(cluster, rank_1_dies_rank_0_sleeps, WorkerDiedError)
    text = str(err)
    assert err.task == "/job:worker/task:1" and "exit code 7" in text and "cluster.restart(1)" in text
    assert "cancelled on /job:worker/task:0" in text and err.cancelled == ["/job:worker/task:0"]
    assert cluster.call(0, lambda: "free", timeout=20) == "free"
    cluster.restart(1)
    assert cluster.run(lambda: 1, timeout=20) == [1, 1]


def test_a_death_inside_an_allreduce_names_the_dead_worker_not_its_peer_and_restart_heals_the_group(make_cluster):
    cluster = make_cluster(workers=2)
    assert cluster.run(ranked_sum) == [[3.0] * 3] * 2
    err = failing_call(cluster, rank_1_dies_rank_0_reduces, WorkerDiedError)
    text = str(err)
    # rank 0's allreduce fails too (PeerLostError), but the cause named first is rank 1's death
    assert err.task == "/job:worker/task:1" and "exit code 5" in text and "cluster.restart(1)" in text
    assert "/job:worker/task:0" in text
    cluster.restart(1)      # the same port: the survivor must not keep its group with the dead process
    assert cluster.run(ranked_sum, timeout=40) == [[3.0] * 3] * 2
    assert cluster.run(ranked_sum, "native", timeout=40) == [[3.0] * 3] * 2


def test_a_call_past_its_deadline_cancels_the_work_it_waited_for(make_cluster):
    cluster = make_cluster(workers=2)
    start = time.monotonic()
    with pytest.raises(ClusterTimeoutError) as info:
        cluster.run(time.sleep, LONG, timeout=1.0)
    assert time.monotonic() - start < LONG / 2
    err = info.value
    assert "did not answer" in str(err) and sorted(err.cancelled) == cluster.workers
    assert cluster.run(lambda: 1, timeout=20) == [1, 1]


def rank_1_sleeps_before_an_allreduce():
    if fl.cluster.rank() == 1:
        time.sleep(LONG)
    return ranked_sum()


def test_interrupting_a_collective_puts_the_counts_back_in_step(make_cluster):
    """The notebook's Interrupt button while rank 0 waits in an allreduce that rank 1 has not reached:
    both are cancelled, and the next allreduce on both gives the right sum (not a mismatch)."""
    import _thread
    import threading

    from flowlab.cluster.errors import Interrupted

    cluster = make_cluster(workers=2)
    assert cluster.run(ranked_sum) == [[3.0] * 3] * 2
    timer = threading.Timer(1.0, _thread.interrupt_main)
    timer.start()
    try:
        with pytest.raises(Interrupted) as info:
            cluster.run(rank_1_sleeps_before_an_allreduce)
    finally:
        timer.cancel()
    assert sorted(info.value.cancelled) == cluster.workers
    assert cluster.run(ranked_sum, timeout=40) == [[3.0] * 3] * 2
