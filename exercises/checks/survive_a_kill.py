"""13 · Fault tolerance: a custom training loop that survives a killed worker.

The answer is ``train_with_recovery(directory, batch_for, steps)``: the training function of the
notebook's ``train`` (a linear model ``x @ w + b`` of 3 features, ``w`` and ``b`` starting at zero,
``SGD(0.1, momentum=0.9)``, the squared error averaged over the global batch of 8 rows, under
``MultiWorkerMirroredStrategy`` on 2 workers), which also saves a checkpoint of ``w``, ``b``, the
optimizer and the step in ``directory`` after every step (the chief only) and, when it starts,
restores the newest checkpoint there on every worker and goes on from its step. ``batch_for(step)``
gives this worker's 4 rows of ``step``; it returns ``[w, b]`` as arrays.

The check starts its own 2-worker ``LocalCluster`` and runs the answer with
``fl.distribute.run_with_recovery``. Its ``batch_for`` kills the chosen worker with SIGKILL when
that worker asks for the chosen step (the first time only: a marker file remembers), and logs
every step each worker asks for. It reads:

- every worker's final ``w`` and ``b``, against a numpy run of the same training with no fault;
- how many restarts ``run_with_recovery`` made (at least 1: the kill really happened);
- how many steps each worker did twice: resuming from the newest checkpoint repeats at most 2 (the
  step the kill cut short, and the one before when stopping the survivors also cut the chief's last
  save short: that is a race, so 2 and not 1, and a loop that saves every other step passes too);
  starting again from step 0 repeats every step before the kill (at least 4 here);
- that no worker process is left once the cluster is closed (``no_process_left``).

Timing: a case takes 3-4 s on a quiet machine (cluster start, a first try that imports the strategy
on the workers, one restart, a short second try). Each try may take ``TRY_TIMEOUT_S`` (an answer
that deadlocks fails with a TimeoutError then), and ``max_restarts=1``, so a case always ends, with
its cluster closed, well inside ``TIME_LIMIT``, also on a loaded 2-core machine."""
import os
import shutil
import tempfile

import numpy as np

from flowlab.grading import Case

POINTS = 3
HINTS = [
    "A retry calls your function again on every worker, from the top. Whatever it does not read back "
    "from disk starts from zero again: look at how many steps each worker ran in total.",
    "Put w, b, the optimizer and the step in one fl.train.Checkpoint. On the chief (strategy.worker_index "
    "== 0) save it with a CheckpointManager after every step; at the start, every worker restores "
    "fl.train.latest_checkpoint(directory) when there is one.",
    "The step must come from the checkpoint (an fl.Variable(0, dtype=fl.int64) in it, or the number "
    "of the checkpoint restored), and the optimizer must be in it too: its momentum is part of where "
    "training is. Loop `while int(step.numpy()) < steps:` and save with checkpoint_number=int(step.numpy()).",
]
TOLERANCE = {"rtol": 1e-4, "atol": 1e-5}
TIME_LIMIT = 45.0
TRY_TIMEOUT_S = 15.0

WORKERS, PER_WORKER, ROWS = 2, 4, 32
LR, MOMENTUM = 0.1, 0.9
MAX_REPEATED = 2


def _data(seed):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(ROWS, 3)).astype(np.float32)
    true_w = rng.normal(size=(3, 1))
    y = (x @ true_w + 0.5 + rng.normal(0.0, 0.1, (ROWS, 1))).astype(np.float32)
    return x, y


def _reference(steps, seed):
    """The fault-free training in float64 numpy: the global batch of step s is rows 8s.. (mod 32)."""
    x, y = (a.astype(np.float64) for a in _data(seed))
    batch = WORKERS * PER_WORKER
    w, b = np.zeros((3, 1)), np.zeros(1)
    vw, vb = np.zeros_like(w), np.zeros_like(b)
    for s in range(steps):
        lo = (s * batch) % ROWS
        xb, yb = x[lo:lo + batch], y[lo:lo + batch]
        r = xb @ w + b - yb
        gw, gb = 2.0 * xb.T @ r / batch, 2.0 * r.sum(axis=0) / batch
        vw, vb = MOMENTUM * vw - LR * gw, MOMENTUM * vb - LR * gb
        w, b = w + vw, b + vb
    return [float(v) for v in w.reshape(-1)], [float(v) for v in b.reshape(-1)]


