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
"""
from __future__ import annotations

import sys
import threading
import time

from . import events as _events
from .errors import ClusterError, ClusterTimeoutError, Interrupted, ProtocolError, WorkerBusyError, remote_error
from .protocol import Signer, Verifier, dumps, loads, new_id
from .spec import ClusterSpec, parse_task, task_name

__all__ = ["Client", "Pending"]

HEALTH_EVERY = 0.1          # seconds between liveness checks while a call waits
DEFAULT_TIMEOUT = 60.0      # a control call's deadline when none is given
CANCEL_WAIT = 3.0           # seconds an interrupted call waits for its tasks to confirm the cancel
BUSY_WAIT = 0.5             # seconds a request to a busy task waits for the interrupted work to end
_QUEUED = frozenset(("run", "op", "partition", "push"))   # requests that queue behind running work
_monotonic = time.monotonic


class Pending:
    """A request sent and not yet answered: ``task`` and ``seq`` (the reply's ``re``)."""
    __slots__ = ("task", "seq", "type", "sent")

    def __init__(self, task, seq, type, sent):
        self.task, self.seq, self.type, self.sent = task, seq, type, sent

    def __repr__(self):
        return f"<Pending {self.type} to {self.task} seq={self.seq}>"


class _Peer:
    __slots__ = ("task", "address", "conn", "server_id", "lock", "stash", "pid")

    def __init__(self, task, address, conn, server_id=None, pid=None):
        self.task, self.address, self.conn, self.server_id, self.pid = task, address, conn, server_id, pid
        self.lock = threading.Lock()
        self.stash: dict = {}   # replies that arrived while another call was reading

    def __repr__(self):
        return f"<peer {self.task} at {self.address} over {getattr(self.conn, 'lane', '?')}>"


def _checker(health, task):
    return lambda: health(task)


class Client:
    """Talks to tasks by name (``/job:worker/task:1``). ``key``: the cluster key;
    ``transport``: as for Server; ``health``: ``health(task) -> exception or None``."""

    def __init__(self, key, *, transport=None, health=None, name: str = "client", event_log=None):
        from .server import _transport
        self.key = key
        self.transport = _transport(transport)
        self.id = new_id(name)
        self.health = health
        self.log = event_log if event_log is not None else _events.default_log()
        self._signer = Signer(key, self.id)
        self._verifier = Verifier(key, self.id)
        self._peers: dict[str, _Peer] = {}
        self._lock = threading.Lock()
        self.dropped = 0
        self.stop_hint = None       # stop_hint(task) -> how a user ends that task's process, e.g. "cluster.restart(1)"
        self._busy: dict = {}       # task -> (Pending, when): interrupted work that did not stop

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
            conn = self.transport.connect(address)
            if self.health is not None and hasattr(conn, "check"):   # a blocked send asks it too
                conn.check = _checker(self.health, task)
            peer = _Peer(task, address, conn, server_id, pid)
            self._peers[task] = peer
        if server_id is None:
            reply = self.request(task, "hello", timeout=timeout)
            peer.server_id, peer.pid = reply.body["id"], reply.body["pid"]

    def remove(self, task) -> None:
        self._busy.pop(task_name(*parse_task(task)), None)
        with self._lock:
            peer = self._peers.pop(task_name(*parse_task(task)), None)
        if peer is not None:
            peer.conn.close()

    def tasks(self) -> list[str]:
        return list(self._peers)

    def lane(self, task) -> str:
        """How this client reaches ``task``: ``"unix"`` (the local lane, see :mod:`.unix`),
        ``"tcp"`` (ZeroMQ) or ``"inproc"``."""
        return getattr(self._peer(task).conn, "lane", "?")

    @property
    def stats(self) -> dict:
        """``{"lanes": {task: lane}, "dropped": replies dropped}``."""
        return {"lanes": {t: getattr(p.conn, "lane", "?") for t, p in list(self._peers.items())},
                "dropped": self.dropped}

    def __contains__(self, task):
        return task in self._peers

    # -- requests ------------------------------------------------------------------------------
    def submit(self, task: str, type: str, body=None, buffers=(), sign_buffers: bool = False) -> Pending:
        """Send one request to ``task`` without waiting for its reply."""
        peer = self._peers.get(task)
        if peer is None:
            peer = self._peer(task)
        if self._busy and type in _QUEUED and peer.task in self._busy:
            self._check_busy(peer, type)
        to = peer.server_id or "*"
        seq = self._signer.next_seq()
        frames = self._signer.pack(type, to, body, buffers, sign_buffers, seq)
        with peer.lock:
            peer.conn.send(frames)
        return Pending(task, seq, type, _monotonic())

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
            raise self._remote_error(self._peers.get(pending.task), msg.body.get("error") or {})
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
                        raise self._remote_error(self._peers.get(pendings[i].task), msg.body.get("error") or {})
                    out[i] = msg
                    left.remove(i)
            if not left:
                break
            if health is not None:
                for i in left:
                    problem = health(pendings[i].task)
                    if problem is not None:
                        raise problem
            if deadline is not None and _monotonic() >= deadline:
                p = pendings[left[0]]
                peer = self._peers.get(p.task)
                raise ClusterTimeoutError(f"{p.task} did not answer a {p.type!r} request within {timeout:g} s",
                                          p.task, peer.pid if peer else None)
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
                try:
                    m = self._verifier.unpack(frames)
                except ProtocolError as e:
                    self._dropped(peer, e)
                else:
                    re = m.body.get("re")
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

    # -- interrupts ------------------------------------------------------------------------------
    def _interrupted(self, waiting):
        """Cancel ``waiting`` on their tasks, wait up to CANCEL_WAIT s for each to stop, raise Interrupted."""
        cancels = []
        for p in waiting:
            try:
                cancels.append(self.submit(p.task, "cancel", {"seq": p.seq}))
            except Exception:   # noqa: BLE001 - a task we cannot reach: reported below as not confirmed
                pass
        deadline = _monotonic() + CANCEL_WAIT
        outcome: dict[str, list] = {"cancelled": [], "finished": [], "gone": [], "running": []}
        for p in waiting:
            state = None
            while state is None:
                msg = self._poll(p, max(0.0, min(HEALTH_EVERY, deadline - _monotonic())))
                if msg is not None:
                    stopped = not msg.body.get("ok") and (msg.body.get("error") or {}).get("type") == "KeyboardInterrupt"
                    state = "cancelled" if stopped else "finished"
                elif self.health is not None and self.health(p.task) is not None:
                    state = "gone"
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
        raise Interrupted(self._interrupt_message(outcome), [p.task for p in outcome["cancelled"]],
                          [p.task for p in outcome["running"]]) from None

    def _interrupt_message(self, outcome) -> str:
        what = sorted({p.type for ps in outcome.values() for p in ps})
        lines = [f"interrupted while waiting for {' and '.join(repr(w) for w in what) or 'nothing'} on the cluster"]
        if outcome["cancelled"]:
            lines.append(f"cancelled on {', '.join(p.task for p in outcome['cancelled'])}: free for the next call")
        if outcome["finished"]:
            lines.append(f"already finished on {', '.join(p.task for p in outcome['finished'])} (result dropped)")
        if outcome["gone"]:
            lines.append(f"{', '.join(p.task for p in outcome['gone'])}: the task is gone (died or stopped answering)")
        for p in outcome["running"]:
            peer = self._peers.get(p.task)
            lines.append(f"{p.task}{f' (pid {peer.pid})' if peer and peer.pid else ''} did not stop within "
                         f"{CANCEL_WAIT:g} s (busy in code that does not return to Python): it is STILL RUNNING "
                         f"there, and new calls to it raise WorkerBusyError until it finishes; "
                         f"{self._how_to_stop(p.task)} ends it now")
        return "\n  ".join(lines)

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
        return self.submit(task, "run", None, [code or dumps(fn), dumps((tuple(args), kwargs or {}))])

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
            raise ClusterError(f"this client is not connected to {task} (it knows {list(self._peers)})")
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
