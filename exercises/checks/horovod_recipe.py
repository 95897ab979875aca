"""12 · Horovod style: the recipe in a training loop.

The answer is ``train_rank(w0, x, y, base_lr, steps)``, the function every rank runs. It gets this
rank's own starting weights ``w0 = [kernel (features, 1), bias (1,)]`` (float32, different on every
rank), this rank's share of the data ``x`` (rows, features) and ``y`` (rows, 1), the learning rate
``base_lr`` tuned for one rank's batch, and the number of steps. With ``import flowlab.horovod as
hvd`` it must: ``hvd.init()``; scale the learning rate by ``hvd.size()``; wrap SGD in
``hvd.DistributedOptimizer``; broadcast rank 0's starting weights before the first step; then take
``steps`` full-batch steps on its share, minimising the mean squared error of ``x @ kernel + bias``.
It returns the final ``[kernel, bias]``.

The check runs it on every rank of a ``LocalGroup`` (one thread per rank, each with its own
communicator, which ``hvd.init()`` finds), each rank with an equal share of one data set, and reads
(in this order: the first that fails is the one shown):

- that the ranks hold the same weights as each other (forgetting the broadcast breaks this: the
  averaged steps move every rank alike, so the gap between their starts never closes);
- from the group's event log: how many all-reduces each rank ran. The recipe runs one per step
  for all the gradients together (a group of one needs none);
- that every rank holds the weights of ONE worker that trains on the whole data set from rank 0's
  start with ``base_lr * ranks`` (a numpy reference here, in float64):
  ``flowlab.grading.properties.every_rank_holds`` (summing the gradients instead of averaging
  them, or leaving the learning rate unscaled, fails here).

A rank that waits in a collective the other ranks never call (only rank 0 applying gradients) is
stopped after ``JOIN_S`` seconds and the case fails with that reason.
"""
import numpy as np

from flowlab.cluster.collectives import LocalGroup
from flowlab.grading import Case
from flowlab.grading.properties import every_rank_holds

POINTS = 3
HINTS = [
    "Every rank must end with the same weights as one worker on the whole batch. Compare your ranks' "
    "weights with each other first: if they differ, rank 0's start never reached the others.",
    "hvd.broadcast_variables([kernel, bias], root_rank=0) before the first step copies rank 0's start to "
    "every rank; hvd.DistributedOptimizer(fl.optimizers.SGD(base_lr * hvd.size())) averages the gradients "
    "(the default, op=hvd.Average) in one all-reduce per step.",
    "Every rank calls opt.apply_gradients at every step (the all-reduce inside it needs all the ranks), "
    "and returns [kernel.numpy(), bias.numpy()].",
]
TOLERANCE = {"rtol": 1e-4, "atol": 1e-5}
TIME_LIMIT = 20.0        # seconds per case; a right answer takes well under a second
JOIN_S = 12.0            # a rank still running after this long is waiting for a collective
FEATURES = 3


def _data(ranks, rows, seed):
    """One data set cut into equal shares, and a different float32 start for every rank."""
    rng = np.random.default_rng(seed)
    x = rng.normal(0.0, 1.0, (ranks * rows, FEATURES)).astype(np.float32)
    y = (x @ np.array([[1.5], [-2.0], [0.5]]) + 0.3 + rng.normal(0.0, 0.1, (ranks * rows, 1))).astype(np.float32)
    starts = [[rng.normal(0.0, 1.0, (FEATURES, 1)).astype(np.float32), rng.normal(0.0, 1.0, (1,)).astype(np.float32)]
              for _ in range(ranks)]
    return x, y, starts


def _one_worker(x, y, start, lr, steps):
    """One worker, the whole batch, plain gradient descent on the mean squared error (float64)."""
    x, y = x.astype(np.float64), y.astype(np.float64)
    kernel, bias = start[0].astype(np.float64), start[1].astype(np.float64)
    for _ in range(steps):
        r = x @ kernel + bias - y
        kernel = kernel - lr * 2.0 * x.T @ r / len(x)
        bias = bias - lr * 2.0 * r.mean(axis=0)
    return [float(v) for v in np.concatenate([kernel.ravel(), bias.ravel()])]


