"""MPI as a transport: how a flowlab program outgrows one machine with no code change.

Under ``mpiexec -n N python script.py`` the collectives' default communicator is an
:class:`MPICommunicator` over MPI's world (see :func:`.comm.current`), so ``allreduce(x)`` in the
script is an allreduce across the N processes, wherever ``mpiexec`` placed them.

Both ways of using MPI are here:

- point to point (``algorithm="ring"``, ``"tree"``, ``"naive"``, the default ``"ring"`` included):
  flowlab's own algorithms run over ``MPI_Isend``/``MPI_Recv``, exactly as over threads or
  ZeroMQ, with the same checks, deadlines and per-step events. This is what the lessons show.
- ``algorithm="native"``: MPI's own collectives (``MPI_Iallreduce``, ``MPI_Ibcast``,
  ``MPI_Iallgatherv``, ``MPI_Ireduce_scatter``, ``MPI_Ibarrier``), tuned by the MPI library and
  usually faster. Before each one the ranks swap their call signatures (one small
  ``MPI_Iallgather``), so a mismatch still raises an error that shows both calls, and the call is
  polled against its deadline, so it cannot hang either. A native collective that timed out cannot
  be cancelled in MPI; the communicator then refuses further native calls. float16 has no MPI
  reduction type: a native reduction of float16 runs flowlab's ring instead.

Messages: a header (tag 1: the header dict and each array's dtype and shape, in ``marshal``
format: plain data only, several times faster than JSON; all ranks run the same Python) followed
by one message per array (raw bytes, tag 2), on a duplicate of the given MPI communicator (so
flowlab's messages never meet the program's own).
``send`` copies the arrays and posts ``MPI_Isend`` (it never waits for the receiver); ``recv``
polls ``MPI_Iprobe`` from any source until its timeout. mpi4py is imported only by this module.
"""
from __future__ import annotations

import atexit
import collections
import marshal
import os
import time
import weakref

import numpy as np

from . import ring
from ._exchange import _their_sig
from .comm import Communicator
from .errors import CollectiveError, CollectiveTimeoutError

__all__ = ["MPICommunicator"]

_TAG_HEADER, _TAG_DATA = 1, 2
_SIG_BYTES = 1024   # room for one call signature in the native pre-check


_YIELD_S = 2e-3        # how long a wait looks at its request between sched_yield calls before it sleeps
_SLEEP_S = (2e-5, 2.5e-4)   # then sleeps this long, growing from the first to the second


def _poll(test, deadline):
    """Call ``test()`` until it is true; False once ``deadline`` (a ``perf_counter`` time, or None)
    passes. MPI moves messages only while a rank is inside MPI, so the wait calls ``test()`` (which
    drives MPI's progress) back to back for ``_YIELD_S``, giving the core away (``sched_yield``)
    between calls so a peer waiting for this core runs at once; only a longer wait sleeps, from 20 us
    growing to 250 us: a few percent of one core (measured: 35 ms of CPU in a 1 s wait), and about
    0.3 ms late at most (the 1 ms sleeps this replaced made collectives up to 1 ms late; on a busy
    host a 4 KiB native allreduce took ~950 us instead of ~90)."""
    if test():
        return True
    now = time.perf_counter()
    stop_yielding = now + _YIELD_S
    yield_ = os.sched_yield
    while now < stop_yielding:
        yield_()
        if test():
            return True
        now = time.perf_counter()
        if deadline is not None and now >= deadline:
            return False
    pause = _SLEEP_S[0]
    while True:
        if deadline is not None:
            if now >= deadline:
                return test()
            time.sleep(min(pause, deadline - now))
        else:
            time.sleep(pause)
        if test():
            return True
        pause = min(_SLEEP_S[1], pause * 1.5)
        now = time.perf_counter()


class MPICommunicator(Communicator):
    """A communicator over an mpi4py communicator (``MPI.COMM_WORLD`` unless given)."""

    def __init__(self, mpi_comm=None):
        from mpi4py import MPI
        self._MPI = MPI
        self._comm = (MPI.COMM_WORLD if mpi_comm is None else mpi_comm).Dup()
        self.rank, self.size = self._comm.Get_rank(), self._comm.Get_size()
        self._pending: collections.deque = collections.deque()   # (requests, buffers kept alive)
        self._status = MPI.Status()
        self.native = _Native(self)
        ref = weakref.ref(self)
        atexit.register(lambda: ref() is not None and ref().close())

    # -- the contract -----------------------------------------------------------------------------
    def send(self, peer, header, arrays):
        MPI, comm = self._MPI, self._comm
        meta = marshal.dumps((header, [(a.dtype.str, a.shape) for a in arrays]))
        reqs, keep = [comm.Isend([meta, MPI.BYTE], peer, _TAG_HEADER)], [meta]
        for a in arrays:
            c = np.array(a, copy=True, order="C")   # the caller may overwrite ``a`` once we return
            reqs.append(comm.Isend([c.reshape(-1).view(np.uint8), MPI.BYTE], peer, _TAG_DATA))
            keep.append(c)
        self._pending.append((reqs, keep))
        if len(self._pending) > 8:
            self._reap()

    def recv(self, timeout):
        MPI, comm, st = self._MPI, self._comm, self._status
        if not comm.Iprobe(MPI.ANY_SOURCE, _TAG_HEADER, st):
            self._reap()
            deadline = None if timeout is None else time.perf_counter() + timeout
            if not _poll(lambda: comm.Iprobe(MPI.ANY_SOURCE, _TAG_HEADER, st), deadline):
                raise TimeoutError(f"rank {self.rank}: no MPI message within {timeout:.3g} s")
        src = st.Get_source()
        raw = bytearray(st.Get_count(MPI.BYTE))
        comm.Recv([raw, MPI.BYTE], src, _TAG_HEADER)
        header, metas = marshal.loads(raw)
        arrays = []
        for dtype, shape in metas:
            a = np.empty(shape, dtype)
            comm.Recv([a.reshape(-1).view(np.uint8), MPI.BYTE], src, _TAG_DATA)
            arrays.append(a)
        return src, header, arrays

    def flush(self, deadline: float | None) -> None:
        """Wait (until ``deadline``, a ``perf_counter`` time) for this rank's sends to leave. The
        collective layer calls it as a call ends: large MPI messages move only while the sender is
        inside MPI, so a rank that went back to its own work could stall a peer's receive."""
        if self._pending:
            _poll(self._all_sent, deadline)

    def close(self) -> None:
        """Finish (or after 10 s, cancel) pending sends and free the duplicate communicator."""
        MPI = self._MPI
        if self._comm is None or MPI.Is_finalized():
            return
        self.flush(time.perf_counter() + 10.0)
        for reqs, _ in self._pending:
            for r in reqs:
                try:
                    r.Cancel()
                    r.Free()
                except Exception:  # noqa: BLE001 - already complete or not cancellable
                    pass
        self._pending.clear()
        if not self.native.broken:
            try:
                self._comm.Free()
            except Exception:  # noqa: BLE001
                pass
        self._comm = None

    def _reap(self):
        pending, testall = self._pending, self._MPI.Request.Testall
        while pending and testall(pending[0][0]):
            pending.popleft()

    def _all_sent(self) -> bool:
        self._reap()
        return not self._pending


