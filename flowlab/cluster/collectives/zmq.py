"""The cluster's transport as a :class:`~.comm.Communicator`: collectives between the worker
processes of a LocalCluster (or of ``flowlab run``), worker to worker.

Two kinds of channel, negotiated per pair when the group forms:

- **shared memory** between ranks on the same host (same :func:`~.shm.host_identity`: machine,
  boot, user, namespaces): a ring buffer per ordered pair (:mod:`.shm`), read by ``recv`` in the
  caller's own thread;
- **ZeroMQ** otherwise (or when shared memory is unavailable, or switched off with
  ``FLOWLAB_SHM=0`` or ``shm=False``): one-way signed messages of type ``coll`` straight to the
  peer's :class:`Server` (no reply per message), whose loop thread puts them on this rank's inbox
  (and pokes the wake socket when ``recv`` sleeps, so one wait covers both kinds of peers). Arrays
  of 64 KiB and more would leave without a copy, so ``send`` copies them first (the contract lets
  the caller reuse its buffers at once).

A rank waiting in ``recv`` on shared memory first spins on the rings for up to ``spin`` seconds
(x86-64, a core per rank; see :mod:`.shm`), then sleeps on its wake socket. When other threads
queue for the cores at that moment, it does not spin hard: it looks at the rings between
``sched_yield`` calls for the same time (giving its core to whoever waits, often the peer it
waits for), since a sleep and a wake-up cost far more on a busy host. Data that did not fit a
ring when it was sent is moved on while this rank waits
in ``recv``, and in ``flush``, which the collective layer calls as each collective ends (else a
Pusher thread does it). When every pair shares memory, ``native`` offers the shared-memory
collectives of :mod:`.direct` (``algorithm="native"``).

Greeting: every rank connects to every peer's server and asks (``coll-hi``, answered once the
peer's communicator is in place) with its host identity, pid and wake socket; a peer on the same
host creates the ring for messages from the asker and names it in its answer, and the asker maps
it. A pair where that fails for any reason stays on ZeroMQ (``channels`` says which is used).
The communicator of :func:`.comm.current` is made without its group (``formed`` False): the first
collective forms it (:meth:`ZmqCommunicator.form`) within its own deadline, so a peer that never
comes makes it raise :class:`~.errors.CollectiveTimeoutError` naming that rank by the caller's
``timeout``, and one the cluster's monitor reported dead (:mod:`._gone`) makes it raise
:class:`~.errors.PeerLostError` at once, naming its pid, how it ended and the restart call.

Liveness: while ``recv`` waits, peers that have said nothing for half a second are pinged through
their servers; one that answers no ping for ``peer_timeout`` seconds (dead, SIGSTOPped,
unreachable) counts as gone (a peer merely idle since the last collective answers at once), and so does, at once, a same-host peer whose process has exited or whose communicator was
closed, and any peer named in a death notice from the cluster's monitor (:mod:`._gone`: it
carries the exit code or signal). ``recv`` then delivers what those peers had sent and raises
:class:`PeerGone` naming them.

:func:`for_server` gives the communicator of a task's server (made once per cluster layout);
:mod:`.comm` uses it as the default inside ``cluster.run(fn)``. pyzmq is imported by the cluster's
transport, never by ``import flowlab``.
"""
from __future__ import annotations

import collections
import logging
import os
import queue
import threading
import time

import numpy as np

from . import _gone
from . import shm as _shm
from .comm import Communicator, PeerGone
from .errors import CollectiveTimeoutError, PeerLostError

__all__ = ["ZmqCommunicator", "for_server"]

log = logging.getLogger("flowlab.cluster")

MSG_TYPE = "coll"
HELLO_TYPE = "coll-hi"
COPY_BYTES = 65536          # pyzmq copies smaller frames itself
PING_EVERY = 0.5            # seconds between pings to silent peers while waiting
CHECK_EVERY = 0.02          # seconds between liveness checks while waiting
FLUSH_STALL_S = 0.2         # flush gives up after this long without progress (the Pusher goes on)
_WAKE = object()


