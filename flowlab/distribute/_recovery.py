"""Training that recovers by itself: ``run_with_recovery(cluster, train_fn)`` runs ``train_fn`` on
every worker of a LocalCluster, and when a worker dies (or stops answering) it restarts that
worker and runs ``train_fn`` again on all of them, a bounded number of times.

This is the notebook-side half of fault tolerance, shaped like torchrun's elastic agent
(``--max-restarts``: restart the whole worker group after a failure) and Horovod's
``hvd.elastic.run`` (retry after a collective fails because a peer went away). ``train_fn`` makes
its own progress durable, normally with ``fl.keras.callbacks.BackupAndRestore`` in ``fit``: a run
after a restart starts from the last backup, so training ends with the weights a run without the
fault would have reached.

A custom loop does the same with a checkpoint (the chief writes, every worker restores the latest
first; tests/process/test_elastic_recovery.py), or keeps its state in memory with ``hvd.elastic``
(flowlab/horovod/_elastic.py: a surviving worker hands its last commit to the restarted one)::

    def train(directory):
        strategy = fl.distribute.MultiWorkerMirroredStrategy()
        with strategy.scope():
            model, opt = make_model(), fl.optimizers.SGD(0.1)
        step = fl.Variable(0, dtype=fl.int64)
        ckpt = fl.train.Checkpoint(model=model, optimizer=opt, step=step)
        if fl.train.latest_checkpoint(directory):
            ckpt.restore(fl.train.latest_checkpoint(directory))
        manager = fl.train.CheckpointManager(ckpt, directory) if strategy.worker_index == 0 else None
        while int(step) < STEPS:
            strategy.run(replica_step, args=batch_for(int(step), strategy.worker_index))
            step.assign_add(1)
            if manager and int(step) % 10 == 0:
                manager.save(checkpoint_number=int(step))

    fl.distribute.run_with_recovery(cluster, train, "/tmp/ckpt", max_restarts=3)

Only failures caused by a lost worker are retried: an error raised by ``train_fn`` itself while
every worker is alive (a bug, a bad shape) is raised at once, as it would recur on every try.

``wait=False`` runs the same loop on a thread and returns a :class:`RecoveryRun` at once, shaped
like a ``concurrent.futures.Future`` (``done``, ``result``, ``exception``, ``cancel``), so the
notebook stays free while training runs: the cluster panel's Kill button works during it, and the
run's ``restarts`` grow as they happen. ``cancel()`` stops it the way the notebook's Interrupt
button stops a blocking call (the work on the workers is cancelled); a cluster closed under it
ends it with an error saying so.
"""
from __future__ import annotations

import ctypes
import html
import logging
import threading
import time
import weakref
from concurrent.futures import CancelledError
from typing import NamedTuple

from ..cluster.errors import (ClusterError, WorkerBusyError, WorkerDiedError, WorkerPausedError,
                              WorkerUnresponsiveError, describe_exit)

__all__ = ["run_with_recovery", "Restart", "RecoveryError", "RecoveredResults", "RecoveryRun"]

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


def run_with_recovery(cluster, train_fn, *args, max_restarts: int = 3, timeout: float | None = None,
                      wait: bool = True, **kwargs):
    """Run ``train_fn(*args, **kwargs)`` on every worker of ``cluster`` (``cluster.run``); when a
    worker is lost during it, restart that worker (``cluster.restart``) and run ``train_fn`` again
    on every worker, at most ``max_restarts`` times in all. Returns the results in worker order
    (a list with a ``restarts`` attribute). ``timeout`` bounds each try.

    ``train_fn`` must resume from its own backup (``BackupAndRestore`` in ``fit``, or a checkpoint
    it restores in a custom loop). Each restart is logged on the ``flowlab.distribute`` logger
    (a warning: count, task, reason). Past ``max_restarts`` it raises :class:`RecoveryError`
    listing every restart; an error not caused by a lost worker is raised as it is.

    ``wait=False``: return a :class:`RecoveryRun` at once and train on a background thread;
    ``run.result()`` then returns (or raises) what the blocking call would have.

    >>> results = fl.distribute.run_with_recovery(cluster, train, max_restarts=3)  # doctest: +SKIP
    >>> results.restarts                                                           # doctest: +SKIP
    [Restart(count=1, task='/job:worker/task:1', pid=4242, reason='...killed by signal 9 (SIGKILL)...')]
    """
    if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
        raise ValueError(f"run_with_recovery: max_restarts must be a whole number >= 0, got {max_restarts!r}")
    if not wait:
        return RecoveryRun(cluster, train_fn, args, kwargs, max_restarts, timeout)
    return _recover(cluster, train_fn, args, kwargs, max_restarts, timeout, [], None)


