"""Growing a running LocalCluster with ``add_worker`` (issue 14, item 4), on real workers.

A new worker gets the cluster's key and the new ClusterSpec goes to every task; the next collective
forms a new group of N+1 ranks. The new task is a task like the others (run, status, logs, kill,
restart, pause, close), a task paused during the add catches up on resume, a collective running
during the add is given up with an error saying the group changed, and close leaves nothing.
"""
import os
import threading
import time

import pytest

from flowlab.cluster.collectives import shm
from flowlab.cluster.collectives.errors import CollectiveError
from flowlab.cluster.errors import ClusterError

pytestmark = pytest.mark.process

NATIVE = shm.unavailable() is None


def _sum(step, algorithm="ring"):
    """Every worker's ``rank + step``, summed over the group, and the group's size as seen here."""
    import numpy as np

    import flowlab.cluster as cl
    out = cl.allreduce(np.full(4096, float(cl.rank() + step), np.float32), algorithm=algorithm, timeout=10.0)
    assert float(out.min()) == float(out.max())
    return float(out[0]), cl.world_size()


def _rank_and_size():
    import flowlab.cluster as cl
    return cl.rank(), cl.world_size()


def _expected(n, step):
    return [(float(sum(range(n)) + n * step), n)] * n


def _leftovers(pids, addresses):
    """What these workers could leave behind: lane sockets of their addresses, their /dev/shm segments."""
    from flowlab.cluster import unix
    from flowlab.cluster.leftovers import SHM_DIR
    lanes = []
    for a in addresses:
        host, _, port = a.rpartition(":")
        path = unix.lane_path(host, int(port))
        if path and os.path.exists(path):
            lanes.append(path)
    try:
        names = os.listdir(SHM_DIR)
    except OSError:
        names = []
    segments = [n for n in names for p in pids if n.startswith(f"flowlab-{p}-")]
    return lanes, segments


def test_an_added_worker_joins_the_collectives_and_is_a_task_like_the_others(make_cluster):
    from _processes import wait_gone

    c = make_cluster(workers=2)
    assert c.run(_sum, 0, timeout=30) == _expected(2, 0)
    name = c.add_worker()
    assert name == "/job:worker/task:2"
    assert c.workers == ["/job:worker/task:0", "/job:worker/task:1", "/job:worker/task:2"]
    assert len(c.spec.as_dict()["worker"]) == 3
    snap = {t["task"]: t for t in c.snapshot()["tasks"]}
    assert snap[name]["status"] == "alive" and snap[name]["pid"] == c.pid(2) and snap[name]["address"]
    assert c.status(2) == "alive" and "listening" in c.logs(2)

    # a new group of three, with each algorithm
    assert c.run(_sum, 1, timeout=30) == _expected(3, 1)
    assert c.run(_sum, 2, "tree", timeout=30) == _expected(3, 2)
    if NATIVE:
        assert c.run(_sum, 3, "native", timeout=30) == _expected(3, 3)
    assert c.call(2, _rank_and_size, timeout=10) == (2, 3)

    # the new task can be killed and restarted like the first ones
    first_pid = c.pid(2)
    c.kill(2)
    deadline = time.monotonic() + 10
    while c.status(2) != "dead" and time.monotonic() < deadline:
        time.sleep(0.02)
    assert c.status(2) == "dead"
    c.restart(2)
    assert c.pid(2) != first_pid
    assert c.run(_sum, 4, timeout=30) == _expected(3, 4)

    # a second one: ranks keep counting
    assert c.add_worker() == "/job:worker/task:3"
    assert c.run(_sum, 0, timeout=30) == _expected(4, 0)
    if NATIVE:
        assert c.run(_sum, 1, "native", timeout=30) == _expected(4, 1)

    # close: no process, folder, lane socket or shared-memory segment of any of them is left
    pids = [c.pid(t) for t in c.tasks] + [first_pid]
    addresses = [a for a in c.spec.as_dict()["worker"] if a]
    folder = c._res.tmpdir
    c.close()
    assert wait_gone(pids, 10) == []
    assert not os.path.exists(folder)
    assert _leftovers(pids, addresses) == ([], [])
    with pytest.raises(ClusterError, match="closed"):
        c.add_worker()


