"""Liveness: is each task alive, and if not, what exactly happened to it?

Two signals, because each misses what the other sees:

- a **process watch**: the monitor polls each child process it started; an exit (crash, kill,
  ``sys.exit``) is seen within ``poll`` seconds, with its exit code or signal;
- **heartbeats**: each task sends a small signed message every ``interval`` seconds from a thread
  of its own; a process that exists but sends none for ``timeout`` seconds (stopped with SIGSTOP,
  frozen, starved) is *unresponsive*. When heartbeats come back (SIGCONT) it is alive again.

The same channel carries each task's ``ready`` message (its address, pid and server id), which is
how a LocalCluster knows its workers are up without sleeping. A call that waits on a task asks
:meth:`Monitor.problem` and raises the error it gets, naming the task, its pid, its exit code or
signal, and the last lines of its log.

One caveat for teaching: a heartbeat thread needs the GIL; a C extension that holds it for longer
than ``timeout`` makes its task look unresponsive until it lets go.
"""
from __future__ import annotations

import os
import threading
import time

from .errors import (ClusterTimeoutError, ProtocolError, WorkerDiedError, WorkerPausedError,
                     WorkerUnresponsiveError, describe_exit)
from . import schemes as _schemes
from .protocol import Signer, Verifier, new_id
from .unix import remove_if_dead

__all__ = ["Heartbeat", "Monitor", "TaskState", "log_tail", "process_state"]

_monotonic = time.monotonic


def log_tail(path, lines: int = 12, max_bytes: int = 8192) -> str | None:
    """The last ``lines`` lines of a log file (None if there is none)."""
    if not path:
        return None
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            data = f.read().decode("utf-8", "replace")
    except OSError:
        return None
    tail = data.splitlines()[-lines:]
    return "\n".join(tail) if tail else None