def _recover(cluster, train_fn, args, kwargs, max_restarts, timeout, restarts, run):
    """The loop behind both forms: try, name the lost workers, restart them, try again. ``run``:
    the RecoveryRun it works for (None when the caller waits), told when a try starts and ends."""
    while True:
        try:
            if run is None:
                return RecoveredResults(cluster.run(train_fn, *args, timeout=timeout, **kwargs), restarts)
            with run._trying():
                return RecoveredResults(cluster.run(train_fn, *args, timeout=timeout, **kwargs), restarts)
        except (ClusterError, TimeoutError) as err:
            if getattr(cluster, "closed", False):
                raise ClusterError(f"run_with_recovery: the cluster was closed while {_name(train_fn)} ran on it; "
                                   f"nothing runs on any more") from err
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
                if run is not None:
                    run._check_cancelled()
                    run.state = "restarting"
                cluster.restart(task)
                restarts.append(entry)


_runs: "weakref.WeakSet[RecoveryRun]" = weakref.WeakSet()    # what the cluster panel lists


def runs_on(cluster) -> list:
    """The background runs started on ``cluster`` that someone still holds, oldest first."""
    return sorted((r for r in list(_runs) if r._cluster() is cluster), key=lambda r: r._started)


def _raise_in(thread_id: int, exc) -> None:
    """Raise ``exc`` in another thread at its next bytecode (None takes back one not raised yet)."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id),
                                               None if exc is None else ctypes.py_object(exc))


_COLOURS = {"running": "#1565c0", "restarting": "#f9a825", "done": "#2e7d32", "failed": "#c62828",
            "cancelled": "#616161"}


class RecoveryRun:
    """A :func:`run_with_recovery` started with ``wait=False``: training runs on a background
    thread while the notebook stays free. Like a ``concurrent.futures.Future``:

    - ``done()``, ``running()``, ``cancelled()``; ``state``: ``running``, ``restarting``, ``done``,
      ``failed`` or ``cancelled``;
    - ``result(timeout=None)``: the results (a :class:`RecoveredResults`), or what the blocking
      call would have raised; ``TimeoutError`` if not done within ``timeout`` s;
      ``concurrent.futures.CancelledError`` after :meth:`cancel`;
    - ``exception(timeout=None)``: that error, or None;
    - ``restarts``: the restarts made so far (it grows while the run goes on);
    - ``cancel()``: stop it and wait until it has stopped; the work on the workers is cancelled as
      the Interrupt button cancels a blocking call.

    Displayed in a notebook, it shows its state, its restarts and how long it has run.
    """

    def __init__(self, cluster, train_fn, args, kwargs, max_restarts, timeout):
        self.restarts: list[Restart] = []
        self.state = "running"
        self._what = _name(train_fn)
        self._cluster = weakref.ref(cluster)
        self._lock = threading.Lock()
        self._finished = threading.Event()
        self._cancel = self._in_try = self._raised = False
        self._value = self._error = None
        self._started, self._ended = time.monotonic(), None
        self._thread = threading.Thread(target=self._main, name=f"flowlab-recovery-{self._what}", daemon=True,
                                        args=(cluster, train_fn, args, kwargs, max_restarts, timeout))
        _runs.add(self)
        self._thread.start()

    def _main(self, cluster, train_fn, args, kwargs, max_restarts, timeout):
        try:
            self._value = _recover(cluster, train_fn, args, kwargs, max_restarts, timeout, self.restarts, self)
            self.state = "done"
        except BaseException as e:  # noqa: BLE001 - kept for result(); nobody else would see it
            if self._cancel:
                err = CancelledError(f"run_with_recovery({self._what}) was cancelled after "
                                     f"{len(self.restarts)} restart(s): {_first_line(e)}")
                err.__cause__ = e
                self._error, self.state = err, "cancelled"
            else:
                self._error, self.state = e, "failed"
        finally:
            with self._lock:
                self._in_try = False
            self._ended = time.monotonic()
            self._finished.set()
            del cluster, train_fn, args, kwargs

    def _trying(self):
        """Context of one try: a cancel raises KeyboardInterrupt in this thread only while it waits
        on the cluster (the client then cancels the work on every worker and raises Interrupted)."""
        run = self

        class _Try:
            def __enter__(self):
                with run._lock:
                    run._check_cancelled()
                    run._in_try, run.state = True, "running"

            def __exit__(self, *exc):
                with run._lock:
                    run._in_try = False
                    if run._raised:          # raised too late to land inside the try: take it back
                        _raise_in(threading.get_ident(), None)
                return False
        return _Try()

    def _check_cancelled(self):
        if self._cancel:
            raise CancelledError(f"run_with_recovery({self._what}) was cancelled")

    # -- the Future-like face --------------------------------------------------------------------
    def done(self) -> bool:
        return self._finished.is_set()

    def running(self) -> bool:
        return not self._finished.is_set()

    def cancelled(self) -> bool:
        return self.state == "cancelled"

    def result(self, timeout: float | None = None):
        if not self._finished.wait(timeout):
            raise TimeoutError(f"run_with_recovery({self._what}) is still {self.state} after {timeout:g} s "
                               f"({len(self.restarts)} restart(s) so far); call result() again to wait on, "
                               f"or cancel() to stop it")
        if self._error is not None:
            raise self._error
        return self._value

    def exception(self, timeout: float | None = None):
        try:
            self.result(timeout)
        except TimeoutError:
            if not self._finished.is_set():
                raise
            return self._error
        except BaseException as e:  # noqa: BLE001
            return e
        return None

    def cancel(self, timeout: float = 60.0) -> bool:
        """Stop the run: the work on the workers is cancelled (the client's interrupt), a restart
        under way finishes first, and no further try starts. Waits up to ``timeout`` s for it to
        stop; True if this call cancelled it, False if it had already ended."""
        with self._lock:
            if self._finished.is_set():
                return False
            self._cancel = True
            if self._in_try and not self._raised:
                self._raised = True
                _raise_in(self._thread.ident, KeyboardInterrupt)
        self._finished.wait(timeout)
        return self.state == "cancelled"

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until it has ended (however); True if it has."""
        return self._finished.wait(timeout)

    # -- display ---------------------------------------------------------------------------------
    def seconds(self) -> float:
        return (self._ended or time.monotonic()) - self._started

    def snapshot(self) -> dict:
        """JSON-safe state: what runs, its state, seconds so far, the restarts and the error line."""
        return {"what": self._what, "state": self.state, "seconds": round(self.seconds(), 1),
                "restarts": [str(r) for r in self.restarts],
                "error": None if self._error is None else _first_line(self._error)}

    def __repr__(self):
        s = self.snapshot()
        tail = f"; {s['error']}" if s["error"] else ""
        return (f"<RecoveryRun {s['what']}: {s['state']} after {s['seconds']:.1f} s, "
                f"{len(s['restarts'])} restart(s){tail}>")

    def _repr_html_(self):
        s = self.snapshot()
        rows = "".join(f"<li>{html.escape(r)}</li>" for r in s["restarts"])
        error = f"<div><code>{html.escape(s['error'])}</code></div>" if s["error"] else ""
        return (f"<div class='flowlab-recovery'><b>run_with_recovery({html.escape(s['what'])})</b> "
                f"<span style='color:{_COLOURS.get(s['state'], '#000')}'>&#9679; {s['state']}</span> "
                f"&middot; {s['seconds']:.1f} s &middot; {len(s['restarts'])} restart(s)"
                f"{'<ul>' + rows + '</ul>' if rows else ''}{error}</div>")


def _first_line(err) -> str:
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0]}" if text else type(err).__name__


def _name(fn) -> str:
    return getattr(fn, "__qualname__", None) or repr(fn)


def _reason(err) -> str:
    """What happened to the worker ``err`` names, without its name (the Restart says it)."""
    if isinstance(err, WorkerDiedError):
        return describe_exit(err.exitcode, err.signal)
    if isinstance(err, WorkerPausedError):
        return "was paused (SIGSTOP) and answered nothing"
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
