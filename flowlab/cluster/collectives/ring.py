"""Ring collectives: each rank sends only to its successor (rank + 1) and receives only from its
predecessor (rank - 1), so every link carries the same load and the time barely grows with N.

The flat buffer is cut into N chunks (sizes differ by at most one element when N does not
divide it). An allreduce is a reduce-scatter (N - 1 steps: a chunk goes round the ring and each
rank adds its own part as it passes, so rank r ends with chunk r fully reduced) followed by an
all-gather (N - 1 more steps: each finished chunk goes round once more). Each rank sends
2(N - 1) chunks of about 1/N of the data: about 2x the data per rank, whatever N is.

Pipelining: a large chunk is cut into parts of at most ``segment_bytes``, and each part moves on
as soon as it is reduced, so the next rank adds part 0 while part 1 is still on the wire. The
chunk a rank reduces at step t is the one it sends at step t + 1, which lets every part flow
round the ring without waiting for its whole chunk.

All functions work on a C-contiguous 1-d ``buf`` with chunk boundaries ``bounds`` (N + 1
element offsets) and receive an :class:`~._exchange.Exchange` as ``ex``. The reductions may read
this rank's values from a separate ``src`` and write only ``buf``: the ring reduces each chunk at
most once per rank, so the input never needs copying into ``buf`` first.
"""
from __future__ import annotations

from ..events import now

__all__ = ["allreduce", "reduce_scatter", "allgather", "broadcast", "DEFAULT_SEGMENT_BYTES"]

DEFAULT_SEGMENT_BYTES = 1 << 20   # parts of at most 1 MiB: enough to overlap, few enough messages


def _parts(buf, lo, hi, nparts):
    step = hi - lo
    return [buf[lo + step * j // nparts: lo + step * (j + 1) // nparts] for j in range(nparts)]


def _nparts(ex, buf, bounds):
    seg = ex.segment_bytes or DEFAULT_SEGMENT_BYTES
    if buf.nbytes <= seg:
        return 1                  # no chunk is larger than the whole buffer
    biggest = max(bounds[i + 1] - bounds[i] for i in range(len(bounds) - 1)) * buf.itemsize
    return max(1, -(-biggest // seg))


def _chunk_views(ex, buf, bounds, n=None):
    if n is None:
        n = _nparts(ex, buf, bounds)
    if n == 1:
        return [[buf[bounds[c]:bounds[c + 1]]] for c in range(len(bounds) - 1)], 1
    return [_parts(buf, bounds[c], bounds[c + 1], n) for c in range(len(bounds) - 1)], n


def _ring(ex, buf, bounds, ufunc, reduce_steps, gather_steps, first_chunk, src=None):
    """The common loop: ``reduce_steps`` steps that add, then ``gather_steps`` that copy. The
    chunk received at step t is ``first_chunk - t - 1`` (mod N) and is sent on at step t + 1.
    ``src`` (default ``buf``): where this rank's own values are read; every chunk is reduced at
    most once per rank, so reading ``src`` and writing ``buf`` saves copying the input first."""
    n, r = ex.size, ex.rank
    succ, pred = (r + 1) % n, (r - 1) % n
    views, nparts = _chunk_views(ex, buf, bounds)
    own = views if src is None or src is buf else _chunk_views(ex, src, bounds, nparts)[0]
    send, recv = ex.send, ex.recv
    for j, v in enumerate(own[first_chunk]):
        send(succ, [v], 0, first_chunk, j)
    total = reduce_steps + gather_steps
    last = total - 1
    for t in range(total):
        c = (first_chunk - t - 1) % n
        chunk, mine = views[c], own[c]
        for j in range(nparts):
            arr = recv(pred, t, c, j)[0]
            v = chunk[j]
            if t < reduce_steps:
                t0 = now()
                ufunc(mine[j], arr, out=v)
                ex.reduced(t0, v.nbytes, pred, t, c, j)
                if t < last:
                    send(succ, [v], t + 1, c, j)
            else:
                if t < last:
                    send(succ, [arr], t + 1, c, j)   # pass it on first: the next rank is waiting
                v[...] = arr


def allreduce(ex, buf, bounds, ufunc, src=None):
    """Afterwards ``buf`` holds the reduction on every rank. This rank's values are read from
    ``src`` (default: ``buf`` itself), which is never written."""
    n = ex.size
    _ring(ex, buf, bounds, ufunc, n - 1, n - 1, (ex.rank - 1) % n, src)


def reduce_scatter(ex, buf, bounds, ufunc, src=None):
    """Afterwards ``buf[bounds[r]:bounds[r + 1]]`` holds the reduced chunk r on rank r."""
    n = ex.size
    _ring(ex, buf, bounds, ufunc, n - 1, 0, (ex.rank - 1) % n, src)


def allgather(ex, buf, bounds):
    """On entry rank r's own block is at ``bounds[r]``; afterwards every block is everywhere."""
    _ring(ex, buf, bounds, None, 0, ex.size - 1, ex.rank)


def broadcast(ex, buf, root):
    """A pipelined chain root -> root+1 -> ...: each part is passed on as soon as it arrives."""
    n, r = ex.size, ex.rank
    q = (r - root) % n
    nparts = _nparts(ex, buf, [0, buf.size])
    parts = _parts(buf, 0, buf.size, nparts)
    succ, pred = (r + 1) % n, (r - 1) % n
    if q == 0:
        for j, v in enumerate(parts):
            ex.send(succ, [v], 0, 0, j)
        return
    for j, v in enumerate(parts):
        arr = ex.recv(pred, q - 1, 0, j)[0]
        if q < n - 1:
            ex.send(succ, [arr], q, 0, j)
        v[...] = arr
