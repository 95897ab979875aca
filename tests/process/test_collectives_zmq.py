"""Collectives between real LocalCluster worker processes over the ZeroMQ communicator."""
import threading
import time

import numpy as np
import pytest

import flowlab as fl
from flowlab.cluster.protocol import dumps

pytestmark = pytest.mark.process


def _collectives():
    import numpy as np

    import flowlab as fl
    r, n = fl.cluster.rank(), fl.cluster.world_size()
    x = np.arange(100_003, dtype=np.float64) * (r + 1)       # not a multiple of n: uneven chunks
    out = {"rank": r, "size": n}
    for alg in ("ring", "tree", "naive"):
        out[alg] = fl.cluster.allreduce(x, algorithm=alg)
    out["mean"] = fl.cluster.allreduce(np.array([float(r), 2.0], np.float32), op="mean")
    out["bcast"] = fl.cluster.broadcast(np.full(5, r, np.int64), root=n - 1)
    out["gather"] = fl.cluster.allgather(np.array([r, r], np.int32))
    fl.cluster.barrier()
    return out


@pytest.mark.parametrize("n", [2, 3])
def test_allreduce_across_workers_equals_closed_form(n):
    with fl.cluster.LocalCluster(workers=n) as cluster:
        results = cluster.run(_collectives, timeout=120)
    base = np.arange(100_003, dtype=np.float64)
    total = n * (n + 1) / 2
    for r, out in enumerate(results):
        assert out["rank"] == r and out["size"] == n
        for alg in ("ring", "tree", "naive"):
            np.testing.assert_allclose(out[alg], base * total)
        np.testing.assert_allclose(out["mean"], [(n - 1) / 2, 2.0])
        np.testing.assert_array_equal(out["bcast"], np.full(5, n - 1))
        np.testing.assert_array_equal(out["gather"], np.repeat(np.arange(n), 2))


def _allreduce_or_error(wait):
    import time

    import numpy as np

    import flowlab as fl
    time.sleep(wait)
    try:
        fl.cluster.allreduce(np.ones(10), timeout=60)
        return "finished"
    except fl.cluster.CollectiveError as e:
        return f"{type(e).__name__}: {e}"


def _join():
    import flowlab as fl
    fl.cluster.barrier()


def test_killed_worker_is_named_by_the_others():
    with fl.cluster.LocalCluster(workers=3) as cluster:
        cluster.run(_join, timeout=60)     # every rank has loaded flowlab and joined the group
        client = cluster.client
        code = dumps(_allreduce_or_error)
        waiting = [client.submit(t, "run", None, [code, dumps(((0.0,), {}))]) for t in cluster.workers[:2]]
        client.submit(cluster.workers[2], "run", None, [code, dumps(((600.0,), {}))])
        time.sleep(1.0)
        cluster.kill(2)
        # the survivors must give up well before the collective's own 60 s deadline
        results = client.gather(waiting, timeout=40)
    for r, text in enumerate(results):
        assert text.startswith("PeerLostError"), (r, text)
        assert "rank 2" in text or "ranks 2" in text, text
        assert "/job:worker/task:2" in text, text
