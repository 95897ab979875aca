"""``Client``: requests to a cluster's tasks, and their replies, with deadlines and liveness.

A client holds one connection per task. ``request(task, type, body, buffers)`` sends one signed
message and returns the checked reply (a :class:`~flowlab.cluster.protocol.Message`); a reply
with ``ok`` false raises :class:`RemoteError`. ``submit`` sends without waiting and ``result``
collects, so one request can go to every task before any reply is awaited.

While it waits, a client asks its ``health(task)`` callable (a LocalCluster's liveness monitor)
every ``HEALTH_EVERY`` seconds and raises the error it returns (the task died or stopped
answering), so no call waits on a task that cannot answer. Without ``health``, calls wait at most
their ``timeout``.

A KeyboardInterrupt while a call waits (the notebook's Interrupt button) sends each task that has
not answered a signed ``cancel`` for its request, waits up to ``CANCEL_WAIT`` seconds for them to
confirm, and raises :class:`~flowlab.cluster.errors.Interrupted` saying what was cancelled and
what still runs. A task whose work did not stop is *busy*: the next ``run``/``op``/``partition``/
``push`` request to it raises :class:`~flowlab.cluster.errors.WorkerBusyError` naming it and how to
end it (``stop_hint(task)``, e.g. ``cluster.restart(1)``), instead of queueing silently behind it.

A call on several tasks that fails on one of them (its code raised, it died or hung, or the
call's deadline passed) stops the rest the same way before the error is raised: the unanswered
``run``/``op``/``partition``/``push`` requests get a ``cancel``, and the error's message gains
lines naming the task that failed first (a peer's death before the collective error it caused
on another rank) and what became of each other task; its ``cancelled`` and ``still_running``
attributes list them. After a stop (failure or interrupt), the stopped tasks' collectives are
brought back in step (``coll-sync``: every rank of a job moves to the furthest one's count of
collectives), so the next collective matches on every rank. A task that failed the call by going
silent (paused, unresponsive) is sent the cancel too: it reads it when it runs again, right behind
the request, so that request never starts late there; its collectives are brought in step with the
others' before the next request that runs work, once it answers again.
"""
from __future__ import annotations

import sys
import threading
import time

from . import events as _events
from . import schemes as _schemes
from .errors import (ClusterError, ClusterTimeoutError, Interrupted, ProtocolError, WorkerBusyError,
                     WorkerUnresponsiveError, describe_exit, remote_error)
from .protocol import Pickled, Signer, Verifier, dumps, loads, new_id
from .spec import ClusterSpec, parse_task, task_name

__all__ = ["Client", "Pending"]

HEALTH_EVERY = 0.1          # seconds between liveness checks while a call waits
DEFAULT_TIMEOUT = 60.0      # a control call's deadline when none is given
CANCEL_WAIT = 3.0           # seconds an interrupted call waits for its tasks to confirm the cancel
BUSY_WAIT = 0.5             # seconds a request to a busy task waits for the interrupted work to end
SYNC_TIMEOUT = 10.0         # seconds to bring the tasks' collectives back in step after a stopped call
_QUEUED = frozenset(("run", "op", "partition", "push"))   # requests that queue behind running work
_BYTES = frozenset((bytes, Pickled))   # frames whose len() is their size in bytes, told apart quickly
_RUNS = {"partition": "step"}     # what a queued request runs, for views, when the caller does not say
_SECONDARY = frozenset(("PeerLostError", "CollectiveError", "CollectiveTimeoutError"))  # failed because a peer did
_monotonic = time.monotonic
_NOTHING_STOPPED = {"gone": (), "running": ()}    # an outcome of _stop for _resync that skips no task


class Pending:
    """A request sent and not yet answered: ``task`` and ``seq`` (the reply's ``re``); ``error``:
    how it failed, once a stopped call has sorted it (see ``Client._stop``)."""
    __slots__ = ("task", "seq", "type", "sent", "error", "what")

    def __init__(self, task, seq, type, sent):
        self.task, self.seq, self.type, self.sent = task, seq, type, sent   # ``error``: set only when sorted
        self.what = None    # what it runs there, for error reports (a function's name), where known

    def __repr__(self):
        return f"<Pending {self.type} to {self.task} seq={self.seq}>"


def _size(frame) -> int:
    """A frame's length in bytes (a numpy array's ``len`` counts rows, its ``nbytes`` bytes)."""
    n = getattr(frame, "nbytes", None)
    return len(frame) if n is None else n


