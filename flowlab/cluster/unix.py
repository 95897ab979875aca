"""The local lane: the same signed frames over a Unix domain socket, between processes of one machine.

ZeroMQ moves every message through I/O threads of its own, two thread hops on each side; a tiny
round trip costs well over 100 us on a laptop before any work is done. When a task listens on a
loopback address (``127.0.0.1:5555``), its :class:`~.transport.Listener` also listens on a Unix
socket at :func:`lane_path` (``127.0.0.1-5555`` in a directory only this user may enter, 0700),
and a connection to a loopback address whose socket file exists goes there instead of TCP. The
messages are exactly the signed frames of :mod:`.protocol`: the receiver checks each one as it
would from TCP, so nothing is trusted because of the lane it came by.

On the stream, a message is a preamble, ``count`` (u32) and the ``count`` frame lengths (u64,
little-endian), then the frames back to back. Frames up to :data:`SMALL` bytes are copied out of a
reused read buffer; a larger one (a tensor) is received straight into a buffer of its own, and sent
from its own memory with ``sendmsg``. A stream that breaks the framing (a count of 0, absurd
lengths) is handed up as one frame, so the server drops and counts it as any message that fails
its checks, and that connection is closed (its framing cannot be trusted any more).

Verify before allocating: a listener's connections check the first frame of a message (signature
and header) with the server's ``Verifier.admit`` before they receive anything more, whenever the
message is larger than the read buffer, and for every message until the connection has sent one
that passed (see :meth:`.transport.Listener.check_with`). A frame's announced length must then be
exactly what the signed header lists, and at most ``protocol.MAX_FRAME``; a first frame longer
than :data:`MAX_HEADER` is refused unread. A connection that has not passed that check within
:data:`HANDSHAKE` seconds is closed, and at most :data:`MAX_PENDING` such connections are kept (the
oldest goes first), so peers without the key hold at most about MAX_PENDING * (CHUNK + MAX_HEADER)
bytes of a server, and only for a few seconds.

Reused receive buffers: a large frame lands in a buffer from a small per-connection pool
(:class:`_Pool`), handed out again only when nothing refers to it any more (the message, the
arrays numpy made on it and any view of them are gone: the buffer's reference count says so), so a
tensor a user holds is never overwritten. Fresh memory costs a page fault per 4 KiB on first
touch, which on some VMs made a 64 MiB transfer take 150 ms instead of 12 ms.

Sameness of the machine is decided by the file: the socket's directory is per user, and its name
carries the network namespace, so a container with its own loopback never sees another's socket.
``FLOWLAB_LOCAL_LANE=0`` turns the lane off (everything goes over TCP, as without AF_UNIX).

Waiting (opt-in): waking a process that sleeps in ``poll`` costs tens of microseconds on a small
machine (more on a VM), as much as the work of a tiny round trip itself. With
``FLOWLAB_LANE_SPIN_US=200`` (microseconds, kept in :data:`SPIN` as seconds; 0, the default, is off), a side
whose last answer came within 2 * SPIN looks for the next one without sleeping first, yielding the
processor between looks (``sched_yield``), for at most SPIN, then sleeps as before (at once when a
look took longer than :data:`CONTENDED`: the yield let other processes run, so the processor is
wanted elsewhere): a client waiting for a reply (:meth:`UnixConnection._wait`) and a listener's
loop waiting for the next request (:class:`~.transport.Listener`). A burst of tiny calls keeps both
processes awake; an idle cluster, or calls slower than 2 * SPIN, never spin, so the most a side can
waste is SPIN per message. (The verdict allows twice the spin: a side that slept measures the
wake-up too, and a stricter one can lock both sides out of a spin that would pay.)

Measured on a 2-core VM under a load of about 2: a tiny op's round trip 126-135 us with the spin,
157-176 us without. It is off by default because it can also cost: with a handler that takes
~100 us more (a handler sent by value from ``__main__``), the same machine measured 337 us with
the spin against 224 us without, two busy-looping processes competing with everything else.
"""
from __future__ import annotations

import atexit
import collections
import logging
import os
import select
import socket
import stat
import struct
import sys
import tempfile
import threading
import time

from . import protocol as _protocol
from .errors import ClusterTimeoutError, ProtocolError

