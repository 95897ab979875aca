"""The ZeroMQ transport: how frames move between processes. pyzmq is imported here only, and this
module only when a server or a client starts (``import flowlab.cluster`` never loads it).

Between processes of one machine the same frames take the *local lane* instead (:mod:`.unix`):
a listener on a loopback address also listens on a Unix socket, and ``connect`` to such an
address goes there when its socket file exists, skipping ZeroMQ's I/O threads (a tiny round trip
costs about half as much). Other hosts, non-loopback binds and systems without AF_UNIX use TCP;
``FLOWLAB_LOCAL_LANE=0`` forces TCP everywhere. A connection's ``lane`` says which it took.

A transport makes two kinds of endpoint, with the same interface as :mod:`.inproc`:

- ``listen(host, port)`` -> a :class:`Listener` (a ROUTER socket): ``recv(timeout)`` gives
  ``(peer, frames)``, ``send(peer, frames)`` answers from the thread that receives, and ``post``
  queues an answer from any other thread (the receiving thread sends it at its next ``recv``).
- ``connect(address)`` -> a :class:`Connection` (a DEALER socket to one listener): ``send(frames)``,
  ``recv(timeout)``.

Frames are sent with ``copy=False``: a large buffer (a tensor) goes to the network straight from
its memory (pyzmq still copies frames below ``zmq.COPY_THRESHOLD``, 64 KiB, which is faster for
small ones). On receipt the first frame of a message (the signed header) is read as bytes and
every later one (a tensor) as a ``zmq.Frame`` whose buffer numpy wraps without a copy.
A buffer given to ``send`` must not change until the peer has it. Sockets close with linger 0, so
closing never waits on a peer that is gone. Every wait has a timeout.

Limits on what a peer can make a listener hold before a message is verified: over TCP, ZeroMQ
disconnects a peer that announces a frame longer than ``protocol.MAX_FRAME`` (``MAXMSGSIZE``),
drops a connection whose ZMTP handshake takes over :data:`HANDSHAKE_MS`, and pings every
connection, dropping one that does not answer within :data:`HEARTBEAT_TIMEOUT_MS` (a peer stalled
in the middle of a frame cannot answer). ZeroMQ still assembles a whole message before flowlab sees
its signed header, so over TCP a peer without the key can make a listener hold up to MAX_FRAME per
frame it actually sends; the local lane checks the header first (see :mod:`.unix`).
"""
from __future__ import annotations

import collections
import errno
import os
import threading
import time

import zmq

from . import protocol as _protocol
from . import unix as _unix
from .errors import ClusterError, ClusterTimeoutError
from .spec import split_address

__all__ = ["ZmqTransport", "Listener", "Connection", "context"]

SEND_TIMEOUT_MS = 10_000     # a send that cannot be queued for this long raises (full queue)
HANDSHAKE_MS = 5_000         # a TCP connection must finish ZeroMQ's handshake within this
HEARTBEAT_MS = 2_000         # a listener pings each connection this often when it is quiet ...
HEARTBEAT_TIMEOUT_MS = 10_000  # ... and drops one that has not answered within this
_NOBLOCK = zmq.NOBLOCK
_Again = zmq.Again
_POLLIN = int(zmq.POLLIN)
_POLLOUT = int(zmq.POLLOUT)       # plain ints: flag enums are slow to combine
_POLLIN_ERR = int(zmq.POLLIN | zmq.POLLERR)
_monotonic = time.monotonic
_zmq_poll = zmq.zmq_poll
_yield = getattr(os, "sched_yield", lambda: None)
_ctx = None
_ctx_lock = threading.Lock()


def context() -> "zmq.Context":
    """The process's ZeroMQ context (created on first use, never terminated: sockets close with
    linger 0 instead, so nothing waits at exit)."""
    global _ctx
    with _ctx_lock:
        if _ctx is None:
            _ctx = zmq.Context()
        return _ctx


