"""Process-wide settings: BLAS threads.

Small matmuls run 2 to 3 times faster with one BLAS thread than with two on a 2-core machine
(threads spin up and synchronise for microseconds of work), and worker processes that share a
machine should not each start a full thread pool. So importing flowlab sets BLAS to
``FLOWLAB_BLAS_THREADS`` threads (default 1); ``set_blas_threads`` changes it at any time.
"""
from __future__ import annotations

import os

__all__ = ["set_blas_threads", "get_blas_threads", "blas_info"]

_DEFAULT = "FLOWLAB_BLAS_THREADS"
_limiter = None


def _controller():
    from threadpoolctl import ThreadpoolController  # imported lazily: it scans loaded libraries
    return ThreadpoolController()


def set_blas_threads(n: int) -> None:
    """Use ``n`` threads in every BLAS library numpy has loaded (OpenBLAS, MKL, BLIS)."""
    global _limiter
    n = int(n)
    if n < 1:
        raise ValueError(f"set_blas_threads needs at least 1 thread, got {n}")
    _limiter = _controller().limit(limits=n, user_api="blas")


def get_blas_threads() -> int:
    """The thread count of numpy's BLAS (the largest, if several BLAS libraries are loaded)."""
    info = blas_info()
    return max((lib["num_threads"] for lib in info), default=1)


def blas_info() -> list[dict]:
    """What threadpoolctl reports for each loaded BLAS library."""
    return [lib for lib in _controller().info() if lib.get("user_api") == "blas"]


def _apply_default() -> None:
    value = os.environ.get(_DEFAULT, "1")
    try:
        set_blas_threads(int(value))
    except ValueError:
        raise ValueError(f"{_DEFAULT} must be a whole number of threads >= 1, got {value!r}") from None