__all__ = ["AVAILABLE", "enabled", "lane_dir", "lane_path", "remove_if_dead", "UnixConnection", "UnixSide"]

AVAILABLE = hasattr(socket, "AF_UNIX") and sys.platform != "win32"
SMALL = 65536              # frames up to this size are copied out of the read buffer
CHUNK = 262144             # the read buffer
MAX_FRAMES = 4096          # more frames than this in one message is garbage
MAX_FRAME = _protocol.MAX_FRAME   # so is a longer frame (FLOWLAB_MAX_FRAME_MB; default 4 GiB)
MAX_HEADER = 1 << 20       # the longest first frame (signature + header) read before it is checked
HANDSHAKE = 5.0            # seconds a new connection has to send a message that passes the check
MAX_PENDING = 32           # connections kept that have not passed it yet (the oldest is closed first)
POOL = 2                   # reusable receive buffers kept per connection
POOL_LARGEST = 1 << 30     # frames longer than this get memory of their own, never kept
POOL_IDLE = 30.0           # seconds a free pooled buffer is kept unused
SOCKET_BUFFER = 4 << 20    # asked of the kernel for each socket (it may give less)
SEND_TIMEOUT = 10.0        # seconds a blocked send waits (as the TCP transport's send timeout)
_IOV = 512                 # buffers per sendmsg call (the system's limit is 1024 or more)


def _spin_from_env() -> float:
    text = os.environ.get("FLOWLAB_LANE_SPIN_US", "0")
    try:
        return max(0.0, float(text)) / 1e6
    except ValueError:
        logging.getLogger("flowlab.cluster").warning(
            "FLOWLAB_LANE_SPIN_US=%r is not a number of microseconds: no spin", text)
        return 0.0


SPIN = _spin_from_env()    # seconds a waiting side looks without sleeping (see "Waiting" above)
CONTENDED = 50e-6          # a look that took longer than this: the yield let others run, stop spinning
_monotonic = time.monotonic
_yield = getattr(os, "sched_yield", lambda: None)
_unpack_count = struct.Struct("<I").unpack_from
_dir = None
_dir_lock = threading.Lock()


class Garbage(Exception):
    """A stream that breaks the lane's framing: ``data`` is what was read of the bad message."""

    def __init__(self, why, data=b""):
        super().__init__(why)
        self.data = bytes(data)


def enabled() -> bool:
    return AVAILABLE and os.environ.get("FLOWLAB_LOCAL_LANE", "1") != "0"


def _private(path) -> bool:
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o077


def lane_dir(create: bool = False) -> str | None:
    """This user's lane directory (mode 0700, owned by this user), made when ``create``; None when
    it is missing, or is not private (then no lane is used)."""
    global _dir
    if _dir is not None:
        return _dir
    with _dir_lock:
        runtime = os.environ.get("XDG_RUNTIME_DIR")
        base = runtime if runtime and _private(runtime) else tempfile.gettempdir()
        path = os.path.join(base, "flowlab" if base == runtime else f"flowlab-{os.getuid()}")
        if create and not os.path.lexists(path):
            try:
                os.mkdir(path, 0o700)
            except FileExistsError:
                pass
            except OSError:
                return None
        if not _private(path):
            return None
        _dir = path
        return path


def _netns() -> str:
    try:
        link = os.readlink("/proc/self/ns/net")      # net:[4026531833]
        return "".join(c for c in link if c.isdigit())
    except OSError:
        return "0"


_NETNS = _netns()


def lane_path(host: str, port: int, create: bool = False) -> str | None:
    """The Unix socket of the task listening on ``host:port``, or None when that address gets no
    lane (not loopback, no AF_UNIX, lane turned off, no private directory)."""
    if not enabled():
        return None
    if host in ("localhost", ""):
        host = "127.0.0.1"
    elif host == "::1":
        host = "ip6-localhost"
    elif not host.startswith("127."):
        return None
    d = lane_dir(create)
    if d is None:
        return None
    path = os.path.join(d, f"{_NETNS}-{host}-{int(port)}.sock")
    return path if len(path.encode()) < 100 else None    # sun_path holds 108 bytes


def remove_if_dead(address: str) -> None:
    """Remove the lane socket of ``address`` if nothing listens on it any more (its task was
    killed, or exited without closing)."""
    host, _, port = address.rpartition(":")
    try:
        path = lane_path(host.strip("[]"), int(port))
    except ValueError:
        return
    if path is not None and os.path.exists(path):
        _unlink_if_dead(path)


