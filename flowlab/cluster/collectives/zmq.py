"""The cluster's ZeroMQ transport as a :class:`~.comm.Communicator`: collectives between the
worker processes of a LocalCluster (or of ``flowlab run``), worker to worker.

Each rank registers an inline handler for messages of type ``coll`` on its own :class:`Server`;
the handler puts ``(source, header, arrays)`` on one inbox queue that ``recv`` reads (messages of
one sender stay in order: one DEALER socket per peer, one loop thread per receiver). A rank sends
straight to its peer's server over its own connection, signed with the cluster key. Arrays of
64 KiB and more would leave without a copy, so ``send`` copies them first (the contract lets the
caller reuse its buffers at once).

When the communicator is made it greets every peer until each one has its handler in place, so
no message is sent to a server that would refuse it. A peer counts as gone when it has not
answered anything (a reply, a ping) for ``peer_timeout`` seconds while this rank waits: ``recv``
then raises :class:`PeerGone` naming it.

:func:`for_server` gives the communicator of a task's server (made once per cluster layout);
:mod:`.comm` uses it as the default inside ``cluster.run(fn)``. pyzmq is imported by the cluster's
transport, never by ``import flowlab``.
"""
from __future__ import annotations

import queue
import threading
import time

import numpy as np

from .comm import Communicator, PeerGone

__all__ = ["ZmqCommunicator", "for_server"]

MSG_TYPE = "coll"
COPY_BYTES = 65536          # pyzmq copies smaller frames itself
PING_EVERY = 0.5            # seconds between pings to silent peers while waiting
_WAKE = object()