def _expected(kill_worker, kill_step, steps, seed):
    w, b = _reference(steps, seed)
    return {"every worker's [w, b]": [[w, b] for _ in range(WORKERS)],
            "restarts (the kill happened)": "at least 1",
            "steps each worker did twice": f"at most {MAX_REPEATED}",
            "processes left after close": "none"}


def _case(name, kill_worker, kill_step, steps, seed):
    kw = {"kill_worker": kill_worker, "kill_step": kill_step, "steps": steps, "seed": seed}
    return Case(name, kwargs=kw, expected=lambda args, kw=kw: _expected(**kw))


def cases():
    yield _case("worker 1 killed at step 5 of 10", 1, 5, 10, 0)


### BEGIN HIDDEN TESTS
def hidden_cases():
    yield _case("the chief (worker 0, the one that saves) killed at step 4 of 8", 0, 4, 8, 1)
    yield _case("worker 1 killed at step 9 of 12, other data", 1, 9, 12, 2)
### END HIDDEN TESTS


def _batches(folder, x, y, kill):
    """``batch_for(step)``: this worker's rows of ``step``. It logs each step asked for (one line,
    ``pid step``, in ``steps-<rank>.log``) and kills its own process with SIGKILL when
    ``(rank, step) == kill`` and the marker file does not exist yet. Sent to the workers by value."""
    def batch_for(step):
        import os
        import signal
        import flowlab as fl
        step = int(step)
        rank = fl.cluster.rank()
        with open(os.path.join(folder, f"steps-{rank}.log"), "a") as f:
            f.write(f"{os.getpid()} {step}\n")
        marker = os.path.join(folder, "killed")
        if (rank, step) == kill and not os.path.exists(marker):
            open(marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        lo = (step * 8) % len(x) + rank * 4           # 2 workers, 4 rows each: a global batch of 8
        return x[lo:lo + 4].copy(), y[lo:lo + 4].copy()
    return batch_for


def _weights(result):
    """A worker's ``[w, b]`` as lists of floats, or a sentence saying what came back instead."""
    if type(result) not in (list, tuple) or len(result) != 2:
        what = type(result).__name__ + (f" of {len(result)}" if type(result) in (list, tuple) else "")
        return f"returned {what}; expected [w, b]"
    out = []
    for name, value in zip("wb", result):
        if not isinstance(value, np.ndarray) and callable(getattr(value, "numpy", None)):
            value = value.numpy()
        if type(value) is not np.ndarray or value.dtype.kind not in "fiu":
            return f"{name} is {type(value).__name__}, not an array of numbers"
        out.append([float(v) for v in value.astype(np.float64).reshape(-1)])
    return out


def _repeated(folder, steps):
    counts = []
    for rank in range(WORKERS):
        path = os.path.join(folder, f"steps-{rank}.log")
        lines = open(path).read().split() if os.path.exists(path) else []
        counts.append(len(lines) // 2 - steps)
    if all(c <= MAX_REPEATED for c in counts):
        return f"at most {MAX_REPEATED}"
    return ", ".join(f"worker {r}: {c}" for r, c in enumerate(counts))


def run(answer, case):
    import flowlab as fl
    from flowlab.grading.properties import no_process_left

    kw = case.kwargs
    x, y = _data(kw["seed"])
    folder = tempfile.mkdtemp(prefix="survive-a-kill-")
    pids = []
    try:
        cluster = fl.cluster.LocalCluster(workers=WORKERS)
        try:
            pids += [cluster.pid(t) for t in cluster.workers]
            batch_for = _batches(folder, x, y, (kw["kill_worker"], kw["kill_step"]))
            results = fl.distribute.run_with_recovery(
                cluster, answer, os.path.join(folder, "checkpoints"), batch_for, kw["steps"],
                max_restarts=1, timeout=TRY_TIMEOUT_S)
            restarts = len(results.restarts)
        finally:
            pids += [cluster.pid(t) for t in cluster.workers]
            cluster.close()
        left = no_process_left(pids=sorted({p for p in pids if p}))
        return {"every worker's [w, b]": [_weights(r) for r in results],
                "restarts (the kill happened)": "at least 1" if restarts >= 1 else str(restarts),
                "steps each worker did twice": _repeated(folder, kw["steps"]),
                "processes left after close": "none" if left.ok else left.why}
    finally:
        shutil.rmtree(folder, ignore_errors=True)
