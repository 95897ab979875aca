"""Shared-memory collectives for ranks on one host: every rank reads its peers' buffers directly.

The cluster transport's ``algorithm="native"`` when every rank of the group shares memory with
every other (:class:`~.zmq.ZmqCommunicator` with all channels ``"shm"``). Each rank keeps a
*window*: a shared segment of its own, mapped by all its peers, with two halves used by turns
(call g writes half ``g % 2``). An allreduce of B bytes over N ranks:

0. every rank copies its input into its window's half, but for its own slice r
   (``bounds[r]:bounds[r + 1]``, about B/N), and tells every peer ("step 0", carrying the
   window's name: a peer maps a window it has not seen yet);
1. rank r reduces slice r, from its own input and straight from the peers' windows, in rank
   order, into slice r of its window (no peer reads it before the next step), and tells every
   peer ("step 1"); only rank r computes slice r, so every rank gets the same bits;
2. every rank copies the reduced slices out of the windows.

Each rank copies about (2N - 1)B/N bytes and reads B to reduce, with two rounds of small
messages (the ring moves as many bytes but in 2(N - 1) rounds, each through a ring buffer).
An allreduce of at most :data:`ONE_SHOT_BYTES` takes one round instead: every rank sends its
tensor to every peer and reduces all N in rank order (latency counts there, not bandwidth). On
x86-64 that round goes through the *boxes* beside the channels' rings (:mod:`.shm`, "The box"):
the tensor, a checksum of the call's signature and the call's sequence number as a ticket,
written straight into shared memory and read where it lies, without a message (about half the
time of a message round); a box that shows another call is a mismatch error.
Taking turns between the halves is what makes reuse safe without a third round: every native
call counts (one-shot and barrier too), and a rank writes half h again only in native call g + 2,
after it heard from every peer in call g + 1, which each peer does only once it has finished
call g (a step-0 message, a one-shot tensor, or its share of the barrier). Ranks check that their
counts agree at step 0, so calls that differed earlier give an error, never the wrong half. reduce_scatter stops after step 1; allgather and broadcast copy
blocks through the windows the same way (one round); barrier is a ring barrier over the
channels.

Messages go through the call's :class:`~._exchange.Exchange`, so signatures, deadlines, lost
peers and events work as for every algorithm. A window grows (a new segment, the old one dropped)
when a call needs more than it has; its name is unlinked once every peer has mapped it (all
their step-1 messages arrived), so nothing stays in ``/dev/shm`` after that. A call that fails
before then (a peer late past the deadline, lost, or a mismatch) drops the window at once, name
and all: the next call makes a new one, and a late peer that finds the name gone fails its call
with a :class:`~.errors.CollectiveError` naming the rank whose window it was.
"""
from __future__ import annotations

import time
import zlib

import numpy as np

from ..events import now
from . import ring
from .errors import CollectiveError
from .shm import (BOX_BYTES, STRONG_ORDER, _unlink, map_segment, new_segment_name, segment_path, spin_until,
                  yield_until)

__all__ = ["SharedMemoryCollectives"]

_ALIGN = 64
MIN_WINDOW = 1 << 20
ONE_SHOT_BYTES = 64 << 10     # allreduce of at most this many bytes: one round, no windows
_WAIT_SPIN_S = 1e-3           # a box wait spins (or yields) this long between looks at the messages
_WAIT_SLEEP_AFTER_S = 0.02    # ... and after this long also sleeps a little each time (a stopped peer)
_EVENT_KEYS = ("peer", "step", "chunk", "part", "seq", "alg")


