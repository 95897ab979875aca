"""``Client``: requests to a cluster's tasks, and their replies, with deadlines and liveness.

A client holds one connection per task. ``request(task, type, body, buffers)`` sends one signed
message and returns the checked reply (a :class:`~flowlab.cluster.protocol.Message`); a reply
with ``ok`` false raises :class:`RemoteError`. ``submit`` sends without waiting and ``result``
collects, so one request can go to every task before any reply is awaited.

While it waits, a client asks its ``health(task)`` callable (a LocalCluster's liveness monitor)
every ``HEALTH_EVERY`` seconds and raises the error it returns (the task died or stopped
answering), so no call waits on a task that cannot answer. Without ``health``, calls wait at most
their ``timeout``.
"""
from __future__ import annotations

import sys
import threading
import time

from . import events as _events
from .errors import ClusterError, ClusterTimeoutError, ProtocolError, remote_error
from .protocol import Signer, Verifier, dumps, loads, new_id
from .spec import ClusterSpec, parse_task, task_name

__all__ = ["Client", "Pending"]

HEALTH_EVERY = 0.1          # seconds between liveness checks while a call waits
DEFAULT_TIMEOUT = 60.0      # a control call's deadline when none is given
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
        to = peer.server_id or "*"
        seq = self._signer.next_seq()
        frames = self._signer.pack(type, to, body, buffers, sign_buffers, seq)
        with peer.lock:
            peer.conn.send(frames)
        return Pending(task, seq, type, _monotonic())

    def result(self, pending: Pending, timeout: float | None = DEFAULT_TIMEOUT):
        """The reply to ``pending``; raises RemoteError if the handler raised, the health error if
        the task died or hung, ClusterTimeoutError after ``timeout`` seconds (None: no deadline)."""
        msg = self._poll(pending, HEALTH_EVERY if timeout is None else min(HEALTH_EVERY, timeout))
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
