"""Same-host message channels through shared memory, for the cluster's collectives.

Ranks of one group that run on the same machine (see :func:`host_identity`) exchange messages
through shared memory instead of ZeroMQ: per ordered pair of ranks, one single-producer
single-consumer ring buffer (:class:`Inbound` on the receiving side, :class:`Outbound` on the
sending side) carrying whole messages, each a small header and a list of arrays::

    u64 record length | u32 meta length | meta: marshal((header, [(dtype.str, shape), ...])) | the arrays' bytes

A ring is a file of ``4096 + capacity`` bytes (and the box, below) under ``/dev/shm``: a header with the counters,
each on its own cache line (``head``: bytes ever written, only the producer writes it; ``tail``:
bytes ever read, only the consumer writes it; ``rx_waiting``/``tx_waiting``: "I am about to
sleep" flags, each holding a new number per sleep so that the other side pokes once per sleep;
``closed`` flags of both ends), then the data, used round and round. A message larger than the
free space is streamed through in parts, so 64 MiB go through a 4 MiB ring (the consumer copies
each part out as soon as it is there; the ring never holds a whole message). What does not fit
when ``send`` is called is copied aside (the caller may reuse its arrays at once) and moved on
as the consumer frees space: by the sending rank's own thread whenever it is inside the
communicator (waiting in ``recv``, or in ``flush`` as a collective ends), else by its
:class:`Pusher` thread; so ``send`` never waits for the receiver (the contract's rule 2). The
receiver reads in the caller's own thread, inside ``recv``: no queue, no thread hop.

Segments: the receiving rank creates the file (``O_EXCL``, mode 0600) when a peer on its host
asks for a channel; the sender maps it and unlinks it at once, so the name exists only while
the group forms: afterwards a SIGKILL of any rank leaves nothing in ``/dev/shm`` (the memory is
freed when the last mapping goes). The creator unlinks it too when it closes, in case the peer
never came. A segment's name starts with its maker's owner tag (``flowlab-<pid>-<start>-<pidns>-r...``,
:mod:`..leftovers`): until it is unlinked, the maker has it registered, so its exit handlers (and a
worker's fast exits) unlink it; what a SIGKILLed maker left is unlinked by the next sweep, which
every process runs when it first makes a segment, and every LocalCluster worker when it starts.
The files are opened with ``os.open`` + ``mmap``, not
``multiprocessing.shared_memory``: Python 3.11's ``resource_tracker`` registers every segment a
process attaches and unlinks (and warns about) it when that process exits, which would pull the
segment from under the other rank.

Wake-ups. Each rank has one wake socket (:class:`Waker`): a Unix datagram socket in Linux's
abstract namespace (no file to leave behind after a SIGKILL; a stranger on the host could at most
send a spurious wake-up, which costs a recheck). It wakes the rank's own thread, waiting in the
communicator, when data arrives or space frees up (the ZeroMQ handler pokes it too, so one wait
covers both kinds of peers). A waiter sets its flag in the ring, issues
a full memory barrier, checks the counters once more and only then blocks (with a timeout, so
liveness is still checked); the other side, after moving its counter, issues the barrier and
pokes the socket only when the flag is set. On x86-64 a waiter first spins on the counters for a
millisecond at most (:data:`SPIN_S`; waking a sleeping process costs tens of microseconds, more
in a virtual machine), unless there are more ranks on the host than usable cores. When, at that
moment, there are more runnable threads than cores (:func:`runnable`), a hard spin would steal
the core its peer needs, so it looks at the counters between ``sched_yield`` calls instead
(:func:`yield_until`): the peer, if queued, runs at once, and the waiter needs no wake-up.

The box. Beside the ring, each segment holds a *box* for the small allreduce of ``algorithm=
"native"`` (:mod:`.direct`): two halves of :data:`BOX_BYTES`, each with a line in the counter page
that only the producer writes (ticket, signature checksum, size) and one that only the consumer
writes (the last ticket it has read). The producer writes the payload and the signature, then the
ticket; the consumer waits for the ticket it expects, reads the payload where it lies (no copy, no
framing, no wake-up: the waiter spins), then stores the ticket as read. The producer writes a half
again only once it has been read (or when the call it was for failed on the producer's side: the
consumer never reads an old call's ticket), so the box never needs a message. The producer
clears the ticket before it writes, and the consumer checks the ticket again after reading, so a
payload rewritten under a reader (possible only after a failed call) is an error, never a wrong sum.

Memory order. x86-64 keeps stores in order and loads in order (TSO), and glibc's memcpy ends
its non-temporal copies with ``sfence``: data written before ``head`` is visible to a reader that
sees the new ``head``. The one reordering x86 allows, a later load passing an earlier store, would
lose wake-ups (flag store / counter load on one side, counter store / flag load on the other), so
both sides call :func:`fence` between them: acquiring a ``threading.Lock`` is a locked
instruction, a full barrier on x86. Other architectures order memory more weakly, and there a
syscall between two plain accesses is not, architecturally, a barrier either; so off x86-64
shared memory is used only when ``FLOWLAB_SHM=1`` asks for it, and then nobody spins: every
counter move is followed by a poke and readers check counters only after a blocking wait on the
fd (the syscalls on both sides are the barrier this mode relies on; untested here, where the
machines are x86-64). ``FLOWLAB_SHM=0`` turns shared memory off everywhere.
"""
from __future__ import annotations