def process_state(pid) -> str | None:
    """The kernel's state letter for ``pid`` with its meaning (``T (stopped)``), Linux only."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None
    meaning = {"R": "running", "S": "sleeping", "D": "disk sleep", "T": "stopped", "t": "traced",
               "Z": "zombie", "X": "dead"}.get(state, "?")
    return f"{state} ({meaning})"


class Heartbeat:
    """A task's side: a daemon thread that sends ``ready`` once, then a heartbeat every
    ``interval`` seconds, to the monitor at ``address`` (whose id is ``monitor_id``)."""

    def __init__(self, transport, key, address: str, monitor_id: str, task: str, info: dict,
                 interval: float = 0.25):
        self._conn = _schemes.keyed(transport, key).connect(address)
        self._signer = Signer(key, new_id("hb"))
        self._to, self.task, self.info, self.interval = monitor_id, task, info, interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="flowlab-heartbeat", daemon=True)

    def start(self) -> "Heartbeat":
        self._thread.start()
        return self

    def _run(self):
        pack, send, body = self._signer.pack, self._conn.send, {"task": self.task}
        try:
            send(pack("ready", self._to, {"task": self.task, **self.info}))
            while not self._stop.wait(self.interval):
                send(pack("hb", self._to, body))
        except Exception:   # the monitor is gone (closed or crashed): nothing left to tell
            pass

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self._conn.close()


class TaskState:
    """What the monitor knows about one task."""
    __slots__ = ("task", "proc", "log_path", "pid", "address", "server_id", "ready", "last_seen",
                 "exitcode", "status", "info", "paused")

    def __init__(self, task, proc=None, log_path=None):
        self.task, self.proc, self.log_path = task, proc, log_path
        self.pid = getattr(proc, "pid", None)
        self.address = self.server_id = None
        self.ready = threading.Event()
        self.last_seen = None
        self.exitcode = None
        self.status = "starting"      # starting, alive, unresponsive, paused, dead, closed
        self.info: dict = {}
        self.paused = None            # when paused on purpose (Monitor.pause): (since, how to resume)

    def snapshot(self) -> dict:
        return {"task": self.task, "status": self.status, "alive": self.status in ("alive", "unresponsive", "paused"),
                "pid": self.pid, "address": self.address, "exitcode": self.exitcode}


class Monitor:
    """The client's side: a thread that receives ready messages and heartbeats on its own
    listener, polls the processes it watches, and keeps each task's status."""

    def __init__(self, transport, key, *, interval: float = 0.25, timeout: float = 1.5, poll: float = 0.1):
        transport = _schemes.keyed(transport, key)   # a keyed TCP handshake
        self.transport, self.interval, self.timeout, self.poll = transport, interval, timeout, poll
        self.id = new_id("monitor")
        self._listener = transport.listen(port=0)     # on the transport's own host: 127.0.0.1, inproc
        self.address = self._listener.address
        self._verifier = Verifier(key, self.id)
        if hasattr(self._listener, "check_with"):     # headers checked before buffers are received
            self._listener.check_with(self._verifier.admit)
        self._tasks: dict[str, TaskState] = {}
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._stop = threading.Event()
        self.dropped = 0
        self.restart_hint = None    # restart_hint(task) -> the call that restarts it ("cluster.restart(1)")
        self.on_dead = None         # on_dead(monitor, state), in this thread, once per task seen dead
        self._thread = threading.Thread(target=self._run, name="flowlab-monitor", daemon=True)
        self._thread.start()

    # -- what the cluster tells it -------------------------------------------------------------
    def watch(self, task: str, proc=None, log_path=None) -> TaskState:
        """Start watching ``task`` (a new incarnation replaces the old one): ``proc`` has ``pid``
        and ``poll()`` (a ``subprocess.Popen``)."""
        state = TaskState(task, proc, log_path)
        with self._lock:
            self._tasks[task] = state
        return state

    def forget(self, task: str, status: str = "closed") -> None:
        with self._lock:
            state = self._tasks.get(task)
            if state is not None:
                state.status = status
                state.proc = None

    def state(self, task: str) -> TaskState | None:
        return self._tasks.get(task)

    def pause(self, task: str, hint: str | None = None) -> None:
        """``task`` was stopped on purpose (SIGSTOP): report it as ``paused``, not unresponsive or
        dead, until :meth:`resume`. ``hint``: the call that wakes it (``cluster.resume(1)``)."""
        with self._changed:
            state = self._tasks.get(task)
            if state is not None and state.status not in ("dead", "closed"):
                state.paused, state.status = (_monotonic(), hint), "paused"
                self._changed.notify_all()

    def resume(self, task: str) -> None:
        """``task`` was woken (SIGCONT): alive again, its silence counted from now."""
        with self._changed:
            state = self._tasks.get(task)
            if state is not None and state.paused is not None:
                state.paused = None
                if state.status == "paused":
                    state.status, state.last_seen = ("alive" if state.ready.is_set() else "starting"), _monotonic()
                self._changed.notify_all()

    def describe(self, task: str) -> dict | None:
        """What a root-cause report shows of ``task``: pid, status, how it ended, its log's path."""
        state = self._tasks.get(task)
        if state is None:
            return None
        code = state.exitcode
        return {"task": task, "pid": state.pid, "status": state.status, "log_path": state.log_path,
                "exit": describe_exit(code) if code is not None else None}

    def snapshot(self) -> list[dict]:
        with self._lock:
            return [s.snapshot() for s in self._tasks.values()]

    # -- what callers ask ----------------------------------------------------------------------
    def problem(self, task: str, doing: str | None = None):
        """The error a call waiting on ``task`` should raise now, or None while it is healthy."""
        state = self._tasks.get(task)
        if state is None or state.status in ("alive", "starting"):
            return None
        restart = self.restart_hint(task) if self.restart_hint is not None else None
        if state.status == "dead":
            code = state.exitcode
            return WorkerDiedError(task, state.pid, code if code is None or code >= 0 else None,
                                   -code if code is not None and code < 0 else None,
                                   log_tail(state.log_path), doing, restart)
        if state.status == "paused":
            since, hint = state.paused or (_monotonic(), None)
            return WorkerPausedError(task, state.pid, _monotonic() - since,
                                     process_state(state.pid) if state.pid else None, log_tail(state.log_path),
                                     doing, hint)
        if state.status == "unresponsive":
            silent = _monotonic() - state.last_seen if state.last_seen else self.timeout
            return WorkerUnresponsiveError(task, state.pid, silent, process_state(state.pid) if state.pid else None,
                                           log_tail(state.log_path), doing, restart)
        return WorkerDiedError(task, state.pid, log_tail=None, doing=doing or "the cluster was closed")

    def wait_ready(self, tasks, timeout: float) -> None:
        """Return once every task in ``tasks`` has said ``ready``; raise the first task's problem
        (it died while starting) or a timeout error naming the tasks still starting."""
        deadline = _monotonic() + timeout
        while True:
            with self._changed:
                dead = next((t for t in tasks if self._tasks[t].status == "dead"), None)
                pending = [t for t in tasks if not self._tasks[t].ready.is_set()]
                left = deadline - _monotonic()
                if dead is None and pending and left > 0:
                    self._changed.wait(min(left, 0.1))
                    continue
            if dead is not None:
                raise self.problem(dead, "starting")
            if not pending:
                return
            first = self._tasks[pending[0]]
            raise ClusterTimeoutError(f"{', '.join(pending)} did not start within {timeout:g} s",
                                      pending[0], first.pid, log_tail(first.log_path))

    # -- the thread ------------------------------------------------------------------------------
    def _run(self):
        recv, unpack = self._listener.recv, self._verifier.unpack
        next_check = last_loop = _monotonic()
        while not self._stop.is_set():
            item = recv(self.poll)
            now = _monotonic()
            while item is not None:
                try:
                    msg = unpack(item[1])
                except ProtocolError:
                    self.dropped += 1
                else:
                    self._heard(msg, now)
                item = recv(0)
            if now - last_loop > self.timeout / 2:
                # this thread itself was held up (a busy kernel, a suspended laptop): nobody's
                # silence can be judged on this round
                with self._lock:
                    for s in self._tasks.values():
                        if s.last_seen is not None:
                            s.last_seen = max(s.last_seen, now)
            last_loop = now
            if now >= next_check:
                next_check = now + self.poll
                self._check(now)
        self._listener.close()

    def _heard(self, msg, now):
        task = msg.body.get("task")
        with self._changed:
            state = self._tasks.get(task)
            if state is None or state.status in ("dead", "closed"):
                return
            if state.paused is not None and msg.type == "hb":
                return      # sent before the stop; a paused task stays paused until resumed
            if msg.type == "ready":
                if state.pid is not None and msg.body.get("pid") != state.pid:
                    return     # a message from an earlier incarnation
                state.address, state.server_id = msg.body.get("address"), msg.body.get("id")
                state.info = dict(msg.body)
                state.ready.set()
                state.status = "alive" if state.paused is None else "paused"
                self._changed.notify_all()
            elif msg.type == "hb" and state.ready.is_set() and state.status == "unresponsive":
                state.status = "alive"
                self._changed.notify_all()
            state.last_seen = now

    def _check(self, now):
        changed, died = False, []
        with self._lock:
            states = list(self._tasks.values())
        for s in states:
            if s.status in ("dead", "closed"):
                continue
            proc = s.proc
            code = proc.poll() if proc is not None else None
            with self._changed:
                if code is not None and s.status not in ("dead", "closed"):
                    s.exitcode, s.status, changed = code, "dead", True
                    died.append(s)
                    if s.address:
                        remove_if_dead(s.address)    # the local-lane socket a killed task left
                elif s.paused is not None:
                    continue
                elif (s.status == "alive" and s.last_seen is not None and now - s.last_seen > self.timeout):
                    s.status, changed = "unresponsive", True
        if changed:
            with self._changed:
                self._changed.notify_all()
        for s in died if self.on_dead is not None else ():
            self.on_dead(self, s)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
