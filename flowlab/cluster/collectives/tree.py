"""Tree collectives: recursive halving and doubling (allreduce, reduce_scatter, allgather) and a
binomial tree (broadcast). Each takes about log2(N) steps, against the ring's 2(N - 1): fewer,
larger messages, which wins for small tensors, where a step's latency costs more than its bytes.

Recursive halving (a reduce-scatter): partners at distance N/2, N/4, ... 1 swap halves of what
they hold; each keeps the half that contains its own block and adds the partner's copy of it.
After log2(N) steps each rank holds its own block, fully reduced. Recursive doubling (an
all-gather) runs it backwards: partners at distance 1, 2, 4 ... swap everything they hold.

When N is not a power of two, let P be the largest power of two below N and R = N - P. First
the R even ranks among 0 .. 2R-1 hand their data to the odd rank above them and sit out ("fold");
the P ranks left do the halving and doubling, each standing for one or two original ranks (so a
rank's range of blocks is always contiguous); at the end each folded rank gets its result from
the rank that stood for it ("unfold").

The same functions as :mod:`.ring`, with the same buffer conventions.
"""
from __future__ import annotations

from ..events import now

__all__ = ["allreduce", "reduce_scatter", "allgather", "broadcast"]

_WHOLE = -1   # the chunk id of messages that carry a rank's whole buffer (fold and unfold)


class _Layout:
    """Which original ranks each of the P = 2**k ranks that stay in stands for."""

    def __init__(self, n, rank, bounds):
        self.p2 = 1 << (n.bit_length() - 1)
        self.rem = n - self.p2
        self.steps = self.p2.bit_length() - 1
        self.bounds = bounds
        r = rank
        self.folded = r < 2 * self.rem and r % 2 == 0         # sits out, gets the result at the end
        self.absorbs = r < 2 * self.rem and r % 2 == 1        # also stands for rank r - 1
        self.me = -1 if self.folded else (r // 2 if self.absorbs else r - self.rem)

    def rank_of(self, j):
        """The original rank that plays virtual rank ``j``."""
        return 2 * j + 1 if j < self.rem else j + self.rem

    def offset(self, j):
        """Element offset where virtual rank ``j``'s blocks begin (``j`` may be P: the end)."""
        return self.bounds[2 * j if j < self.rem else j + self.rem]


def _halve(ex, buf, lay, ufunc, step):
    lo, hi, mask = 0, lay.p2, lay.p2 >> 1
    me, off = lay.me, lay.offset
    while mask:
        partner = me ^ mask
        peer = lay.rank_of(partner)
        mid = lo + mask
        keep, give = ((lo, mid), (mid, hi)) if me < mid else ((mid, hi), (lo, mid))
        ex.send(peer, [buf[off(give[0]):off(give[1])]], step, list(give))
        arr = ex.recv(peer, step, list(keep))[0]
        v = buf[off(keep[0]):off(keep[1])]
        t0 = now()
        ufunc(v, arr, out=v)
        ex.reduced(t0, v.nbytes, peer, step, list(keep))
        lo, hi = keep
        mask >>= 1
        step += 1
    return step


def _double(ex, buf, lay, step):
    me, off = lay.me, lay.offset
    lo, hi, mask = me, me + 1, 1
    while mask < lay.p2:
        partner = me ^ mask
        peer = lay.rank_of(partner)
        plo = partner & ~(mask - 1)
        ex.send(peer, [buf[off(lo):off(hi)]], step, [lo, hi])
        arr = ex.recv(peer, step, [plo, plo + mask])[0]
        buf[off(plo):off(plo + mask)] = arr
        lo, hi = min(lo, plo), max(hi, plo + mask)
        mask <<= 1
        step += 1
    return step


def _fold_in(ex, buf, lay, ufunc):
    """Step 0: folded ranks hand over their buffer; the rank above adds it. False: sit out."""
    r = ex.rank
    if lay.folded:
        ex.send(r + 1, [buf], 0, _WHOLE)
        return False
    if lay.absorbs:
        arr = ex.recv(r - 1, 0, _WHOLE)[0]
        t0 = now()
        ufunc(buf, arr, out=buf)
        ex.reduced(t0, buf.nbytes, r - 1, 0, _WHOLE)
    return True


def allreduce(ex, buf, bounds, ufunc, src=None):
    if src is not None and src is not buf:
        buf[...] = src
    lay = _Layout(ex.size, ex.rank, bounds)
    last = 1 + 2 * lay.steps
    if _fold_in(ex, buf, lay, ufunc):
        _double(ex, buf, lay, _halve(ex, buf, lay, ufunc, 1))
        if lay.absorbs:
            ex.send(ex.rank - 1, [buf], last, _WHOLE)
    else:
        buf[...] = ex.recv(ex.rank + 1, last, _WHOLE)[0]


def reduce_scatter(ex, buf, bounds, ufunc, src=None):
    if src is not None and src is not buf:
        buf[...] = src
    lay = _Layout(ex.size, ex.rank, bounds)
    r, last = ex.rank, 1 + lay.steps
    if _fold_in(ex, buf, lay, ufunc):
        _halve(ex, buf, lay, ufunc, 1)
        if lay.absorbs:
            ex.send(r - 1, [buf[bounds[r - 1]:bounds[r]]], last, r - 1)
    else:
        buf[bounds[r]:bounds[r + 1]] = ex.recv(r + 1, last, r)[0]


def allgather(ex, buf, bounds):
    lay = _Layout(ex.size, ex.rank, bounds)
    r, last = ex.rank, 1 + lay.steps
    if lay.folded:
        ex.send(r + 1, [buf[bounds[r]:bounds[r + 1]]], 0, r)
        buf[...] = ex.recv(r + 1, last, _WHOLE)[0]
        return
    if lay.absorbs:
        buf[bounds[r - 1]:bounds[r]] = ex.recv(r - 1, 0, r - 1)[0]
    _double(ex, buf, lay, 1)
    if lay.absorbs:
        ex.send(r - 1, [buf], last, _WHOLE)


def broadcast(ex, buf, root):
    """Binomial tree: in round k every rank that has the data sends it 2**k ranks further, so it
    reaches everyone in ceil(log2 N) rounds."""
    from .ring import _nparts, _parts
    n = ex.size
    q = (ex.rank - root) % n
    parts = _parts(buf, 0, buf.size, _nparts(ex, buf, [0, buf.size]))
    mask, parent = 1, None
    while mask < n:
        if q & mask:
            parent = (q - mask + root) % n
            break
        mask <<= 1
    children = []
    m = mask >> 1
    while m > 0:
        if q + m < n:
            children.append(((q + m + root) % n, m.bit_length() - 1))
        m >>= 1
    for j, v in enumerate(parts):
        if parent is not None:
            v[...] = ex.recv(parent, mask.bit_length() - 1, 0, j)[0]
        for child, step in children:
            ex.send(child, [v], step, 0, j)
