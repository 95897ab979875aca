"""The reductions an allreduce or reduce_scatter can apply: sum, mean, max, min, prod.

Each is a numpy ufunc applied in place (``ufunc(mine, theirs, out=mine)``), so a reduction step
allocates nothing. ``mean`` sums, then divides once at the end. On bool tensors sum and max are
logical or, prod and min logical and; mean of bools is refused. The mean of an integer tensor
is rounded toward zero (as integer division in TensorFlow does).
"""
from __future__ import annotations

import numpy as np

__all__ = ["REDUCTIONS", "ufunc_for", "finish"]

REDUCTIONS = {"sum": np.add, "mean": np.add, "max": np.maximum, "min": np.minimum, "prod": np.multiply}


def ufunc_for(op: str, dtype: np.dtype):
    """The in-place step of ``op`` for ``dtype``, or a ValueError/TypeError that says what is allowed."""
    try:
        ufunc = REDUCTIONS[op]
    except (KeyError, TypeError):
        raise ValueError(f"unknown reduction {op!r}; use one of {', '.join(REDUCTIONS)}") from None
    if op == "mean" and dtype.kind == "b":
        raise TypeError("the mean of bool tensors is not defined; cast to a number first, or use "
                        "op='sum' (logical or) or op='prod' (logical and)")
    return ufunc


def finish(op: str, out: np.ndarray, n: int) -> None:
    """Complete ``op`` in place on the combined values of ``n`` ranks (divides for mean)."""
    if op != "mean" or n == 1 or out.size == 0:
        return
    if out.dtype.kind == "f":
        np.divide(out, out.dtype.type(n), out=out)
        return
    # integers: truncate toward zero, without going through floats (int64 would lose digits)
    negative_inexact = (out < 0) & (np.remainder(out, n) != 0)
    np.floor_divide(out, n, out=out)
    out += negative_inexact.astype(out.dtype)