class _Peer:
    """One task as this client reaches it. Besides the connection it counts this client's traffic
    with the task (``msgs_out``/``bytes_out`` sent, ``msgs_in``/``bytes_in`` received: plain adds
    under ``lock``, which every send and receive holds anyway), and knows the work in flight:
    ``work``, the seq of the last ``run``/``op``/``partition``/``push`` request sent (None once
    its reply came: tasks run such requests one after another, so the last reply means idle),
    and ``running``, what that request runs (see :meth:`Client.submit`)."""
    __slots__ = ("task", "address", "conn", "server_id", "lock", "stash", "pid",
                 "msgs_in", "msgs_out", "bytes_in", "bytes_out", "work", "running")

    def __init__(self, task, address, conn, server_id=None, pid=None):
        self.task, self.address, self.conn, self.server_id, self.pid = task, address, conn, server_id, pid
        self.lock = threading.Lock()
        self.stash: dict = {}   # replies that arrived while another call was reading
        self.msgs_in = self.msgs_out = self.bytes_in = self.bytes_out = 0
        self.work = self.running = None

    def __repr__(self):
        return f"<peer {self.task} at {self.address} over {getattr(self.conn, 'lane', '?')}>"


def root_cause_table(rows) -> str:
    """Plain text for a notebook: one aligned line per task, the first failure first, then the
    last lines of the log of each task that failed (``rows``: dicts with task, pid, state, exit,
    doing, log)."""
    head = ("#", "task", "pid", "state", "exit / error", "running")
    cells = [head] + [(str(i + 1), r["task"], str(r["pid"] or "-"), r["state"], r["exit"], r["doing"])
                      for i, r in enumerate(rows)]
    widths = [max(len(c[k]) for c in cells) for k in range(len(head))]
    lines = ["root cause (first failure first):"]
    lines += ["  " + "  ".join(c[k].ljust(widths[k]) for k in range(len(head))).rstrip() for c in cells]
    for r in rows:
        if r.get("log"):
            lines.append(f"  last lines of {r['task']}'s log:")
            lines += ["    | " + ln[:200] for ln in r["log"].splitlines()]
    return "\n".join(lines)


def _checker(health, task):
    return lambda: health(task)


def _secondary(error) -> bool:
    """Whether ``error`` is a collective that failed because of a peer (lost, gave up, timed out)."""
    return getattr(error, "remote_type", None) in _SECONDARY


def _answered(pendings, left) -> list:
    """The requests of a call on several tasks that have answered (not in ``left``)."""
    return [p for j, p in enumerate(pendings) if j not in left]


def _still_there(error) -> bool:
    """Whether ``error`` says the task stopped answering but still exists (paused, unresponsive):
    the request it was sent waits there, to run once the task runs again."""
    return isinstance(error, WorkerUnresponsiveError)     # WorkerPausedError is one too


def _first_line(error) -> str:
    return str(error).partition("\n")[0]


def _where(outcome, pending) -> str:
    return next(k for k, ps in outcome.items() if pending in ps)