class ZmqCommunicator(Communicator):
    """Rank ``server.task_index`` of the tasks of ``server.job_name`` in ``server.spec``.

    ``peer_timeout``: seconds of silence (no message, no ping answer) after which a peer counts
    as gone; ``connect_timeout``: how long to wait for every peer to be ready (None: the group is
    formed later, by :meth:`form`, which the collectives call with their own deadline; ``formed``
    says whether it has been). ``shm``: False keeps
    every pair on ZeroMQ (None: shared memory between same-host ranks where available); ``host``
    overrides this rank's host identity (ranks with different ones never share memory: for tests);
    ``spin``: seconds a waiting ``recv`` spins before it blocks (None: :data:`~.shm.SPIN_S` on
    x86-64 when the host has a core for each of its ranks, else 0).

    ``channels[peer]`` is ``"shm"`` or ``"zmq"`` (``None`` for this rank). When every peer is on
    shared memory, ``native`` holds :class:`~.direct.SharedMemoryCollectives` (``algorithm="native"``:
    every rank reads the others' buffers directly); else it is None."""

    def __init__(self, server, peer_timeout: float = 5.0, connect_timeout: float | None = 30.0, shm=None,
                 host: str | None = None, spin: float | None = None):
        from ..protocol import Signer, Verifier, new_id
        from ..spec import task_name

        spec = server.spec
        if spec is None:
            raise RuntimeError(f"{server.name} does not know its cluster yet (no ClusterSpec)")
        self.server = server
        self._layout = self._spec = None   # what communicator() made it for (its cache's check)
        self.rank, self.size = server.task_index, spec.num_tasks(server.job_name)
        self.peer_timeout = float(peer_timeout)
        self.tasks = [task_name(server.job_name, r) for r in range(self.size)]
        self.addresses = [spec.address_of(t) for t in self.tasks]
        self.id = new_id(f"coll{self.rank}")
        self.host = host or _shm.host_identity()
        self.shm_unavailable = "switched off (shm=False)" if shm is False else _shm.unavailable()
        self._shm = self.shm_unavailable is None
        self.channels: list = ["zmq"] * self.size
        self.channels[self.rank] = None
        self.why_zmq: dict = {}         # peer -> why its pair is on ZeroMQ (for the errors that need shm)
        self._signer = Signer(server.key, self.id)
        self._verifier = Verifier(server.key, self.id)
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._conns: dict = {}
        self._ids: dict = {}
        self._heard = [time.monotonic()] * self.size
        self._pinged = [0.0] * self.size
        self._asked = [0.0] * self.size    # per peer: the first ping sent since it was last heard
        self._told: set = set()
        self._closed = False
        self._lock = threading.Lock()
        self._in: dict = {}             # src -> shm.Inbound (made by the greeting handler)
        self._old_in: list = []         # Inbounds replaced by a fresh one (closed with this communicator)
        self._in_list: tuple = ()
        self._out: dict = {}            # peer -> shm.Outbound
        self._pids: dict = {}           # same-host peer -> pid
        self._rr = 0
        self._queued = False            # some Outbound may hold queued data
        self._active = 0                # calls of this rank's thread inside send/recv/flush
        self._early: collections.deque = collections.deque()   # read during flush, for recv
        self._next_check = 0.0
        self._cores, self._cores_checked, self._cores_ok = _shm.usable_cores(), 0.0, True
        self._sleeping = False
        self.spin = 0.0
        if self._shm:
            self._tx = _shm.poke_socket()
            self._rx = _shm.Waker("rx")
            self._pusher = _shm.Pusher(self._out, lambda: self._active > 0, self._gone_for_pusher,
                                       name=f"flowlab-shm-push{self.rank}")
        self.native = None
        self.formed = False
        self._greeted: set = set()      # peers whose coll-hi was answered (forming the group)
        self._spin_arg = spin
        server.register(HELLO_TYPE, self._on_hello, inline=True)
        server.register(MSG_TYPE, self._on_message, inline=True, reply=False)
        if connect_timeout is not None:
            try:
                self.form(connect_timeout)
            except BaseException:
                self.close()
                raise

    def form(self, timeout: float, op: str | None = None, seq: int | None = None) -> None:
        """Form the group (once): connect to every peer and wait, at most ``timeout`` seconds in
        all, until each has its communicator in place. ``op`` and ``seq`` name the collective that
        needs the group, for the errors: :class:`~.errors.CollectiveTimeoutError` naming the rank
        that did not answer in time, :class:`~.errors.PeerLostError` at once for a peer the
        cluster's monitor reported dead (see :mod:`._gone`). After a failure the next call goes
        on where this one stopped (the peers already greeted stay greeted: their side of the pair
        stays valid)."""
        if self.formed:
            return
        if self._closed:
            raise PeerGone([self.rank], "closed (its communicator was closed)")
        self._greet(timeout, op, seq)
        if self._shm and all(c == "shm" for c in self.channels if c):
            from .direct import SharedMemoryCollectives
            self.native = SharedMemoryCollectives(self)
        local = 1 + sum(1 for p in range(self.size) if p != self.rank and p in self._pids)
        if self._spin_arg is not None:
            self.spin = float(self._spin_arg)
        elif self._shm and _shm.STRONG_ORDER and local <= _shm.usable_cores():
            self.spin = _shm.SPIN_S
        self.formed = True

    # -- the receiving side (the server's loop thread) ---------------------------------------------
    def _on_message(self, server, msg):
        body = msg.body
        self._inbox.put((body["src"], body["h"], msg.buffers))
        if self._sleeping:
            _shm.poke(self._tx, self._rx.name)

    def _on_hello(self, server, msg):
        """A peer's greeting: answer with this rank's host and, for a peer on this host, the name
        of the ring it should write to (made here, once per peer communicator)."""
        if self._closed:
            raise RuntimeError(f"rank {self.rank}'s communicator is closed")
        b = msg.body
        src = b.get("src")
        reply = {"coll_hi": True, "host": self.host, "pid": os.getpid(), "seg": None,
                 "rx": self._rx.name if self._shm else None, "n": b.get("n")}
        if not (isinstance(src, int) and 0 <= src < self.size and src != self.rank):
            raise ValueError(f"rank {self.rank} got a greeting from rank {src!r} in a group of {self.size}")
        if b.get("host") != self.host:
            return reply
        self._pids[src] = b.get("pid")
        if self._shm and b.get("tx"):
            ch = self._in.get(src)
            # a new ring for a new peer communicator, or when the asker could not map the last one
            # (``fresh``; asked again with the same number, the answer names the same ring)
            if ch is None or ch.owner != b.get("comm") or (b.get("fresh") and ch.hello_n != b.get("n")):
                if ch is not None:
                    self._old_in.append(ch)     # closed with the communicator (a reader may hold it now)
                try:
                    ch = _shm.Inbound(src, self._tx, owner=b.get("comm"))
                except OSError as e:    # e.g. /dev/shm is full: this pair talks over ZeroMQ
                    log.warning("rank %d: no shared memory for messages from %s (%s); using ZeroMQ", self.rank,
                                self.tasks[src], e)
                    return reply
                ch.producer = b["tx"]
                ch.hello_n = b.get("n")
                self._in[src] = ch
                self._in_list = tuple(self._in.values())
            reply["seg"] = ch.name
        return reply

    # -- the contract ------------------------------------------------------------------------------
    def send(self, peer, header, arrays):
        if self._closed:
            raise PeerGone([self.rank], "closed (its communicator was closed)")
        if not 0 <= peer < self.size or peer == self.rank:
            raise ValueError(f"rank {self.rank} cannot send to rank {peer} in a group of {self.size}")
        if peer in self._told:
            return
        out = self._out.get(peer)
        if out is not None:
            self._active += 1
            try:
                if not out.send(header, arrays):
                    self._queued = True
                    self._pusher.notify()
            finally:
                self._active -= 1
            return
        if not self.formed:       # used directly, not through a collective: its default deadline
            self.form(_default_timeout())
        bufs = [np.array(a, copy=True, order="C") if a.nbytes >= COPY_BYTES else np.ascontiguousarray(a)
                for a in arrays]
        frames = self._signer.pack(MSG_TYPE, self._ids[peer], {"src": self.rank, "h": header}, bufs)
        with self._lock:
            self._conns[peer].send(frames)

    def recv(self, timeout):
        if self._closed:
            raise PeerGone([self.rank], "closed (its communicator was closed)")
        if not self.formed:
            self.form(_default_timeout() if timeout is None else timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        spin = self.spin
        self._active += 1
        try:
            while True:
                item = self._poll()
                if item is not None:
                    break
                if self._queued and self._push():
                    continue
                if spin:
                    if self._cores_free():
                        got = _shm.spin_until(self._ready, spin)
                    else:       # the cores are queued for: give ours away between looks
                        got = _shm.yield_until(self._ready, spin)
                    spin = 0.0
                    if got:
                        continue
                gone = self._find_gone()
                if gone:
                    item = self._poll()     # what they sent before they went comes first
                    if item is not None:
                        break
                    self._told.update(gone)
                    raise PeerGone(sorted(gone), _reason(gone))
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(f"rank {self.rank}: no message within {timeout:.3g} s") from None
                wait = min(0.1, left) if left is not None else 0.1
                if self._shm:
                    self._block(wait)
                    continue
                try:
                    item = self._inbox.get(timeout=wait)
                except queue.Empty:
                    continue
                if item is _WAKE:
                    raise PeerGone([self.rank], "closed (its communicator was closed)")
                break
        except ValueError:
            if self._closed:     # closed by another thread while this one read a ring
                raise PeerGone([self.rank], "closed (its communicator was closed)") from None
            raise
        finally:
            self._active -= 1
        self._heard[item[0]] = time.monotonic()
        return item

    def poll(self):
        """A message that is already here (``(src, header, arrays)``), else None, without waiting;
        raises :class:`PeerGone` as ``recv`` does. For a rank that waits on a shared-memory box
        (:mod:`.direct`) and must still hear aborts and lost peers."""
        if self._closed:
            raise PeerGone([self.rank], "closed (its communicator was closed)")
        self._active += 1
        try:
            item = self._poll()
            if item is None and self._queued:
                self._push()
            if item is None:
                gone = self._find_gone()
                if gone:
                    item = self._poll()     # what they sent before they went comes first
                    if item is None:
                        self._told.update(gone)
                        raise PeerGone(sorted(gone), _reason(gone))
        finally:
            self._active -= 1
        if item is not None:
            self._heard[item[0]] = time.monotonic()
        return item

    def flush(self, deadline: float) -> None:
        """Move this rank's queued shared-memory data into the rings before the collective returns
        (until ``deadline``, a ``time.perf_counter()`` value, or until the rings have not moved for
        :data:`FLUSH_STALL_S`: a peer that stopped reading, e.g. one that gave the call up, is left
        to the Pusher thread); messages that arrive meanwhile are kept for ``recv``. Gone peers'
        data is dropped."""
        if not self._queued or self._closed:
            return
        self._active += 1
        try:
            moved = time.perf_counter()
            while self._queued and not self._closed:
                if self._push():
                    moved = time.perf_counter()
                    continue
                now = time.perf_counter()
                if not self._queued or now >= deadline or now - moved > FLUSH_STALL_S:
                    return
                item = self._poll()
                if item is not None:
                    self._early.append(item)
                    continue
                for peer, out in list(self._out.items()):
                    if out.pending and self._gone_for_pusher(peer):
                        out.drop()
                if self._find_gone():       # reported by recv (not marked told here)
                    self._next_check = 0.0
                    return
                self._block(min(FLUSH_STALL_S, max(0.0, deadline - now)))
        finally:
            self._active -= 1

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for kind, fn in ((MSG_TYPE, self._on_message), (HELLO_TYPE, self._on_hello)):
            if self.server._handlers.get(kind, (None,))[0] == fn:
                self.server._handlers.pop(kind, None)
        with self._lock:
            for c in self._conns.values():
                c.close()
        self._inbox.put(_WAKE)
        if getattr(self, "native", None) is not None:
            self.native.close()
        if self._shm:
            _shm.poke(self._tx, self._rx.name)
            self._pusher.close()
            for ch in list(self._out.values()) + list(self._in.values()) + self._old_in:
                ch.close()
            self._rx.close()
            self._tx.close()

    def __repr__(self):
        kinds = [c for c in self.channels if c]
        return (f"<ZmqCommunicator rank {self.rank} of {self.size} ({self.server.name}; "
                f"{kinds.count('shm')} shared-memory, {kinds.count('zmq')} ZeroMQ peers)>")

    # -- receiving ---------------------------------------------------------------------------------
    def _poll(self):
        """The next message that is here, from either kind of channel, else None."""
        if self._early:
            return self._early.popleft()
        inbox = self._inbox
        if not inbox.empty():
            item = inbox.get_nowait()
            if item is _WAKE:
                raise PeerGone([self.rank], "closed (its communicator was closed)")
            return item
        chans = self._in_list
        n = len(chans)
        if n:
            first = self._rr
            for i in range(n):
                ch = chans[(first + i) % n]
                m = ch.pump()
                if m is not None:
                    self._rr = (first + i + 1) % n
                    return ch.src, m[0], m[1]
        return None

    def _push(self) -> bool:
        """Move queued data into rings with space; True if any moved. Clears ``_queued`` when
        nothing is left queued."""
        moved, left = 0, False
        for out in self._out.values():
            if out.pending:
                moved += out.push()
                left = left or bool(out.pending)
        if not left:
            self._queued = False
        return moved > 0

    def _cores_free(self) -> bool:
        """Whether spinning is worth it now: no more runnable threads on the host than usable
        cores (else the spinner takes a core its peer is queued for). Looked up at most every
        :data:`CHECK_EVERY` seconds."""
        now = time.monotonic()
        if now >= self._cores_checked:
            self._cores_checked = now + CHECK_EVERY
            self._cores_ok = _shm.runnable() <= self._cores
        return self._cores_ok

    def _ready(self) -> bool:
        if self._early or not self._inbox.empty():
            return True
        for ch in self._in_list:
            if ch.ready():
                return True
        if self._queued:
            for out in self._out.values():
                if out.pending and not out.full():
                    return True
        return False

    def _block(self, timeout):
        """Sleep on the wake socket until poked: announced first in every ring this rank waits on
        (for data, and for space where it has data queued; see :mod:`.shm`)."""
        chans = self._in_list
        outs = [out for out in self._out.values() if out.pending] if self._queued else ()
        self._sleeping = True
        for ch in chans:
            ch.set_waiting(True)
        for out in outs:
            out.set_waiting(True)
        _shm.fence()
        try:
            if not self._ready():
                self._rx.wait(timeout)
        finally:
            self._sleeping = False
            for ch in chans:
                ch.set_waiting(False)
            for out in outs:
                out.set_waiting(False)

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

    def _find_gone(self) -> dict:
        """Peers newly known to be gone (not yet reported): ``{peer: reason}``. Pings the silent."""
        now = time.monotonic()
        gone = {}
        if now < self._next_check:
            return gone
        self._next_check = now + CHECK_EVERY
        with self._lock:
            if self._closed:
                return gone
            for peer, conn in self._conns.items():
                if peer in self._told:
                    continue
                why = self._local_death(peer)
                if why:
                    gone[peer] = why
                    continue
                self._drain(peer, conn)
                heard = self._heard[peer]
                if now - heard <= PING_EVERY:
                    continue
                # silence counts from the first ping it left unanswered, not from its last message:
                # a peer idle between collectives (or late to this one) is not a dead one
                asked = self._asked[peer]
                if asked > heard and now - asked > self.peer_timeout:
                    gone[peer] = (f"stopped answering ({self.tasks[peer]} answered no ping for more than "
                                  f"{self.peer_timeout:g} s: dead, frozen or unreachable)")
                elif now - self._pinged[peer] > PING_EVERY:
                    self._pinged[peer] = now
                    if asked <= heard:
                        self._asked[peer] = now
                    conn.send(self._signer.pack("ping", self._ids[peer], {}))
        return gone

    def _local_death(self, peer) -> str | None:
        """Why a peer is gone for sure (the cluster's monitor said it died; or, on this host, its
        process exited or it closed), else None."""
        why = _gone.known(self.server, self.tasks[peer])
        if why:
            return why
        pid = self._pids.get(peer)
        if pid and not _alive(pid):
            return f"exited ({self.tasks[peer]}, pid {pid}, is gone)"
        ch = self._in.get(peer)
        if ch is not None and not ch.closed and ch.producer_closed():
            return f"closed its communicator ({self.tasks[peer]})"
        return None

    def _gone_for_pusher(self, peer) -> bool:
        return self._closed or peer in self._told or self._local_death(peer) is not None

    # -- forming the group ---------------------------------------------------------------------------
    def _greet(self, timeout, op=None, seq=None):
        """Connect to every peer and wait until each has its communicator in place (its ``coll-hi``
        handler answers); set up shared memory with the peers on this host. Everything here waits
        until one deadline, ``timeout`` seconds from now."""
        transport = self.server.transport
        start = time.monotonic()
        deadline = start + timeout
        me = {"src": self.rank, "comm": self.id, "host": self.host, "pid": os.getpid(),
              "tx": self._rx.name if self._shm else None}
        for peer in range(self.size):
            if peer == self.rank or peer in self._greeted:
                continue
            self._check_notice(peer, op, seq)
            conn = self._conns.get(peer)
            if conn is None:
                conn = self._conns[peer] = transport.connect(self.addresses[peer])
            server_id = self._ids.get(peer)
            while server_id is None:
                conn.send(self._signer.pack("hello", "*", {}))
                body = self._await_reply(conn, start, deadline, peer, "id", op, seq, reached=False)
                server_id = body.get("id") if body is not None and body.get("ok") else None
            self._ids[peer] = server_id
            for attempt in range(_MAP_TRIES):
                # each greeting carries its own number, echoed in the answer: an answer left over
                # from an earlier, given-up greeting (it may name a ring its peer has since closed)
                # is never taken for this one
                ask = dict(me, n=_new_nonce(), fresh=attempt > 0)
                while True:
                    conn.send(self._signer.pack(HELLO_TYPE, server_id, ask))
                    body = self._await_reply(conn, start, deadline, peer, "coll_hi", op, seq, reached=True,
                                             retry_error=True, nonce=ask["n"])
                    if body is not None and body.get("ok"):
                        break
                    self._check_notice(peer, op, seq)
                    time.sleep(min(0.02, max(0.0, deadline - time.monotonic())))
                if self._map(peer, body):
                    break
            self._greeted.add(peer)
            self._heard[peer] = time.monotonic()

    def _map(self, peer, body) -> bool:
        """Take a greeting's answer: map the ring it names (shared memory with ``peer``). False
        when the ring could not be mapped (the caller asks for a fresh one); True otherwise, the
        pair then being on shared memory, or on ZeroMQ with the reason in ``why_zmq``."""
        if body.get("host") != self.host:
            self.why_zmq[peer] = f"{self.tasks[peer]} runs on another host"
            return True
        self._pids[peer] = body.get("pid")
        if not self._shm:
            self.why_zmq[peer] = f"shared memory is unavailable on rank {self.rank}: {self.shm_unavailable}"
            return True
        if not (body.get("seg") and body.get("rx")):
            self.why_zmq[peer] = (f"{self.tasks[peer]} made no ring for rank {self.rank} (shared memory unavailable "
                                  f"there, or /dev/shm full: see its log)")
            return True
        try:
            out = _shm.Outbound(body["seg"], body["rx"], self._tx)
        except (OSError, ValueError) as e:
            self.why_zmq[peer] = f"rank {self.rank} could not map the ring {self.tasks[peer]} made ({e})"
            log.warning("rank %d: no shared memory with %s (%s)", self.rank, self.tasks[peer], e)
            return False
        self._out[peer] = out
        self.channels[peer] = "shm"
        self.why_zmq.pop(peer, None)
        return True

    def _what(self, op, seq) -> str:
        if op is None:
            return f"forming the collective group on rank {self.rank}"
        return f"{op}{'' if seq is None else f' #{seq}'} on rank {self.rank}"

    def _check_notice(self, peer, op, seq) -> None:
        """Fail at once if the cluster's monitor said ``peer`` died (see :mod:`._gone`)."""
        why = _gone.known(self.server, self.tasks[peer])
        if why:
            raise PeerLostError(f"{self._what(op, seq)} failed while forming the group: rank {peer} {why}",
                                op, seq, self.rank, [peer])

    def _await_reply(self, conn, start, deadline, peer, key, op, seq, reached, retry_error=False, nonce=None):
        """The body of the next reply that has ``key`` (or an error, when ``retry_error``), None
        after half a second without one (the caller asks again). Past ``deadline``: a
        :class:`CollectiveTimeoutError` naming ``peer`` (``reached``: its server had answered)."""
        ask_again = time.monotonic() + 0.5
        while True:
            now = time.monotonic()
            left = deadline - now
            if left <= 0:
                waited = now - start
                if reached:
                    why = ("answers, but has not called a collective (every rank of the job calls the same "
                           "collectives, in the same order)")
                else:
                    why = "never answered (not started yet, dead, or unreachable)"
                later = [p for p in range(peer + 1, self.size) if p != self.rank]
                rest = f"; ranks {later} were not asked yet" if later else ""
                err = CollectiveTimeoutError(
                    f"{self._what(op, seq)} timed out after {waited:.3g} s forming the group: rank {peer} "
                    f"({self.tasks[peer]} at {self.addresses[peer]}) {why}{rest}",
                    op, seq, self.rank, [peer], waited)
                err.peer = peer     # which rank never answered (read by callers that name it their own way)
                raise err
            self._check_notice(peer, op, seq)
            if now >= ask_again:
                return None
            frames = conn.recv(min(left, ask_again - now, 0.1))
            if frames is None:
                continue
            try:
                body = self._verifier.unpack(frames).body
            except Exception:   # noqa: BLE001 - a reply we cannot read: ask again
                return None
            if nonce is not None and body.get("n", nonce) != nonce and (key in body or body.get("ok")):
                continue        # the answer to an earlier greeting
            if key in body or (retry_error and not body.get("ok")):
                return body


_MAP_TRIES = 3              # greetings per peer whose ring cannot be mapped before the pair stays on ZeroMQ


def _new_nonce() -> str:
    return os.urandom(8).hex()


def _default_timeout() -> float:
    from ._exchange import default_timeout
    return default_timeout()


def _alive(pid: int) -> bool:
    """Whether process ``pid`` still runs (a zombie does not)."""
    from ..leftovers import owner_gone
    return not owner_gone(pid)


def _reason(gone: dict) -> str:
    reasons = sorted(set(gone.values()))
    return reasons[0] if len(reasons) == 1 else "gone (" + "; ".join(reasons) + ")"


_cache: dict = {}
_cache_lock = threading.Lock()


def sync(server, to=None, close: bool = False) -> dict:
    """The collective state of ``server``'s communicator, for a client that stopped a call on
    several tasks (the ``coll-sync`` message): ``{"job"}`` when it has none; else ``{"job", "state"}``
    with ``state`` from :func:`._exchange.resync` (``to``: move forward to that point first).
    ``close``: drop the communicator, so the next collective forms the group again (after a
    peer's process was restarted)."""
    comm = _cache.get(id(server))
    if comm is None or comm._closed:
        return {"job": server.job_name}
    if close:
        with _cache_lock:
            if _cache.get(id(server)) is comm:
                del _cache[id(server)]
        comm.close()
        return {"job": server.job_name, "closed": True}
    from ._exchange import resync
    return {"job": server.job_name, "state": resync(comm, to)}


def for_server(server, formed: bool = True) -> ZmqCommunicator:
    """The communicator among the tasks of ``server``'s job, made on first use and again whenever
    the cluster's layout (its ClusterSpec) changes, as after a restart. ``formed``: return it with
    its group formed (waiting up to the collectives' default timeout); False: possibly not yet
    formed (the collectives form it by their own deadline: what :func:`.comm.current` gives)."""
    spec = server.spec
    comm = _cache.get(id(server))
    if comm is not None and comm._spec is spec and not comm._closed and (comm.formed or not formed):
        return comm            # the same ClusterSpec object: the same layout (checked below once)
    layout = (id(server), repr(spec.as_dict()) if spec is not None else None)
    with _cache_lock:
        comm = _cache.get(id(server))
        if comm is not None and comm._layout == layout and not comm._closed:
            comm._spec = spec
        else:
            if comm is not None:
                comm.close()
            comm = ZmqCommunicator(server, connect_timeout=None)   # formed by the first collective, by its deadline
            comm._layout, comm._spec = layout, spec
            _cache[id(server)] = comm
    if formed:
        comm.form(_default_timeout())
    return comm
