"""The collectives as ops of core's table: ``allreduce``, ``broadcast``, ``allgather`` and
``reduce_scatter``, each one ``defop`` entry whose kernel calls the collective backend
(:mod:`._arrays`) and whose gradient rule is another collective, written with these ops (so
gradients of gradients work, and a traced gradient is graph nodes too):

===================  ===========================================================================
op                   gradient of its input, given the output's gradient ``g``
===================  ===========================================================================
allreduce sum, mean  ``allreduce(g, sum or mean)``: every rank's ``g`` reaches every input
allreduce max, min   ``allreduce(g, sum) * hit / allreduce(hit, sum)``, ``hit = (x == result)``:
                     the ranks that held the extreme share it (ties split it evenly)
broadcast            ``allreduce(g, sum)`` kept on rank ``root`` (zeros elsewhere)
allgather            ``reduce_scatter(g, sum)``: each rank's rows of ``g``, summed over ranks
reduce_scatter       ``allgather`` of each rank's block (``rows``: back to the input's rows;
                     divided by N for mean). Not for max, min, prod.
===================  ===========================================================================

Because they go through ``execute``, a collective on Tensors behaves like any op: eagerly it runs
now and every recording GradientTape sees it; inside ``@fl.function`` (or a compat.v1 graph) it is
a graph node, run each time the graph runs, and its gradient comes from the same rules. They are
``stateful``: graph passes never fold, merge, drop or reorder them, so every rank runs its
collectives in the order it traced them.

Attributes (all of every op, so a gradient rule passes them on): ``algorithm``, ``timeout``,
``comm`` (a Communicator; None: :func:`.comm.current` each time the op runs; or a function
returning one, called each time it runs: a strategy's or Horovod's group), ``where`` (None, a
text or a function giving one: added as a note to a failing call's error, e.g. "in the all-reduce of
MultiWorkerMirroredStrategy.run traced by @fl.function"), and ``op``/``root``/``rows``/``mean`` as
each needs. A failing kernel raises the backend's own error (``CollectiveTimeoutError``,
``PeerLostError``, ``ValueError``...), made an OpError too, so execute and graph plans pass it on
unchanged and the caller catches the same class with the same attributes.
"""
from __future__ import annotations

import numpy as np

from flowlab.core import ops as _fl
from flowlab.core.backends import to_device_of, to_numpy
from flowlab.core.dtypes import numpy_dtype
from flowlab.core.errors import InvalidArgumentError, OpError
from flowlab.core.execute import defop, execute

from . import _arrays, nccl
from .comm import Communicator, current

__all__ = ["ALLREDUCE", "BROADCAST", "ALLGATHER", "REDUCE_SCATTER", "attrs_for"]


def attrs_for(comm=None, algorithm="ring", timeout=None, where=None, **more) -> dict:
    """The attributes of a collective op (see the module docstring)."""
    return {"comm": comm, "algorithm": algorithm, "timeout": timeout, "where": where, **more}


# -- kernels: the backend on host arrays, the result where the input lives ---------------------------
def _comm_of(comm):
    if comm is None:
        return current()
    if isinstance(comm, Communicator):
        return comm
    return comm() if callable(comm) else comm


def _run(fn, x, where, comm, timeout, *args, **kwargs):
    """``fn`` (a collective of the backend) on ``x``: on the host, or on the GPU through NCCL when
    the group runs there (:func:`.nccl.on_gpus`; every rank asks, so all decide alike)."""
    try:
        if nccl.on_gpus(x, comm, timeout):
            data = nccl.placed(x, comm)         # on this rank's NCCL GPU (usually where x is)
        else:
            data = x if type(x) is np.ndarray else to_numpy(x)
        out = fn(data, *args, **kwargs)
    except Exception as e:  # noqa: BLE001 - every failure passes through execute as itself
        raise _passing(e, where) from None
    return out if data is x else to_device_of(x, out)


def _allreduce_kernel(x, *, op, comm, algorithm, timeout, where, root=None):
    comm = _comm_of(comm)
    return _run(_arrays.allreduce, x, where, comm, timeout, op, algorithm, comm, timeout, root=root)


def _broadcast_kernel(x, *, root, comm, algorithm, timeout, where):
    comm = _comm_of(comm)
    return _run(_arrays.broadcast, x, where, comm, timeout, root, algorithm, comm, timeout)


def _allgather_kernel(x, *, comm, algorithm, timeout, where, rows=None, mean=False):
    comm = _comm_of(comm)
    return _run(_arrays.allgather, x, where, comm, timeout, algorithm, comm, timeout, rows, mean)


def _reduce_scatter_kernel(x, *, op, comm, algorithm, timeout, where):
    comm = _comm_of(comm)
    return _run(_arrays.reduce_scatter, x, where, comm, timeout, op, algorithm, comm, timeout)


_PASSING: dict = {}


