"""``LocalCluster``: a real cluster of worker processes on this machine, from one notebook cell.

>>> import flowlab as fl
>>> with fl.cluster.LocalCluster(workers=2) as cluster:              # doctest: +SKIP
...     cluster.run(lambda: fl.cluster.rank() * 10)
[0, 10]

Each task is a child process (see :mod:`.worker`) on a free 127.0.0.1 port, all started at once;
the constructor returns when every one has said it is ready. A per-cluster random key signs every
message. The client, the tasks and their heartbeats talk over the local lane (Unix sockets beside
each port, :mod:`.unix`; ``cluster.client.stats["lanes"]`` shows it), TCP where there is none.
Closing the cluster, the end of the ``with`` block, the kernel's exit, restart or death all end
every worker. The notebook's Interrupt button does not end them: it cancels the work a call was
waiting for on them (the client sends each a signed ``cancel``), or says which worker is still
running it and that ``cluster.restart(i)`` ends it. Workers that die or hang are reported by the
next call that waits on them (see :mod:`.liveness`), with the call that starts them again.
"""
from __future__ import annotations

import collections
import json
import os
import shutil
import signal as _signal
import subprocess
import sys
import tempfile
import threading
import time
import weakref

from . import schemes as _schemes
from .client import Client
from .errors import ClusterError, describe_exit
from .liveness import Monitor, log_tail
from .protocol import dumps, new_key
from .spec import ClusterSpec, parse_task, task_name

__all__ = ["LocalCluster", "ScheduledFault", "cluster_for_target", "clusters", "latest_cluster"]

RECENT_FAULTS = 6     # the faults done from here that snapshot() lists (for the cluster panel)

_by_target: "weakref.WeakValueDictionary[str, LocalCluster]" = weakref.WeakValueDictionary()


_started: list = []   # weak references to every LocalCluster made, oldest first


def cluster_for_target(target: str) -> "LocalCluster | None":
    """The live LocalCluster of this process that has ``target`` (``flowlab://host:port``;
    ``grpc://host:port``, the spelling of TensorFlow material, is taken as an alias)."""
    if isinstance(target, str) and target.startswith("grpc://"):
        target = "flowlab://" + target[len("grpc://"):]
    return _by_target.get(target)


def clusters() -> list:
    """The LocalClusters of this process that are still open, oldest first (held weakly: a
    closed or collected cluster drops out). A panel uses it to find a cluster started earlier."""
    out = []
    for ref in list(_started):
        cluster = ref()
        if cluster is None:
            try:
                _started.remove(ref)
            except ValueError:     # another thread pruned it first
                pass
        elif not cluster.closed:
            out.append(cluster)
    return out


def latest_cluster() -> "LocalCluster | None":
    """The most recently started LocalCluster of this process that is still open, or None."""
    for ref in reversed(_started):
        cluster = ref()
        if cluster is not None and not cluster.closed:
            return cluster
    return None


