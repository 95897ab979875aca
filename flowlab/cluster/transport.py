"""The ZeroMQ transport: how frames move between processes. pyzmq is imported here only, and this
module only when a server or a client starts (``import flowlab.cluster`` never loads it).

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
"""
from __future__ import annotations

import errno
import os
import threading

import zmq

from .errors import ClusterError, ClusterTimeoutError
from .spec import split_address

__all__ = ["ZmqTransport", "Listener", "Connection", "context"]

SEND_TIMEOUT_MS = 10_000     # a send that cannot be queued for this long raises (full queue)
_NOBLOCK = zmq.NOBLOCK
_Again = zmq.Again
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
    """A bound ROUTER socket: messages from any number of connections, answers to each.

    ``post`` from another thread goes through that thread's own inproc DEALER, connected to this
    same ROUTER under a random identity; ``recv`` forwards such messages to their peer. So the
    receiving thread blocks on one socket (a plain blocking receive with a timeout, the cheapest
    wait pyzmq has) and still sends what other threads hand it at once."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, tries: int = 1):
        ctx = context()
        self._sock = sock = ctx.socket(zmq.ROUTER)
        sock.linger = 0
        sock.sndtimeo = SEND_TIMEOUT_MS
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

    def recv(self, timeout: float | None):
        """``(peer, frames)`` of the next message, or None after ``timeout`` seconds (None: wait)."""
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

    def send(self, peer: bytes, frames) -> None:
        """Send to ``peer`` (from the thread that calls ``recv``). A peer that is gone is skipped."""
        try:
            self._sock.send_multipart([peer, *frames], copy=False)
        except _Again:
            raise ClusterTimeoutError(f"could not send to a client of {self.address} for "
                                      f"{SEND_TIMEOUT_MS / 1000:.0f} s (its queue is full)") from None
        except zmq.ZMQError as e:
            if e.errno != zmq.EHOSTUNREACH:
                raise

    def post(self, peer: bytes, frames) -> None:
        """Send to ``peer`` from any thread: the thread in ``recv`` passes it on at once."""
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
        self._sock.close(200)   # a moment for the last answers (a shutdown's receipt) to leave


class Connection:
    """A DEALER socket connected to one listener: requests out, answers in, in order per side."""

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


class ZmqTransport:
    """Listeners and connections over TCP (ZeroMQ)."""
    name = "zmq"

    def listen(self, host: str = "127.0.0.1", port: int = 0, tries: int = 1) -> Listener:
        """Bind ``host:port`` (port 0: any free port; ``tries`` > 1: the first free port of
        ``port``, ``port + 1``, ... skipping ports in use)."""
        return Listener(host, port, tries)

    def connect(self, address: str) -> Connection:
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