class _Window:
    """A shared segment mapped read-write (our own) or read-only use (a peer's)."""

    def __init__(self, name: str, size: int | None = None):
        self.name = name
        self.path = segment_path(name)
        self.map = map_segment(self.path, size)
        self.size = len(self.map)
        self.half = (self.size // 2) // _ALIGN * _ALIGN
        self.bytes = np.frombuffer(self.map, np.uint8)
        self.linked = size is not None

    def view(self, half: int, dtype, count: int) -> np.ndarray:
        dtype = np.dtype(dtype)
        start = half * self.half
        return self.bytes[start:start + count * dtype.itemsize].view(dtype)

    def unlink(self):
        if self.linked:
            self.linked = False
            _unlink(self.path)

    def close(self):
        self.unlink()
        self.bytes = None
        try:
            self.map.close()
        except BufferError:      # a view is still out: the mapping goes with it
            pass


class SharedMemoryCollectives:
    """The ``native`` collectives of a communicator whose ranks all share memory (see the module
    docstring). ``comm`` needs ``rank``, ``size`` and a ``tasks`` list for messages."""

    def __init__(self, comm):
        self.comm = comm
        self._mine: _Window | None = None
        self._peers: dict = {}          # rank -> _Window
        self._calls = 0
        self._sigs: dict = {}           # signature text -> (crc32, its bytes), for the box

    # -- the windows -------------------------------------------------------------------------------
    def _own(self, ex, nbytes: int) -> _Window:
        need = -(-nbytes // _ALIGN) * _ALIGN * 2
        if self._mine is None or self._mine.half * 2 < need:
            if self._mine is not None:
                self._mine.close()
                self._mine = None
            size = max(MIN_WINDOW, 1 << (need - 1).bit_length())
            try:
                self._mine = _Window(new_segment_name("w"), size)
            except OSError as e:      # e.g. NoSharedMemory: every rank hears why
                why = f"rank {ex.rank} could not make its shared window of {size / 2**20:.1f} MiB: {e}"
                ex._fail(CollectiveError(f"{ex.name} #{ex.seq} ({ex.alg}) failed: {why}", ex.name, ex.seq,
                                         ex.rank, ()), {"kind": "error", "message": why})
        return self._mine

    def _peer(self, ex, rank: int, name: str) -> _Window:
        win = self._peers.get(rank)
        if win is None or win.name != name:
            if win is not None:
                win.close()
                del self._peers[rank]
            try:
                win = _Window(name)
            except OSError as e:       # its maker gave the call up (and dropped the window) first
                ex.check(rank)         # its abort (sent before it dropped the window) says why, if here
                why = f"rank {ex.rank} could not map rank {rank}'s shared window {name} ({e.strerror or e})"
                ex._fail(CollectiveError(f"{ex.name} #{ex.seq} ({ex.alg}) failed: {why}; rank {rank} "
                                         f"probably gave this call up", ex.name, ex.seq, ex.rank, (rank,)),
                         {"kind": "error", "message": why})
            self._peers[rank] = win
        return win

    def _drop_own(self) -> None:
        """A windowed call failed: drop this rank's window if its name is still linked (peers may
        not have mapped it; the next call makes a new one), so nothing stays in /dev/shm."""
        if self._mine is not None and self._mine.linked:
            self._mine.close()
            self._mine = None

    def _next_call(self) -> int:
        """Count this native call; its window half is the count's parity (every native call
        counts, so ranks agree, and each hears from every peer: see the module docstring)."""
        self._calls += 1
        return self._calls % 2

    def _announce(self, ex, win: _Window, step: int) -> dict:
        """Tell every peer this rank's window is ready (step ``step``), with this rank's count of
        native calls; map theirs. Counts that differ (ranks that made different calls before)
        are a mismatch: both sides take the larger count, so the next call agrees again."""
        name = np.frombuffer(win.name.encode(), np.uint8)
        count = np.array([self._calls], np.int64)
        for peer in range(ex.size):
            if peer != ex.rank:
                ex.send(peer, [name, count], step)
        wins = {ex.rank: win}
        for peer in range(ex.size):
            if peer != ex.rank:
                their_name, their_count = ex.recv(peer, step)
                theirs = int(their_count[0])
                if theirs != self._calls:
                    mine, self._calls = self._calls, max(self._calls, theirs)
                    ex._mismatch(peer, ex.sig, f"rank {ex.rank} is at its native call #{mine}, rank {peer} "
                                               f"at #{theirs} (an earlier native call differed)")
                wins[peer] = self._peer(ex, peer, their_name.tobytes().decode())
        return wins

    def _round(self, ex, step: int) -> None:
        for peer in range(ex.size):
            if peer != ex.rank:
                ex.send(peer, [], step)
        for peer in range(ex.size):
            if peer != ex.rank:
                ex.recv(peer, step)

    def close(self) -> None:
        for win in self._peers.values():
            win.close()
        self._peers.clear()
        if self._mine is not None:
            self._mine.close()
            self._mine = None

    # -- the collectives -----------------------------------------------------------------------------
    def allreduce(self, ex, buf, bounds, ufunc, src=None, scatter_only=False):
        src = buf if src is None else src
        n, r = ex.size, ex.rank
        half = self._next_call()
        if buf.nbytes <= ONE_SHOT_BYTES and not scatter_only:
            if STRONG_ORDER and buf.nbytes <= BOX_BYTES:
                return self._boxed(ex, buf, ufunc, src)
            return self._one_shot(ex, buf, ufunc, src)
        try:
            win = self._own(ex, buf.nbytes)
            mine = win.view(half, buf.dtype, buf.size)
            for p in range(n):           # the peers' slices of this rank's input (they reduce those)
                if p != r:
                    mine[bounds[p]:bounds[p + 1]] = src[bounds[p]:bounds[p + 1]]
            wins = self._announce(ex, win, 0)
            views = [wins[p].view(half, buf.dtype, buf.size) for p in range(n)]
            lo, hi = bounds[r], bounds[r + 1]
            t0 = now()
            terms = [src[lo:hi] if p == r else views[p][lo:hi] for p in range(n)]
            acc = mine[lo:hi]            # no peer reads this range until step 1 says it is reduced
            ufunc(terms[0], terms[1], out=acc)
            for p in range(2, n):
                ufunc(acc, terms[p], out=acc)
            ex.reduced(t0, acc.nbytes * (n - 1), r, 1, r)
            self._round(ex, 1)
            win.unlink()          # every peer has mapped it by now
            for p in ((r,) if scatter_only else range(n)):
                buf[bounds[p]:bounds[p + 1]] = views[p][bounds[p]:bounds[p + 1]]
        except BaseException:     # failed (deadline, lost peer, mismatch) or interrupted
            self._drop_own()
            raise

    def _boxed(self, ex, buf, ufunc, src):
        """A small tensor through the channels' boxes (:mod:`.shm`, "The box"): this rank puts
        ``src`` in the box of every outgoing channel, with its call's sequence number as the ticket
        (half: its parity) and a checksum of its signature, then reads every peer's box where it
        lies and reduces all N in rank order (as :meth:`_one_shot`, without messages: no framing,
        no wake-ups). A peer whose box shows another call (another signature, or a later ticket)
        is a mismatch; a box that stays empty is waited for with the call's deadline."""
        n, r, ticket = ex.size, ex.rank, ex.seq
        half = ticket & 1
        comm = self.comm
        sig = self._sigs.get(ex.text)
        if sig is None:
            if len(self._sigs) > 1024:
                self._sigs.clear()
            raw = ex.text.encode()
            sig = self._sigs[ex.text] = (zlib.crc32(raw), raw)
        crc, raw = sig
        log, name, alg, nbytes = ex.log, ex.name, ex.alg, src.nbytes
        gave_up = ex.st.failed_seq       # this rank's boxes of calls it gave up will never be read
        faults = ex.faults               # injected faults (flowlab.cluster.faults): None unless set
        for p in range(n):
            if p != r:
                out = comm._out[p]
                if faults is not None and self._box_fault(ex, p):
                    continue
                t0 = now()
                if not out.box_free(half, gave_up):
                    self._await(ex, lambda: out.box_free(half, gave_up), p)
                out.box_put(half, ticket, crc, raw, src)
                log.record_fields("send", name, t0, now(), nbytes, r, _EVENT_KEYS, (p, 0, 0, 0, ticket, alg))
        got, boxes = [], []
        for p in range(n):
            if p == r:
                got.append(src)
                continue
            t0 = now()
            box = comm._in.get(p)
            if box is None:           # its greeting has not been handled here yet
                self._await(ex, lambda: p in comm._in, p)
                box = comm._in[p]
            boxes.append((p, box))
            if box.box_ticket(half) != ticket:
                self._await(ex, lambda: box.box_ticket(half) >= ticket or box.box_ticket(1 - half) > ticket, p)
            theirs = box.box_ticket(half)
            their_crc, _, payload = box.box_get(half, buf.dtype, buf.size)
            if theirs != ticket or their_crc != crc or payload is None:
                h = half if theirs >= box.box_ticket(1 - half) else 1 - half
                ex._mismatch(p, ex.their_sig(box.box_sig(h), box.box_ticket(h)))
            got.append(payload)
            log.record_fields("recv", name, t0, now(), nbytes, r, _EVENT_KEYS, (p, 0, 0, 0, ticket, alg))
        _reduce_all(ex, got, buf, src, ufunc)
        for p, box in boxes:
            if box.box_ticket(half) != ticket:     # rewritten while read: the peer gave this call up
                ex._fail(CollectiveError(f"{ex.name} #{ticket} on rank {r} failed: rank {p} gave the call up "
                                         f"while this rank read its tensor", ex.name, ticket, r, (p,)))
            box.box_done(half, ticket)

    def _box_fault(self, ex, peer) -> bool:
        """This task has injected faults: wait out a delay; True when the box for ``peer`` is
        dropped (left unwritten: the peer fails at the deadline); fail the call on every rank when
        a corrupt roll hits it (a box carries no checksum of its tensor, see flowlab.cluster.faults)."""
        from ..faults import box_fault

        hit = box_fault(ex, peer)
        if hit == "corrupt":
            why = (f"rank {ex.rank} has an injected corrupt fault and it hit the tensor for rank {peer}; "
                   f"shared-memory boxes carry no checksum, so the call fails instead of giving a wrong value")
            ex._fail(CollectiveError(f"{ex.name} #{ex.seq} ({ex.alg}) on rank {ex.rank} failed: {why}", ex.name,
                                     ex.seq, ex.rank, (ex.rank,)), {"kind": "error", "message": why})
        return hit == "drop"

    def _await(self, ex, ready, peer):
        """Wait until ``ready()`` (a peer's progress in shared memory), hearing aborts, lost peers
        and the deadline meanwhile (:meth:`Exchange.check`, blaming ``peer``). Spins while there
        is a core for each rank, else gives the core away between looks; after a while it also
        sleeps a little between looks (a stopped peer must not cost a core until the deadline)."""
        comm = self.comm
        started = now()
        while True:
            if comm.spin and comm._cores_free():
                got = spin_until(ready, _WAIT_SPIN_S)
            else:
                got = yield_until(ready, _WAIT_SPIN_S)
            if got:
                return
            ex.check(peer)
            if now() - started > _WAIT_SLEEP_AFTER_S:
                time.sleep(2e-4)
                if ready():
                    return

    def _one_shot(self, ex, buf, ufunc, src):
        """A small tensor: send it to every peer, then every rank reduces all N in rank order."""
        n, r = ex.size, ex.rank
        for peer in range(n):
            if peer != r:
                ex.send(peer, [src], 0)
        got = [src if p == r else ex.recv(p, 0)[0] for p in range(n)]
        _reduce_all(ex, got, buf, src, ufunc)

    def reduce_scatter(self, ex, buf, bounds, ufunc, src=None):
        self.allreduce(ex, buf, bounds, ufunc, src, scatter_only=True)

    def allgather(self, ex, buf, bounds):
        n, r = ex.size, ex.rank
        half = self._next_call()
        try:
            win = self._own(ex, buf.nbytes)
            mine = win.view(half, buf.dtype, buf.size)
            mine[bounds[r]:bounds[r + 1]] = buf[bounds[r]:bounds[r + 1]]
            wins = self._announce(ex, win, 0)
            for p in range(n):
                if p != r:
                    buf[bounds[p]:bounds[p + 1]] = wins[p].view(half, buf.dtype, buf.size)[bounds[p]:bounds[p + 1]]
            self._round(ex, 1)    # nobody rewrites a window another rank may still be copying from
            win.unlink()
        except BaseException:
            self._drop_own()
            raise

    def broadcast(self, ex, buf, root):
        half = self._next_call()
        try:
            win = self._own(ex, buf.nbytes)
            if ex.rank == root:
                win.view(half, buf.dtype, buf.size)[...] = buf
            wins = self._announce(ex, win, 0)
            if ex.rank != root:
                buf[...] = wins[root].view(half, buf.dtype, buf.size)
            self._round(ex, 1)
            win.unlink()
        except BaseException:
            self._drop_own()
            raise

    def barrier(self, ex):
        self._next_call()
        ring.allreduce(ex, np.zeros(0, np.int8), [0] * (ex.size + 1), np.add)


def _reduce_all(ex, got, buf, src, ufunc):
    """``buf`` = every rank's term (``got``, in rank order) combined in rank order, so every rank
    gets the same bits; ``src`` is this rank's own term (it may be ``buf`` itself: in place)."""
    n, r = ex.size, ex.rank
    t0 = now()
    if r >= 2 and src is buf:      # in place: the first step would overwrite this rank's term
        got[r] = src.copy()
    ufunc(got[0], got[1], out=buf)
    for p in range(2, n):
        ufunc(buf, got[p], out=buf)
    ex.reduced(t0, buf.nbytes * (n - 1), (r + 1) % n, 0)