def _ms(timeout):
    return -1 if timeout is None else max(0, int(timeout * 1000 + 0.999))


class Listener:
    """A bound ROUTER socket: messages from any number of connections, answers to each; on a
    loopback address also the local lane's Unix socket (see :mod:`.unix`), served by the same
    thread: ``recv`` waits on the ROUTER and the Unix sockets together (one ``zmq_poll``).

    When the last message came within ``unix.SPIN`` of the call before, ``recv`` looks for the next
    one without sleeping first (see :mod:`.unix`, "Waiting").

    ``post`` from another thread goes through that thread's own inproc DEALER, connected to this
    same ROUTER under a random identity; ``recv`` forwards such messages to their peer. A peer of
    the local lane is answered from the posting thread itself (its writes are locked). So the
    receiving thread waits in one place and still sends what other threads hand it at once.
    ``lane`` is ``"unix+tcp"`` when the local lane is open, else ``"tcp"``."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, tries: int = 1):
        ctx = context()
        self._sock = sock = ctx.socket(zmq.ROUTER)
        sock.linger = 0
        sock.sndtimeo = SEND_TIMEOUT_MS
        sock.maxmsgsize = _protocol.MAX_FRAME
        sock.handshake_ivl = HANDSHAKE_MS
        sock.heartbeat_ivl = HEARTBEAT_MS
        sock.heartbeat_timeout = HEARTBEAT_TIMEOUT_MS
        self.port = _bind(sock, host, port, tries)
        self.host = host
        self.address = f"{host}:{self.port}"
        self._post_prefix = b"flowlab-post-" + os.urandom(8).hex().encode()
        self._post_addr = f"inproc://{self._post_prefix.decode()}"
        sock.bind(self._post_addr)
        self._posters: list = []
        self._local = threading.local()
        self._post_lock = threading.Lock()
        self._timeout = None
        self._closed = False
        self._unix = None
        path = _unix.lane_path(host, self.port, create=True)
        if path is not None:
            try:
                self._unix = _unix.UnixSide(path)
            except OSError:
                self._unix = None        # no lane (a full disk, a path we may not use): TCP only
        self._spin = None          # spin before sleeping (see unix.SPIN): None off, else the last verdict
        if self._unix is not None:
            self._ready = collections.deque()
            self._items: list = []
            if _unix.SPIN > 0:
                self._spin = False
        self.lane = "unix+tcp" if self._unix is not None else "tcp"

    def check_with(self, admit) -> None:
        """Have the local lane check each message's signed header with ``admit`` (a server's
        ``Verifier.admit``) before it receives the message's buffers (see :mod:`.unix`). ZeroMQ
        hands up whole messages only; TCP relies on the limits in this module's docstring."""
        if self._unix is not None:
            self._unix.admit = admit

    @property
    def lane_path(self) -> str | None:
        """The local lane's socket file (None without a lane)."""
        return self._unix.path if self._unix is not None else None

    def recv(self, timeout: float | None):
        """``(peer, frames)`` of the next message, or None after ``timeout`` seconds (None: wait)."""
        if self._unix is not None:
            return self._recv_both(timeout)
        sock = self._sock
        ms = _ms(timeout)
        if ms != self._timeout:
            sock.rcvtimeo = self._timeout = ms
        prefix = self._post_prefix
        flags = 0 if ms else _NOBLOCK
        while True:
            try:
                peer, *frames = _recv(sock, flags, 2)
            except _Again:
                return None
            if not peer.startswith(prefix):
                return peer, frames
            if frames[0]:
                self.send(frames[0], frames[1:])   # posted by another thread: pass it on
            else:
                return None                        # wake(): let the caller look around

    def _recv_both(self, timeout):
        ready = self._ready
        if ready:
            return ready.popleft()
        unix, sock = self._unix, self._sock
        deadline = None
        spin = self._spin
        if spin is not None:
            start = _monotonic()
        while True:
            if unix.changed:
                self._register()
            if unix.pending:
                unix.expire()
            if deadline is None:
                ms = _ms(timeout)
                if ms > 0:
                    deadline = _monotonic() + ms / 1000
                elif ms < 0:
                    deadline = False
            elif deadline is not False:
                ms = max(0, int((deadline - _monotonic()) * 1000 + 0.999))
            woke = False
            events = None
            if spin and ms:        # the last message came soon after the one before: look without sleeping
                spin, end, last = False, start + _unix.SPIN, start
                events = _zmq_poll(self._items, 0)
                while not events:
                    now = _monotonic()
                    if now >= end or now - last > _unix.CONTENDED:   # others want the processor: sleep
                        break
                    last = now
                    _yield()
                    events = _zmq_poll(self._items, 0)
            for what, ev in events or _zmq_poll(self._items, ms):
                if what is sock:
                    woke = self._drain_router() or woke
                elif what == unix.fd:
                    unix.accept()
                else:
                    if ev & _POLLOUT:
                        unix.writable(what)
                    if ev & _POLLIN_ERR:
                        unix.readable(what, ready)
            if ready:
                if spin is not None:
                    self._spin = _monotonic() - start <= 2 * _unix.SPIN
                return ready.popleft()
            if woke or ms == 0 or (deadline and _monotonic() >= deadline):
                if spin is not None and not woke:
                    self._spin = False
                return None

    def _register(self):
        """Poll the ROUTER, the lane's listening socket and each lane connection (writable too
        where answers wait to go out)."""
        unix = self._unix
        items = [(self._sock, _POLLIN), (unix.fd, _POLLIN)]
        items += [(fd, _POLLIN | _POLLOUT if out else _POLLIN) for fd, out in unix.wanted()]
        self._items = items

    def _drain_router(self) -> bool:
        """Take every message the ROUTER holds; True if one of them was a wake()."""
        sock, prefix, ready = self._sock, self._post_prefix, self._ready
        woke = False
        while True:
            try:
                peer, *frames = _recv(sock, _NOBLOCK, 2)
            except _Again:
                return woke
            if not peer.startswith(prefix):
                ready.append((peer, frames))
            elif frames[0]:
                self.send(frames[0], frames[1:])
            else:
                woke = True

    def send(self, peer, frames) -> None:
        """Send to ``peer`` (from the thread that calls ``recv``). A peer that is gone is skipped."""
        if peer.__class__ is not bytes:
            self._unix.send(peer, frames)          # the local lane: what does not fit now goes later
            return
        try:
            self._sock.send_multipart([peer, *frames], copy=False)
        except _Again:
            raise ClusterTimeoutError(f"could not send to a client of {self.address} for "
                                      f"{SEND_TIMEOUT_MS / 1000:.0f} s (its queue is full)") from None
        except zmq.ZMQError as e:
            if e.errno != zmq.EHOSTUNREACH:
                raise

    def post(self, peer, frames) -> None:
        """Send to ``peer`` from any thread: the thread in ``recv`` passes it on at once."""
        if peer.__class__ is not bytes:
            if not self._unix.send(peer, frames):
                self.wake()                        # the rest waits for the loop to see it writable
            return
        poster = getattr(self._local, "sock", None)
        if poster is None:
            with self._post_lock:
                if self._closed:
                    return
                poster = context().socket(zmq.DEALER)
                poster.linger = 0
                poster.identity = self._post_prefix + b"-%d" % len(self._posters)
                poster.connect(self._post_addr)
                self._posters.append(poster)
                self._local.sock = poster
        poster.send_multipart([peer, *frames], copy=False)

    def wake(self) -> None:
        """Make a ``recv`` waiting in another thread return None now."""
        self.post(b"", [])

    def close(self) -> None:
        with self._post_lock:
            self._closed = True
            for p in self._posters:
                p.close(0)
            self._posters.clear()
        if self._unix is not None:
            self._unix.close()                     # the socket file goes first: no new lane clients
        self._sock.close(200)   # a moment for the last answers (a shutdown's receipt) to leave

    def __repr__(self):
        return f"<flowlab Listener on {self.address} ({self.lane}{': ' + self.lane_path if self._unix else ''})>"


