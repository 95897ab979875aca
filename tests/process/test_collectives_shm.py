"""Collectives between LocalCluster worker processes over shared memory: the channel each pair
negotiated, large tensors through the small rings, and peers that are SIGKILLed or SIGSTOPped
while the others wait (a named error, never a hang; nothing left in /dev/shm)."""
import os
import signal
import time

import pytest

import flowlab as fl
from flowlab.cluster.collectives import shm
from flowlab.cluster.protocol import dumps

pytestmark = [pytest.mark.process,
              pytest.mark.skipif(shm.unavailable() is not None, reason=str(shm.unavailable()))]


def _left_by(pids):
    return sorted(f for f in os.listdir(shm.SHM_DIR) for p in pids if f.startswith(f"flowlab-{p}-"))


def _big_collectives():
    import numpy as np

    import flowlab as fl
    from flowlab.cluster.collectives.zmq import for_server
    from flowlab.cluster.server import current_server

    comm = for_server(current_server())
    r, n = fl.cluster.rank(), fl.cluster.world_size()
    x = np.arange((9 << 20) // 8 + 3, dtype=np.float64) * (r + 1)      # 9 MiB: more than a ring holds
    out = {"channels": list(comm.channels), "pid": os.getpid()}
    for alg in ("ring", "tree", "naive"):
        got = fl.cluster.allreduce(x, algorithm=alg)
        out[alg] = bool(np.array_equal(got, np.arange(x.size, dtype=np.float64) * (n * (n + 1) / 2)))
    out["gather"] = fl.cluster.allgather(np.full((2, 3), r, np.int16)).tolist()
    out["bcast"] = fl.cluster.broadcast(np.arange(5, dtype=np.float32) * r, root=1).tolist()
    return out


@pytest.mark.parametrize("n", [2, 3])
def test_same_host_workers_talk_through_shared_memory(n):
    with fl.cluster.LocalCluster(workers=n) as cluster:
        results = cluster.run(_big_collectives, timeout=180)
        pids = [r["pid"] for r in results]
        assert _left_by(pids) == []               # names dropped as soon as both ends mapped them
    for r, out in enumerate(results):
        assert out["channels"] == [None if p == r else "shm" for p in range(n)]
        assert out["ring"] and out["tree"] and out["naive"], out
        assert out["gather"] == [[p] * 3 for p in range(n) for _ in range(2)]
        assert out["bcast"] == [float(i) for i in range(5)]
    assert _left_by(pids) == []


def _mixed(hosts):
    import numpy as np

    import flowlab as fl
    from flowlab.cluster.collectives.zmq import ZmqCommunicator
    from flowlab.cluster.server import current_server

    r = fl.cluster.rank()
    comm = ZmqCommunicator(current_server(), host=hosts[r])
    try:
        x = np.arange(300_001, dtype=np.float32) + r
        got = {alg: fl.cluster.allreduce(x, algorithm=alg, comm=comm) for alg in ("ring", "tree", "naive")}
        fl.cluster.barrier(comm=comm)
        return list(comm.channels), {k: v.tolist()[:3] + v.tolist()[-1:] for k, v in got.items()}
    finally:
        comm.close()


def test_ranks_on_two_pretend_hosts_mix_shared_memory_and_zeromq():
    hosts = ["a", "b", "a", "b"]
    with fl.cluster.LocalCluster(workers=4) as cluster:
        results = cluster.run(_mixed, hosts, timeout=180)
    want = [sum(i + r for r in range(4)) for i in (0, 1, 2, 300_000)]
    for r, (channels, got) in enumerate(results):
        assert channels == [None if p == r else "shm" if hosts[p] == hosts[r] else "zmq" for p in range(4)]
        for alg, values in got.items():
            assert values == want, (r, alg, values)


def _join():
    import os

    import flowlab as fl
    fl.cluster.barrier()
    return os.getpid()


def _allreduce_or_error(wait, how):
    import time

    import numpy as np

    import flowlab as fl
    time.sleep(wait)
    try:
        if how == "big ring":     # 16 MiB: the rings fill up
            fl.cluster.allreduce(np.ones(4 << 20, np.float32), timeout=60)
        else:                     # 4 KiB, native: the waiters spin on the channels' boxes, not on messages
            fl.cluster.allreduce(np.ones(1024, np.float32), algorithm="native", timeout=60)
        return "finished"
    except fl.cluster.CollectiveError as e:
        return f"{type(e).__name__}: {e}"


@pytest.mark.parametrize("how", ["big ring", "small native"])
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSTOP], ids=["SIGKILL", "SIGSTOP"])
def test_a_killed_or_frozen_peer_is_named_and_nothing_is_left(sig, how):
    cluster = fl.cluster.LocalCluster(workers=3)
    try:
        pids = cluster.run(_join, timeout=60)
        client = cluster.client
        code = dumps(_allreduce_or_error)
        waiting = [client.submit(t, "run", None, [code, dumps(((0.0, how), {}))]) for t in cluster.workers[:2]]
        client.submit(cluster.workers[2], "run", None, [code, dumps(((600.0, how), {}))])
        time.sleep(1.0)
        start = time.monotonic()
        cluster.kill(2, sig)
        results = client.gather(waiting, timeout=40)      # well before the collective's 60 s deadline
        took = time.monotonic() - start
        for r, text in enumerate(results):
            assert text.startswith("PeerLostError"), (r, text)
            assert ("rank 2 " in text or "ranks 2" in text) and "/job:worker/task:2" in text, text
            assert ("exited" if sig == signal.SIGKILL else "stopped answering") in text, text
        assert took < 30, took
        if sig == signal.SIGSTOP:
            cluster.kill(2, signal.SIGCONT)
    finally:
        cluster.close()
    assert _left_by(pids) == []
