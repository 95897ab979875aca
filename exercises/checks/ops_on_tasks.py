"""07 · A local cluster: put ops on the tasks of a cluster.

The answer is ``spread(cluster, blocks)``: ``blocks`` are the row blocks of a tall float32 matrix X
(each ``(rows_i, d)``, the same ``d``); it returns ``X^T X``, the ``(d, d)`` sum of every block's
``B^T B``, as a numpy array. Block ``i``'s product runs on worker ``i % n`` of the cluster
(round-robin over its ``n`` workers), the products are added up on a worker, and the notebook
fetches only the sum.

The check starts a ``LocalCluster`` of 2 or 3 real worker processes for each case (closed when the
case ends, also when the answer raises or hangs), clears its event log, runs the answer, and reads:

- the value, against numpy's ``X.T @ X`` in float64;
- where the products ran: the ``matmul`` events each task recorded in the cluster's event log
  (``cluster.events()``), so an answer that computes on the notebook's side shows "ran no ops";
- how many values the notebook fetched: the ``send`` events to the peer ``client``. Only the sum
  should come back; an answer that fetches every product and adds them in numpy fetches more."""
import threading

import numpy as np

from flowlab.cluster import LocalCluster
from flowlab.grading import Case

POINTS = 2
HINTS = [
    "An op runs where the innermost fl.device scope says. Use the names in cluster.workers: block i goes "
    "to cluster.workers[i % len(cluster.workers)], and the op must be a flowlab op (fl.matmul), not numpy's @.",
    "Inside `with fl.device(cluster.workers[i % n]):` write `fl.matmul(block, block, transpose_a=True)`: the "
    "product stays on that worker as a handle. Keep the handles in a list; don't call .numpy() on them.",
    "Add the handles up on worker 0 (`with fl.device(cluster.workers[0]): total = fl.add_n(products)`: worker 0 "
    "pulls the others' products itself) and return total.numpy(), the one value the notebook fetches.",
]
TOLERANCE = {"rtol": 1e-4, "atol": 1e-4}
TIME_LIMIT = 30.0          # per case: starting 2-3 worker processes on a loaded machine takes a few seconds
WATCHDOG_S = 20.0          # an answer still running then has its cluster closed, so its calls fail at once


def _blocks(rows, d, seed):
    rng = np.random.default_rng(seed)
    return [rng.normal(0.0, 1.0, (r, d)).astype(np.float32) for r in rows]


def _matmuls(k):
    return f"{k} matmul" + ("" if k == 1 else "s") if k else "no matmul"


def _share(n_blocks, workers):
    """How many blocks round-robin gives each task."""
    return {f"/job:worker/task:{t}": len(range(t, n_blocks, workers)) for t in range(workers)}


def _expected(args):
    workers, blocks = args
    x = np.concatenate([np.asarray(b, dtype=np.float64) for b in blocks])
    return {"result": x.T @ x,
            "matmuls on each task": {t: _matmuls(k) for t, k in _share(len(blocks), workers).items()},
            "values fetched by the notebook": 1}


def _case(name, workers, rows, d, seed):
    return Case(name, args=(workers, _blocks(rows, d, seed)), expected=_expected)


def cases():
    yield _case("2 workers, 2 blocks", 2, [4, 6], 3, 0)
    yield _case("2 workers, 5 blocks (3 on task 0, 2 on task 1)", 2, [3, 5, 4, 2, 6], 3, 1)
    yield _case("3 workers, 4 blocks of different heights", 3, [8, 1, 5, 3], 4, 2)


### BEGIN HIDDEN TESTS
def hidden_cases():
    yield _case("3 workers, 2 blocks (task 2 gets none)", 3, [5, 7], 3, 3)
    yield _case("2 workers, 1 block", 2, [6], 5, 4)
    yield _case("3 workers, 7 wide blocks", 3, [2, 9, 4, 4, 1, 6, 3], 8, 5)
### END HIDDEN TESTS


def _where(events, task, expected_k):
    ops = [e.name for e in events if e.kind == "op" and e.task == task]
    k = ops.count("matmul")
    if k or expected_k == 0:
        return _matmuls(k)
    if ops:
        return f"no matmul (it ran {', '.join(sorted(set(ops)))})"
    return "ran no ops"


def _warm_up():
    import numpy as np
    import flowlab as fl
    one = np.ones((1, 1), np.float32)
    return fl.add_n([fl.matmul(one, one, transpose_a=True)]).shape


class _Watchdog:
    """Closes the cluster if the answer still runs after WATCHDOG_S seconds, so that its pending
    calls fail at once instead of hanging (then ``check()`` says why)."""

    def __init__(self, cluster):
        self.cluster, self.fired = cluster, False
        self.timer = threading.Timer(WATCHDOG_S, self._fire)
        self.timer.daemon = True

    def _fire(self):
        self.fired = True
        self.cluster.close()

    def check(self):
        if self.fired:
            raise TimeoutError(f"the answer ran longer than {WATCHDOG_S:g} s, so the check closed its cluster")

    def __enter__(self):
        self.timer.start()
        return self

    def __exit__(self, *exc):
        self.timer.cancel()
        return False


def run(answer, case):
    workers, blocks = case.args
    with LocalCluster(workers=workers) as cluster, _Watchdog(cluster) as watchdog:
        cluster.run(_warm_up)                 # every worker loads its op kernels at once, not one after another
        cluster.events(clear=True)
        try:
            result = answer(cluster, [b.copy() for b in blocks])
            result = np.asarray(result, dtype=np.float64)      # fetches a handle (counted as a fetch)
        finally:
            watchdog.check()
        events = cluster.events()
    share = _share(len(blocks), workers)
    return {"result": result,
            "matmuls on each task": {t: _where(events, t, k) for t, k in share.items()},
            "values fetched by the notebook": sum(1 for e in events if e.kind == "send"
                                                  and (e.attrs or {}).get("peer") == "client")}