def refuses(path) -> bool:
    """Whether nobody listens on the socket file ``path`` (a connect is refused, or it is gone)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.setblocking(False)      # a live listener with a full backlog says EAGAIN instead of blocking
    try:
        s.connect(path)
    except (ConnectionRefusedError, FileNotFoundError):
        return True
    except OSError:
        return False
    finally:
        s.close()
    return False


def _unlink_if_dead(path) -> None:
    if refuses(path):
        try:
            os.unlink(path)
        except OSError:
            pass


_open: dict = {}          # path -> inode of each lane socket this process listens on
_swept = False


def _sweep(directory, older_than: float = 60.0) -> None:
    """Once per process: remove socket files of the lane directory that nobody listens on (left by
    processes that were killed). Files younger than ``older_than`` seconds are left alone (a
    listener between its bind and its listen would look dead)."""
    global _swept
    if _swept:
        return
    _swept = True
    now = time.time()
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        path = os.path.join(directory, name)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if stat.S_ISSOCK(st.st_mode) and now - st.st_mtime > older_than:
            _unlink_if_dead(path)


@atexit.register
def _remove_open() -> None:
    """At exit, remove the sockets of listeners that were never closed (a server on a daemon thread)."""
    for path, ino in list(_open.items()):
        try:
            if os.stat(path).st_ino == ino:
                os.unlink(path)
        except OSError:
            pass


def _tune(sock) -> None:
    for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        try:
            sock.setsockopt(socket.SOL_SOCKET, opt, SOCKET_BUFFER)
        except OSError:
            pass


# -- framing ----------------------------------------------------------------------------------------
def encode(frames) -> tuple[list, int]:
    """The buffers that carry ``frames`` on the stream (the preamble first) and their total size.
    A small message is one bytes object; large frames are sent from their own memory."""
    sizes = [len(f) if f.__class__ is bytes else _nbytes(f) for f in frames]
    count = len(sizes)
    total = sum(sizes) + 4 + 8 * count
    head = _preamble(count).pack(count, *sizes)
    if total <= SMALL:
        return [head + b"".join(frames)], total
    return [head, *map(_byte_view, frames)], total


def _nbytes(f) -> int:
    n = getattr(f, "nbytes", None)          # an array or a memoryview says so without a new view
    return n if n.__class__ is int else memoryview(f).nbytes


def _byte_view(f):
    m = memoryview(f)
    return m if m.ndim == 1 and m.itemsize == 1 else m.cast("B")


_PREAMBLES: dict = {}


def _preamble(count) -> struct.Struct:
    """The struct of a preamble with ``count`` frames (made once per count)."""
    st = _PREAMBLES.get(count)
    if st is None:
        st = struct.Struct(f"<I{count}Q")
        if len(_PREAMBLES) < 64:
            _PREAMBLES[count] = st
    return st


def _big(n):
    np = sys.modules.get("numpy")      # no zero-fill where numpy is loaded (it is, wherever tensors are)
    return memoryview(np.empty(n, np.uint8)) if np is not None else memoryview(bytearray(n))


_refcount = sys.getrefcount


class _Pool:
    """A few receive buffers of one connection, reused once nothing refers to them.

    A buffer is a numpy uint8 array kept in ``_items``; the frame handed up is a memoryview of it,
    and every array numpy builds on that frame (``frombuffer``, ``reshape``, views of views) keeps
    the memoryview, and so the buffer, referenced. While its reference count is above the pool's
    own, somebody still holds data in it, and it is not handed out."""
    __slots__ = ("_items",)

    def __init__(self):
        self._items: list = []      # [buffer, last time handed out]

    def take(self, n):
        np = sys.modules.get("numpy")
        if np is None or n > POOL_LARGEST:
            return _big(n)
        items = self._items
        now = _monotonic()
        for i in range(len(items)):
            # 2: the list in items, and getrefcount's argument: nobody else holds it
            if items[i][0].nbytes == n and _refcount(items[i][0]) == 2:
                items[i][1] = now
                return memoryview(items[i][0])
        self.trim(now)
        items = self._items
        buf = np.empty(n, np.uint8)
        if len(items) >= POOL:
            items.pop(0)            # the oldest (held by its user, or of another size) is not kept
        items.append([buf, now])
        return memoryview(buf)

    def trim(self, now) -> None:
        """Forget free buffers unused for POOL_IDLE seconds."""
        items = self._items
        if items:
            self._items = [it for it in items if now - it[1] < POOL_IDLE or _refcount(it[0]) > 2]


class Reader:
    """Reads messages off one stream socket, however its bytes are split into reads.

    ``admit(first_frame, sizes)`` (a listener's side; raises ProtocolError) checks the signed
    header of each message larger than the read buffer before the rest of it is received (one
    that fails closes the stream: Garbage), and of smaller ones until one passes (``verified``;
    without ``admit``, once a message arrived)."""

    def __init__(self, admit=None):
        self._buf = bytearray(CHUNK)
        self._mv = memoryview(self._buf)
        self._start = self._end = 0
        self._lengths = None      # of the message being read
        self._frames: list = []
        self._big = None          # a large frame being received in place, and how much of it is in
        self._pos = 0
        self._pool = _Pool()
        self.admit = admit
        self.verified = False     # a message of this stream passed admit (or, without admit, arrived)
        self._unchecked = False   # the message being read waits for admit once its first frame is in

    def read(self, sock, out) -> bool:
        """Receive what ``sock`` (non-blocking) has now; complete messages (lists of frames) are
        appended to ``out``. False when the peer closed the stream; raises Garbage."""
        while True:
            big = self._big
            if big is not None:
                want = len(big) - self._pos
                try:
                    n = sock.recv_into(big[self._pos:], want)
                except (BlockingIOError, InterruptedError):
                    return True
                if not n:
                    return False
                self._pos += n
                if n == want:
                    self._big = None
                    self._frames.append(big)
                    self._parse(out)
                    continue
                return True
            start, end = self._start, self._end
            if start == end:
                self._start = self._end = start = end = 0
            elif start > CHUNK // 2:        # keep room: a partial item is at most 64 KiB
                self._buf[:end - start] = self._mv[start:end]
                self._start, self._end = 0, end - start
                start, end = 0, end - start
            want = CHUNK - end
            try:
                n = sock.recv_into(self._mv[end:], want)
            except (BlockingIOError, InterruptedError):
                return True
            if not n:
                return False
            self._end = end + n
            self._parse(out)
            if n < want and self._big is None:
                return True      # a short read: the socket had no more for now

    def _parse(self, out):
        buf, mv = self._buf, self._mv
        while True:
            start, end = self._start, self._end
            lengths = self._lengths
            if lengths is None:
                if end - start < 4:
                    return
                count = _unpack_count(buf, start)[0]
                if not 0 < count <= MAX_FRAMES:
                    raise Garbage(f"bad frame count {count}", mv[start:end])
                need = 4 + 8 * count
                if end - start < need:
                    return
                lengths = _preamble(count).unpack_from(buf, start)[1:]
                if max(lengths) > MAX_FRAME:
                    raise Garbage(f"a frame of {max(lengths)} bytes (the limit is {MAX_FRAME}, "
                                  f"FLOWLAB_MAX_FRAME_MB)", mv[start:end])
                if self.admit is not None and sum(lengths) > CHUNK - need:
                    if lengths[0] > MAX_HEADER:
                        raise Garbage(f"a first frame of {lengths[0]} bytes before its signature was "
                                      f"checked", mv[start:end])
                    self._unchecked = True
                self._start = start = start + need
                self._lengths, self._frames = lengths, []
            frames = self._frames
            while len(frames) < len(lengths):
                if self._unchecked and frames:
                    self._check(frames[0], lengths)
                n = lengths[len(frames)]
                have = end - start
                if n <= SMALL:
                    if have < n:
                        self._start = start
                        return
                    frames.append(bytes(mv[start:start + n]))
                    start += n
                else:
                    try:
                        big = self._pool.take(n)
                    except MemoryError:
                        raise Garbage(f"a frame of {n} bytes does not fit in memory") from None
                    take = min(have, n)
                    big[:take] = mv[start:start + take]
                    start += take
                    if take < n:
                        self._start, self._big, self._pos = start, big, take
                        return
                    frames.append(big)
            if self._unchecked:
                self._check(frames[0], lengths)
            elif not self.verified:
                self._learn(frames[0], lengths)
            self._start = start
            self._lengths = None
            out.append(frames)

    def _learn(self, first, lengths):
        """A small message (it fit in the read buffer) of a stream not verified yet: whether it
        passes decides ``verified``; one that fails is handed up all the same, for the server to
        drop, count and log with its reason."""
        if self.admit is None:
            self.verified = True
            return
        try:
            self.admit(first, lengths[1:])
        except ProtocolError:
            return
        self.verified = True

    def _check(self, first, lengths):
        self._unchecked = False
        try:
            self.admit(first, lengths[1:])
        except ProtocolError as e:
            raise Garbage(f"refused before its buffers were received: {e}", first) from None
        self.verified = True


class _Writer:
    """Bytes waiting to go out on one non-blocking socket."""
    __slots__ = ("pending",)

    def __init__(self):
        self.pending = collections.deque()

    def write(self, sock) -> bool:
        """Send what the socket takes now; True when nothing is left."""
        pending = self.pending
        while pending:
            bufs = list(pending) if len(pending) <= _IOV else [pending[i] for i in range(_IOV)]
            try:
                n = sock.sendmsg(bufs) if len(bufs) > 1 else sock.send(bufs[0])
            except (BlockingIOError, InterruptedError):
                return False
            while n:
                first = pending[0]
                size = len(first) if first.__class__ is bytes else first.nbytes
                if n >= size:
                    pending.popleft()
                    n -= size
                else:
                    pending[0] = memoryview(first)[n:]
                    n = 0
        return True


# -- a client's connection ----------------------------------------------------------------------------
class UnixConnection:
    """A connection over the local lane, with the interface of :class:`.transport.Connection`.

    ``send`` returns once the message is in the kernel (it waits, up to SEND_TIMEOUT, while the
    peer's buffer is full, asking ``check()`` every 0.1 s: a client sets it to its liveness test,
    so a send to a frozen task raises that task's error). A peer that went away is connected to
    again on the next send (a restarted task binds the same path); until then what is sent is lost,
    as over TCP to a closed port, and the caller's wait (deadline, liveness) decides."""
    lane = "unix"

    def __init__(self, address: str, path: str):
        self.address, self.path = address, path
        self.check = None
        self._spin = True
        self._sock = None
        self._connect()           # raises OSError when nothing listens there

    def _connect(self):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(self.path)
        except OSError:
            sock.close()
            raise
        _tune(sock)
        sock.setblocking(False)
        self._sock = sock
        self._reader = Reader()
        self._msgs = collections.deque()
        self._poll = select.poll()
        self._poll.register(sock.fileno(), select.POLLIN)

    def _broken(self):
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def send(self, frames) -> None:
        if self._sock is None:
            try:
                self._connect()
            except OSError:
                return                # nobody there: lost, as over TCP
        bufs, total = encode(frames)
        sock = self._sock
        try:
            n = sock.send(bufs[0])    # a small message: usually one send does it
        except (BlockingIOError, InterruptedError):
            n = 0
        except (BrokenPipeError, ConnectionResetError, ConnectionRefusedError):
            # Nothing of this message went out. The listener closes a connection that stays silent
            # for unix.HANDSHAKE seconds after connecting: connect again and send it whole.
            self._broken()
            try:
                self._connect()
                sock = self._sock
                n = sock.send(bufs[0])
            except (BlockingIOError, InterruptedError):
                n = 0
            except OSError:
                self._broken()
                return
        if n == total:
            return
        if n:
            rest = memoryview(bufs[0])[n:]
            bufs = [rest, *bufs[1:]] if rest.nbytes else bufs[1:]
        writer = _Writer()
        writer.pending.extend(bufs)
        try:
            deadline = None
            while not writer.write(sock):
                if deadline is None:
                    deadline = time.monotonic() + SEND_TIMEOUT
                self._wait_writable(sock, deadline)
        except (BrokenPipeError, ConnectionResetError, ConnectionRefusedError):
            self._broken()

    def _wait_writable(self, sock, deadline):
        p = select.poll()
        p.register(sock.fileno(), select.POLLOUT)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ClusterTimeoutError(f"could not send to {self.address} for {SEND_TIMEOUT:.0f} s "
                                          f"(the peer is not reading)")
            if p.poll(min(left, 0.1) * 1000):
                return
            check = self.check
            if check is not None:
                problem = check()
                if problem is not None:
                    self._broken()    # the rest of the message is dropped: the stream cannot resume
                    raise problem

    def recv(self, timeout: float | None):
        """The frames of the next message, or None after ``timeout`` seconds (0: do not wait)."""
        msgs = self._msgs
        if msgs:
            return msgs.popleft()
        deadline = None
        if timeout != 0 and self._sock is not None:
            # A caller that waits has usually just sent a request, whose answer is not in yet: ask
            # poll first (a read that finds nothing costs a system call and an exception).
            if timeout is not None:
                deadline = time.monotonic() + timeout
            if not self._wait(timeout):
                return None
        while True:
            sock = self._sock
            if sock is not None:
                try:
                    alive = self._reader.read(sock, msgs)
                except Garbage:
                    alive = False
                except OSError:
                    alive = False
                if msgs:
                    return msgs.popleft()
                if not alive:
                    self._broken()
                    sock = None
            if timeout == 0:
                return None
            if deadline is None and timeout is not None:
                deadline = time.monotonic() + timeout
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return None
            if sock is None:
                time.sleep(0.05 if left is None else min(left, 0.05))
                continue
            if not self._poll.poll(-1 if left is None else max(1, int(left * 1000 + 0.999))):
                return None

    def _wait(self, timeout) -> bool:
        """Wait until the socket has something to read (False after ``timeout`` seconds). When the
        last answer came within SPIN seconds, look for this one without sleeping first (up to SPIN,
        yielding the processor between looks): waking a sleeping process costs more than that."""
        poll = self._poll.poll
        if not SPIN:
            return bool(poll(-1 if timeout is None else max(1, int(timeout * 1000 + 0.999))))
        start = _monotonic()
        if self._spin:
            end, last = start + SPIN, start
            while True:
                if poll(0):
                    return True
                now = _monotonic()
                if now >= end or now - last > CONTENDED:   # the processor is wanted elsewhere: sleep
                    break
                last = now
                _yield()
            if timeout is not None:
                timeout -= _monotonic() - start       # the spin counts against the caller's wait
                if timeout <= 0:
                    self._spin = False
                    return False
        ready = poll(-1 if timeout is None else max(1, int(timeout * 1000 + 0.999)))
        self._spin = _monotonic() - start <= 2 * SPIN     # a quick answer: spin for the next one
        return bool(ready)

    def close(self) -> None:
        self._broken()

    def __repr__(self):
        return f"<flowlab connection to {self.address} over the local lane (unix:{self.path})>"


# -- a listener's side ----------------------------------------------------------------------------------
class _Peer:
    """One accepted connection of a listener: an opaque peer handle for ``send`` and ``post``."""
    __slots__ = ("sock", "fd", "reader", "writer", "lock", "closed", "__weakref__")
    lane = "unix"

    def __init__(self, sock, admit=None):
        self.sock, self.fd = sock, sock.fileno()
        self.reader, self.writer = Reader(admit), _Writer()
        self.lock = threading.Lock()
        self.closed = False

    def __repr__(self):
        return f"<local-lane peer fd={self.fd}>"


class UnixSide:
    """The Unix half of a listener: a listening socket at ``path`` and the connections it accepted.
    The owner polls :meth:`fds` and calls :meth:`ready` with what the poll said."""

    def __init__(self, path: str):
        self.path = path
        try:
            os.unlink(path)          # a file left by a task that was killed (the TCP port is ours now)
        except FileNotFoundError:
            pass
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(path)
            sock.listen(128)
            self._ino = os.stat(path).st_ino
        except OSError:
            sock.close()
            raise
        _open[path] = self._ino
        _sweep(os.path.dirname(path))
        sock.setblocking(False)
        self.sock, self.fd = sock, sock.fileno()
        self.peers: dict[int, _Peer] = {}
        self.pending: dict = {}           # fd -> (deadline, peer) of connections not verified yet, oldest first
        self.admit = None                 # the server's Verifier.admit: checks headers before buffers
        self.changed = True               # fds or the events wanted changed: the owner re-registers
        self._want_out: set = set()
        self._lock = threading.Lock()
        self._uid = os.getuid()

    def wanted(self) -> list:
        """``(fd, wants_out)`` for every connection."""
        self.changed = False
        with self._lock:
            out = self._want_out
            return [(fd, fd in out) for fd in self.peers]

    def accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            if not self._same_user(conn):
                conn.close()
                continue
            _tune(conn)
            conn.setblocking(False)
            peer = _Peer(conn, self.admit)
            self.peers[peer.fd] = peer
            if len(self.pending) >= MAX_PENDING:
                self._refuse(next(iter(self.pending.values()))[1], "too many connections still unverified")
            self.pending[peer.fd] = (_monotonic() + HANDSHAKE, peer)
            self.changed = True

    def expire(self) -> None:
        """Close connections that have not sent a message passing the check within HANDSHAKE s."""
        now = _monotonic()
        for deadline, peer in list(self.pending.values()):
            if deadline > now:
                break
            self._refuse(peer, f"no verified message within {HANDSHAKE:g} s")

    def _refuse(self, peer, why):
        logging.getLogger("flowlab.cluster").warning("local lane %s: closing a connection (%s)", self.path, why)
        self.drop(peer)

    def _same_user(self, conn) -> bool:
        opt = getattr(socket, "SO_PEERCRED", None)
        if opt is None:
            return True
        try:
            _, uid, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, opt, struct.calcsize("3i")))
        except OSError:
            return False
        return uid in (self._uid, 0)

    def readable(self, fd, out) -> None:
        """Read what connection ``fd`` has: ``(peer, frames)`` appended to ``out``; a connection
        that broke the framing hands up what it sent as one frame, and is closed."""
        peer = self.peers.get(fd)
        if peer is None:
            return
        msgs: list = []
        try:
            alive = peer.reader.read(peer.sock, msgs)
        except Garbage as e:
            logging.getLogger("flowlab.cluster").warning(
                "local lane %s: closing a connection that broke the framing (%s)", self.path, e)
            msgs.append([e.data or b"?"])
            alive = False
        except OSError:
            alive = False
        for frames in msgs:
            out.append((peer, frames))
        if peer.reader.verified and fd in self.pending:
            del self.pending[fd]
        if not alive:
            self.drop(peer)

    def writable(self, fd) -> None:
        peer = self.peers.get(fd)
        if peer is not None:
            self._flush(peer)

    def send(self, peer, frames) -> bool:
        """Queue ``frames`` to ``peer`` and send what the socket takes now (any thread). False when
        some is left for the owner's loop to send when the socket is writable."""
        if peer.closed:
            return True
        bufs, total = encode(frames)
        with peer.lock:
            w = peer.writer
            if w.pending:
                w.pending.extend(bufs)
                return True                  # already waiting for POLLOUT
            try:
                if len(bufs) == 1:           # a small message: usually one send does it
                    try:
                        n = peer.sock.send(bufs[0])
                    except (BlockingIOError, InterruptedError):
                        n = 0
                    if n == total:
                        return True
                    bufs = [memoryview(bufs[0])[n:]]
                w.pending.extend(bufs)
                if w.write(peer.sock):
                    return True
            except OSError:
                w.pending.clear()
                peer.closed = True
                return True
        with self._lock:
            self._want_out.add(peer.fd)
        self.changed = True
        return False

    def _flush(self, peer):
        with peer.lock:
            try:
                done = peer.writer.write(peer.sock)
            except OSError:
                peer.writer.pending.clear()
                done = True
                peer.closed = True
        if done:
            with self._lock:
                self._want_out.discard(peer.fd)
            self.changed = True

    def drop(self, peer) -> None:
        peer.closed = True
        if self.pending.get(peer.fd, (0, None))[1] is peer:
            del self.pending[peer.fd]
        if self.peers.pop(peer.fd, None) is not None:
            with self._lock:
                self._want_out.discard(peer.fd)
            self.changed = True
            with peer.lock:               # not while another thread writes to it
                peer.sock.close()

    def close(self) -> None:
        for peer in list(self.peers.values()):
            self.drop(peer)
        self.sock.close()
        if _open.get(self.path) == self._ino:
            del _open[self.path]
        try:
            if os.stat(self.path).st_ino == self._ino:     # ours, not a successor's
                os.unlink(self.path)
        except OSError:
            pass
