"""Two things the soak test (tests/process/test_soak.py) found about restarts, on a real cluster:

- a worker that was paused while another worker was restarted missed the regroup and the new
  spec: once resumed, each of its collectives failed with ``PeerLostError`` naming the old, dead
  process, for good. Now it catches up when it is resumed, and the group forms again;
- a call to a task while ``cluster.restart`` of it is under way said ``this client is not
  connected to ...``; it now says the task is being restarted.
"""
import threading
import time

import pytest

from flowlab.cluster.errors import ClusterError

pytestmark = pytest.mark.process


def _sum_of_ranks_plus(step):
    import numpy as np

    import flowlab.cluster as cl
    out = cl.allreduce(np.full(16, float(cl.rank() + step)), timeout=5.0)
    return float(out[0])


def _rank():
    import flowlab.cluster as cl
    return cl.rank()


def test_a_worker_paused_during_a_restart_rejoins_when_resumed(make_cluster):
    c = make_cluster(workers=3, unresponsive_after=1.0)
    assert c.run(_sum_of_ranks_plus, 0, timeout=20) == [3.0] * 3
    c.pause(2)
    c.kill(1)
    time.sleep(0.3)
    c.restart(1)
    c.resume(2)
    assert c.run(_sum_of_ranks_plus, 1, timeout=20) == [6.0] * 3
    assert c.run(_sum_of_ranks_plus, 2, timeout=20) == [9.0] * 3


def test_a_call_during_a_restart_says_the_task_is_being_restarted(make_cluster):
    c = make_cluster(workers=2)
    done = threading.Event()
    failed = []

    def restart():
        try:
            c.restart(1)
        except BaseException as e:   # noqa: BLE001 - reported below
            failed.append(e)
        finally:
            done.set()

    threading.Thread(target=restart, daemon=True).start()
    heard = []
    end = time.monotonic() + 30
    while not done.is_set() and time.monotonic() < end:
        try:
            c.call(1, _rank, timeout=5)
        except ClusterError as e:
            heard.append(str(e).splitlines()[0])
        time.sleep(0.005)
    assert done.is_set() and not failed, failed
    assert heard, "no call fell inside the restart"
    assert not [h for h in heard if "not connected" in h], heard
    assert any("/job:worker/task:1" in h and "is being restarted" in h and "cluster.restart(1)" in h
               for h in heard), heard
    assert c.call(1, _rank, timeout=10) == 1
