"""Result buffers of large collectives and of large frames joined from TCP parts, recycled once nobody holds them.

A collective returns a new array each call. For large tensors the fresh memory costs as much as
the work itself: the kernel maps and zeroes every page on first touch (about as long as one more
copy of the tensor). So results of :data:`MIN_BYTES` and more are carved out of blocks kept here,
and a block is handed out again only when no array made from it is alive any more (numpy views
keep their base block alive, so the block's reference count says so). At most :data:`MAX_BYTES`
are kept; beyond that a result is plain new memory.

Nothing changes for the caller: the result is an ordinary C-contiguous array that it owns (its
``base`` is the block; nothing else ever writes there while it lives).
"""
from __future__ import annotations

import sys
import threading

import numpy as np

MIN_BYTES = 1 << 20
MAX_BYTES = 512 << 20

_blocks: dict = {}            # nbytes -> [uint8 block, ...]
_held = [0]                   # bytes in all blocks
_lock = threading.Lock()


def empty(size: int, dtype) -> np.ndarray:
    """A 1-d array of ``size`` elements of ``dtype``, not initialised (as ``numpy.empty``)."""
    dtype = np.dtype(dtype)
    nbytes = size * dtype.itemsize
    if nbytes < MIN_BYTES:
        return np.empty(size, dtype)
    with _lock:
        blocks = _blocks.setdefault(nbytes, [])
        for block in blocks:
            if sys.getrefcount(block) <= 3:       # this list, the loop variable, getrefcount's argument
                return block.view(dtype)
        if _held[0] + nbytes > MAX_BYTES:
            _evict(nbytes)
        if _held[0] + nbytes > MAX_BYTES:
            return np.empty(size, dtype)
        block = np.empty(nbytes, np.uint8)
        blocks.append(block)
        _held[0] += nbytes
        return block.view(dtype)


def _evict(need: int) -> None:
    """Drop free blocks (of any size) until ``need`` more bytes fit, or none is free."""
    for nbytes, blocks in list(_blocks.items()):
        for block in list(blocks):
            if _held[0] + need <= MAX_BYTES:
                return
            if sys.getrefcount(block) <= 4:       # blocks, list(blocks), the loop variable, the argument
                blocks.remove(block)
                _held[0] -= nbytes
        if not blocks:
            del _blocks[nbytes]


def clear() -> None:
    """Forget every block (those still in use stay alive with their arrays)."""
    with _lock:
        _blocks.clear()
        _held[0] = 0
