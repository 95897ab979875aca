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

The TCP handshake: a transport made with the cluster key (``ZmqTransport(key)``; a Server, a
Client and the liveness monitor key theirs) makes every TCP socket do a keyed ZeroMQ handshake
(:func:`apply_key`), with credentials derived from the key by HMAC-SHA256 (the key itself is never
sent): ``FLOWLAB_TCP_AUTH=plain`` (the default) sends a derived password, which the process's ZAP
handler (:class:`_Zap`, one thread, started with the first keyed listener; a ZAP domain per key, so
clusters of several keys share it) checks; ``curve`` derives CURVE keypairs instead (the traffic is
then encrypted too, at about a quarter of the speed: see the figures in docs/ARCHITECTURE.md);
``null`` turns the check off (for measurements). A connection that fails the handshake is dropped by
ZeroMQ; a :class:`Connection` watches its socket's handshake events until one succeeds, so a
connection made with another key raises a ClusterError naming the address and the cluster key at
its next ``send`` or ``recv`` instead of waiting out a timeout. PLAIN's password crosses the network
in the clear: someone who can read the traffic can then connect (not sign: nothing runs without the
key) and so send authenticated messages; use ``curve`` where that matters.

Limits on what a peer can make a listener hold before a message is verified: every TCP socket
takes ZeroMQ parts (and handshake commands) of at most :data:`CHUNK` bytes (``MAXMSGSIZE``,
``FLOWLAB_TCP_CHUNK_MB``, default 1 MiB; ZeroMQ disconnects a peer that announces more), drops a
connection whose handshake takes over :data:`HANDSHAKE_MS`, and pings every connection, dropping
one that does not answer within :data:`HEARTBEAT_TIMEOUT_MS`. So a peer without the key holds at
most CHUNK bytes per connection for at most HANDSHAKE_MS. A larger frame travels as several parts
(:func:`_send_parts`: an empty part, the list of buffer sizes, the signed header, then each buffer
in parts of at most CHUNK bytes); the receiver checks the signed header against those sizes
(``Verifier.admit`` on a listener: the signature, the address, the time, the replay window, the
sizes exactly those signed, each within ``protocol.MAX_FRAME``) before it allocates one buffer per
frame and receives the parts straight into it (``recv_into``: one copy, nothing else allocated).
A message whose frames all fit in one part each goes as before (one length check per buffer). ZeroMQ still
delivers a multipart message only when all its parts are in, so a peer *with* the key can make a
listener hold a whole message before flowlab looks at it; the local lane checks the header first
(see :mod:`.unix`).
"""
from __future__ import annotations

import collections
import errno
import hashlib
import hmac
import logging
import os
import struct
import threading
import time

import zmq
from zmq.utils import z85 as _z85

from . import protocol as _protocol
from . import unix as _unix
from .errors import ClusterError, ClusterTimeoutError
from .spec import split_address

__all__ = ["ZmqTransport", "Listener", "Connection", "context", "apply_key", "AUTH", "CHUNK"]

log = logging.getLogger("flowlab.cluster")

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


def _auth_from_env() -> str:
    text = os.environ.get("FLOWLAB_TCP_AUTH", "plain").strip().lower()
    if text not in ("plain", "curve", "null"):
        raise ValueError(f"FLOWLAB_TCP_AUTH={text!r}: use 'plain' (the default: a password derived from the "
                         f"cluster key), 'curve' (keys derived from it, traffic encrypted) or 'null' (no "
                         f"handshake check: for measurements only)")
    if text == "curve" and not zmq.has("curve"):
        raise ValueError("FLOWLAB_TCP_AUTH=curve, but this libzmq was built without CURVE; use 'plain'")
    return text


def _chunk_from_env() -> int:
    text = os.environ.get("FLOWLAB_TCP_CHUNK_MB", "1")
    try:
        mib = float(text)
        if not 1 / 64 <= mib <= 1024:
            raise ValueError
    except ValueError:
        raise ValueError(f"FLOWLAB_TCP_CHUNK_MB={text!r} is not a number of mebibytes between 1/64 and 1024 "
                         f"(the largest ZeroMQ part a TCP peer may send; unset it for the default, 1)") from None
    return int(mib * (1 << 20))


AUTH = _auth_from_env()       # the handshake every TCP socket makes (see the module's docstring)
CHUNK = _chunk_from_env()     # bytes: ZMQ_MAXMSGSIZE on every TCP socket, and the largest part sent
_WIRE_SLACK = 1024           # bytes a part may grow on the wire (CURVE's box and nonce: 33)
_MAX_BUFFERS = 4096           # buffers a chunked message may list (the layout part is 8 bytes each)


def context() -> "zmq.Context":
    """The process's ZeroMQ context (created on first use, never terminated: sockets close with
    linger 0 instead, so nothing waits at exit)."""
    global _ctx
    with _ctx_lock:
        if _ctx is None:
            _ctx = zmq.Context()
        return _ctx


class _Keys:
    """What a cluster key gives a ZeroMQ handshake, each derived by HMAC-SHA256 (the key itself
    never leaves the process): the ZAP domain of its listeners, a PLAIN password, and CURVE
    keypairs for the listener and for every connecting side."""

    def __init__(self, key: bytes):
        def derive(label):
            return hmac.new(key, b"flowlab tcp handshake: " + label, hashlib.sha256).digest()
        self.domain = "flowlab-" + derive(b"zap domain")[:8].hex()
        self.user = "flowlab"
        self.password = derive(b"plain password").hex()
        self.server_secret = _z85.encode(derive(b"curve listener"))
        self.server_public = zmq.curve_public(self.server_secret)
        self.client_secret = _z85.encode(derive(b"curve connection"))
        self.client_public = zmq.curve_public(self.client_secret)
        self.client_public_raw = _z85.decode(self.client_public)


_keys: dict = {}
_zap = None            # the process's ZAP handler, started with the first keyed listener
_zap_lock = threading.Lock()


def _keys_of(key) -> _Keys:
    keys = _keys.get(key)
    if keys is None:
        from .protocol import _check_key
        keys = _keys[key] = _Keys(_check_key(key))
    return keys


class _Zap(threading.Thread):
    """ZeroMQ's authentication protocol (ZAP, RFC 27) for this process's context: a REP socket on
    ``inproc://zeromq.zap.01`` that libzmq asks about each TCP handshake of a keyed listener, and
    that answers 200 only for the credentials of the listener's domain (a domain per cluster key).
    A small thread of its own rather than ``zmq.auth`` (which loads asyncio: ~0.1-0.3 s more at
    every worker's start)."""

    def __init__(self, ctx):
        super().__init__(name="flowlab-zap", daemon=True)
        self.domains: dict = {}      # ZAP domain (bytes) -> _Keys
        self._sock = ctx.socket(zmq.REP)
        self._sock.linger = 0
        self._sock.bind("inproc://zeromq.zap.01")

    def run(self):
        sock = self._sock
        while True:
            try:
                request = sock.recv_multipart()
                sock.send_multipart(self.answer(request))
            except zmq.ZMQError:       # the context was terminated: nothing left to guard
                return

    def answer(self, request) -> list:
        ok = False
        if len(request) >= 6 and request[0] == b"1.0":
            _, rid, domain, _address, _identity, mechanism, *creds = request
            keys = self.domains.get(domain)
            if keys is not None and mechanism == b"PLAIN" and len(creds) == 2:
                ok = (hmac.compare_digest(creds[0], keys.user.encode())
                      & hmac.compare_digest(creds[1], keys.password.encode()))
            elif keys is not None and mechanism == b"CURVE" and len(creds) == 1:
                ok = hmac.compare_digest(creds[0], keys.client_public_raw)
        rid = request[1] if len(request) > 1 else b""
        return [b"1.0", rid, b"200", b"OK", b"flowlab", b""] if ok else [b"1.0", rid, b"400", b"no cluster key", b"", b""]


def _authenticator(keys: _Keys):
    """Teach the process's ZAP handler (started on first use) the credentials of ``keys``."""
    global _zap
    ctx = context()
    with _zap_lock:
        if _zap is None:
            _zap = _Zap(ctx)
            _zap.start()
        _zap.domains[keys.domain.encode()] = keys


def apply_key(sock, key, server: bool = False) -> None:
    """Make ``sock`` (a ZeroMQ socket, before it binds or connects) do flowlab's TCP handshake for
    the cluster ``key`` (:data:`AUTH`), and take parts of at most :data:`CHUNK` bytes. ``server``:
    the binding side (its peers' credentials are checked by the process's ZAP handler)."""
    sock.maxmsgsize = CHUNK + _WIRE_SLACK
    if key is None or AUTH == "null":
        return
    keys = _keys_of(key)
    if server:
        _authenticator(keys)
        sock.zap_domain = keys.domain.encode()
        if AUTH == "plain":
            sock.plain_server = True
        else:
            sock.curve_secretkey = keys.server_secret
            sock.curve_publickey = keys.server_public
            sock.curve_server = True
    elif AUTH == "plain":
        sock.plain_username = keys.user.encode()
        sock.plain_password = keys.password.encode()
    else:
        sock.curve_serverkey = keys.server_public
        sock.curve_publickey = keys.client_public
        sock.curve_secretkey = keys.client_secret


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

    def __init__(self, host: str = "127.0.0.1", port: int = 0, tries: int = 1, key=None):
        ctx = context()
        self._sock = sock = ctx.socket(zmq.ROUTER)
        sock.linger = 0
        sock.sndtimeo = SEND_TIMEOUT_MS
        apply_key(sock, key, server=True)      # before bind: a listener copies its options then
        self._admit = None
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
        ``Verifier.admit``) before it receives the message's buffers (see :mod:`.unix`), and TCP
        check each chunked message's header before it allocates the frames to join its parts in
        (see this module's docstring)."""
        self._admit = admit
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
                peer, *frames = _recv(sock, flags, 2, self._admit)
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
                peer, *frames = _recv(sock, _NOBLOCK, 2, self._admit)
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
            if len(frames) > 1 or len(frames[0]) > CHUNK:
                _send_parts(self._sock, frames, peer)
            else:
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
        try:
            poster.send_multipart([peer, *frames], copy=False)
        except zmq.ZMQError:
            if self._closed:      # closed meanwhile (a server's stop racing its loop's close): nothing to wake
                return
            raise

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

    def __init__(self, address: str, key=None):
        host, port = split_address(address)
        self.address = address
        self._sock = sock = context().socket(zmq.DEALER)
        sock.linger = 0
        sock.sndtimeo = SEND_TIMEOUT_MS
        apply_key(sock, key)
        self._timeout = None
        self._watch = None      # until a handshake succeeds: the socket's events, to tell a refused one
        if AUTH != "null":
            self._watch = sock.get_monitor_socket(_WATCHED)
        sock.connect(f"tcp://{_host(host)}:{port}")

    def send(self, frames) -> None:
        if self._watch is not None:
            self._events()                   # a refused handshake raises (else sends wait 10 s)
        try:
            if len(frames) > 1 or len(frames[0]) > CHUNK:
                _send_parts(self._sock, frames)
            else:
                self._sock.send(frames[0], copy=False)
        except _Again:
            if self._watch is not None:
                self._events()
            raise ClusterTimeoutError(f"could not send to {self.address} for {SEND_TIMEOUT_MS / 1000:.0f} s "
                                      f"(the peer is not reading)") from None

    def recv(self, timeout: float | None):
        """The frames of the next message, or None after ``timeout`` seconds."""
        if self._watch is not None:
            return self._recv_watching(timeout)
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

    def _recv_watching(self, timeout):
        """``recv`` until the first handshake is done: waits on the socket and its events
        together, so that a listener that refuses the handshake (another cluster key) raises at
        once instead of letting the caller wait out its timeout."""
        sock, watch = self._sock, self._watch
        if watch.__class__ is ClusterError:
            raise watch
        deadline = None if timeout is None else _monotonic() + timeout
        while True:
            ms = -1 if deadline is None else max(0, int((deadline - _monotonic()) * 1000 + 0.999))
            ready = dict(_zmq_poll([(sock, _POLLIN), (watch, _POLLIN)], ms))
            if watch in ready:
                self._events()
            if sock in ready:
                try:
                    return _recv(sock, _NOBLOCK, 1)
                except _Again:
                    pass
            if self._watch is None:          # handshake done: the plain wait from now on
                return self.recv(None if deadline is None else max(0.0, deadline - _monotonic()))
            if not ready:
                return None

    def _events(self):
        """Read the handshake events so far: stop watching after a success; raise ClusterError,
        now and on every later call, after a refusal."""
        from zmq.utils.monitor import recv_monitor_message
        watch = self._watch
        if watch.__class__ is ClusterError:
            raise watch
        while watch.poll(0):
            event = recv_monitor_message(watch)["event"]
            if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self._unwatch()
                return
            if event in _REFUSED:
                self._unwatch()
                self._watch = ClusterError(
                    f"{self.address} refused this connection's handshake: it was made with a different cluster "
                    f"key (connect with the key of the cluster that listens there, e.g. LocalCluster.key, "
                    f"FLOWLAB_CLUSTER_KEY; the same FLOWLAB_TCP_AUTH ({AUTH}) must be set on both sides)")
                raise self._watch

    def _unwatch(self):
        watch, self._watch = self._watch, None
        if watch is not None and watch.__class__ is not ClusterError:
            try:
                self._sock.disable_monitor()
            except zmq.ZMQError:
                pass
            watch.close(0)

    def close(self) -> None:
        self._unwatch()
        self._sock.close(0)

    def __repr__(self):
        return f"<flowlab connection to {self.address} over TCP (ZeroMQ)>"


_WATCHED = int(zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_AUTH
               | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)
_REFUSED = (zmq.EVENT_HANDSHAKE_FAILED_AUTH, zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL,
            zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)


class ZmqTransport:
    """Listeners and connections over TCP (ZeroMQ), keyed with the cluster ``key``: every TCP
    connection then makes the handshake of :data:`AUTH` with credentials derived from it (None:
    no handshake check, for tools that speak to no cluster). :mod:`.schemes` serves addresses of
    the scheme ``tcp`` with it (``host:port``, ``tcp://host:port``)."""
    scheme, name = "tcp", "zmq"

    def __init__(self, key=None):
        self.key = key

    def keyed(self, key) -> "ZmqTransport":
        """This transport if it has ``key``, else one that has."""
        return self if self.key == key else ZmqTransport(key)

    def listen(self, host: str = "127.0.0.1", port: int = 0, tries: int = 1) -> Listener:
        """Bind ``host:port`` (port 0: any free port; ``tries`` > 1: the first free port of
        ``port``, ``port + 1``, ... skipping ports in use)."""
        return Listener(host, port, tries, self.key)

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
        return Connection(address, self.key)


def _recv(sock, flags, small, admit=None):
    """One whole message: its first ``small`` frames (routing id, signed header) as bytes, the
    frames after them (tensor buffers) as zero-copy ``zmq.Frame`` s. A chunked message (its
    header's place holds an empty part) is joined by :func:`_recv_joined`."""
    f = sock.recv(flags, copy=False)
    out = [f.bytes]
    if small == 1 and f.more and not out[0]:
        return _recv_joined(sock, [], admit)
    while f.more:
        f = sock.recv(copy=False)
        if len(out) < small:
            b = f.bytes
            if not b and f.more and len(out) == small - 1:
                return _recv_joined(sock, out, admit)
            out.append(b)
        else:
            out.append(f)
    return out


def _send_parts(sock, frames, peer=None):
    """Send ``frames`` (a header and buffers) with no ZeroMQ part over :data:`CHUNK` bytes: as
    they are when each fits, else chunked: ``[b"", layout, header, parts...]`` where ``layout``
    lists each buffer's byte length (unsigned 64-bit, little-endian) and each buffer follows as
    one or more parts of at most CHUNK bytes (one empty part for an empty buffer)."""
    head = frames[0]
    if len(head) > CHUNK:
        raise ClusterError(f"a message header of {len(head)} bytes is over the TCP part limit of {CHUNK} bytes "
                           f"(FLOWLAB_TCP_CHUNK_MB on both sides raises it): send large data as buffers")
    sizes = []
    for b in frames[1:]:
        try:
            sizes.append(b.nbytes)
        except AttributeError:
            sizes.append(len(b))
    if not sizes or max(sizes) <= CHUNK:
        sock.send_multipart([peer, *frames] if peer is not None else frames, copy=False)
        return
    if len(sizes) > _MAX_BUFFERS:
        raise ClusterError(f"a message of {len(sizes)} buffers is over the limit of {_MAX_BUFFERS} for TCP")
    parts = [peer] if peer is not None else []
    parts += [b"", struct.pack(f"<{len(sizes)}Q", *sizes), head]
    for b, n in zip(frames[1:], sizes):
        if n <= CHUNK:
            parts.append(b)
            continue
        mv = memoryview(b)
        if mv.ndim != 1 or mv.itemsize != 1:
            mv = mv.cast("B")
        parts += [mv[i:i + CHUNK] for i in range(0, n, CHUNK)]
    sock.send_multipart(parts, copy=False)


def _recv_joined(sock, out, admit):
    """The rest of a chunked message (see :func:`_send_parts`) after its empty marker part: the
    layout and the signed header are read and checked (``admit``: a listener's
    ``Verifier.admit``, else the sizes against ``protocol.MAX_FRAME``) *before* one buffer per
    frame is allocated; the parts are then received straight into them (one copy, no other
    allocation). A message that fails is drained and handed up as one bad frame (the caller's
    verifier drops it and counts it), after a warning that says why."""
    base = len(out)
    try:
        layout = sock.recv()
        if not sock.rcvmore:
            raise ValueError("no header after the layout")
        header = sock.recv()
        if len(layout) % 8 or len(layout) > 8 * _MAX_BUFFERS:
            raise ValueError(f"a layout of {len(layout)} bytes")
        sizes = struct.unpack(f"<{len(layout) // 8}Q", layout)
        if admit is not None:
            admit(header, sizes)
        elif sizes and max(sizes) > _protocol.MAX_FRAME:
            raise ValueError(f"a frame of {max(sizes)} bytes (the limit is {_protocol.MAX_FRAME}, "
                             f"FLOWLAB_MAX_FRAME_MB)")
        out.append(header)
        empty = _empty()
        for n in sizes:
            if not sock.rcvmore:
                raise ValueError("fewer parts than the layout lists")
            mv = memoryview(empty(n, "u1")) if n else memoryview(bytearray(0))
            got = 0
            while True:
                k = sock.recv_into(mv[got:]) if got < n else sock.recv_into(bytearray(0))
                if k > n - got:
                    raise ValueError(f"a part overruns its frame of {n} bytes")
                got += k
                if got == n:
                    break
                if not sock.rcvmore:
                    raise ValueError("fewer parts than the layout lists")
            out.append(mv)
        if sock.rcvmore:
            raise ValueError("more parts than the layout lists")
        return out
    except (ValueError, struct.error, _protocol.ProtocolError) as e:
        while sock.rcvmore:
            sock.recv(copy=False)
        log.warning("tcp: dropped a chunked message refused before its buffers were received (%s)", e)
        del out[base:]
        out.append(b"refused before its buffers were received")
        return out


def _empty():
    """The allocator of joined frames: recycled blocks (:mod:`._buffers`), so a stream of large
    messages does not pay for fresh pages (their first touch) on every one."""
    from . import _buffers
    return _buffers.empty


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