def _allreduces_text(counts, steps):
    """What the all-reduce counts per rank say, as one line."""
    if len(set(counts)) > 1:
        return ", ".join(f"rank {r}: {c}" for r, c in enumerate(counts))
    c = counts[0]
    if len(counts) == 1:
        return "0 (a group of one needs none)" if c == 0 else f"{c} on a group of one"
    return f"{c} on every rank ({c / steps:g} per step)"


def _expected(ranks, steps):
    return {"the ranks hold the same weights": f"all {ranks} ranks hold rank 0's weights",
            "all-reduces": _allreduces_text([steps if ranks > 1 else 0] * ranks, steps),
            "every rank holds one worker's weights": f"all {ranks} ranks hold the right result"}


def _case(name, ranks, rows, steps, base_lr, seed):
    return Case(name, kwargs={"ranks": ranks, "rows_per_rank": rows, "steps": steps, "base_lr": base_lr,
                              "seed": seed},
                expected=lambda args: _expected(ranks, steps))


def cases():
    yield _case("2 ranks, 5 steps", 2, 8, 5, 0.05, 0)
    yield _case("3 ranks, 8 steps", 3, 6, 8, 0.04, 1)
    yield _case("4 ranks, 6 steps", 4, 5, 6, 0.03, 2)


### BEGIN HIDDEN TESTS
def hidden_cases():
    yield _case("1 rank (a group of one)", 1, 12, 6, 0.1, 3)
    yield _case("2 ranks, 1 step", 2, 10, 1, 0.1, 4)
    yield _case("5 ranks, 10 steps, 2 rows each", 5, 2, 10, 0.02, 5)
### END HIDDEN TESTS


def _flat(result):
    """A rank's [kernel, bias] as one list of floats (whatever array types it came in)."""
    return [float(v) for part in result for v in np.ravel(np.asarray(part, dtype=np.float64))]


def run(answer, case):
    k = case.kwargs
    ranks, rows, steps, base_lr = k["ranks"], k["rows_per_rank"], k["steps"], k["base_lr"]
    x, y, starts = _data(ranks, rows, k["seed"])
    shares = [(x[r * rows:(r + 1) * rows].copy(), y[r * rows:(r + 1) * rows].copy()) for r in range(ranks)]
    with LocalGroup(ranks) as group:
        def rank_fn(comm):
            r = comm.rank
            return answer([a.copy() for a in starts[r]], shares[r][0], shares[r][1], base_lr, steps)
        try:
            results = group.run(rank_fn, join_timeout=JOIN_S)
        except RuntimeError as e:
            if "still running" not in str(e):
                raise
            raise RuntimeError(f"{e}: those ranks waited for a collective the other ranks never called. "
                               f"Every rank must run the same collectives in the same order (every rank "
                               f"calls apply_gradients, not only rank 0)") from None
        calls = group.events.events(kind="collective")
    flat = [_flat(r) for r in results]
    reference = _one_worker(x, y, starts[0], base_lr * ranks, steps)
    holds = every_rank_holds(flat, reference, **TOLERANCE)
    differ = [(r, max(abs(a - b) for a, b in zip(flat[r], flat[0])) if len(flat[r]) == len(flat[0]) else None)
              for r in range(ranks)]
    differ = [(r, d) for r, d in differ if d is None or d > 0.0]
    if not differ:
        same = f"all {ranks} ranks hold rank 0's weights"
    else:
        r, d = differ[0]
        same = (f"rank {r} holds {len(flat[r])} values, rank 0 {len(flat[0])}" if d is None else
                f"rank {r} differs from rank 0 by up to {d:.3g}") + (
            f" ({len(differ)} ranks differ)" if len(differ) > 1 else "")
    counts = [sum(1 for e in calls if e.name == "allreduce" and e.rank == r) for r in range(ranks)]
    return {"the ranks hold the same weights": same,
            "all-reduces": _allreduces_text(counts, steps),
            "every rank holds one worker's weights": holds.why}