class ZmqCommunicator(Communicator):
    """Rank ``server.task_index`` of the tasks of ``server.job_name`` in ``server.spec``.

    ``peer_timeout``: seconds of silence (no reply, no ping answer) after which a peer counts as
    gone; ``connect_timeout``: how long to wait for every peer to be ready."""

    def __init__(self, server, peer_timeout: float = 5.0, connect_timeout: float = 30.0):
        from ..protocol import Signer, Verifier, new_id
        from ..spec import task_name

        spec = server.spec
        if spec is None:
            raise RuntimeError(f"{server.name} does not know its cluster yet (no ClusterSpec)")
        self.server = server
        self.rank, self.size = server.task_index, spec.num_tasks(server.job_name)
        self.peer_timeout = float(peer_timeout)
        self.tasks = [task_name(server.job_name, r) for r in range(self.size)]
        self.addresses = [spec.address_of(t) for t in self.tasks]
        self.id = new_id(f"coll{self.rank}")
        self._signer = Signer(server.key, self.id)
        self._verifier = Verifier(server.key, self.id)
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._conns: dict = {}
        self._ids: dict = {}
        self._heard = [time.monotonic()] * self.size
        self._pinged = [0.0] * self.size
        self._told: set = set()
        self._closed = False
        self._lock = threading.Lock()
        server.register(MSG_TYPE, self._on_message, inline=True)
        try:
            self._greet(connect_timeout)
        except BaseException:
            self.close()
            raise

    # -- the receiving side (the server's loop thread) ---------------------------------------------
    def _on_message(self, server, msg):
        body = msg.body
        if "probe" not in body:     # a probe only checks that this handler is registered
            self._inbox.put((body["src"], body["h"], msg.buffers))

    # -- the contract ------------------------------------------------------------------------------
    def send(self, peer, header, arrays):
        if self._closed:
            raise PeerGone([self.rank], "closed (its communicator was closed)")
        if not 0 <= peer < self.size or peer == self.rank:
            raise ValueError(f"rank {self.rank} cannot send to rank {peer} in a group of {self.size}")
        if peer in self._told:
            return
        bufs = [np.array(a, copy=True, order="C") if a.nbytes >= COPY_BYTES else np.ascontiguousarray(a)
                for a in arrays]
        frames = self._signer.pack(MSG_TYPE, self._ids[peer], {"src": self.rank, "h": header}, bufs)
        conn = self._conns[peer]
        with self._lock:
            conn.send(frames)
            self._drain(peer, conn)

    def recv(self, timeout):
        if self._closed:
            raise PeerGone([self.rank], "closed (its communicator was closed)")
        inbox = self._inbox
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                item = inbox.get_nowait()
            except queue.Empty:
                self._check_peers()
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(f"rank {self.rank}: no message within {timeout:.3g} s") from None
                try:
                    item = inbox.get(timeout=min(0.1, left) if left is not None else 0.1)
                except queue.Empty:
                    continue
            if item is _WAKE:
                raise PeerGone([self.rank], "closed (its communicator was closed)")
            src, header, arrays = item
            self._heard[src] = time.monotonic()
            return src, header, arrays

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.server._handlers.get(MSG_TYPE, (None,))[0] == self._on_message:
            self.server._handlers.pop(MSG_TYPE, None)
        for c in self._conns.values():
            c.close()
        self._inbox.put(_WAKE)

    def __repr__(self):
        return f"<ZmqCommunicator rank {self.rank} of {self.size} ({self.server.name})>"

    # -- liveness ------------------------------------------------------------------------------------
    def _drain(self, peer, conn):
        """Read the replies waiting on ``conn`` (each one says the peer is alive)."""
        got = False
        while True:
            frames = conn.recv(0)
            if frames is None:
                break
            got = True
        if got:
            self._heard[peer] = time.monotonic()

    def _check_peers(self):
        now = time.monotonic()
        gone = []
        with self._lock:
            for peer, conn in self._conns.items():
                if peer in self._told:
                    continue
                self._drain(peer, conn)
                silent = now - self._heard[peer]
                if silent > self.peer_timeout:
                    gone.append(peer)
                elif silent > PING_EVERY and now - self._pinged[peer] > PING_EVERY:
                    self._pinged[peer] = now
                    conn.send(self._signer.pack("ping", self._ids[peer], {}))
        if gone:
            self._told.update(gone)
            raise PeerGone(gone, f"stopped answering ({', '.join(self.tasks[p] for p in gone)} silent for "
                                 f"more than {self.peer_timeout:g} s: dead, frozen or unreachable)")

    def _greet(self, timeout):
        """Connect to every peer and wait until each has its ``coll`` handler (a test message of
        type ``coll-ready`` is answered by the handler below only once it is registered)."""
        transport = self.server.transport
        deadline = time.monotonic() + timeout
        for peer in range(self.size):
            if peer == self.rank:
                continue
            conn = self._conns[peer] = transport.connect(self.addresses[peer])
            server_id = None
            while server_id is None:
                conn.send(self._signer.pack("hello", "*", {}))
                server_id = self._await_reply(conn, deadline, peer, "hello")
            self._ids[peer] = server_id
            while not self._await_reply(conn, deadline, peer, MSG_TYPE, probe=True):
                time.sleep(0.02)
            self._heard[peer] = time.monotonic()

    def _await_reply(self, conn, deadline, peer, kind, probe=False):
        if probe:
            conn.send(self._signer.pack(MSG_TYPE, self._ids[peer], {"src": self.rank, "probe": True}))
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"rank {self.rank}: {self.tasks[peer]} at {self.addresses[peer]} was not "
                                   f"ready for collectives within the connect timeout")
            frames = conn.recv(min(left, 0.5))
            if frames is None:
                if not probe:
                    return None      # resend the hello
                continue
            try:
                m = self._verifier.unpack(frames)
            except Exception:   # noqa: BLE001 - a reply we cannot read: ask again
                return None
            body = m.body
            if kind == "hello":
                return body.get("id") if body.get("ok") else None
            return bool(body.get("ok"))


_cache: dict = {}
_cache_lock = threading.Lock()


def for_server(server) -> ZmqCommunicator:
    """The communicator among the tasks of ``server``'s job, made on first use and again whenever
    the cluster's layout (its ClusterSpec) changes, as after a restart."""
    layout = (id(server), repr(server.spec.as_dict()) if server.spec is not None else None)
    with _cache_lock:
        comm = _cache.get(id(server))
        if comm is not None and comm._layout == layout and not comm._closed:
            return comm
        if comm is not None:
            comm.close()
        comm = ZmqCommunicator(server)
        comm._layout = layout
        _cache[id(server)] = comm
        return comm