class _Native:
    """MPI's own collectives behind flowlab's checks (see the module docstring)."""

    def __init__(self, owner: MPICommunicator):
        self.owner = owner
        self.broken: str | None = None

    def _ops(self, name, dtype):
        MPI = self.owner._MPI
        if dtype.kind == "b":
            return {"sum": MPI.LOR, "mean": MPI.LOR, "max": MPI.LOR, "min": MPI.LAND, "prod": MPI.LAND}[name]
        return {"sum": MPI.SUM, "mean": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN, "prod": MPI.PROD}[name]

    def _wait(self, ex, req):
        if not _poll(req.Test, ex.deadline):
            self.broken = f"{ex.name} #{ex.seq} timed out in MPI"
            ex.st.failed_seq = max(ex.st.failed_seq, ex.seq)
            raise CollectiveTimeoutError(
                f"{ex.name} #{ex.seq} (native MPI) on rank {ex.rank} timed out after {ex.timeout:g} s: some "
                f"rank is not calling it (or is stopped); MPI cannot say which", ex.name, ex.seq, ex.rank, (),
                ex.timeout)

    def _check(self, ex):
        """Swap call signatures with every rank (one small allgather) and compare them."""
        if self.broken:
            raise CollectiveError(f"{ex.name} #{ex.seq} on rank {ex.rank}: native MPI collectives are "
                                  f"unusable on this communicator since {self.broken}", ex.name, ex.seq, ex.rank)
        text = f"{ex.seq}|{ex.text}".encode()      # made without building the signature dict
        if len(text) > _SIG_BYTES:
            raise ValueError(f"{ex.name}: the call signature is too long for the native check ({len(text)} bytes)")
        mine = np.zeros(_SIG_BYTES, np.uint8)
        mine[:len(text)] = np.frombuffer(text, np.uint8)
        every = np.empty((ex.size, _SIG_BYTES), np.uint8)
        MPI = self.owner._MPI
        self._wait(ex, self.owner._comm.Iallgather([mine, MPI.BYTE], [every, MPI.BYTE]))
        for peer in range(ex.size):
            raw = every[peer].tobytes().rstrip(b"\0")
            if raw != text:
                seq, _, fields = raw.decode(errors="replace").partition("|")
                ex._mismatch(peer, _their_sig({"s": fields, "q": int(seq) if seq.isdigit() else seq}))

    def allreduce(self, ex, buf, bounds, ufunc, src=None):
        if buf.dtype == np.float16:
            return ring.allreduce(ex, buf, bounds, ufunc, src)
        self._check(ex)
        MPI = self.owner._MPI
        send = MPI.IN_PLACE if src is None or src is buf else src
        self._wait(ex, self.owner._comm.Iallreduce(send, buf, self._ops(ex.sig["reduce"], buf.dtype)))

    def reduce_scatter(self, ex, buf, bounds, ufunc, src=None):
        if buf.dtype == np.float16:
            return ring.reduce_scatter(ex, buf, bounds, ufunc, src)
        self._check(ex)
        r = ex.rank
        counts = [bounds[i + 1] - bounds[i] for i in range(ex.size)]
        out = np.empty(counts[r], buf.dtype)
        send = buf if src is None else src
        self._wait(ex, self.owner._comm.Ireduce_scatter(send, out, counts, self._ops(ex.sig["reduce"], buf.dtype)))
        buf[bounds[r]:bounds[r + 1]] = out

    def allgather(self, ex, buf, bounds):
        self._check(ex)
        MPI, k = self.owner._MPI, buf.itemsize
        counts = [(bounds[i + 1] - bounds[i]) * k for i in range(ex.size)]
        displs = [b * k for b in bounds[:-1]]
        raw = buf.view(np.uint8)
        self._wait(ex, self.owner._comm.Iallgatherv(MPI.IN_PLACE, [raw, counts, displs, MPI.BYTE]))

    def broadcast(self, ex, buf, root):
        self._check(ex)
        MPI = self.owner._MPI
        self._wait(ex, self.owner._comm.Ibcast([buf.view(np.uint8), MPI.BYTE], root))

    def barrier(self, ex):
        self._check(ex)
        self._wait(ex, self.owner._comm.Ibarrier())