class Connection:
    """A DEALER socket connected to one listener: requests out, answers in, in order per side."""
    lane = "tcp"

    def __init__(self, address: str):
        host, port = split_address(address)
        self.address = address
        self._sock = sock = context().socket(zmq.DEALER)
        sock.linger = 0
        sock.sndtimeo = SEND_TIMEOUT_MS
        self._timeout = None
        sock.connect(f"tcp://{_host(host)}:{port}")

    def send(self, frames) -> None:
        try:
            self._sock.send_multipart(frames, copy=False)
        except _Again:
            raise ClusterTimeoutError(f"could not send to {self.address} for {SEND_TIMEOUT_MS / 1000:.0f} s "
                                      f"(the peer is not reading)") from None

    def recv(self, timeout: float | None):
        """The frames of the next message, or None after ``timeout`` seconds."""
        sock = self._sock
        ms = _ms(timeout)
        try:
            if not ms:
                return _recv(sock, _NOBLOCK, 1)
            if ms != self._timeout:
                sock.rcvtimeo = self._timeout = ms
            return _recv(sock, 0, 1)
        except _Again:
            return None

    def close(self) -> None:
        self._sock.close(0)

    def __repr__(self):
        return f"<flowlab connection to {self.address} over TCP (ZeroMQ)>"


