"""The alpha-beta cost model of a collective, and the bus bandwidth of a measured one.

With ``n`` ranks and a tensor of ``S`` bytes on each, an all-reduce takes

    time = steps * alpha + bytes_on_the_busiest_link * beta

where ``alpha`` is what one message costs even when empty (latency) and ``beta`` what each byte
costs (one over the bandwidth). Per algorithm (as :mod:`.naive`, :mod:`.ring` and :mod:`.tree`
implement them):

=========  ======================================  ==========================================
algorithm  steps                                   bytes on the busiest link
=========  ======================================  ==========================================
naive      2                                       2(n-1)·S (rank 0 takes in and sends out
                                                   every other rank's tensor)
ring       2(n-1)                                  2(n-1)/n·S
tree       2·log2(n); 2·log2(P) + 2 when n is not  2(n-1)/n·S; when n is not a power of two, the
           a power of two (P: the power of two    halving and doubling of the P ranks left (some
           below n)                                stand for two ranks' blocks) plus 2·S (the
                                                   folded ranks hand over and get back the whole
                                                   tensor)
=========  ======================================  ==========================================

A link carries both ways at once, so a step counts the larger of what a rank sent and received.

Bus bandwidth follows nccl-tests (its ``doc/PERFORMANCE.md``): ``algbw = size / time`` and
``busbw = algbw * factor``, where the factor makes busbw comparable with the link's peak whatever
the number of ranks: ``2(n-1)/n`` for all-reduce, ``(n-1)/n`` for all-gather and reduce-scatter
(there ``size`` is the whole gathered tensor, n times one rank's share), 1 for broadcast.

:func:`fit_alpha_beta` measures alpha and beta on this machine from one-message broadcasts
between the two ranks of a :class:`~.local.LocalGroup` (threads: alpha is waking a thread and a
message's bookkeeping, beta about the speed of a memory copy).

>>> steps("ring", 4), bytes_on_busiest_link("ring", 4, 1024), busbw_factor("allreduce", 4)
(6, 1536, 1.5)
"""
from __future__ import annotations

import time
from typing import NamedTuple

import numpy as np

__all__ = ["MODEL_ALGORITHMS", "steps", "bytes_on_busiest_link", "predict", "busbw_factor", "algbw", "busbw",
           "AlphaBeta", "measure", "fit_alpha_beta"]

MODEL_ALGORITHMS = ("naive", "ring", "tree")
_FACTORS = {"allreduce": "2(n-1)/n", "allgather": "(n-1)/n", "reduce_scatter": "(n-1)/n", "broadcast": "1"}


def _check(algorithm: str, n: int) -> None:
    if algorithm not in MODEL_ALGORITHMS:
        raise ValueError(f"the cost model knows the algorithms {', '.join(MODEL_ALGORITHMS)}; got {algorithm!r}")
    if not (isinstance(n, (int, np.integer)) and n >= 1):
        raise ValueError(f"the number of ranks must be a positive integer, got {n!r}")


def _pow2_below(n: int) -> int:
    return 1 << (int(n).bit_length() - 1)


def steps(algorithm: str, n: int) -> int:
    """Rounds of messages one after another in an all-reduce on ``n`` ranks (0 for one rank)."""
    _check(algorithm, n)
    if n == 1:
        return 0
    if algorithm == "naive":
        return 2
    if algorithm == "ring":
        return 2 * (n - 1)
    p2 = _pow2_below(n)
    return 2 * (p2.bit_length() - 1) + (2 if p2 != n else 0)


def bytes_on_busiest_link(algorithm: str, n: int, nbytes: int) -> int:
    """Bytes the busiest rank pushes through its link in an all-reduce of ``nbytes`` on ``n`` ranks
    (per step the larger of what it sends and receives, summed over the steps)."""
    _check(algorithm, n)
    if nbytes < 0:
        raise ValueError(f"nbytes must be >= 0, got {nbytes!r}")
    if n == 1:
        return 0
    if algorithm == "naive":
        return 2 * (n - 1) * nbytes
    if algorithm == "ring":
        return 2 * (n - 1) * nbytes // n
    p2 = _pow2_below(n)
    if p2 == n:
        return 2 * (p2 - 1) * nbytes // p2
    return _tree_busiest(n, nbytes)