import collections
import errno
import marshal
import math
import mmap
import os
import platform
import secrets
import select
import socket
import struct
import sys
import threading
import time

import numpy as np

from .. import leftovers

__all__ = ["Inbound", "Outbound", "Pusher", "Waker", "NoSharedMemory", "host_identity", "unavailable", "fence", "poke",
           "poke_socket", "new_segment_name", "spin_until", "yield_until", "CAPACITY", "SPIN_S", "STRONG_ORDER"]

STRONG_ORDER = platform.machine().lower() in ("x86_64", "amd64")
CAPACITY = 4 << 20          # bytes of data per ring (a power of two); 4 KiB of counters come first
SPIN_S = 1e-3               # how long a waiter spins on the counters before it blocks (x86-64 only)
SMALL = 64 << 10            # messages up to this size are packed into one piece (one copy, one publish)
PUSH_POLL_S = 0.005         # how often the Pusher looks for queued data when its owner is elsewhere
SHM_DIR = "/dev/shm"
_HDR = 4096
_MAGIC = 0x31627A6C776F6C66          # b"flowlzb1", little-endian
# slots of the counter page (u64 indexes; 8 apart = one 64-byte cache line each)
_HEAD, _TAIL, _RXW, _TXW, _PCLOSED, _CCLOSED, _MAGIC_AT, _CAP_AT = (8 * i for i in range(8))
# the box (see "The box" above): per half h, a producer line (ticket, crc, nbytes, signature
# length) and a consumer line (the last ticket read)
_BOX_TICKET, _BOX_CRC, _BOX_NBYTES, _BOX_SIGLEN = 64, 65, 66, 67
_BOX_ACK = 72
_BOX_LINES = 16                     # u64 slots from half 0's lines to half 1's
BOX_BYTES = 64 << 10                # the most a box half carries
_BOX_SIG = 1024                     # bytes for the sender's call signature, before the payload
_BOX_HALF = _BOX_SIG + BOX_BYTES
_PREFIX = struct.Struct("<QI")      # record length (prefix included), meta length
_DTYPES: dict = {}
_DSTRS: dict = {}
_fence_lock = threading.Lock()


def fence() -> None:
    """A full memory barrier on x86-64 (a lock's acquire is a ``lock cmpxchg``)."""
    _fence_lock.acquire()
    _fence_lock.release()


