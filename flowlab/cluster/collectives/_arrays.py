"""The collective backend: ``allreduce``, ``broadcast``, ``allgather``, ``reduce_scatter`` and
``barrier`` on numpy arrays, over a communicator, with the algorithms of ``ALGORITHMS``. Both
ways in call these functions: the public functions of :mod:`.api` for numpy arrays, lists and
numbers, and the kernels of the table ops of :mod:`.ops` for Tensors (eagerly, or as graph nodes).

Each function takes this rank's array (any shape, a flowlab dtype) and returns a new array (or
``out``); the input is never modified. Every call forms the group first if it is not formed
(within its deadline), checks its signature against the peers', records its events, and raises a
:class:`~.errors.CollectiveError` naming the rank and the peers it waited for when it fails.
"""
from __future__ import annotations

import math
import time

import numpy as np

from flowlab.core.backends import array_module

from .. import _buffers
from . import naive, ring, tree
from ._exchange import Exchange, comm_state, default_timeout
from .errors import PeerLostError
from .reductions import finish, ufunc_for

__all__ = ["ALGORITHMS", "allreduce", "broadcast", "allgather", "reduce_scatter", "barrier", "check_out",
           "even_bounds"]

ALGORITHMS = {"ring": ring, "tree": tree, "naive": naive}


def allreduce(arr, op, algorithm, comm, timeout, out=None, root=None):
    """``op`` over every rank's ``arr``, shaped like ``arr`` (written into ``out``, a flat view from
    :func:`check_out`, when given). ``root`` (the gradient of a broadcast): only rank ``root``
    keeps the result, the others get zeros."""
    ufunc = ufunc_for(op, arr.dtype)
    n = comm.size
    if out is not None:
        src = arr.reshape(-1) if arr.flags.c_contiguous else np.ascontiguousarray(arr).reshape(-1)
        if np.may_share_memory(src, out):     # in place (the algorithms then see src is buf),
            same = src.ctypes.data == out.ctypes.data and src.strides == out.strides
            src = out if same else src.copy()  # or overlapping elsewhere: read a copy
        buf = out
    if n > 1:
        left = timeout if getattr(comm, "formed", True) else _formed(comm, "allreduce", timeout)
        algorithm, impl = _route(algorithm, comm, arr)
        if out is None:
            src, buf = _source_and_buffer(arr)
        try:
            with _exchange(comm, "allreduce", algorithm, arr, reduce=op, timeout=left) as ex:
                impl.allreduce(ex, buf, even_bounds(buf.size, n), ufunc, src)
        except PeerLostError as e:
            _regrouped(comm, e)
            raise
    elif out is None:
        buf = _flat_copy(arr)
    elif buf.ctypes.data != src.ctypes.data:
        buf[...] = src
    finish(op, buf, n)
    if root is not None and comm.rank != root:
        buf[...] = 0
    return buf.reshape(arr.shape)


def broadcast(arr, root, algorithm, comm, timeout):
    """Rank ``root``'s ``arr`` (every rank passes one of the same shape and dtype)."""
    n = comm.size
    if not (isinstance(root, (int, np.integer)) and 0 <= root < n):
        raise ValueError(f"broadcast: root must be a rank in 0..{n - 1}, got {root!r}")
    root = int(root)
    buf = _flat_copy(arr)
    if n > 1:
        left = timeout if getattr(comm, "formed", True) else _formed(comm, "broadcast", timeout)
        algorithm, impl = _route(algorithm, comm, arr)
        try:
            with _exchange(comm, "broadcast", algorithm, arr, root=root, timeout=left) as ex:
                impl.broadcast(ex, buf, root)
        except PeerLostError as e:
            _regrouped(comm, e)
            raise
    return buf.reshape(arr.shape)


def allgather(arr, algorithm, comm, timeout, rows=None, mean=False):
    """Every rank's ``arr`` concatenated along the first axis in rank order (a scalar counts as one
    row). ``rows`` (the gradient of a reduce_scatter of ``rows`` rows): each rank gives its share of
    them, as reduce_scatter split them; ``mean``: the result divided by the number of ranks."""
    n = comm.size
    if rows is None:
        out = _allgather(arr, [arr.shape[0] if arr.ndim else 1] * n, algorithm, comm, timeout, arr.shape)
    else:
        bounds = even_bounds(rows, n)
        counts = [bounds[i + 1] - bounds[i] for i in range(n)]
        out = _allgather(arr, counts, algorithm, comm, timeout, (rows,) + arr.shape[1:], "reduce_scatter_grad")
    if mean:
        out = out / out.dtype.type(n)
    return out


