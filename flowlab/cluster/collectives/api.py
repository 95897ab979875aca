"""The collectives a learner calls: ``allreduce``, ``broadcast``, ``allgather``, ``reduce_scatter``
and ``barrier``. Every rank of a group calls the same one, in the same order, with a tensor of
the same shape and dtype; each call returns on every rank.

Arguments common to all of them:

- ``algorithm``: ``"ring"`` (bandwidth-optimal, the default), ``"tree"`` (recursive halving and
  doubling: fewer steps, better for small tensors), ``"naive"`` (everything through rank 0, as a
  parameter server does), or ``"native"`` (the transport's own collectives: MPI's, or, between
  cluster workers that all run on one host, shared-memory collectives that read the peers'
  buffers directly, see :mod:`.direct`).
- ``comm``: the communicator; by default the current one (see :func:`.comm.current`): a
  ``LocalGroup`` rank inside ``LocalGroup.run``, MPI's world under ``mpiexec``, else a group of one.
- ``timeout``: seconds before the call gives up (default 60, see ``set_default_timeout``). A call
  never waits longer: a dead or silent rank makes every rank raise an error that names it.

Inputs may be flowlab Tensors (or Variables), numpy arrays, numpy scalars, Python numbers or
nested lists, of any flowlab dtype. The result has the caller's type: a Tensor for a Tensor
(on the same device), a numpy array for an array or a list, a scalar for a scalar (but a numpy
array when the result has dimensions the input had not: allgather of scalars). The input is
never modified.

Tensors go through the collective ops of core's table (:mod:`.ops`), as any op does: eagerly they
run now, and inside ``@fl.function`` (or a compat.v1 graph) each is a graph node that runs every
time the graph does. Their gradients are in the table: inside a ``GradientTape``, eager or traced,
the gradient of an allreduce is an allreduce of the gradients (every rank must then compute
gradients through the same collectives). Numpy arrays, lists and numbers call the collective
backend (:mod:`._arrays`) directly, with no Tensor made, and keep their type; so does
``allreduce(x, out=...)``, which writes into a numpy array (not differentiable).

>>> from flowlab.cluster.collectives import LocalGroup, allreduce, allgather
>>> with LocalGroup(4) as group:
...     sums = group.run(lambda comm: allreduce([1.0, comm.rank], op="sum"))
...     gathered = group.run(lambda comm: allgather(comm.rank * 10))
>>> sums[0].tolist(), gathered[2].tolist()
([4.0, 6.0], [0, 10, 20, 30])
"""
from __future__ import annotations

import numpy as np

from flowlab.core.dtypes import as_dtype
from flowlab.core.execute import execute
from flowlab.core.tape import recording
from flowlab.core.tensor import Tensor

from . import _arrays
from ._arrays import ALGORITHMS
from .comm import Communicator, current
from .ops import ALLGATHER, ALLREDUCE, BROADCAST, REDUCE_SCATTER

__all__ = ["allreduce", "broadcast", "allgather", "reduce_scatter", "barrier", "ALGORITHMS"]


# -- the five collectives ------------------------------------------------------------------------
def allreduce(x, op: str = "sum", algorithm: str = "ring", comm: Communicator | None = None,
              timeout: float | None = None, out: np.ndarray | None = None):
    """Combine ``x`` from every rank with ``op`` (``"sum"``, ``"mean"``, ``"max"``, ``"min"``,
    ``"prod"``); every rank gets the same result, shaped like ``x``.

    ``out``: a C-contiguous, writable numpy array of ``x``'s shape and dtype to write the result
    into (and return), instead of new memory; ``out=x`` (a numpy array) reduces in place. Not
    with a GradientTape recording ``x``."""
    if isinstance(x, Tensor):
        if out is None:
            return execute(ALLREDUCE, (x,), {"comm": comm, "algorithm": algorithm, "timeout": timeout,
                                             "where": None, "op": op})
        if recording():
            raise ValueError("allreduce(out=...) is not differentiable: leave out unset inside a GradientTape")
    arr, wrap = _prepare(x, "allreduce")
    comm = current() if comm is None else comm
    if out is not None:
        _arrays.allreduce(arr, op, algorithm, comm, timeout, _arrays.check_out(out, arr, "allreduce"))
        return out
    return wrap(_arrays.allreduce(arr, op, algorithm, comm, timeout))