def unavailable() -> str | None:
    """Why this process cannot use shared-memory channels, or None when it can."""
    env = os.environ.get("FLOWLAB_SHM", "").strip().lower()
    if env in ("0", "off", "no", "false"):
        return "switched off by FLOWLAB_SHM=0"
    if not sys.platform.startswith("linux"):
        return "shared-memory channels need Linux (abstract Unix sockets and /dev/shm)"
    if not STRONG_ORDER and env not in ("1", "on", "yes", "true"):
        return (f"shared-memory channels are used on x86-64 only unless FLOWLAB_SHM=1 (this is "
                f"{platform.machine()}; see flowlab.cluster.collectives.shm)")
    if not (os.path.isdir(SHM_DIR) and os.access(SHM_DIR, os.W_OK | os.X_OK)):
        return f"{SHM_DIR} is missing or not writable"
    return None


def host_identity() -> str:
    """What two processes must share to talk through shared memory: the machine (hostname and
    boot id), the user, the network and pid namespaces and /dev/shm itself."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = "?"
    try:   # abstract sockets live in the network namespace; pids (for liveness) in the pid one
        netns = os.readlink("/proc/self/ns/net") + os.readlink("/proc/self/ns/pid")
    except OSError:
        netns = "?"
    try:
        st = os.stat(SHM_DIR)
        shm = f"{st.st_dev}:{st.st_ino}"
    except OSError:
        shm = "?"
    return f"{socket.gethostname()}|{boot}|uid{os.getuid()}|{netns}|{shm}"


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def runnable() -> int:
    """Threads runnable on the host right now (the 4th field of /proc/loadavg), this one included;
    0 when unknown."""
    try:
        with open("/proc/loadavg", "rb") as f:
            return int(f.read().split()[3].split(b"/")[0])
    except (OSError, ValueError, IndexError):
        return 0


# -- wake-up sockets ---------------------------------------------------------------------------------
class Waker:
    """A datagram socket to block on; anyone who knows ``name`` may poke it (:func:`poke`)."""

    def __init__(self, what: str = "rx"):
        self.name = f"flowlab-{what}-{os.getpid()}-{secrets.token_hex(8)}"
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(b"\0" + self.name.encode())
        self.sock.setblocking(False)
        self._poller = select.poll()
        self._poller.register(self.sock.fileno(), select.POLLIN)

    def wait(self, timeout: float) -> bool:
        """Block until poked or ``timeout`` seconds pass; True when poked. Swallows the pokes."""
        got = bool(self._poller.poll(max(0, int(timeout * 1000 + 0.999))))
        if got:
            self.drain()
        return got

    def drain(self) -> None:
        recv = self.sock.recv
        while True:
            try:
                recv(16)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return

    def close(self) -> None:
        self.sock.close()


def poke_socket() -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.setblocking(False)
    return s


def poke(tx: socket.socket, name: str | None) -> None:
    """Wake the owner of the Waker called ``name`` (nothing happens when it is gone, or already has
    a poke waiting: one is enough)."""
    if name:
        try:
            tx.sendto(b"!", b"\0" + name.encode())
        except OSError:          # BlockingIOError (a poke is pending), ConnectionRefusedError (gone)
            pass


# -- the rings --------------------------------------------------------------------------------------
class _Ring:
    def __init__(self, name: str, create: bool, capacity: int = CAPACITY):
        self.name = name
        self.path = segment_path(name)
        if create:
            if capacity <= 0 or capacity & (capacity - 1):
                raise ValueError(f"a ring's capacity must be a power of two, got {capacity}")
            self._map = map_segment(self.path, _HDR + capacity + 2 * _BOX_HALF)
        else:
            try:
                self._map = map_segment(self.path)
            finally:
                _unlink(self.path)   # both ends have it mapped now (the creator first): drop the name
            if len(self._map) <= _HDR:
                size = len(self._map)
                self._map.close()
                raise ValueError(f"{self.path} is not a flowlab ring ({size} bytes)")
        self._mv = memoryview(self._map)
        self.ctr = self._mv[:_HDR].cast("Q")
        self.dmv = self._mv[_HDR:]
        self.data = None
        self.closed = False
        if create:
            self.ctr[_MAGIC_AT], self.ctr[_CAP_AT] = _MAGIC, capacity
        elif self.ctr[_MAGIC_AT] != _MAGIC or self.ctr[_CAP_AT] + _HDR + 2 * _BOX_HALF != len(self._map):
            self.close()
            raise ValueError(f"{self.path} is not a flowlab ring")
        self.cap = self.ctr[_CAP_AT]
        self.mask = self.cap - 1
        self.data = np.frombuffer(self._map, np.uint8, self.cap, _HDR)
        self.box = np.frombuffer(self._map, np.uint8, 2 * _BOX_HALF, _HDR + self.cap)

    def close(self) -> None:
        if getattr(self, "_map", None) is None:
            return
        self.closed = True
        self.data = self.box = None
        try:
            self.dmv.release()
            self.ctr.release()
            self._mv.release()
            self._map.close()
        except BufferError:      # a view is still out (another thread reading): the mapping goes with it
            pass
        self._map = None


class NoSharedMemory(OSError):
    """The shared-memory filesystem has no room for a new segment (said with sizes and what to do)."""


def segment_path(name: str) -> str:
    """Where the shared segment ``name`` lives (under :data:`SHM_DIR`)."""
    return os.path.join(SHM_DIR, name)


_swept = False


def new_segment_name(kind: str) -> str:
    """A fresh segment name, ``flowlab-<owner tag>-<kind><random>``; the first call of a process
    also sweeps what dead processes left in :data:`SHM_DIR` (see :mod:`..leftovers`)."""
    global _swept
    if not _swept:
        _swept = True
        leftovers.sweep_segments(SHM_DIR)
    return f"flowlab-{leftovers.owner_tag()}-{kind}{secrets.token_hex(6)}"


def map_segment(path: str, size: int | None = None) -> mmap.mmap:
    """Map a shared segment read-write: a new one of ``size`` bytes (mode 0600, and it must not
    exist yet: removed again if sizing or mapping fails), or, with ``size`` None, an existing one
    whole. The file descriptor is closed either way (the mapping keeps the memory).

    A new segment's memory is reserved at once (``posix_fallocate``): when the filesystem is full,
    creating it raises :class:`NoSharedMemory`, instead of the process dying of SIGBUS later, on
    the first write to a page that has no memory behind it (a container's /dev/shm is often only
    64 MiB)."""
    if size is None:
        fd = os.open(path, os.O_RDWR)
        try:
            return mmap.mmap(fd, os.fstat(fd).st_size)
        finally:
            os.close(fd)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    leftovers.own(path)       # unlinked at this process's exit unless it is unlinked before
    try:
        os.ftruncate(fd, size)
        try:
            os.posix_fallocate(fd, 0, size)
        except OSError as e:
            if e.errno not in (errno.ENOSPC, errno.EFBIG, errno.ENOMEM):
                raise
            raise _no_room(path, size) from None
        return mmap.mmap(fd, size)
    except BaseException:
        _unlink(path)
        raise
    finally:
        os.close(fd)


def _no_room(path: str, size: int) -> NoSharedMemory:
    where = os.path.dirname(path)
    try:
        st = os.statvfs(where)
        room = f" ({st.f_bavail * st.f_frsize / 2**20:.0f} MiB free of {st.f_blocks * st.f_frsize / 2**20:.0f} MiB)"
    except OSError:
        room = ""
    return NoSharedMemory(errno.ENOSPC, f"{where} has no room for {size / 2**20:.1f} MiB more of shared memory"
                          f"{room}: give it more (in a container, e.g. `docker run --shm-size=1g`), use smaller "
                          f"tensors or another algorithm than 'native', or set FLOWLAB_SHM=0")


def _unlink(path):
    leftovers.disown(path)
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _encode(header: dict, arrays):
    """A message as ``(record length, pieces)``: one bytes object for a small message, else the
    prefix and meta, then uint8 views of the arrays (written one after the other)."""
    descs = [(_dtype_str(a.dtype), a.shape) for a in arrays]
    try:
        meta = marshal.dumps((header, descs), 4)
    except ValueError as e:
        raise TypeError(f"a message header must hold only str, int, float, bool, None, lists and dicts: "
                        f"{header!r} ({e})") from None
    nbytes = 0
    for a in arrays:
        nbytes += a.nbytes
    rec = _PREFIX.size + len(meta) + nbytes
    first = _PREFIX.pack(rec, len(meta)) + meta
    if rec <= SMALL:
        return rec, b"".join([first, *(a.tobytes() for a in arrays)])
    views = [np.ascontiguousarray(a).reshape(-1).view(np.uint8) for a in arrays if a.nbytes]
    return rec, [np.frombuffer(first, np.uint8), *views]


def _dtype_str(dtype) -> str:
    """``dtype.str``, remembered (numpy builds the string on every access)."""
    got = _DSTRS.get(dtype)
    if got is None:
        got = _DSTRS[dtype] = dtype.str
    return got


def _dtype(name):
    dt = _DTYPES.get(name)
    if dt is None:
        dt = _DTYPES[name] = np.dtype(name)
    return dt


class Outbound(_Ring):
    """The sending end of a ring that the receiver created (``name``); ``consumer`` is the name
    of the receiver's rx Waker. :meth:`send` writes what fits and queues the rest for the Pusher."""

    def __init__(self, name: str, consumer: str, tx: socket.socket):
        super().__init__(name, create=False)
        self.consumer, self.tx = consumer, tx
        self.head = self.ctr[_HEAD]
        self._poked = 0             # the consumer's sleep we last poked
        self._sleeps = 0            # the producer's sleeps waiting for space (its tx_waiting flag)
        self.lock = threading.Lock()
        self.pending: collections.deque = collections.deque()   # [pieces, index, offset]

    def send(self, header: dict, arrays) -> bool:
        """Write one message; True when all of it is in the ring, False when the rest waits for
        the Pusher (copied: the caller may reuse its arrays at once)."""
        rec, pieces = _encode(header, arrays)
        with self.lock:
            if self.closed:
                return True
            if isinstance(pieces, bytes):
                if not self.pending and self.cap - (self.head - self.ctr[_TAIL]) >= rec:
                    self._put_small(pieces)
                    return True
                pieces = [np.frombuffer(pieces, np.uint8)]
            i = off = 0
            if not self.pending:
                i, off = self._write(pieces, 0, 0)
                if i == len(pieces):
                    return True
            rest = [pieces[i][off:].copy()] + [p.copy() for p in pieces[i + 1:]]
            self.pending.append([rest, 0, 0])
            return False

    def _put_small(self, blob: bytes) -> None:
        """Write a small record that fits (memoryview copies: no numpy call per message)."""
        head, n = self.head, len(blob)
        pos = head & self.mask
        first = min(n, self.cap - pos)
        dmv = self.dmv
        dmv[pos:pos + first] = blob[:first] if first < n else blob
        if first < n:
            dmv[:n - first] = blob[first:]
        self.head = head = head + n
        self.ctr[_HEAD] = head
        self._wake_consumer()

    def _wake_consumer(self):
        """After moving ``head``: poke the consumer if it sleeps (once per sleep: its flag holds a
        new number each time it goes to sleep)."""
        if STRONG_ORDER:
            fence()
            w = self.ctr[_RXW]
            if w and w != self._poked:
                self._poked = w
                poke(self.tx, self.consumer)
        else:
            poke(self.tx, self.consumer)

    def push(self) -> int:
        """Move queued messages into the ring (the Pusher calls this); bytes moved."""
        moved = 0
        with self.lock:
            while self.pending and not self.closed:
                item = self.pending[0]
                before = self.head
                i, off = self._write(*item)
                moved += self.head - before
                if i == len(item[0]):
                    self.pending.popleft()
                    continue
                item[1], item[2] = i, off
                break
        return moved

    def full(self) -> bool:
        return self.head - self.ctr[_TAIL] >= self.cap

    # -- the box ------------------------------------------------------------------------------------
    def box_free(self, half: int, abandoned: int = 0) -> bool:
        """Whether box half ``half`` may be written: the consumer has read what this side last put
        there, or that was for a call this side gave up (a ticket up to ``abandoned``), which the
        consumer will never read (it reads only its current call's ticket)."""
        at = _BOX_LINES * half
        ticket = self.ctr[_BOX_TICKET + at]
        return self.ctr[_BOX_ACK + at] >= ticket or ticket <= abandoned

    def box_put(self, half: int, ticket: int, crc: int, sig: bytes, payload: np.ndarray) -> None:
        """Put ``payload`` (at most :data:`BOX_BYTES`) in box half ``half`` (which must be free),
        with the call's signature. The ticket is cleared first and published last, so a consumer
        that finds the same ticket before and after reading knows it read one whole payload."""
        base, at = half * _BOX_HALF, _BOX_LINES * half
        box, ctr = self.box, self.ctr
        n = payload.nbytes
        sig = sig[:_BOX_SIG]
        ctr[_BOX_TICKET + at] = 0
        box[base + _BOX_SIG:base + _BOX_SIG + n] = payload.reshape(-1).view(np.uint8)
        box[base:base + len(sig)] = np.frombuffer(sig, np.uint8)
        ctr[_BOX_CRC + at], ctr[_BOX_NBYTES + at], ctr[_BOX_SIGLEN + at] = crc, n, len(sig)
        ctr[_BOX_TICKET + at] = ticket

    def set_waiting(self, on: bool) -> None:
        """Announce (with a new number) or end a sleep of the producer waiting for space."""
        if on:
            self._sleeps += 1
            self.ctr[_TXW] = self._sleeps
        elif not self.closed:
            self.ctr[_TXW] = 0

    def _write(self, pieces, i, off):
        ctr, data, cap, mask = self.ctr, self.data, self.cap, self.mask
        head = start = self.head
        tail = ctr[_TAIL]
        while i < len(pieces):
            p = pieces[i]
            n = p.size
            while off < n:
                free = cap - (head - tail)
                if free <= 0:
                    tail = ctr[_TAIL]
                    if cap - (head - tail) <= 0:
                        break
                    continue
                pos = head & mask
                k = min(n - off, free, cap - pos)
                data[pos:pos + k] = p[off:off + k]
                off += k
                head += k
            if off < n:
                break
            i, off = i + 1, 0
        if head != start:
            self.head = head
            ctr[_HEAD] = head
            self._wake_consumer()
        return i, off

    def drop(self) -> None:
        with self.lock:
            self.pending.clear()

    def close(self) -> None:
        with self.lock:
            if self._map is None:
                return
            self.pending.clear()
            self.ctr[_PCLOSED] = 1
            poke(self.tx, self.consumer)
            super().close()