class Client:
    """Talks to tasks by name (``/job:worker/task:1``). ``key``: the cluster key;
    ``transport``: as for Server (by default each task's transport is the one its address's scheme
    names, see :mod:`.schemes`); ``health``: ``health(task) -> exception or None``."""

    def __init__(self, key, *, transport=None, health=None, name: str = "client", event_log=None):
        self.key = key
        self.transport = None if transport is None else _schemes.resolve(transport, key)   # None: by address
        self.id = new_id(name)
        self.health = health
        self.log = event_log if event_log is not None else _events.default_log()
        self._signer = Signer(key, self.id)
        self._verifier = Verifier(key, self.id)
        self._peers: dict[str, _Peer] = {}
        self._lock = threading.Lock()
        self.dropped = 0
        self.stop_hint = None       # stop_hint(task) -> how a user ends that task's process, e.g. "cluster.restart(1)"
        self.describe = None        # describe(task) -> {"pid", "status", "exit", "log_path"}: root-cause table rows
        self._busy: dict = {}       # task -> (Pending, when): interrupted work that did not stop
        self._away: dict = {}       # task -> why it was removed, said to a call that asks for it meanwhile
        self._unsynced: dict = {}   # silent task whose work was cancelled -> the tasks of that call (see settle)
        self._counted: dict = {}    # task -> the traffic counts of its peer before a remove (kept over restarts)

    @classmethod
    def connect(cls, spec, key, *, transport=None, timeout: float = 10.0) -> "Client":
        """A client to every task of ``spec`` (a ClusterSpec or dict), each greeted with ``hello``."""
        spec = spec if isinstance(spec, ClusterSpec) else ClusterSpec(spec)
        client = cls(key, transport=transport)
        for task in spec.tasks():
            client.add(task, spec.address_of(task), timeout=timeout)
        return client

    # -- tasks ---------------------------------------------------------------------------------
    def add(self, task, address: str, server_id: str | None = None, pid: int | None = None,
            timeout: float = 10.0) -> None:
        """Connect to ``task`` at ``address``. Without ``server_id`` (the server's random id, which
        every request names so it cannot be replayed to another server), ask it with ``hello``."""
        task = task_name(*parse_task(task))
        self._busy.pop(task, None)
        with self._lock:
            old = self._peers.pop(task, None)
            if old is not None:
                old.conn.close()
            conn = (self.transport or _schemes.for_address(address, self.key)).connect(address)
            if self.health is not None and hasattr(conn, "check"):   # a blocked send asks it too
                conn.check = _checker(self.health, task)
            peer = _Peer(task, address, conn, server_id, pid)
            counted = self._counted.pop(task, None)
            if counted is not None:     # a restarted task: its counts go on from the old process's
                peer.msgs_in, peer.msgs_out, peer.bytes_in, peer.bytes_out = counted
            self._peers[task] = peer
            # only now: a call from another thread meanwhile (a restart run by a fault schedule)
            # still hears why the task is away, never "not connected"
            self._away.pop(task, None)
        if server_id is None:
            try:
                reply = self.request(task, "hello", timeout=timeout)
            except BaseException:   # no half-made peer whose requests nobody would accept: the next add tries again
                with self._lock:
                    if self._peers.get(task) is peer:
                        del self._peers[task]
                conn.close()
                raise
            peer.server_id, peer.pid = reply.body["id"], reply.body["pid"]

    def remove(self, task, why: str | None = None) -> None:
        """Forget ``task``; a call to it meanwhile raises a ClusterError that says ``why`` (e.g.
        ``"is being restarted"``), until it is added again."""
        self._busy.pop(task_name(*parse_task(task)), None)
        self._unsynced.pop(task_name(*parse_task(task)), None)    # a new process starts a new group
        if why:
            self._away[task_name(*parse_task(task))] = why
        with self._lock:
            peer = self._peers.pop(task_name(*parse_task(task)), None)
            if peer is not None:
                self._counted[peer.task] = (peer.msgs_in, peer.msgs_out, peer.bytes_in, peer.bytes_out)
        if peer is not None:
            peer.conn.close()

    def tasks(self) -> list[str]:
        return list(self._peers)

    def server_id(self, task):
        """The id of the server this client reaches as ``task`` (None: not known or not connected)."""
        peer = self._peers.get(task)
        return None if peer is None else peer.server_id

    def lane(self, task) -> str:
        """How this client reaches ``task``: ``"unix"`` (the local lane, see :mod:`.unix`),
        ``"tcp"`` (ZeroMQ) or ``"inproc"``."""
        return getattr(self._peer(task).conn, "lane", "?")

    def traffic(self, drain: bool = True) -> dict:
        """Per connected task, what this client knows of it without asking it: ``{"busy": a
        run/op/partition/push request is in flight to it, "running": what that request runs
        (see :meth:`submit`) or None, "msgs_in", "msgs_out", "bytes_in", "bytes_out": this
        client's messages and bytes from and to it}``. Safe from any thread, and cheap (no
        message is sent). ``drain``: first read the replies already waiting on connections that
        no call is reading now (a request submitted and not yet collected, as a parameter-server
        step is), so a task that has answered shows idle; they are kept for their callers."""
        out = {}
        for task, peer in list(self._peers.items()):
            if drain and peer.work is not None and peer.lock.acquire(blocking=False):
                try:
                    self._read_waiting(peer)
                except Exception:   # noqa: BLE001 - a connection that fails is reported by its next call
                    pass
                finally:
                    peer.lock.release()
            work = peer.work
            out[task] = {"busy": work is not None, "running": peer.running if work is not None else None,
                         "msgs_in": peer.msgs_in, "msgs_out": peer.msgs_out,
                         "bytes_in": peer.bytes_in, "bytes_out": peer.bytes_out}
        return out

    def _read_waiting(self, peer) -> None:
        """Stash every reply ``peer``'s connection holds now (``peer.lock`` held; no wait)."""
        frames = peer.conn.recv(0)
        while frames is not None:
            self._count_in(peer, frames)
            try:
                m = self._verifier.unpack(frames)
            except ProtocolError as e:
                self._dropped(peer, e)
            else:
                re = m.body.get("re")
                if re == peer.work:
                    peer.work = None
                peer.stash[re] = m
                if len(peer.stash) > 1000:
                    peer.stash.pop(next(iter(peer.stash)))
            frames = peer.conn.recv(0)

    @staticmethod
    def _count_in(peer, frames) -> None:
        size = 0
        for f in frames:
            size += len(f) if f.__class__ in _BYTES else _size(f)
        peer.msgs_in += 1
        peer.bytes_in += size

    @property
    def stats(self) -> dict:
        """``{"lanes": {task: lane}, "dropped": replies dropped}``."""
        return {"lanes": {t: getattr(p.conn, "lane", "?") for t, p in list(self._peers.items())},
                "dropped": self.dropped}

    def __contains__(self, task):
        return task in self._peers

    # -- requests ------------------------------------------------------------------------------
    def submit(self, task: str, type: str, body=None, buffers=(), sign_buffers: bool = False,
               what: str | None = None) -> Pending:
        """Send one request to ``task`` without waiting for its reply. ``what``: what it runs there
        (a function's name), for views (:meth:`traffic`) and error reports; an ``op`` request
        names its op type, a ``partition`` request is a ``step``, others their type."""
        peer = self._peers.get(task)
        if peer is None:
            peer = self._peer(task)
        if self._busy and type in _QUEUED and peer.task in self._busy:
            self._check_busy(peer, type)
        if self._unsynced and type in _QUEUED:
            self.settle()
        to = peer.server_id or "*"
        seq = self._signer.next_seq()
        frames = self._signer.pack(type, to, body, buffers, sign_buffers, seq)
        size = 0
        for f in frames:
            size += len(f) if f.__class__ in _BYTES else _size(f)
        with peer.lock:
            peer.conn.send(frames)
            peer.msgs_out += 1
            peer.bytes_out += size
            if type in _QUEUED:
                peer.work = seq
                peer.running = what or (body.get("op") if type == "op" and body else _RUNS.get(type, type))
        pending = Pending(task, seq, type, _monotonic())
        if what is not None:
            pending.what = what
        return pending

    def result(self, pending: Pending, timeout: float | None = DEFAULT_TIMEOUT):
        """The reply to ``pending``; raises RemoteError if the handler raised, the health error if
        the task died or hung, ClusterTimeoutError after ``timeout`` seconds (None: no deadline)."""
        try:
            msg = self._poll(pending, HEALTH_EVERY if timeout is None else min(HEALTH_EVERY, timeout))
        except KeyboardInterrupt:
            self._interrupted([pending])
        if msg is None:                        # not within the first slice: the full wait
            return self.results([pending], timeout)[0]
        if not msg.body.get("ok"):
            raise self._failed(self._remote_error(self._peers.get(pending.task), msg.body.get("error") or {}),
                               pending, [])
        return msg

    def results(self, pendings, timeout: float | None = DEFAULT_TIMEOUT) -> list:
        """The replies to several requests, in order. Waits on all at once: the first task that
        fails (remote error, death, silence) raises at once, whatever its place in the list."""
        n = len(pendings)
        out = [None] * n
        left = list(range(n))
        try:
            return self._results(pendings, timeout, out, left)
        except KeyboardInterrupt:
            self._interrupted([pendings[i] for i in left])

    def _results(self, pendings, timeout, out, left):
        deadline = None if timeout is None else _monotonic() + timeout
        health = self.health
        while left:
            wait = HEALTH_EVERY if deadline is None else max(0.0, min(HEALTH_EVERY, deadline - _monotonic()))
            for i in list(left):
                msg = self._poll(pendings[i], wait if i == left[0] else 0.0)
                if msg is not None:
                    if not msg.body.get("ok"):
                        left.remove(i)
                        raise self._failed(self._remote_error(self._peers.get(pendings[i].task),
                                                              msg.body.get("error") or {}),
                                           pendings[i], [pendings[j] for j in left], _answered(pendings, left))
                    out[i] = msg
                    left.remove(i)
            if not left:
                break
            if health is not None:
                for i in left:
                    problem = health(pendings[i].task)
                    if problem is not None:
                        raise self._failed(problem, pendings[i], [pendings[j] for j in left if j != i],
                                           _answered(pendings, left))
            if deadline is not None and _monotonic() >= deadline:
                p = pendings[left[0]]
                peer = self._peers.get(p.task)
                err = ClusterTimeoutError(f"{p.task} did not answer a {p.type!r} request within {timeout:g} s",
                                          p.task, peer.pid if peer else None)
                raise self._failed(err, None, [pendings[j] for j in left], _answered(pendings, left))
        return out

    def _poll(self, pending: Pending, wait: float):
        """The reply to ``pending`` if it arrives within ``wait`` seconds, else None; other replies
        read on the way are kept for their own callers."""
        peer = self._peers.get(pending.task) or self._peer(pending.task)
        seq = pending.seq
        with peer.lock:
            msg = peer.stash.pop(seq, None)
            if msg is not None:
                return msg
            frames = peer.conn.recv(wait)
            while frames is not None:
                size = 0
                for f in frames:
                    size += len(f) if f.__class__ in _BYTES else _size(f)
                peer.msgs_in += 1
                peer.bytes_in += size
                try:
                    m = self._verifier.unpack(frames)
                except ProtocolError as e:
                    self._dropped(peer, e)
                else:
                    re = m.body.get("re")
                    if re == peer.work:       # the last work sent to it is answered: idle
                        peer.work = None
                    if re == seq:
                        return m
                    peer.stash[re] = m
                    if len(peer.stash) > 1000:   # answers nobody waits for any more
                        peer.stash.pop(next(iter(peer.stash)))
                frames = peer.conn.recv(0)
        return None

    def request(self, task: str, type: str, body=None, buffers=(), timeout: float | None = DEFAULT_TIMEOUT,
                sign_buffers: bool = False):
        """Send one request and wait for its reply (see :meth:`result`)."""
        return self.result(self.submit(task, type, body, buffers, sign_buffers), timeout)

    def request_all(self, tasks, type: str, body=None, buffers=(), timeout=DEFAULT_TIMEOUT) -> list:
        """The same request to every task in ``tasks`` (all sent before any reply is awaited);
        the replies in the order of ``tasks``."""
        return self.results([self.submit(t, type, body, buffers) for t in tasks], timeout)

    # -- interrupts and failures -------------------------------------------------------------------
    def _interrupted(self, waiting):
        """Cancel ``waiting`` on their tasks, wait up to CANCEL_WAIT s for each to stop, bring the
        stopped tasks' collectives back in step, raise Interrupted."""
        outcome = self._stop(waiting)
        note = self._resync([p.task for p in waiting], outcome)
        message = self._interrupt_message(outcome) + (f"\n  {note}" if note else "")
        raise Interrupted(message, [p.task for p in outcome["cancelled"]],
                          [p.task for p in outcome["running"]]) from None

    def _failed(self, error, failed, others, answered=()):
        """``error`` (the first failure of a call on several tasks: ``failed``'s reply or health, or
        a deadline when ``failed`` is None) with the rest of the call stopped: the ``others`` that
        queue work (run, op, partition, push) are cancelled as for an interrupt, their collectives
        are brought back in step, and the error's message says what happened to each (as its
        ``cancelled``/``still_running`` attributes do), so nothing runs on behind the error.
        ``answered``: the call's requests that already succeeded; a rank that finished may be a
        collective ahead of the one that failed, so they are brought back in step too."""
        others = [p for p in others if p.type in _QUEUED]
        answered = [p.task for p in answered if p.type in _QUEUED]
        silent = [failed] if failed is not None and failed.type in _QUEUED and _still_there(error) else []
        if not others:
            if silent:
                self._stop([], silent)
            if failed is not None and failed.type in _QUEUED and answered:
                self._resync([failed.task, *answered], {"gone": [], "running": []}, silent)
            return self._root_cause(error, failed, None)
        outcome = self._stop(others, silent)
        tasks = ([failed.task] if failed is not None else []) + [p.task for p in others] + answered
        note = self._resync(tasks, outcome, silent)
        if failed is not None and _secondary(error):   # a collective that failed because a peer did:
            cause = next(iter(outcome["gone"] + [p for p in outcome["failed"] if not _secondary(p.error)]), None)
            if cause is not None:                    # name the peer's own failure first
                failed.error = error
                outcome[_where(outcome, cause)].remove(cause)
                outcome["failed"].insert(0, failed)
                error, failed = cause.error, cause
        lines = self._outcome_lines(outcome)
        if note:
            lines.append(note)
        what = others[0].type
        head = (f"{failed.task} failed first; " if failed is not None else "") + \
            f"the rest of this {what!r} call was stopped so that nothing runs on behind this error:"
        text = str(error)
        first, sep, rest = text.partition("\n")
        error.args = (first + "\n  " + head + "".join("\n    " + ln for ln in lines) + sep + rest,)
        error.cancelled = [p.task for p in outcome["cancelled"]]
        error.still_running = [p.task for p in outcome["running"]]
        return self._root_cause(error, failed, outcome)

    def _root_cause(self, error, failed, outcome):
        """``error`` with its text ending in the root-cause table (see :func:`root_cause_table`),
        when this client can describe its tasks (a LocalCluster's); its ``root_cause`` attribute
        holds the rows."""
        if self.describe is None or getattr(error, "root_cause", None) is not None:
            return error
        rows = []
        if failed is not None:
            rows.append(self._row(failed.task, failed, error))
        elif getattr(error, "task", None):    # a deadline: the request it names, where it is known
            mine = next((p for ps in (outcome or {}).values() for p in ps if p.task == error.task), None)
            rows.append(self._row(error.task, mine, error))
        for state in ("failed", "gone", "running", "cancelled", "finished") if outcome else ():
            for p in outcome[state]:
                if not any(r["task"] == p.task for r in rows):
                    rows.append(self._row(p.task, p, p.error if state in ("failed", "gone") else state))
        if not rows:
            return error
        try:
            table = root_cause_table(rows)
        except Exception:   # noqa: BLE001 - a report that cannot be made must not hide the error
            return error
        text = str(error)
        tail = getattr(error, "log_tail", None)
        if tail:     # the table shows the log's last lines: drop the longer copy from the message
            from .errors import _indent
            text = text.replace("\nlast lines of its log:\n" + _indent(tail), "", 1)
        error.args = (text + "\n" + table,)
        error.root_cause = rows
        return error

    def _row(self, task, pending, error) -> dict:
        from .errors import RemoteError, WorkerDiedError, WorkerPausedError, WorkerUnresponsiveError
        from .liveness import log_tail

        info = (self.describe(task) if self.describe is not None else None) or {}
        peer = self._peers.get(task)
        pid = info.get("pid") or (peer.pid if peer else None)
        if isinstance(error, str):
            state, how = {"running": "still running"}.get(error, error), "-"
        elif isinstance(error, WorkerPausedError):
            state, how = "paused", "SIGSTOP"
        elif isinstance(error, WorkerUnresponsiveError):
            state, how = "unresponsive", "no heartbeat"
        elif isinstance(error, WorkerDiedError):
            state, how = "dead", describe_exit(error.exitcode, error.signal)
        elif isinstance(error, RemoteError):
            state, how = "raised", error.remote_type
        elif isinstance(error, ClusterTimeoutError):
            state, how = "no answer", "deadline passed"
        else:
            state, how = "failed", type(error).__name__
        if pending is not None:
            doing = f"{pending.type} {pending.what}" if pending.what else pending.type
        else:
            doing = "-"
        log = None
        if state in ("dead", "paused", "unresponsive", "raised", "no answer"):
            log = log_tail(info.get("log_path"), 4)
        return {"task": task, "pid": pid, "state": state, "exit": how, "doing": doing, "log": log}

    def _stop(self, waiting, silent=()) -> dict:
        """Send each of ``waiting`` a cancel, wait up to CANCEL_WAIT s for their replies, and sort
        them: ``cancelled`` (the work stopped, here or in a collective whose peer stopped),
        ``finished`` (it had answered), ``failed`` (it answered with another error, in ``p.error``),
        ``gone`` (the task died or hung: ``p.error`` says how) and ``running`` (it did not stop:
        marked busy). ``silent``: requests of tasks that stopped answering (paused, unresponsive):
        sent the same cancel, not waited for. The task reads it when it runs again, right behind
        the request it names, so that request never starts there (or stops at once if it had):
        else it would run late, into the collectives of whatever call comes next."""
        cancels = []
        for p in (*silent, *waiting):
            try:
                cancels.append(self.submit(p.task, "cancel", {"seq": p.seq}))
            except Exception:   # noqa: BLE001 - a task we cannot reach: reported below as not confirmed
                pass
        deadline = _monotonic() + CANCEL_WAIT
        outcome: dict[str, list] = {"cancelled": [], "finished": [], "failed": [], "gone": [], "running": []}
        for p in waiting:
            state = None
            while state is None:
                msg = self._poll(p, max(0.0, min(HEALTH_EVERY, deadline - _monotonic())))
                if msg is not None:
                    err = None if msg.body.get("ok") else (msg.body.get("error") or {})
                    if err is None:
                        state = "finished"
                    elif err.get("type") == "KeyboardInterrupt" or err.get("type") in _SECONDARY:
                        state = "cancelled"   # stopped: by the cancel, or by a peer's in a collective
                    else:
                        state, p.error = "failed", self._remote_error(self._peers.get(p.task), err)
                elif self.health is not None and (problem := self.health(p.task)) is not None:
                    state, p.error = "gone", problem
                elif _monotonic() >= deadline:
                    state = "running"
            outcome[state].append(p)
        for c in cancels:    # the cancels' own acknowledgements: nobody reads them
            peer = self._peers.get(c.task)
            if peer is not None:
                peer.stash.pop(c.seq, None)
        now = _monotonic()
        for p in outcome["running"]:
            if p.type in _QUEUED:     # work that later requests would queue behind
                self._busy[p.task] = (p, now)
        return outcome

    def _resync(self, tasks, outcome, silent=()) -> str | None:
        """Bring the collectives of ``tasks`` (those not gone or still running) back in step: after
        a stopped call some ranks may have entered a collective that others never reached, and
        their next collectives would not match (see ``collectives._exchange.resync``). None when
        done (or nothing to do), else a line saying what the user must do. A task that is silent
        now (``silent`` requests', or gone but paused or unresponsive) joins in later: ``settle``."""
        for p in (*silent, *outcome["gone"]):
            if p in silent or _still_there(p.error):
                self._unsynced[p.task] = list(tasks)
        skip = {p.task for p in (*outcome["gone"], *outcome["running"])}
        tasks = [t for t in dict.fromkeys(tasks) if t not in skip and t in self._peers
                 and (self.health is None or self.health(t) is None)]
        if len(tasks) < 2:
            return None
        try:
            groups: dict = {}
            for task, reply in zip(tasks, self.request_all(tasks, "coll-sync", {}, timeout=SYNC_TIMEOUT)):
                if "job" in reply.body:     # the task has loaded the collectives (else it never formed a group)
                    groups.setdefault(reply.body["job"], []).append((task, reply.body.get("state")))
            for job, members in groups.items():
                states = [s for _, s in members]
                if len(members) < 2 or all(s == states[0] for s in states):
                    continue
                if any(s is None for s in states):   # some have no group (any more): all form it afresh
                    body = {"close": True}
                else:                                # every rank moves to the furthest one's count
                    body = {"to": [max(s[0] for s in states), max(s[1] for s in states)]}
                self.request_all([t for t, _ in members], "coll-sync", body, timeout=SYNC_TIMEOUT)
        except ClusterError as e:
            return (f"the workers' collectives could not be brought back in step ({_first_line(e)}): the "
                    f"next collective may fail; {self._how_to_stop(tasks[0])} forms the group again")
        return None

    def settle(self) -> None:
        """Bring the collectives of each call stopped while one of its tasks was silent back in
        step, once that task answers again (done before any request that runs work; a caller
        that sends one call to several tasks, as ``LocalCluster.run`` does, calls it first, so no
        task is settled between two submits of the same call). The cancel the silent task was
        sent (see ``_stop``) may have cut a collective it had entered, so it can count one more
        than the others, and every later collective would mismatch. Its cancel is read before the
        ``coll-sync`` that asks its count (one connection, in order). Nothing noted: returns at once."""
        if not self._unsynced:
            return
        for task, tasks in list(self._unsynced.items()):
            problem = None if self.health is None else self.health(task)
            if task not in self._peers or (problem is not None and not _still_there(problem)):
                self._unsynced.pop(task, None)      # it died: its restart forms the group afresh
            elif problem is None and self._unsynced.pop(task, None) is not None:
                self._resync(tasks, _NOTHING_STOPPED)

    def _interrupt_message(self, outcome) -> str:
        what = sorted({p.type for ps in outcome.values() for p in ps})
        lines = [f"interrupted while waiting for {' and '.join(repr(w) for w in what) or 'nothing'} on the cluster"]
        return "\n  ".join(lines + self._outcome_lines(outcome))

    def _outcome_lines(self, outcome) -> list:
        lines = []
        if outcome["cancelled"]:
            lines.append(f"cancelled on {', '.join(p.task for p in outcome['cancelled'])}: free for the next call")
        if outcome["finished"]:
            lines.append(f"already finished on {', '.join(p.task for p in outcome['finished'])} (result dropped)")
        for p in outcome["failed"]:       # its own first line names the task
            lines.append(f"then {_first_line(p.error)} (it is free for the next call)")
        for p in outcome["gone"]:
            lines.append(_first_line(p.error))
        for p in outcome["running"]:
            peer = self._peers.get(p.task)
            lines.append(f"{p.task}{f' (pid {peer.pid})' if peer and peer.pid else ''} did not stop within "
                         f"{CANCEL_WAIT:g} s (busy in code that does not return to Python): it is STILL RUNNING "
                         f"there, and new calls to it raise WorkerBusyError until it finishes; "
                         f"{self._how_to_stop(p.task)} ends it now")
        return lines

    def _how_to_stop(self, task) -> str:
        hint = self.stop_hint(task) if self.stop_hint is not None else None
        return hint or "restarting that task's process"

    def _check_busy(self, peer, type):
        """Raise WorkerBusyError if the interrupted work on ``peer`` still runs (after BUSY_WAIT s)."""
        pending, since = self._busy[peer.task]
        if self._poll(pending, BUSY_WAIT) is not None or (self.health is not None and self.health(peer.task)):
            self._busy.pop(peer.task, None)
            return
        hint = self._how_to_stop(peer.task)
        raise WorkerBusyError(
            f"{peer.task}{f' (pid {peer.pid})' if peer.pid else ''} is still running the {pending.type!r} request that "
            f"was interrupted {_monotonic() - since:.0f} s ago (it did not stop); this {type!r} request would wait "
            f"behind it. Wait and try again, or end it with {hint}", peer.task, peer.pid,
            hint if self.stop_hint is not None else None)

    # -- code ------------------------------------------------------------------------------------
    def call(self, task: str, fn, *args, timeout: float | None = None, **kwargs):
        """Run ``fn(*args, **kwargs)`` on ``task`` and return its result."""
        return self.gather([self.submit_call(task, fn, args, kwargs)], timeout)[0]

    def submit_call(self, task, fn, args=(), kwargs=None, code=None) -> Pending:
        """Send ``fn(*args, **kwargs)`` to ``task`` (``code``: ``dumps(fn)`` made once for many)."""
        return self.submit(task, "run", None, [code or dumps(fn), dumps((tuple(args), kwargs or {}))],
                           what=getattr(fn, "__qualname__", None) or type(fn).__name__)

    def gather(self, pendings, timeout: float | None = None) -> list:
        """The unpickled results of ``run`` requests, in the order given."""
        return [loads(m.buffers[0]) for m in self.results(pendings, timeout)]

    # -- the rest ----------------------------------------------------------------------------------
    def close(self) -> None:
        with self._lock:
            peers, self._peers = list(self._peers.values()), {}
        for p in peers:
            p.conn.close()

    def _peer(self, task):
        name = task_name(*parse_task(task))
        peer = self._peers.get(name)
        if peer is None:
            why = self._away.get(name)
            if why:
                raise ClusterError(f"{name} {why}", name)
            raise ClusterError(f"this client is not connected to {task} (it knows {list(self._peers)})", name)
        return peer

    def _dropped(self, peer, error):
        self.dropped += 1
        if self.dropped <= 20:
            print(f"flowlab: dropped a reply from {peer.task}: {error}", file=sys.stderr)

    def _remote_error(self, peer, err):
        cls = None
        module = sys.modules.get(err.get("module") or "")
        if module is not None:
            cls = module
            for part in (err.get("type") or "").split("."):
                cls = getattr(cls, part, None)
        return remote_error(peer.task, err.get("type", "Exception"), err.get("message", ""),
                            err.get("traceback", ""), peer.pid, cls)

    def __repr__(self):
        return f"<flowlab Client {self.id} to {len(self._peers)} task(s)>"