def _tree_busiest(n: int, nbytes: int) -> int:
    """Bytes on the busiest link of flowlab's tree all-reduce when ``n`` is not a power of two: the
    P = 2**k ranks that stay in stand for 2 blocks (those that absorbed a folded rank) or 1 of the
    ``n`` blocks of ``nbytes / n``, so their halves differ in size; the absorbing ranks also take
    in and hand back the whole tensor (fold and unfold)."""
    p2 = _pow2_below(n)
    rem = n - p2
    width = [2 if j < rem else 1 for j in range(p2)]
    block = nbytes / n
    worst = 0.0
    for me in range(p2):
        load, lo, hi, mask = 0.0, 0, p2, p2 >> 1
        while mask:                                  # recursive halving
            mid = lo + mask
            keep, give = ((lo, mid), (mid, hi)) if me < mid else ((mid, hi), (lo, mid))
            load += max(sum(width[give[0]:give[1]]), sum(width[keep[0]:keep[1]])) * block
            lo, hi = keep
            mask >>= 1
        lo, hi, mask = me, me + 1, 1
        while mask < p2:                             # recursive doubling
            partner = me ^ mask
            plo = partner & ~(mask - 1)
            load += max(sum(width[lo:hi]), sum(width[plo:plo + mask])) * block
            lo, hi = min(lo, plo), max(hi, plo + mask)
            mask <<= 1
        if width[me] == 2:
            load += 2 * nbytes                       # fold in, then unfold
        worst = max(worst, load)
    return int(round(worst))


def predict(algorithm: str, n: int, nbytes: int, alpha: float, beta: float) -> float:
    """The model's time in seconds: ``steps * alpha + bytes_on_busiest_link * beta``."""
    return steps(algorithm, n) * alpha + bytes_on_busiest_link(algorithm, n, nbytes) * beta


def busbw_factor(op: str, n: int) -> float:
    """nccl-tests' factor from algbw to busbw for collective ``op`` on ``n`` ranks."""
    if op not in _FACTORS:
        raise ValueError(f"no bus-bandwidth factor for {op!r}; known: {', '.join(_FACTORS)}")
    if n < 1:
        raise ValueError(f"the number of ranks must be >= 1, got {n!r}")
    if op == "allreduce":
        return 2 * (n - 1) / n
    if op in ("allgather", "reduce_scatter"):
        return (n - 1) / n
    return 1.0


busbw_factor.formulas = dict(_FACTORS)   # the factors in words, for display


def algbw(nbytes: int, seconds: float) -> float:
    """Algorithm bandwidth in bytes per second: ``nbytes / seconds``."""
    if not seconds > 0:
        raise ValueError(f"a bandwidth needs a positive time, got {seconds!r}")
    return nbytes / seconds


def busbw(op: str, n: int, nbytes: int, seconds: float) -> float:
    """Bus bandwidth in bytes per second (nccl-tests): ``algbw * busbw_factor(op, n)``."""
    return algbw(nbytes, seconds) * busbw_factor(op, n)


class AlphaBeta(NamedTuple):
    """A fitted model: ``alpha`` seconds per message, ``beta`` seconds per byte."""
    alpha: float
    beta: float

    def predict(self, algorithm: str, n: int, nbytes: int) -> float:
        return predict(algorithm, n, nbytes, self.alpha, self.beta)

    def __repr__(self):
        return (f"AlphaBeta(alpha={self.alpha * 1e6:.1f} µs, beta={self.beta * 1e9:.3f} ns/B "
                f"= {1 / self.beta / 1e9 if self.beta > 0 else float('inf'):.2f} GB/s)")


def measure(fn, ranks: int, nbytes: int, repeats: int = 5) -> float:
    """Seconds ``fn(x)`` takes on ``ranks`` ranks of a fresh :class:`~.local.LocalGroup`, for an
    ``x`` of ``nbytes`` (float32). Each repeat starts at a barrier and lasts as long as its
    slowest rank; the fastest repeat is kept (the one least disturbed by the rest of the machine)."""
    from .api import barrier
    from .local import LocalGroup

    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats!r}")
    x = np.ones(max(1, nbytes // 4), np.float32)

    def body(comm):
        times = []
        for _ in range(repeats):
            barrier()
            start = time.perf_counter()
            fn(x)
            times.append(time.perf_counter() - start)
        return times

    with LocalGroup(ranks) as group:
        per_rank = group.run(body)
    return float(np.min(np.max(per_rank, axis=0)))


def fit_alpha_beta(tiny: int = 4, large: int = 8 << 20, repeats: int = 5) -> AlphaBeta:
    """alpha and beta of this machine from one message (a naive broadcast between the two ranks
    of a LocalGroup) of ``tiny`` and of ``large`` bytes: ``alpha = t(tiny)``,
    ``beta = (t(large) - t(tiny)) / (large - tiny)``."""
    from .api import broadcast

    if not 0 < tiny < large:
        raise ValueError(f"need 0 < tiny < large, got tiny={tiny!r}, large={large!r}")
    one_message = lambda x: broadcast(x, algorithm="naive")   # noqa: E731
    t_tiny = measure(one_message, 2, tiny, repeats)
    t_large = measure(one_message, 2, large, repeats)
    return AlphaBeta(t_tiny, max(t_large - t_tiny, 0.0) / (large - tiny))