class Inbound(_Ring):
    """The receiving end: created here, named ``name`` for the sender to map. ``producer`` (the
    sender's Waker) is poked when space frees up while the sender waits for it."""

    def __init__(self, src: int, tx: socket.socket, capacity: int = CAPACITY, owner: str = ""):
        super().__init__(new_segment_name("r"), create=True, capacity=capacity)
        self.src, self.tx, self.owner = src, tx, owner
        self.producer = None        # the producer's Waker, poked when space frees up while it waits
        self.tail = 0
        self._poked = 0             # the producer's sleep we last poked
        self._sleeps = 0
        self._stage = 0                      # 0: prefix, 1: meta, 2: arrays
        self._pre = np.empty(_PREFIX.size, np.uint8)
        self._dst = self._pre
        self._off = 0
        self._header = self._arrays = self._targets = None

    def ready(self) -> bool:
        """Bytes are waiting (a cheap check for spinning)."""
        return self.ctr[_HEAD] != self.tail

    def producer_closed(self) -> bool:
        return bool(self.ctr[_PCLOSED])

    # -- the box ------------------------------------------------------------------------------------
    def box_ticket(self, half: int) -> int:
        """The ticket the producer last published in box half ``half`` (0: none yet)."""
        return self.ctr[_BOX_TICKET + _BOX_LINES * half]

    def box_get(self, half: int, dtype, count: int):
        """``(crc, nbytes, payload)`` of box half ``half``: the payload as ``count`` elements of
        ``dtype``, read in place (valid until :meth:`box_done`), or None when nbytes differs."""
        at, base = _BOX_LINES * half, half * _BOX_HALF + _BOX_SIG
        ctr = self.ctr
        crc, n = ctr[_BOX_CRC + at], ctr[_BOX_NBYTES + at]
        nbytes = count * dtype.itemsize
        payload = self.box[base:base + nbytes].view(dtype) if n == nbytes else None
        return crc, n, payload

    def box_sig(self, half: int) -> str:
        """The signature text the producer put with box half ``half``."""
        base = half * _BOX_HALF
        n = min(self.ctr[_BOX_SIGLEN + _BOX_LINES * half], _BOX_SIG)
        return self.box[base:base + n].tobytes().decode(errors="replace")

    def box_done(self, half: int, ticket: int) -> None:
        """Tell the producer box half ``half`` has been read (it may be written again)."""
        self.ctr[_BOX_ACK + _BOX_LINES * half] = ticket

    def pump(self):
        """The next whole message ``(header, arrays)`` if it has arrived, else None (a message that
        is only partly there is kept, and continued on the next call)."""
        ctr = self.ctr
        head = ctr[_HEAD]
        tail = self.tail
        if head == tail:
            return None
        if self._stage == 0 and head - tail >= _PREFIX.size:
            pos = tail & self.mask
            if pos + _PREFIX.size <= self.cap:
                rec, mlen = _PREFIX.unpack_from(self.dmv, pos)
                if rec <= SMALL and head - tail >= rec and pos + rec <= self.cap:
                    return self._take_small(pos, rec, mlen)
        data, cap, mask = self.data, self.cap, self.mask
        got = None
        dst, off = self._dst, self._off
        while True:
            n = dst.size
            while off < n and head != tail:
                pos = tail & mask
                k = min(n - off, head - tail, cap - pos)
                dst[off:off + k] = data[pos:pos + k]
                off += k
                tail += k
            if off < n:
                head = ctr[_HEAD]
                if head != tail:
                    continue
                self._dst, self._off = dst, off
                break
            # this piece is complete: on to the next one
            off = 0
            if self._stage == 0:
                dst, self._stage = np.empty(_PREFIX.unpack(self._pre.tobytes())[1], np.uint8), 1
                continue
            if self._stage == 1:
                header, descs = marshal.loads(dst)
                arrays = [np.empty(shape, _dtype(dt)) for dt, shape in descs]
                self._header, self._arrays = header, arrays
                self._targets = collections.deque(a.reshape(-1).view(np.uint8) for a in arrays if a.nbytes)
                self._stage = 2
            else:
                self._targets.popleft()
            if self._targets:
                dst = self._targets[0]
                continue
            got = (self._header, self._arrays)
            self._header = self._arrays = self._targets = None
            self._dst, self._off, self._stage = self._pre, 0, 0
            break
        if tail != self.tail:
            self._advance(tail)
        return got

    def _take_small(self, pos, rec, mlen):
        """A whole small record lying in one piece at ``pos``: parse it straight from the ring."""
        dmv = self.dmv
        off = pos + _PREFIX.size
        header, descs = marshal.loads(dmv[off:off + mlen])
        off += mlen
        arrays = []
        for dt, shape in descs:
            dtype = _dtype(dt)
            nb = dtype.itemsize * math.prod(shape)
            arrays.append(np.frombuffer(bytearray(dmv[off:off + nb]), dtype).reshape(shape))
            off += nb
        self._advance(self.tail + rec)
        return header, arrays

    def _advance(self, tail):
        """Publish ``tail``; poke the producer's Pusher if it sleeps (once per sleep)."""
        self.tail = tail
        ctr = self.ctr
        ctr[_TAIL] = tail
        if STRONG_ORDER:
            fence()
            w = ctr[_TXW]
            if w and w != self._poked:
                self._poked = w
                poke(self.tx, self.producer)
        else:
            poke(self.tx, self.producer)

    def set_waiting(self, on: bool) -> None:
        """Announce (with a new number) or end a sleep of the consumer."""
        if on:
            self._sleeps += 1
            self.ctr[_RXW] = self._sleeps
        elif not self.closed:
            self.ctr[_RXW] = 0

    def unlink(self) -> None:
        _unlink(self.path)

    def close(self) -> None:
        if self._map is None:
            return
        self.unlink()
        self.ctr[_CCLOSED] = 1
        poke(self.tx, self.producer)
        super().close()