class _Resources:
    """Everything that must be released, kept apart from the cluster object so that a finalizer
    (garbage collection, interpreter exit) can release it without the cluster."""

    def __init__(self):
        self.procs: dict[str, subprocess.Popen] = {}
        self.logs: dict[str, object] = {}
        self.monitor = None
        self.client = None
        self.tmpdir = None
        self.addresses: dict[str, str] = {}   # the tasks' addresses (shared with the cluster)
        self.remote = None     # this cluster as remote eager execution knows it
        self.closed = False

    def stop_procs(self, procs, grace: float = 2.0) -> None:
        """End ``procs``: close stdin (the worker exits on EOF), wait up to ``grace`` seconds in
        all, then SIGKILL what is left, and reap every one."""
        for p in procs:
            _close_stdin(p)
            if p.poll() is None:
                p.send_signal(_signal.SIGCONT)   # a SIGSTOPped worker: let it see the end of stdin and clean up
        deadline = time.monotonic() + grace
        for p in procs:
            try:
                p.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for p in procs:
            if p.poll() is None:
                try:
                    p.kill()     # our own child, by pid
                except ProcessLookupError:
                    pass
                try:
                    p.wait(5)
                except subprocess.TimeoutExpired:
                    pass

    @staticmethod
    def remove_lanes(addresses) -> None:
        """Remove the local-lane socket files that ended tasks left (a killed process cannot)."""
        from .unix import remove_if_dead
        for address in addresses:
            if address:
                remove_if_dead(address)

    def release(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.remote is not None:   # closed or collected: ops can no longer be placed on its tasks
            from .remote import detach
            detach(self.remote)
        self.stop_procs(list(self.procs.values()))
        self.remove_lanes(self.addresses.values())
        for f in self.logs.values():
            f.close()
        if self.client is not None:
            self.client.close()
        if self.monitor is not None:
            self.monitor.close()
            if self.monitor.on_dead is not None:
                self.monitor.on_dead.close()
        if self.tmpdir:
            shutil.rmtree(self.tmpdir, ignore_errors=True)


def restart_call(task) -> str:
    """The call a user types to restart ``task``: ``cluster.restart(1)`` for worker 1,
    ``cluster.restart("/job:ps/task:0")`` for another job's task."""
    job, index = parse_task(task)
    return f"cluster.restart({index})" if job == "worker" else f"cluster.restart({task_name(job, index)!r})"


def _dead_note(t) -> str:
    """`` (killed by signal 9 (SIGKILL); cluster.restart(1) starts it again)`` for a dead task."""
    if t["status"] != "dead":
        return ""
    return f" ({describe_exit(t.get('exitcode'))}; {restart_call(t['task'])} starts it again)"


def _fn_name(fn) -> str:
    return getattr(fn, "__qualname__", None) or type(fn).__name__


class ScheduledFault:
    """A fault to be done later (:meth:`LocalCluster.schedule_fault`): ``at`` seconds after it was
    scheduled, ``action`` to ``task``. It holds the cluster weakly (a closed or collected cluster
    gets nothing). ``done`` once it ran or was cancelled; ``error``: what its action raised."""

    def __init__(self, cluster, at, action, task, args=(), kwargs=None):
        self.at, self.action, self.task, self.args, self.kwargs = at, action, task, tuple(args), dict(kwargs or {})
        self.error = None
        self._cluster = weakref.ref(cluster)
        self._done = threading.Event()
        self._timer = threading.Timer(at, self._fire)
        self._timer.daemon = True
        self._timer.name = f"flowlab-fault-{action}"
        self._timer.start()

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until it has happened (or was cancelled); True if so."""
        return self._done.wait(timeout)

    def cancel(self) -> None:
        self._timer.cancel()
        self._done.set()

    def _fire(self):
        cluster = self._cluster()
        try:
            if cluster is not None and not cluster.closed and not self._done.is_set():
                getattr(cluster, self.action)(self.task, *self.args, **self.kwargs)
        except Exception as e:   # noqa: BLE001 - kept for whoever asks (a dead task cannot be paused)
            self.error = e
        finally:
            self._done.set()

    def __repr__(self):
        state = "done" if self.done else "pending"
        return f"<ScheduledFault {self.action} {self.task} at +{self.at:g} s ({state})>"


def _read_dump(path, timeout) -> "str | None":
    """The stack dump a worker writes to ``path`` from its signal handler: once something is
    there, wait until it has stopped growing for QUIET seconds (the handler writes it in one go,
    thread after thread) and holds the main thread's block (a worker just resumed, on a loaded
    machine, can pause longer than QUIET between two threads); None if nothing came within
    ``timeout`` seconds (at the deadline, whatever came)."""
    deadline = time.monotonic() + timeout
    size, still, text = 0, None, None
    while True:
        try:
            now_size = os.path.getsize(path)
        except OSError:
            now_size = 0
        t = time.monotonic()
        if now_size and now_size == size:
            if still is None:
                still = t
            elif t - still >= _QUIET:
                text = _read_text(path)
                if _MAIN_MARK in text:
                    return text
                still = t              # quiet, but the main thread's block is still to come
        else:
            size, still = now_size, None
        if t >= deadline:
            return _read_text(path) if size else None
        time.sleep(0.01)


def _read_text(path) -> str:
    with open(path, "rb") as f:
        return f.read().decode("utf-8", "replace")


_MAIN_MARK = "in serve_exec"   # a line of the main thread's stack: it runs the tasks' requests


def _main_first(dump: str) -> str:
    """faulthandler's dump with the main thread's block first (the one that runs the user's code:
    its stack goes down to ``serve_exec``), named so; the others after it, as they came."""
    blocks = [b for b in dump.strip("\n").split("\n\n") if b.strip()]
    main = next((b for b in blocks if _MAIN_MARK in b), None)
    if main is None:
        return dump.rstrip() + "\n"
    head, sep, rest = main.partition("\n")
    ident = next((w for w in head.split() if w.startswith("0x")), "")
    main = f"Main thread {ident} (runs your code):{sep}{rest}"
    return "\n\n".join([main] + [b for b in blocks if _MAIN_MARK not in b]) + "\n"


_QUIET = 0.05     # seconds a stack dump must stay the same size to count as complete


def _close_stdin(p):
    try:
        if p.stdin is not None and not p.stdin.closed:
            p.stdin.close()
    except OSError:
        pass


class LocalCluster:
    """``workers`` worker tasks and ``ps`` parameter-server tasks, each a process on this machine.

    - ``port``: None (each task takes any free port), or a first port: task i tries ``port + i``
      and the ports after it, skipping those in use.
    - ``heartbeat`` / ``unresponsive_after``: seconds between heartbeats, and of silence before a
      task counts as unresponsive. A task that exits is noticed within 0.1 s.
    - ``start_timeout``: seconds to wait for every task to be ready.
    - ``preload``: modules each worker imports once it is ready (e.g. ``["numpy", "flowlab"]``), so
      the first ``run`` does not pay for them. Workers start without flowlab's engine loaded.
    - ``env``: extra environment variables for the workers.

    Growing it: :meth:`add_worker` starts one more worker (``/job:worker/task:N``) while the
    cluster runs. Every task gets the new ClusterSpec, ``fl.cluster.world_size()`` says N+1 and the
    next collective forms a new group of N+1 ranks, as torchrun's rendezvous does after a
    membership change. A collective running during the add is given up on every rank (an error
    says the group changed): call it again. Strategies made before keep their old workers.
    """

    _view = "flowlab.widgets.cluster:ClusterView"

    def __init__(self, workers: int = 1, ps: int = 0, *, port: int | None = None, heartbeat: float = 0.25,
                 unresponsive_after: float = 1.5, start_timeout: float = 30.0, preload=(), env=None,
                 python: str | None = None):
        if workers < 1 or ps < 0:
            raise ValueError(f"a LocalCluster needs workers >= 1 and ps >= 0 (got workers={workers}, ps={ps})")
        self._res = res = _Resources()
        self._finalizer = weakref.finalize(self, res.release)
        self._key = new_key()
        self._transport = _schemes.get("tcp")   # its tasks listen on 127.0.0.1 (see schemes)
        self._port, self._heartbeat, self._start_timeout = port, heartbeat, start_timeout
        self._preload, self._python = list(preload), python
        self._env = {**os.environ, **(env or {})}
        self._jobs = {"worker": workers, **({"ps": ps} if ps else {})}
        self._tasks = [task_name(j, i) for j, n in self._jobs.items() for i in range(n)]
        self._addresses: dict[str, str] = res.addresses
        self._lock = threading.RLock()
        self._faults_set: dict = {}     # task -> the faults it reported set (inject)
        self._scheduled: list = []      # ScheduledFault handles
        self._recent = collections.deque(maxlen=RECENT_FAULTS)   # (time, action, task, attrs), for views
        self._missed: set = set()       # paused tasks that missed a regroup and a new spec (told at resume)
        self._fault_since = float("-inf")   # events(clear=True) hides this cluster's older fault events
        from ._usage import Usage
        self._usage = Usage()           # CPU, memory and activity history per task, for snapshot()
        self._traffic: dict = {}        # task -> the client's last traffic counts (kept once it closes)
        self._stack_lock = threading.Lock()
        self.closed = False
        try:
            from .leftovers import folder_prefix   # flowlab-cluster-<owner>-: swept once the owner is gone
            res.tmpdir = tempfile.mkdtemp(prefix=folder_prefix())
            res.monitor = Monitor(self._transport, self._key, interval=heartbeat, timeout=unresponsive_after)
            # health: the monitor's own method, so nothing in `res` refers back to the cluster and a
            # cluster nobody holds any more is collected (and its workers ended) by the finalizer
            res.client = Client(self._key, transport=self._transport, health=res.monitor.problem)
            res.monitor.restart_hint = res.client.stop_hint = restart_call   # plain functions: no reference back
            res.client.describe = res.monitor.describe      # rows of the root-cause table
            from .collectives._gone import Teller     # the survivors' collectives fail at once
            res.monitor.on_dead = Teller(self._transport, self._key)
            for i, task in enumerate(self._tasks):
                self._spawn(task, None if port is None else port + i)
            res.monitor.wait_ready(self._tasks, start_timeout)
            for task in self._tasks:
                self._connect(task)
            self._broadcast_spec()
        except BaseException:
            self.close()
            raise
        _by_target[self.target] = self
        _started.append(weakref.ref(self))
        from . import remote
        res.remote = remote.attach(res.client, self._tasks, name=self.target)

    # -- what it is --------------------------------------------------------------------------------
    @property
    def spec(self) -> ClusterSpec:
        """The ClusterSpec of the running tasks (``127.0.0.1:port`` addresses)."""
        spec = {}
        for task in self._tasks:
            job, i = parse_task(task)
            spec.setdefault(job, []).append(self._addresses.get(task))
        return ClusterSpec(spec)

    @property
    def target(self) -> str:
        """``flowlab://127.0.0.1:port`` of ``/job:worker/task:0``, the task a Session talks to."""
        return f"flowlab://{self._addresses[self._tasks[0]]}"

    @property
    def workers(self) -> list[str]:
        """The worker tasks' names, in rank order."""
        return [t for t in self._tasks if t.startswith("/job:worker/")]

    @property
    def tasks(self) -> list[str]:
        return list(self._tasks)

    @property
    def client(self) -> Client:
        """The signed connection to every task: ``client.request(task, type, body, buffers)``."""
        return self._res.client

    @property
    def key(self) -> bytes:
        """This cluster's signing key (for a Client made by hand)."""
        return self._key

    def pid(self, task) -> int | None:
        p = self._res.procs.get(self._name(task))
        return p.pid if p is not None else None

    def status(self, task) -> str:
        """``alive``, ``unresponsive``, ``paused`` (by :meth:`pause`), ``dead``, ``starting`` or ``closed``."""
        state = self._res.monitor.state(self._name(task)) if self._res.monitor else None
        return "closed" if self.closed or state is None else state.status

    def logs(self, task, lines: int = 50) -> str:
        """The last ``lines`` lines of a task's log (its stdout and stderr)."""
        return log_tail(self._log_path(self._name(task)), lines) or ""

    def snapshot(self) -> dict:
        """JSON-safe state for views (cheap and thread-safe: a panel calls it every 0.5 s from a
        thread while cells run; it sends nothing to the tasks). Per task (``tasks``):

        - ``task``, ``status`` (``starting``, ``alive``, ``unresponsive``, ``paused``, ``dead``,
          ``closed``), ``alive``, ``pid``, ``address``, ``exitcode``, ``faults`` (injected ones);
        - ``activity``: ``"busy"`` while a request from this process runs there (``cluster.run``,
          an eager op placed there, a graph step), ``"idle"``, None when it does not run;
          ``running``: what that request runs (the function's qualified name, the op type,
          ``"step"``), else None;
        - ``cpu``: percent of one core since the previous sample, ``rss``: resident bytes (None
          where they cannot be read, or when it does not run);
        - ``msgs_in``, ``msgs_out``, ``bytes_in``, ``bytes_out``: this process's messages from and
          to it (kept across restarts);
        - ``history``: the last 30 samples (one per 0.5 s or more, taken when this is called) of
          its CPU percent; ``history_unit`` at the top says so (``"msgs/s"`` where CPU cannot be read).

        ``scheduled``: the faults still to come, ``(after_s, action, task)``; ``recent``: the last
        :data:`RECENT_FAULTS` faults done from here (kills, pauses, restarts, ...), oldest first,
        each ``{"name", "task", "ago" (seconds), "attrs"}``."""
        from .events import now
        states = {s["task"]: s for s in self._res.monitor.snapshot()} if self._res.monitor else {}
        names = list(self._tasks)
        client = self._res.client
        if client is not None and not self.closed:
            self._traffic.update(client.traffic())
        rows = []
        for task in names:
            s = states.get(task, {})
            status = "closed" if self.closed else s.get("status", "starting")
            proc = self._res.procs.get(task)
            rows.append((task, status, proc.pid if proc is not None else None))
        runs = ("alive", "unresponsive", "paused")
        msgs = {t: self._traffic[t]["msgs_in"] + self._traffic[t]["msgs_out"] for t, _, _ in rows if t in self._traffic}
        usage = self._usage.sample({t: pid if st in runs else None for t, st, pid in rows}, msgs)
        tasks = []
        for task, status, pid in rows:
            s, traffic, use = states.get(task, {}), self._traffic.get(task, {}), usage[task]
            runs_now = status in runs
            busy = traffic.get("busy", False) and runs_now
            tasks.append({"task": task, "status": status, "alive": runs_now, "pid": pid,
                          "address": self._addresses.get(task), "exitcode": s.get("exitcode"),
                          "faults": self._faults_set.get(task),
                          "activity": ("busy" if busy else "idle") if runs_now else None,
                          "running": traffic.get("running") if busy else None,
                          "cpu": use["cpu"] if runs_now else None, "rss": use["rss"] if runs_now else None,
                          "msgs_in": traffic.get("msgs_in", 0), "msgs_out": traffic.get("msgs_out", 0),
                          "bytes_in": traffic.get("bytes_in", 0), "bytes_out": traffic.get("bytes_out", 0),
                          "history": use["history"]})
        t = now()
        recent = [{"name": action, "task": task, "ago": t - at, "attrs": dict(attrs)}
                  for at, action, task, attrs in list(self._recent)]
        scheduled = [] if self.closed else [(s.at, s.action, s.task) for s in list(self._scheduled) if not s.done]
        return {"closed": self.closed, "target": self._target_or_none(), "tasks": tasks,
                "scheduled": scheduled, "recent": recent, "history_unit": self._usage.unit}

    def stack(self, task, timeout: float = 2.0) -> str:
        """The current Python stack of every thread of ``task``'s process, most recent call first,
        also while it is busy in a long computation or stuck in C code (the worker registered
        :func:`faulthandler.register` for :data:`~flowlab.cluster.worker.STACK_SIGNAL` at start,
        so it writes its stack from the signal handler, without the interpreter's help). Raises
        a WorkerDiedError for a dead task, a WorkerPausedError for a paused one (a stopped
        process runs nothing, not even that handler: resume it first), a ClusterTimeoutError if
        nothing came within ``timeout`` seconds."""
        from .errors import ClusterTimeoutError
        from .worker import STACK_SIGNAL

        self._check_open()
        name = self._name(task)
        status = self.status(name)
        if status in ("dead", "paused"):
            error = self._res.monitor.problem(name)
            if status == "dead":
                text = f"no stack to show: {str(error).partition(chr(10))[0]}"
            else:
                text = (f"{name} (pid {error.pid}) is paused (SIGSTOP), so it cannot show its stack: a stopped "
                        f"process runs nothing, not even the handler that writes it; "
                        f"{restart_call(name).replace('restart', 'resume')} wakes it")
            error.args = (text,)
            raise error
        proc = self._res.procs.get(name)
        if status == "starting" or proc is None or proc.poll() is not None:
            raise ClusterError(f"{name} is {status}: no stack to show yet, ask again once it is alive", name)
        path = self._stack_path(name)
        with self._stack_lock:
            with open(path, "ab") as f:     # the worker appends (O_APPEND), so emptying it here is safe
                f.truncate(0)
            proc.send_signal(STACK_SIGNAL)
            text = _read_dump(path, timeout)
        if text is None:
            raise ClusterTimeoutError(f"{name} (pid {proc.pid}) wrote no stack within {timeout:g} s", name, proc.pid)
        return f"{name} (pid {proc.pid}), every thread, most recent call first:\n\n{_main_first(text)}"

    # -- running code --------------------------------------------------------------------------------
    def run(self, fn, *args, timeout: float | None = None, **kwargs) -> list:
        """Run ``fn(*args, **kwargs)`` on every worker at once; the results in rank order. Inside,
        ``fl.cluster.rank()`` and ``fl.cluster.world_size()`` say which worker it is. A remote
        exception is raised here as RemoteError (also an instance of the remote exception's class
        where possible) with the remote traceback and the task's name."""
        self._check_open()
        client = self._res.client
        code, payload = dumps(fn), dumps((args, kwargs))
        client.settle()             # collectives of a task that was silent in an earlier call: in step first
        what = _fn_name(fn)
        pending = [client.submit(t, "run", None, [code, payload], what=what) for t in self.workers]
        return client.gather(pending, timeout)

    def call(self, task, fn, *args, timeout: float | None = None, **kwargs):
        """Run ``fn(*args, **kwargs)`` on one task and return its result."""
        self._check_open()
        client = self._res.client
        pending = client.submit(self._name(task), "run", None, [dumps(fn), dumps((args, kwargs))], what=_fn_name(fn))
        return client.gather([pending], timeout)[0]

    def events(self, clear: bool = False) -> list:
        """Every task's event log (sends, receives, ops), merged and ordered by start time."""
        from .events import Event

        self._check_open()
        live = [t for t in self._tasks if self.status(t) == "alive"]
        replies = self._res.client.request_all(live, "events", {"clear": clear}, timeout=30.0)
        evs = [Event.from_dict(d) for r in replies for d in r.body["events"]]
        evs += self._fault_events(clear)     # kills, pauses, ... done from here
        return sorted(evs, key=lambda e: e.start)

    # -- faults, for teaching ----------------------------------------------------------------------
    def kill(self, task, sig: int = _signal.SIGKILL) -> None:
        """Send ``sig`` (default SIGKILL) to a task's process: ``kill(1)`` kills worker 1.
        ``signal.SIGSTOP`` freezes it instead (``SIGCONT`` wakes it); :meth:`pause` does the same
        and has the cluster show it as ``paused``."""
        name = self._name(task)
        proc = self._res.procs.get(name)
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(sig)
        try:
            signame = _signal.Signals(sig).name
        except ValueError:
            signame = str(sig)
        self._fault_event("kill", name, signal=signame)

    def pause(self, task) -> None:
        """Freeze a task's process (SIGSTOP): it answers nothing, and calls that wait on it fail at
        once with WorkerPausedError naming it; its status is ``paused`` (never ``dead``) until
        :meth:`resume`."""
        name = self._name(task)
        proc = self._res.procs.get(name)
        if proc is None or proc.poll() is not None:
            raise ClusterError(f"{name} is not running, so it cannot be paused ({self.status(name)})", name)
        self._res.monitor.pause(name, restart_call(name).replace("restart", "resume"))
        proc.send_signal(_signal.SIGSTOP)
        self._fault_event("pause", name)

    def resume(self, task) -> None:
        """Wake a task paused by :meth:`pause` (SIGCONT); it answers again."""
        name = self._name(task)
        proc = self._res.procs.get(name)
        if proc is not None and proc.poll() is None:
            proc.send_signal(_signal.SIGCONT)
        self._res.monitor.resume(name)
        self._fault_event("resume", name)
        if name in self._missed and not self.closed:
            self._catch_up(name)

    def _catch_up(self, name):
        """A task that was paused while another was restarted still holds the old group and the
        old spec (with the dead process's death notice): drop that group and send the spec now."""
        self._missed.discard(name)
        try:
            self._res.client.request(name, "coll-sync", {"close": True}, timeout=10.0)
            self._res.client.request(name, "spec", {"cluster": self.spec.as_dict()}, timeout=10.0)
        except ClusterError:   # reported by the next call that uses it
            pass

    def delay(self, task, ms: float, *, timeout: float = 10.0) -> dict:
        """Delay every message ``task`` handles by ``ms`` milliseconds (0 removes the delay)."""
        return self.inject(task, delay_ms=ms, timeout=timeout)

    def drop(self, task, fraction: float, *, seed=None, timeout: float = 10.0) -> dict:
        """Drop ``fraction`` (0..1) of the messages ``task`` receives and of the replies it sends,
        chosen by ``random.Random(seed)``; calls that lose one time out. 0 stops dropping."""
        return self.inject(task, drop=fraction, seed=seed, timeout=timeout)

    def corrupt(self, task, fraction: float, *, seed=None, timeout: float = 10.0) -> dict:
        """Flip a byte in ``fraction`` of the messages ``task`` receives and of the replies it sends:
        the receiver's signature check rejects them (its ``stats["dropped"]`` counts them).

        Collective chunks ``task`` sends over shared memory (same-host peers) carry no signature:
        while this fault is set they carry a CRC-32, ``fraction`` of them get a byte flipped, and
        the receiver's check fails the collective on every rank with a ``CollectiveError`` naming
        ``task``'s rank; a corrupted value is never reduced (see :mod:`flowlab.cluster.faults`)."""
        return self.inject(task, corrupt=fraction, seed=seed, timeout=timeout)

    def inject(self, task, *, delay_ms=None, drop=None, corrupt=None, seed=None, timeout: float = 10.0) -> dict:
        """Set several of a task's faults at once (those left None keep their value); see
        :mod:`flowlab.cluster.faults`. Returns what the task has set now."""
        from .faults import Faults

        self._check_open()
        name = self._name(task)
        Faults(delay_ms or 0.0, drop or 0.0, corrupt or 0.0)     # bad values raise here, naming them
        body = {k: v for k, v in (("delay_ms", delay_ms), ("drop", drop), ("corrupt", corrupt)) if v is not None}
        if seed is not None:
            body["seed"] = seed
        state = self._res.client.request(name, "fault", body, timeout=timeout).body["faults"]
        if any(state.get(k) for k in ("delay_ms", "drop", "corrupt")):
            self._faults_set[name] = state
        else:
            self._faults_set.pop(name, None)
        self._fault_event("inject", name, **body)
        return state

    def faults(self) -> dict:
        """The faults in force, by task: injected ones (``delay_ms``, ``drop``, ``corrupt``),
        ``paused``, and the scheduled ones not yet done (``scheduled``)."""
        out = {t: dict(f) for t, f in self._faults_set.items()}
        for t in self._tasks:
            if self.status(t) == "paused":
                out.setdefault(t, {})["paused"] = True
        pending = [s for s in self._scheduled if not s.done]
        if pending:
            out["scheduled"] = [(s.at, s.action, s.task) for s in pending]
        return out

    def clear_faults(self, timeout: float = 10.0) -> None:
        """Remove every fault: cancel the scheduled ones, resume paused tasks, clear injected
        delays, drops and corruption (dead tasks stay dead: :meth:`restart` them)."""
        for s in self._scheduled:
            s.cancel()
        self._scheduled.clear()
        for t in self._tasks:
            if self.status(t) == "paused":
                self.resume(t)
        live = [t for t in self._tasks if self.status(t) == "alive"]
        if live and not self.closed:
            self._res.client.request_all(live, "fault", {"clear": True}, timeout=timeout)
        for t, f in self._faults_set.items():
            if f.get("drop") or f.get("corrupt"):
                # a call stopped while messages were lost could not confirm its cancel, so its task
                # was marked busy; the request itself was most likely lost: let the next call try
                self._res.client._busy.pop(t, None)
        self._faults_set.clear()
        self._fault_event("clear", None)

    def schedule_fault(self, after_s: float, action: str, task, *args, **kwargs) -> "ScheduledFault":
        """Do ``action`` (``"kill"``, ``"pause"``, ``"resume"``, ``"restart"``, ``"delay"``, ``"drop"``,
        ``"corrupt"``) to ``task`` ``after_s`` seconds from now, with ``args``: e.g.
        ``schedule_fault(2.0, "kill", 1)``. Returns a handle with ``cancel()``, ``wait(timeout)``,
        ``done`` and ``error``; :meth:`clear_faults` and :meth:`close` cancel what has not happened."""
        from .faults import ACTIONS

        if action not in ACTIONS or action == "clear":
            raise ValueError(f"unknown fault {action!r}; schedule one of {[a for a in ACTIONS if a != 'clear']}")
        self._check_open()
        item = ScheduledFault(self, float(after_s), action, self._name(task), args, kwargs)
        self._scheduled.append(item)
        return item

    def schedule_faults(self, plan) -> list:
        """Schedule every ``(after_s, action, task)`` of ``plan`` (e.g. :func:`faults.random_plan`
        with a seed, so a run can be repeated exactly); the handles, in order."""
        return [self.schedule_fault(at, action, task, *rest) for at, action, task, *rest in plan]

    def _fault_event(self, action, task, **attrs):
        from .events import now

        t = now()
        self._recent.append((t, action, task, attrs))
        self._res.client.log.record("fault", action, t, t, task=task, rank=parse_task(task)[1] if task else None,
                                    cluster=id(self), **attrs)

    def _fault_events(self, clear=False) -> list:
        log = self._res.client.log
        evs = [e for e in log.events(kind="fault") if e.attrs and e.attrs.get("cluster") == id(self)]
        if clear:
            self._fault_since = max([self._fault_since] + [e.end for e in evs])
        return [e for e in evs if e.end > self._fault_since]

    def restart(self, task) -> None:
        """End a task's process (if it still runs) and start a new one on the same port when that
        port is free (another otherwise); returns when it is ready. The other tasks of its job
        form their collective group again with the new process at their next collective."""
        self._check_open()
        name = self._name(task)
        with self._lock:
            old = self._res.procs.get(name)
            if old is not None:
                self._res.stop_procs([old], grace=1.0)
                self._res.remove_lanes([self._addresses.get(name)])
                log = self._res.logs.pop(name, None)
                if log is not None:
                    log.close()
            self._res.client.remove(name, why=f"is being restarted ({restart_call(name)} is under way); "
                                              "call it again once that has returned")
            self._faults_set.pop(name, None)
            self._regroup(name)
            port = int(self._addresses[name].rpartition(":")[2]) if name in self._addresses else 0
            self._spawn(name, port, tries=1 if port else None, fallback=True)
            self._res.monitor.wait_ready([name], self._start_timeout)
            self._connect(name)
            withdraw = getattr(self._res.monitor.on_dead, "withdraw", None)
            if old is not None and withdraw is not None:    # the death notice about the old process ends here
                withdraw(self._res.monitor, name, old.pid)
            self._broadcast_spec()
        self._fault_event("restart", name, **({"pid": old.pid} if old is not None else {}))

    def add_worker(self, *, port: int | None = None, timeout: float | None = None) -> str:
        """Start one more worker and return its name, ``/job:worker/task:N`` (N: the old count).

        It gets the cluster's key and, like the others, a free port (``port``: try that one first);
        once it is ready every task is sent the new ClusterSpec, and the next collective forms a new
        group of N+1 ranks (a new communicator, as torchrun's rendezvous does after a membership
        change). :meth:`run`, :attr:`workers`, :meth:`snapshot`, :meth:`status`, :meth:`logs`,
        :meth:`kill`, :meth:`restart`, :meth:`pause` and :meth:`close` all include it.

        A collective that is running while a worker is added is given up on every rank with a
        ``CollectiveError`` saying the group changed (torchrun, too, stops the running workers when
        the membership changes); call it again and it runs on the new group. A task paused now
        catches up when it is resumed. Strategies made before keep their old worker list: make a
        new one to use the new worker. ``timeout``: seconds to wait for it to start (default: the
        cluster's ``start_timeout``)."""
        self._check_open()
        with self._lock:
            self._check_open()
            index = len(self.workers)
            name = task_name("worker", index)
            try:
                self._spawn(name, port, tries=None)
                self._res.monitor.wait_ready([name], self._start_timeout if timeout is None else timeout)
                self._connect(name)
            except BaseException as e:
                self._drop_new(name)
                if isinstance(e, ClusterError):
                    raise ClusterError(f"could not add {name}: {e}", name) from e
                raise
            # only now is it one of the tasks: a run() from another thread meanwhile used the old ones
            self._tasks.insert(self._tasks.index(self.workers[-1]) + 1, name)   # before any ps task
            self._jobs["worker"] = index + 1
            self._broadcast_spec()      # first the spec: a collective started from now on forms the new group
            self._regroup(name)         # then drop the old groups: a collective still running is given up
            if self._res.remote is not None:
                self._res.remote.tasks.add(name)
            self._fault_event("add", name)
            return name

    def _drop_new(self, name):
        """Undo a failed :meth:`add_worker`: end the process, forget the task and its files."""
        res = self._res
        proc = res.procs.pop(name, None)
        if proc is not None:
            res.stop_procs([proc], grace=1.0)
        res.remove_lanes([self._addresses.pop(name, None)])
        log = res.logs.pop(name, None)
        if log is not None:
            log.close()
        res.client.remove(name)
        res.monitor.forget(name)

    def close(self) -> None:
        """End every task and release the sockets and the log folder (idempotent)."""
        if self.closed:
            return
        self.closed = True
        for s in self._scheduled:
            s.cancel()
        if _by_target.get(self._target_or_none()) is self:
            del _by_target[self._target_or_none()]
        self._finalizer()

    def __enter__(self) -> "LocalCluster":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- display ------------------------------------------------------------------------------------
    def _repr_mimebundle_(self, include=None, exclude=None):
        """In a Jupyter kernel with anywidget, a cluster that is a cell's last expression shows
        as its live panel (once), with its text and static HTML table in the same bundle;
        elsewhere None, and it prints as text (``__repr__``) or the table (``_repr_html_``)."""
        from .._display import mimebundle
        return mimebundle(self, include, exclude)

    def show(self) -> None:
        """Display the live panel now (state, CPU, memory, traffic per task; kill, pause, resume,
        restart, stack and log buttons) and return None, so ``cluster.show()`` as a cell's last
        expression draws it once. Outside a kernel it displays nothing. :meth:`panel` returns
        the panel without displaying it; a cluster as a cell's last expression is its panel too."""
        from .._display import show
        show(self)

    def panel(self):
        """The live panel (a widget, the same one each time while it is open), not displayed:
        e.g. ``panel = cluster.panel()`` in a test, or to place it in a layout. Raises ImportError
        without anywidget (the ``lab`` extra)."""
        from .._display import view
        return view(self)

    def __repr__(self) -> str:
        snap = self.snapshot()
        lines = [f"LocalCluster({len(self.workers)} worker(s), {len(self._tasks) - len(self.workers)} ps)"
                 f"{' closed' if self.closed else ''}"]
        for t in snap["tasks"]:
            lines.append(f"  {t['task']:<20} {t['status']:<13} pid {t['pid'] or '-':<8} {t['address'] or '-'}"
                         f"{_dead_note(t)}")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        import html

        snap = self.snapshot()
        colour = {"alive": "#2e7d32", "unresponsive": "#f9a825", "paused": "#1565c0", "dead": "#c62828",
                  "starting": "#616161", "closed": "#616161"}
        rows = "".join(
            f"<tr><td><code>{html.escape(t['task'])}</code></td>"
            f"<td style='color:{colour.get(t['status'], '#000')}'>&#9679; {t['status']}"
            f"{html.escape(_dead_note(t))}</td>"
            f"<td>{t['pid'] or '-'}</td><td><code>{html.escape(t['address'] or '-')}</code></td></tr>"
            for t in snap["tasks"])
        title = f"LocalCluster: {len(self.workers)} worker(s)" + (" (closed)" if self.closed else "")
        return (f"<div class='flowlab-cluster'><b>{html.escape(title)}</b><table>"
                f"<tr><th>task</th><th>status</th><th>pid</th><th>address</th></tr>{rows}</table></div>")

    # -- the machinery -----------------------------------------------------------------------------
    def _name(self, task) -> str:
        name = task_name(*parse_task(task))
        if name not in self._tasks:
            raise ValueError(f"this cluster has no task {task!r} (it has {self._tasks})")
        return name

    def _check_open(self):
        if self.closed:
            raise ClusterError("this LocalCluster is closed; start a new one")

    def _target_or_none(self):
        address = self._addresses.get(self._tasks[0])
        return f"flowlab://{address}" if address else None

    def _log_path(self, task):
        return os.path.join(self._res.tmpdir or "", task.strip("/").replace("/", "_").replace(":", "-") + ".log")

    def _stack_path(self, task):
        """Where ``task``'s process writes its stack when asked (:meth:`stack`)."""
        return self._log_path(task)[:-len(".log")] + ".stack"

    def _spawn(self, task, port, tries=None, fallback=False):
        from .worker import command, spawn

        job, index = parse_task(task)
        res = self._res
        log = res.logs[task] = open(self._log_path(task), "ab")
        proc = spawn(command(self._python), stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT,
                     start_new_session=True, env=self._env, close_fds=True)
        res.procs[task] = proc
        res.monitor.watch(task, proc, self._log_path(task))
        cfg = {"key": self._key.hex(), "job": job, "index": index, "bind": "127.0.0.1",
               "port": port or 0, "port_tries": tries or (200 if port else 1), "heartbeat": self._heartbeat,
               "monitor": {"address": res.monitor.address, "id": res.monitor.id}, "preload": self._preload,
               "sys_path": [os.path.abspath(p) if p else os.getcwd() for p in sys.path],
               "stack_file": self._stack_path(task)}
        if fallback and port:
            cfg["port_fallback"] = True
        try:
            proc.stdin.write(json.dumps(cfg).encode() + b"\n")
            proc.stdin.flush()
        except BrokenPipeError:   # it died at once; the monitor reports how
            pass

    def _connect(self, task):
        state = self._res.monitor.state(task)
        self._addresses[task] = state.address
        self._res.client.add(task, state.address, state.server_id, state.pid)

    def _regroup(self, task):
        """Have the other live tasks of ``task``'s job drop their collective group, which still
        holds the old process (gone, its rings, its sequence numbers): their next collective forms
        the group again, with the new process, every rank counting from the start."""
        job = parse_task(task)[0]
        others = [t for t in self._tasks if t != task and parse_task(t)[0] == job and self.status(t) == "alive"]
        self._missed.update(t for t in self._tasks if t != task and self.status(t) == "paused")
        self._tell_silent([t for t in self._tasks if t != task and parse_task(t)[0] == job
                           and self.status(t) == "unresponsive"], "coll-sync", {"close": True})
        if others:
            try:
                self._res.client.request_all(others, "coll-sync", {"close": True}, timeout=10.0)
            except ClusterError:   # a task that fails here is reported by the next call that uses it
                pass

    def _broadcast_spec(self):
        body = {"cluster": self.spec.as_dict()}
        self._tell_silent([t for t in self._tasks if self.status(t) == "unresponsive"], "spec", body)
        live = [t for t in self._tasks if self.status(t) == "alive"]
        try:
            self._res.client.request_all(live, "spec", body, timeout=30.0)
        except ClusterError as e:
            # paused or silent since it was asked: the spec waits in its socket and is read, in order,
            # when it runs again (a restart that had done its work used to raise WorkerPausedError here)
            if e.task not in self._tasks or self.status(e.task) not in ("paused", "unresponsive"):
                raise

    def _tell_silent(self, tasks, type, body):
        """Send ``type`` to tasks that are *unresponsive* (late heartbeats: a loaded machine, a long C
        call, a SIGSTOP from elsewhere) without waiting for them: each reads it once it runs again, in
        order after whatever this client sent it before (its reply is never awaited). Skipping them
        left a restart's old group and death notice on them for good; waiting would hold the restart
        up for as long as they stay silent."""
        for t in tasks:
            try:
                self._res.client.submit(t, type, body)
            except ClusterError:   # not connected, or its socket is full: the next call reports it
                pass