def reduce_scatter(arr, op, algorithm, comm, timeout):
    """``op`` over every rank's ``arr``, then rank r's share of the first axis: rows ``r`` of
    ``numpy.array_split(result, N)``."""
    if arr.ndim == 0:
        raise ValueError("reduce_scatter splits the first axis: it needs a tensor with at least one "
                         "dimension, got a scalar")
    ufunc = ufunc_for(op, arr.dtype)
    n, r = comm.size, comm.rank
    rows = even_bounds(arr.shape[0], n)
    row_size = int(np.prod(arr.shape[1:], dtype=np.int64))
    bounds = [b * row_size for b in rows]
    if n > 1:
        left = timeout if getattr(comm, "formed", True) else _formed(comm, "reduce_scatter", timeout)
        algorithm, impl = _route(algorithm, comm, arr)
        src, buf = _source_and_buffer(arr)
        try:
            with _exchange(comm, "reduce_scatter", algorithm, arr, reduce=op, timeout=left) as ex:
                impl.reduce_scatter(ex, buf, bounds, ufunc, src)
        except PeerLostError as e:
            _regrouped(comm, e)
            raise
    else:
        buf = _flat_copy(arr)
    block = buf[bounds[r]:bounds[r + 1]].copy()
    finish(op, block, n)
    return block.reshape((rows[r + 1] - rows[r],) + arr.shape[1:])


def barrier(algorithm, comm, timeout) -> None:
    """Return only once every rank has called ``barrier``."""
    if comm.size == 1:
        return
    left = timeout if getattr(comm, "formed", True) else _formed(comm, "barrier", timeout)
    impl = _impl(algorithm, comm)
    try:
        with _exchange(comm, "barrier", algorithm, None, timeout=left) as ex:
            if algorithm == "native":
                impl.barrier(ex)
            else:
                impl.allreduce(ex, np.zeros(0, np.int8), [0] * (comm.size + 1), np.add)
    except PeerLostError as e:
        _regrouped(comm, e)
        raise


# -- shared machinery ------------------------------------------------------------------------------
def _allgather(arr, rows_per_rank, algorithm, comm, timeout, sig_shape, name="allgather"):
    """Concatenate ``arr`` (rank r's share: ``rows_per_rank[r]`` rows) from every rank along axis 0."""
    n, r = comm.size, comm.rank
    inner = arr.shape[1:] if arr.ndim else ()
    row_size = int(np.prod(inner, dtype=np.int64))
    bounds = [0]
    for k in rows_per_rank:
        bounds.append(bounds[-1] + k * row_size)
    buf = _buffers.empty(bounds[-1], arr.dtype) if _on_host(arr) else \
        array_module(arr).empty(bounds[-1], arr.dtype)     # a GPU array (NCCL): a GPU buffer
    buf[bounds[r]:bounds[r + 1]] = arr.reshape(-1)
    if n > 1:
        left = timeout if getattr(comm, "formed", True) else _formed(comm, name, timeout)
        algorithm, impl = _route(algorithm, comm, arr)
        try:
            with _exchange(comm, name, algorithm, arr, timeout=left, shape=sig_shape) as ex:
                impl.allgather(ex, buf, bounds)
        except PeerLostError as e:
            _regrouped(comm, e)
            raise
    return buf.reshape((sum(rows_per_rank),) + tuple(inner))


def _exchange(comm, op, algorithm, arr, reduce=None, root=None, timeout=None, shape=None):
    return Exchange(comm, op, algorithm, shape=shape if shape is not None else (None if arr is None else arr.shape),
                    dtype=None if arr is None else _dtype_name(arr.dtype), reduce=reduce, root=root, timeout=timeout,
                    segment_bytes=getattr(comm, "segment_bytes", None), nbytes=0 if arr is None else arr.nbytes)


_DTYPE_NAMES: dict = {}


def _dtype_name(dtype) -> str:
    """``dtype.name``, remembered (numpy computes it in Python: microseconds per call)."""
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = dtype.name
    return name


def _regrouped(comm, err) -> None:
    """When ``err`` (a lost peer) came from the cluster changing its layout under a running call
    (``LocalCluster.add_worker`` sends every task the new ClusterSpec, then has each drop its
    group), say so in ``err``'s message; else leave it as it is. Costs nothing unless a call fails."""
    server, layout = getattr(comm, "server", None), getattr(comm, "_layout", None)
    spec = getattr(server, "spec", None)
    if spec is None or layout is None or repr(spec.as_dict()) == layout[1]:
        return
    size = spec.num_tasks(server.job_name)
    how = (f"the cluster now has {size} {server.job_name} task{'s' if size != 1 else ''} where this group had "
           f"{comm.size}, as after LocalCluster.add_worker" if size != comm.size else
           "a task of it now listens elsewhere, as after a LocalCluster.restart that took a new port")
    text = (f"{err.op} #{err.seq} on rank {comm.rank} was given up: the group changed ({how}), so every rank "
            f"of the old group gives this call up. Call it again: a collective called without comm= runs on a "
            f"new group of {size} ranks (a strategy or communicator made before the change keeps the old "
            f"group: make a new one). What this rank saw: {err}")
    err.args = (text,)