class ZmqTransport:
    """Listeners and connections over TCP (ZeroMQ)."""
    name = "zmq"

    def listen(self, host: str = "127.0.0.1", port: int = 0, tries: int = 1) -> Listener:
        """Bind ``host:port`` (port 0: any free port; ``tries`` > 1: the first free port of
        ``port``, ``port + 1``, ... skipping ports in use)."""
        return Listener(host, port, tries)

    def connect(self, address: str):
        """A connection to the listener at ``address``: over the local lane when that listener is
        on this machine and has one (see :mod:`.unix`), else a ZeroMQ DEALER over TCP."""
        host, port = split_address(address)
        path = _unix.lane_path(host, port)
        if path is not None and os.path.exists(path):
            try:
                return _unix.UnixConnection(address, path)
            except OSError:
                _unix.remove_if_dead(address)      # a file its killed task left behind
        return Connection(address)


def _recv(sock, flags, small):
    """One whole message: its first ``small`` frames (routing id, signed header) as bytes, the
    frames after them (tensor buffers) as zero-copy ``zmq.Frame`` s."""
    f = sock.recv(flags, copy=False)
    out = [f.bytes]
    while f.more:
        f = sock.recv(copy=False)
        out.append(f.bytes if len(out) < small else f)
    return out


def _host(host):
    if host in ("localhost", ""):
        return "127.0.0.1"
    return f"[{host}]" if ":" in host else host


def _bind(sock, host, port, tries):
    h = _host(host)
    if ":" in host:
        sock.ipv6 = True
    if not port:
        sock.bind(f"tcp://{h}:*")
        return int(sock.last_endpoint.decode().rsplit(":", 1)[1])
    last = None
    for p in range(port, min(port + max(1, tries), 65536)):
        try:
            sock.bind(f"tcp://{h}:{p}")
            return p
        except zmq.ZMQError as e:
            if e.errno not in (errno.EADDRINUSE, errno.EACCES):
                sock.close(0)
                raise ClusterError(f"cannot listen on {host}:{p}: {e}") from None
            last = e
    sock.close(0)
    raise ClusterError(f"cannot listen on {host}: ports {port}..{port + max(1, tries) - 1} are all in use ({last})")