def test_a_worker_paused_during_the_add_catches_up_when_resumed(make_cluster):
    c = make_cluster(workers=2)
    assert c.run(_sum, 0, timeout=30) == _expected(2, 0)
    c.pause(1)
    assert c.add_worker() == "/job:worker/task:2"
    assert c.status(1) == "paused"
    c.resume(1)
    assert c.call(1, _rank_and_size, timeout=10) == (1, 3)
    assert c.run(_sum, 1, timeout=30) == _expected(3, 1)
    # and the new worker can be paused and resumed in turn
    c.pause(2)
    assert c.status(2) == "paused"
    c.resume(2)
    assert c.run(_sum, 2, timeout=30) == _expected(3, 2)


def _late_allreduce(folder):
    """Rank 0 enters an allreduce at once (and says so with a file); the others only once the test
    has added a worker (a file says that)."""
    import os
    import time

    import numpy as np

    import flowlab.cluster as cl
    if cl.rank() == 0:
        open(os.path.join(folder, "entered"), "w").close()
    else:
        end = time.monotonic() + 30
        while not os.path.exists(os.path.join(folder, "added")) and time.monotonic() < end:
            time.sleep(0.01)
    return float(cl.allreduce(np.ones(8), timeout=20.0)[0])


def test_a_collective_running_during_the_add_is_given_up_saying_the_group_changed(make_cluster, tmp_path):
    c = make_cluster(workers=2)
    assert c.run(_sum, 0, timeout=30) == _expected(2, 0)
    got = []

    def call():
        try:
            got.append(c.run(_late_allreduce, str(tmp_path), timeout=30))
        except Exception as e:  # noqa: BLE001 - looked at below
            got.append(e)

    th = threading.Thread(target=call, daemon=True)
    th.start()
    end = time.monotonic() + 30
    while not (tmp_path / "entered").exists() and time.monotonic() < end:
        time.sleep(0.01)
    time.sleep(0.1)             # rank 0 is inside its allreduce, waiting for rank 1
    t0 = time.monotonic()
    c.add_worker()
    (tmp_path / "added").touch()
    th.join(40)
    assert not th.is_alive()
    err = got[0]
    assert isinstance(err, CollectiveError), repr(err)
    assert "the group changed" in str(err) and "3 worker tasks" in str(err), str(err)
    assert time.monotonic() - t0 < 15, "it waited for the collective's deadline instead of failing at once"
    # the next call runs on the new group
    assert c.run(_sum, 1, timeout=30) == _expected(3, 1)


def test_a_worker_that_cannot_start_in_time_is_not_added(make_cluster):
    c = make_cluster(workers=2)
    from _processes import wait_gone

    with pytest.raises(ClusterError, match=r"could not add /job:worker/task:2.*did not start"):
        c.add_worker(timeout=0.001)
    pid = c._res.monitor.state("/job:worker/task:2").pid
    assert pid and wait_gone([pid], 10) == [], "the worker that was not added still runs"
    assert c.workers == ["/job:worker/task:0", "/job:worker/task:1"]
    assert c.run(_sum, 0, timeout=30) == _expected(2, 0)
    assert c.add_worker() == "/job:worker/task:2"
    assert c.run(_sum, 1, timeout=30) == _expected(3, 1)


def _keep_a_strategy():
    import numpy as np

    import flowlab as fl
    strategy = fl.distribute.MultiWorkerMirroredStrategy()
    _KEPT["strategy"] = strategy
    return strategy.num_replicas_in_sync, float(fl.cluster.allreduce(np.ones(2), timeout=10.0)[0])


def _use_the_kept_strategy():
    import flowlab as fl
    strategy = _KEPT["strategy"]
    try:
        strategy.reduce("SUM", strategy.run(lambda: fl.constant([1.0])), axis=None)
    except fl.cluster.CollectiveError as e:
        return str(e)
    return "it ran"


def _new_strategy():
    import flowlab as fl
    strategy = fl.distribute.MultiWorkerMirroredStrategy()
    return strategy.num_replicas_in_sync, strategy.cluster_resolver.cluster_spec().num_tasks("worker")


_KEPT = {}      # in a worker's copy of this module: what one call leaves for the next


def test_a_strategy_made_before_keeps_the_old_group_and_a_new_one_sees_the_new_worker(make_cluster):
    c = make_cluster(workers=2)
    assert c.run(_keep_a_strategy, timeout=60) == [(2, 2.0)] * 2
    c.add_worker()
    said = c.call(0, _use_the_kept_strategy, timeout=30)
    assert "the group changed" in said and "make a new one" in said, said
    assert c.run(_new_strategy, timeout=60) == [(3, 3)] * 3