# Code that an interrupt must not cut in half: a KeyboardInterrupt (a client's cancel) raised in
# the middle of reading or writing a ring leaves its offsets out of step with what was moved, and
# every later message on that ring reads garbage. A worker's SIGINT handler
# (``Server._on_sigint``) looks for these in the interrupted stack and asks again a moment later.
NO_INTERRUPT = frozenset({Outbound.send.__code__, Outbound.push.__code__, Outbound.box_put.__code__,
                          Inbound.pump.__code__, Inbound.box_get.__code__, Inbound.box_done.__code__})


class Pusher:
    """The sender's fallback for queued messages: while the owning thread is inside the
    communicator it moves them itself (``push`` in its waits); when it is not (``busy()`` is
    False: it went back to user code with data still queued), this thread moves them, checking
    every :data:`PUSH_POLL_S` seconds. ``gone(peer)`` says when to give up on a peer."""

    def __init__(self, outs: dict, busy, gone, name: str = "flowlab-shm-pusher"):
        self.outs = outs                 # peer -> Outbound (shared with the owner)
        self._busy, self._gone = busy, gone
        self._stop = False
        self._work = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._started = False
        self._start_lock = threading.Lock()

    def notify(self) -> None:
        """Work was queued: start the thread if needed and wake it."""
        if not self._started:
            with self._start_lock:
                if not self._started:
                    self._started = True
                    self._thread.start()
        if not self._work.is_set():
            self._work.set()

    def _run(self):
        while not self._stop:
            if not any(out.pending for out in list(self.outs.values())):
                self._work.wait(0.5)
                self._work.clear()
                continue
            time.sleep(PUSH_POLL_S)
            if self._busy():
                continue
            for peer, out in list(self.outs.items()):
                if out.pending:
                    if self._gone(peer):
                        out.drop()
                    else:
                        out.push()

    def close(self) -> None:
        self._stop = True
        self._work.set()
        if self._started and self._thread is not threading.current_thread():
            self._thread.join(2.0)


def spin_until(ready, seconds: float) -> bool:
    """Spin up to ``seconds`` until ``ready()``; True when it became ready."""
    end = time.perf_counter() + seconds
    while True:
        if ready():
            return True
        if time.perf_counter() >= end:
            return False


def yield_until(ready, seconds: float) -> bool:
    """Like :func:`spin_until`, but giving the core away (``sched_yield``) between looks: for when
    other threads wait for a core (the peer may be one of them), where a wake-up from a sleep
    would cost far more than the yields."""
    end = time.perf_counter() + seconds
    yield_ = os.sched_yield
    while True:
        if ready():
            return True
        if time.perf_counter() >= end:
            return False
        yield_()