def _formed(comm, op, timeout):
    """Form ``comm``'s group first if it has not been (the cluster's transport forms it on first
    use), within the call's deadline; the seconds left of it (what the call itself may take)."""
    if timeout is None:
        timeout = default_timeout()
    elif not timeout > 0:
        raise ValueError(f"a timeout must be positive, got {timeout!r}")
    start = time.monotonic()
    comm.form(timeout, op, comm_state(comm).seq + 1)
    if math.isinf(timeout):
        return timeout
    return max(timeout - (time.monotonic() - start), 1e-3)


def _route(algorithm, comm, arr):
    """(the algorithm's name, its implementation) for a call on ``arr``. A GPU array reaches the
    backend only when the group runs on NCCL (the collective ops chose it, :func:`.nccl.on_gpus`):
    then NCCL, whatever ``algorithm`` says; host arrays take ``algorithm``."""
    if _on_host(arr):
        return algorithm, _impl(algorithm, comm)
    from . import nccl
    return nccl.NAME, nccl


def _on_host(arr) -> bool:
    return type(arr) is np.ndarray or isinstance(arr, np.generic)


def _impl(algorithm, comm):
    if algorithm == "native":
        native = getattr(comm, "native", None)
        if native is None:
            why = getattr(comm, "why_zmq", None)
            if why is not None and getattr(comm, "formed", False):
                raise _no_native(comm, why)
            raise ValueError(f"algorithm='native' needs a transport with collectives of its own (MPI, or the "
                             f"cluster's when all ranks share memory on one host); {comm!r} has none: use "
                             f"'ring', 'tree' or 'naive'")
        return native
    try:
        return ALGORITHMS[algorithm]
    except (KeyError, TypeError):
        raise ValueError(f"unknown algorithm {algorithm!r}; use one of "
                         f"{', '.join([*ALGORITHMS, 'native'])}") from None


def _no_native(comm, why):
    """The error for ``native`` on a cluster group with some pair on ZeroMQ: which peers, and why."""
    from .errors import NativeUnavailableError
    peers = sorted(p for p, c in enumerate(comm.channels) if c == "zmq")
    lines = [f"rank {p} ({comm.tasks[p]}): {why.get(p, 'its pair is on ZeroMQ')}" for p in peers]
    return NativeUnavailableError(
        f"algorithm='native' on rank {comm.rank} needs shared memory with every peer, but this rank talks to "
        f"{'; '.join(lines)}. Use 'ring', 'tree' or 'naive' here; on a LocalCluster, cluster.restart({peers[0]}) "
        f"forms the group again", None, None, comm.rank, peers)


def check_out(out, arr, what) -> np.ndarray:
    """``out`` as a flat view, after checking it can hold ``what``'s result of ``arr``'s shape and dtype."""
    if not isinstance(out, np.ndarray):
        raise TypeError(f"{what}: out must be a numpy array, got {type(out).__name__}")
    if out.shape != arr.shape or out.dtype != arr.dtype:
        raise ValueError(f"{what}: out has shape {out.shape} and dtype {out.dtype}; the result has shape "
                         f"{arr.shape} and dtype {arr.dtype}")
    if not (out.flags.c_contiguous and out.flags.writeable):
        raise ValueError(f"{what}: out must be C-contiguous and writable")
    return out.reshape(-1)


def _flat_copy(arr) -> np.ndarray:
    """A C-contiguous 1-d copy: the buffer a collective works in (the caller's array stays as it is)."""
    if not _on_host(arr):
        return arr.copy(order="C").reshape(-1)      # a GPU array (NCCL): copied on its GPU
    return np.array(arr, copy=True, order="C").reshape(-1)


def _source_and_buffer(arr):
    """(src, buf): this rank's values as a flat C-contiguous array that is only read, and the
    result buffer. For a contiguous input, src is a view of it and buf is new (not filled: the
    algorithms write every element of it; large ones reuse memory, see :mod:`._buffers`);
    otherwise both are one private copy."""
    if arr.flags.c_contiguous:
        flat = arr.reshape(-1)            # a view of the input
        if not _on_host(arr):            # a GPU array (NCCL): a new GPU buffer
            return flat, array_module(arr).empty(flat.size, flat.dtype)
        if arr.nbytes < _buffers.MIN_BYTES:
            return flat, np.empty(flat.size, flat.dtype)
        return flat, _buffers.empty(flat.size, flat.dtype)    # large ones: recycled memory
    flat = _flat_copy(arr)                                   # a private copy
    return flat, flat


def even_bounds(total: int, n: int) -> tuple:
    """Offsets cutting ``total`` into ``n`` parts as ``numpy.array_split`` does (first ones longer)."""
    got = _BOUNDS.get((total, n))
    if got is None:
        if len(_BOUNDS) >= 4096:
            _BOUNDS.clear()
        got = _BOUNDS[total, n] = tuple(_split(total, n))
    return got


_BOUNDS: dict = {}


def _split(total, n):
    base, extra = divmod(total, n)
    out, at = [0], 0
    for i in range(n):
        at += base + (i < extra)
        out.append(at)
    return out