def broadcast(x, root: int = 0, algorithm: str = "ring", comm: Communicator | None = None,
              timeout: float | None = None):
    """Rank ``root``'s ``x`` on every rank. Every rank passes a tensor of the same shape and dtype
    (the others' values are not used)."""
    if isinstance(x, Tensor):
        return execute(BROADCAST, (x,), {"comm": comm, "algorithm": algorithm, "timeout": timeout,
                                         "where": None, "root": root})
    arr, wrap = _prepare(x, "broadcast")
    return wrap(_arrays.broadcast(arr, root, algorithm, current() if comm is None else comm, timeout))


def allgather(x, algorithm: str = "ring", comm: Communicator | None = None, timeout: float | None = None):
    """Every rank's ``x``, concatenated along the first axis in rank order: shape ``(N * d0, ...)``
    for inputs of shape ``(d0, ...)`` (a scalar input gives a vector of N). All ranks pass the
    same shape."""
    if isinstance(x, Tensor):
        return execute(ALLGATHER, (x,), {"comm": comm, "algorithm": algorithm, "timeout": timeout, "where": None})
    arr, wrap = _prepare(x, "allgather")
    return wrap(_arrays.allgather(arr, algorithm, current() if comm is None else comm, timeout))


def reduce_scatter(x, op: str = "sum", algorithm: str = "ring", comm: Communicator | None = None,
                   timeout: float | None = None):
    """Combine ``x`` from every rank with ``op``, then give each rank its share of the first axis:
    rank r gets rows ``r`` of ``numpy.array_split(result, N)`` (when N does not divide the rows,
    the first ``rows % N`` ranks get one row more)."""
    if isinstance(x, Tensor):
        return execute(REDUCE_SCATTER, (x,), {"comm": comm, "algorithm": algorithm, "timeout": timeout,
                                              "where": None, "op": op})
    arr, wrap = _prepare(x, "reduce_scatter")
    return wrap(_arrays.reduce_scatter(arr, op, algorithm, current() if comm is None else comm, timeout))


def barrier(algorithm: str = "ring", comm: Communicator | None = None, timeout: float | None = None) -> None:
    """Return on each rank only once every rank has called ``barrier``."""
    _arrays.barrier(algorithm, current() if comm is None else comm, timeout)


# -- the caller's type ----------------------------------------------------------------------------------
def _prepare(x, what):
    """(a numpy array of ``x``, a function that wraps a result array in the caller's type)."""
    if isinstance(x, Tensor):        # only with out=: the result goes into a numpy array
        return np.asarray(x), _same
    if isinstance(x, np.ndarray):
        arr, wrap = x, _same
    elif isinstance(x, np.generic):
        arr, wrap = np.asarray(x), _scalar
    elif isinstance(x, (bool, int, float)):
        arr, wrap = np.asarray(x), _python
    else:
        try:
            arr = np.asarray(x)
        except Exception as e:  # noqa: BLE001 - ragged lists and the like
            raise TypeError(f"{what}: cannot make an array of {type(x).__name__}: {e}") from None
        wrap = _same
    dtype = _NATIVE.get(arr.dtype)
    if dtype is None:
        try:
            dtype = as_dtype(arr.dtype).as_numpy_dtype
        except TypeError as e:
            raise TypeError(f"{what}: {e}") from None
        _NATIVE[arr.dtype] = dtype
    if arr.dtype is not dtype and arr.dtype != dtype:      # e.g. big-endian input
        arr = arr.astype(dtype)
    return arr, wrap


_NATIVE: dict = {}      # numpy dtype -> the flowlab dtype's numpy dtype (checked once per dtype)


def _same(a):
    return a


def _scalar(a):
    return a[()] if a.ndim == 0 else a     # allgather of scalars gives a vector


def _python(a):
    return a.item() if a.ndim == 0 else a
