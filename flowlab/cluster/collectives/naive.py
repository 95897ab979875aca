"""Naive collectives: everything goes through one rank, as with a parameter server. Every rank
sends its whole tensor to rank 0, which reduces them in rank order and sends the result back to
each rank. Simple and only 2 messages for most ranks, but rank 0's link carries 2(N - 1) full
tensors, so the time grows linearly with N: the bottleneck that ring all-reduce removes.

The same functions as :mod:`.ring`, with the same buffer conventions.
"""
from __future__ import annotations

from ..events import now

__all__ = ["allreduce", "reduce_scatter", "allgather", "broadcast", "ROOT"]

ROOT = 0   # the rank that plays the parameter server


def _gather_reduce(ex, buf, ufunc, mine):
    """Rank 0 adds every other rank's tensor to its own (``mine``), in rank order, into ``buf``."""
    for peer in range(ex.size):
        if peer != ROOT:
            arr = ex.recv(peer, 0)[0]
            t0 = now()
            ufunc(mine, arr, out=buf)
            mine = buf
            ex.reduced(t0, buf.nbytes, peer, 0)


def allreduce(ex, buf, bounds, ufunc, src=None):
    """``src`` (default ``buf``): this rank's values, never written; the result lands in ``buf``."""
    src = buf if src is None else src
    if ex.rank == ROOT:
        _gather_reduce(ex, buf, ufunc, src)
        for dst in range(ex.size):
            if dst != ROOT:
                ex.send(dst, [buf], 1)
    else:
        ex.send(ROOT, [src], 0)
        buf[...] = ex.recv(ROOT, 1)[0]


def reduce_scatter(ex, buf, bounds, ufunc, src=None):
    src, r = buf if src is None else src, ex.rank
    if r == ROOT:
        _gather_reduce(ex, buf, ufunc, src)
        for dst in range(ex.size):
            if dst != ROOT:
                ex.send(dst, [buf[bounds[dst]:bounds[dst + 1]]], 1, dst)
    else:
        ex.send(ROOT, [src], 0)
        buf[bounds[r]:bounds[r + 1]] = ex.recv(ROOT, 1, r)[0]


def allgather(ex, buf, bounds):
    r = ex.rank
    if r == ROOT:
        for src in range(ex.size):
            if src != ROOT:
                buf[bounds[src]:bounds[src + 1]] = ex.recv(src, 0, src)[0]
        for dst in range(ex.size):
            if dst != ROOT:
                ex.send(dst, [buf], 1)
    else:
        ex.send(ROOT, [buf[bounds[r]:bounds[r + 1]]], 0, r)
        buf[...] = ex.recv(ROOT, 1)[0]


def broadcast(ex, buf, root):
    """The root sends the whole tensor to every other rank, one after another."""
    if ex.rank == root:
        for dst in range(ex.size):
            if dst != root:
                ex.send(dst, [buf], 0)
    else:
        buf[...] = ex.recv(root, 0)[0]