def _passing(error, where):
    """``error``, made an instance of a class that is both its own class and an OpError: execute and
    graph plans let OpErrors through unchanged (they would wrap anything else in an
    InvalidArgumentError), so the caller still catches the same CollectiveTimeoutError,
    PeerLostError, ValueError... with the same attributes and message."""
    if isinstance(error, OpError):
        return error
    base = type(error)
    cls = _PASSING.get(base)
    if cls is None:
        cls = _PASSING[base] = type(base.__name__, (base, OpError), {"__module__": base.__module__})
    try:
        error.__class__ = cls    # the same object: only its class gains OpError
    except TypeError:            # a layout that cannot take it: leave it as it is
        return error
    error.source = None
    if not hasattr(error, "op"):
        error.op = None
    if where is not None and hasattr(error, "add_note"):
        error.add_note(f"({where() if callable(where) else where})")
    return error


# -- shape rules ---------------------------------------------------------------------------------------
def _spec(x):
    return tuple(x.shape), numpy_dtype(x.dtype)


def _same_rule(x, **_):
    return _spec(x)


def _known(comm):
    return comm if isinstance(comm, Communicator) else None


def _allgather_rule(x, *, comm, rows=None, mean=False, **_):
    shape, dtype = _spec(x)
    if rows is not None:
        return (rows,) + shape[1:], dtype
    c = _known(comm)       # None: the group is known only when it runs
    first = 1 if not shape else shape[0]
    return ((None if c is None or first is None else first * c.size),) + shape[1:], dtype


def _reduce_scatter_rule(x, *, comm, **_):
    shape, dtype = _spec(x)
    if not shape:
        raise InvalidArgumentError("reduce_scatter splits the first axis: it needs a tensor with at least one "
                                   "dimension, got a scalar")
    c = _known(comm)
    if c is None or shape[0] is None:
        return (None,) + shape[1:], dtype
    bounds = _arrays.even_bounds(shape[0], c.size)
    return (bounds[c.rank + 1] - bounds[c.rank],) + shape[1:], dtype


# -- gradient rules ------------------------------------------------------------------------------------
def _passed(attrs, **more):
    return attrs_for(attrs["comm"], attrs["algorithm"], attrs["timeout"], attrs["where"], **more)


def _allreduce_grad(call, g):
    a = call.attrs
    op, root = a["op"], a.get("root")
    if root is not None:             # reduce to root: the gradient is root's g on every rank
        return (execute(BROADCAST, (g,), _passed(a, root=root)),)
    if op in ("sum", "mean"):
        return (execute(ALLREDUCE, (g,), _passed(a, op=op)),)
    if op in ("max", "min"):
        # the ranks whose value was the extreme share the gradient (ties split it evenly)
        hit = _fl.cast(_fl.equal(call.inputs[0], call.output), g.dtype)
        count = execute(ALLREDUCE, (hit,), _passed(a, op="sum"))
        return (execute(ALLREDUCE, (g,), _passed(a, op="sum")) * hit / count,)
    raise NotImplementedError(f"allreduce(op={op!r}) has no gradient in flowlab; sum, mean, max and min have one")


def _broadcast_grad(call, g):
    return (execute(ALLREDUCE, (g,), _passed(call.attrs, op="sum", root=call.attrs["root"])),)


def _allgather_grad(call, g):
    a = call.attrs
    if a.get("rows") is not None:    # the gradient of reduce_scatter, differentiated again
        return (execute(REDUCE_SCATTER, (g,), _passed(a, op="mean" if a.get("mean") else "sum")),)
    block = execute(REDUCE_SCATTER, (g,), _passed(a, op="sum"))
    return (_fl.reshape(block, []) if call.inputs[0].ndim == 0 else block,)


def _reduce_scatter_grad(call, g):
    a = call.attrs
    op = a["op"]
    if op not in ("sum", "mean"):
        raise NotImplementedError(f"reduce_scatter(op={op!r}) has no gradient in flowlab; sum and mean have one")
    rows = call.inputs[0].shape[0]
    if rows is None:
        raise ValueError("the gradient of reduce_scatter needs the input's first dimension, unknown here "
                         "(give the traced function an input signature with that dimension)")
    return (execute(ALLGATHER, (g,), _passed(a, rows=int(rows), mean=op == "mean")),)


# -- the table entries -----------------------------------------------------------------------------------
ALLREDUCE = defop("allreduce", _allreduce_kernel, _same_rule, _allreduce_grad, stateful=True, peers=True,
                  doc="Every rank's x combined with op (sum, mean, max, min, prod); the same result on every "
                      "rank, shaped like x (flowlab.cluster.collectives.allreduce).")
BROADCAST = defop("broadcast", _broadcast_kernel, _same_rule, _broadcast_grad, stateful=True, peers=True,
                  doc="Rank root's x on every rank (flowlab.cluster.collectives.broadcast).")
ALLGATHER = defop("allgather", _allgather_kernel, _allgather_rule, _allgather_grad, stateful=True, peers=True,
                  doc="Every rank's x concatenated along the first axis in rank order "
                      "(flowlab.cluster.collectives.allgather).")
REDUCE_SCATTER = defop("reduce_scatter", _reduce_scatter_kernel, _reduce_scatter_rule, _reduce_scatter_grad,
                       stateful=True, peers=True,
                       doc="Every rank's x combined with op, then rank r's share of the first axis "
                           "(flowlab.cluster.collectives.reduce_scatter).")
