"""Training that recovers by itself: ``run_with_recovery(cluster, train_fn)`` runs ``train_fn`` on
every worker of a LocalCluster, and when a worker dies (or stops answering) it restarts that
worker and runs ``train_fn`` again on all of them, a bounded number of times.

This is the notebook-side half of fault tolerance, shaped like torchrun's elastic agent
(``--max-restarts``: restart the whole worker group after a failure) and Horovod's
``hvd.elastic.run`` (retry after a collective fails because a peer went away). ``train_fn`` makes
its own progress durable, normally with ``fl.keras.callbacks.BackupAndRestore`` in ``fit``: a run
after a restart starts from the last backup, so training ends with the weights a run without the
fault would have reached.

Only failures caused by a lost worker are retried: an error raised by ``train_fn`` itself while
every worker is alive (a bug, a bad shape) is raised at once, as it would recur on every try.
"""
from __future__ import annotations

import logging
import time
from typing import NamedTuple

from ..cluster.errors import (ClusterError, WorkerBusyError, WorkerDiedError, WorkerUnresponsiveError,
                              describe_exit)

__all__ = ["run_with_recovery", "Restart", "RecoveryError", "RecoveredResults"]

log = logging.getLogger("flowlab.distribute")

# remote errors that a lost peer causes on the workers that survive it
_PEER_FAULTS = ("PeerLostError", "CollectiveError", "CollectiveTimeoutError")
_SETTLE = 5.0          # how long to wait for the liveness monitor to name the worker behind a peer fault


class Restart(NamedTuple):
    """One restart: ``count`` (1, 2, ...), the ``task`` restarted, its old ``pid`` and the ``reason``."""
    count: int
    task: str
    pid: int | None
    reason: str

    def __str__(self):
        pid = f" (pid {self.pid})" if self.pid else ""
        return f"restart {self.count}: {self.task}{pid}: {self.reason}"


class RecoveryError(RuntimeError):
    """Training failed more often than ``max_restarts`` allowed; ``restarts`` lists each restart made
    and ``__cause__`` is the last failure."""

    def __init__(self, message, restarts):
        super().__init__(message)
        self.restarts = list(restarts)


class RecoveredResults(list):
    """``train_fn``'s results in worker order (as ``cluster.run`` gives them), with ``restarts``: the
    restarts it took to get them (empty when nothing failed)."""

    def __init__(self, results, restarts):
        super().__init__(results)
        self.restarts = list(restarts)


def run_with_recovery(cluster, train_fn, *args, max_restarts: int = 3, timeout: float | None = None, **kwargs):
    """Run ``train_fn(*args, **kwargs)`` on every worker of ``cluster`` (``cluster.run``); when a
    worker is lost during it, restart that worker (``cluster.restart``) and run ``train_fn`` again
    on every worker, at most ``max_restarts`` times in all. Returns the results in worker order
    (a list with a ``restarts`` attribute). ``timeout`` bounds each try.

    ``train_fn`` must resume from its own backup (``BackupAndRestore`` in ``fit``, or a checkpoint
    it restores in a custom loop). Each restart is logged on the ``flowlab.distribute`` logger
    (a warning: count, task, reason). Past ``max_restarts`` it raises :class:`RecoveryError`
    listing every restart; an error not caused by a lost worker is raised as it is.

    >>> results = fl.distribute.run_with_recovery(cluster, train, max_restarts=3)  # doctest: +SKIP
    >>> results.restarts                                                           # doctest: +SKIP
    [Restart(count=1, task='/job:worker/task:1', pid=4242, reason='...killed by signal 9 (SIGKILL)...')]
    """
    if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
        raise ValueError(f"run_with_recovery: max_restarts must be a whole number >= 0, got {max_restarts!r}")
    restarts: list[Restart] = []
    while True:
        try:
            return RecoveredResults(cluster.run(train_fn, *args, timeout=timeout, **kwargs), restarts)
        except (ClusterError, TimeoutError) as err:
            lost = _lost_workers(cluster, err)
            if not lost:
                raise
            if len(restarts) + len(lost) > max_restarts:
                made = "\n".join(f"  {r}" for r in restarts) or "  (none)"
                now = "\n".join(f"  {task}: {reason}" for task, _, reason in lost)
                raise RecoveryError(
                    f"run_with_recovery: gave up on {_name(train_fn)} after {len(restarts)} restart(s) "
                    f"(max_restarts={max_restarts}); restarts made:\n{made}\nlost this time:\n{now}\n"
                    f"Look at the last failure below and at cluster.logs(task); raise max_restarts if "
                    f"the faults are expected.", restarts) from err
            for task, pid, reason in lost:
                entry = Restart(len(restarts) + 1, task, pid, reason)
                log.warning("run_with_recovery: %s; restarting it, then running %s again on every worker "
                            "(restart %d of at most %d)", entry, _name(train_fn), entry.count, max_restarts)
                cluster.restart(task)
                restarts.append(entry)


def _name(fn) -> str:
    return getattr(fn, "__qualname__", None) or repr(fn)


def _reason(err) -> str:
    """What happened to the worker ``err`` names, without its name (the Restart says it)."""
    if isinstance(err, WorkerDiedError):
        return describe_exit(err.exitcode, err.signal)
    if isinstance(err, WorkerUnresponsiveError):
        return f"stopped answering (no heartbeat for {err.silent_for:.1f} s)"
    if isinstance(err, WorkerBusyError):
        return "still busy with work that was cancelled and did not stop"
    return (str(err).strip().splitlines() or [type(err).__name__])[0]


def _lost_workers(cluster, err) -> list:
    """``[(task, pid, reason)]``: the workers to restart after ``err``, each named once; empty when
    the failure was not caused by a lost worker."""
    lost: dict[str, tuple] = {}
    if isinstance(err, (WorkerDiedError, WorkerUnresponsiveError, WorkerBusyError)) and err.task:
        lost[err.task] = (err.pid, _reason(err))
    peer_fault = getattr(err, "remote_type", None) in _PEER_FAULTS or bool(lost)
    deadline = time.monotonic() + (_SETTLE if peer_fault else 0.0)
    while True:      # the liveness monitor may name a dead worker a moment after its peers failed
        for t in cluster.snapshot()["tasks"]:
            if t["task"] in cluster.workers and t["status"] in ("dead", "unresponsive") and t["task"] not in lost:
                how = describe_exit(t.get("exitcode")) if t["status"] == "dead" else "stopped answering"
                lost[t["task"]] = (t.get("pid"), how)
        if lost or time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    if lost:         # a survivor whose cancelled work did not stop would block the next try
        for task in getattr(err, "still_running", ()) or ():
            if task in cluster.workers and task not in lost:
                lost[task] = (cluster.pid(task), "its cancelled work did not stop")
    return [(task, pid, reason) for task, (pid, reason) in lost.items()]
