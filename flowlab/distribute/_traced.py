"""``strategy.run`` and ``strategy.reduce`` while ``@fl.function`` traces: the replicas become
parts of one graph.

``run`` traces ``fn`` once per local replica, one after the other, each under its replica's
device and in a name scope ``replica_<i>`` (``i``: its ``replica_id_in_sync_group``; so a node
that fails when the graph runs names its replica, and an error while tracing says which one),
with that replica's component of the PerReplica arguments. ``optimizer.apply_gradients`` in a
replica records the replica's gradients; when the last replica reaches the same call, the
gradient all-reduce is added to the graph:

- over the local replicas: for each variable, the sum of the replicas' gradients, in replica
  order, as ``add`` nodes on the first replica's device (the CPU for CentralStorageStrategy);
- over the worker processes (MultiWorkerMirroredStrategy): one stateful ``strategy_allreduce``
  node whose kernel, each time the graph runs, concatenates the gradients and calls
  ``flowlab.cluster.collectives.allreduce`` over the strategy's communicator, the same call the
  eager path makes (so the bits are the same); the parts are then cut back out with ``getitem`` and
  ``reshape`` nodes. A failed collective (a peer gone, a deadline passed) raises the same
  ``CollectiveError`` as eagerly, naming the missing ranks, the op and its sequence number.

The variables are shared by the local replicas, so the update (the optimizer's own graph nodes)
is added once, with the summed gradients, as the eager path applies it once per process.

What differs from eager ``run``: replicas are traced one after the other, not side by side, so a
replica learns the all-reduced value only if it is the last to ask. ``ReplicaContext.all_reduce``
inside a traced ``run`` is therefore refused (reduce the PerReplica result with
``strategy.reduce`` instead), and so is reading an updated variable after ``apply_gradients`` in
a replica other than the last (that read would come before the update in the graph; eagerly it
comes after): both raise an error that says what to do instead. The usual step, which computes
the loss and gradients, applies them and returns the loss, traces as it runs eagerly.

The same node (:func:`cross_process_reduce`) carries ``flowlab.horovod``'s collectives: the
gradient average of ``DistributedOptimizer`` and ``DistributedGradientTape`` (added when traced:
``Model.fit``'s step, any ``@fl.function``, a compat.v1 graph; the same ops eagerly otherwise),
``hvd.allreduce``, and, with ``op="broadcast"``/``"allgather"``, ``hvd.broadcast_variables``,
``hvd.broadcast`` and ``hvd.allgather`` (:func:`cross_process_gather`).

``strategy_allreduce`` is an :class:`~flowlab.core.execute.OpDef` kept here, not in the op table
(``fl.core.list_ops()``): the op-coverage tests walk that table and a collective cannot run in one
process without peers. It is stateful, so graph passes never fold, merge, drop or reorder it: every
worker runs its collectives in the order it traced them.
"""
from __future__ import annotations

import numpy as np

from ..core._context import state
from ..core.execute import OpDef, execute
from .reduce_op import ReduceOp
from .values import PerReplica

__all__ = ["TraceStep", "run_traced", "reduce_traced", "cross_process_reduce", "cross_process_gather", "ALLREDUCE"]


# -- the collective as a graph op --------------------------------------------------------------------
# The node's ``group`` attribute is what reduces across processes: a strategy (MultiWorkerMirrored),
# or the ranks of flowlab.horovod (its DistributedOptimizer, eager or traced). It gives
# ``_comm`` (a communicator; read each time the node runs), ``_algorithm`` and ``_timeout``; a group
# that is not a strategy also gives ``_collective_note()``, which says where the all-reduce is.
def _allreduce_kernel(*arrays, group, op="sum", root=0):
    """``op`` over ``group``'s processes of the flat concatenation of ``arrays`` (in their common
    dtype): a reduction ("sum", "mean", "max", "min", "prod"), or "broadcast" (rank ``root``'s
    values); "allgather" takes one array and concatenates every process's along its first axis."""
    from ..cluster import collectives
    comm = group._comm
    try:
        if op == "allgather":
            return collectives.allgather(np.asarray(arrays[0]), comm=comm, algorithm=group._algorithm,
                                         timeout=group._timeout)
        dtype = np.result_type(*arrays)
        flat = np.concatenate([np.asarray(a).astype(dtype, copy=False).ravel() for a in arrays]) if len(arrays) > 1 \
            else np.asarray(arrays[0]).astype(dtype, copy=False).ravel()
        if op == "broadcast":
            return collectives.broadcast(flat, root=root, comm=comm, algorithm=group._algorithm, timeout=group._timeout)
        return collectives.allreduce(flat, op=op, comm=comm, algorithm=group._algorithm, timeout=group._timeout)
    except collectives.CollectiveError as e:
        raise _as_op_error(e, group) from None


_PASSING: dict = {}


def _as_op_error(error, group):
    """``error`` (a CollectiveError naming the op, call and missing ranks), made an instance of a
    class that is both its own class and an OpError: a graph plan lets OpErrors through unchanged (it
    would wrap anything else in an InvalidArgumentError), so the caller still catches the same
    CollectiveTimeoutError, PeerLostError... with the same attributes."""
    from ..core.errors import OpError
    base = type(error)
    cls = _PASSING.get(base)
    if cls is None:
        cls = _PASSING[base] = type(base.__name__, (base, OpError), {"__module__": base.__module__})
    out = error
    out.__class__ = cls          # the same object, with the same attributes: only its class gains OpError
    out.source = None
    if hasattr(out, "add_note"):
        out.add_note(f"({_note(group)})")
    return out


def _note(group) -> str:
    own = getattr(group, "_collective_note", None)
    if own is not None:
        return own()
    return (f"in the all-reduce of {type(group).__name__}.run traced by @fl.function, on worker "
            f"{group.worker_index} of {group.num_workers}")


def _allreduce_rule(*specs, group, op="sum", root=0):
    if op == "allgather":       # the other processes' first dimensions are known when it runs
        return (None, *tuple(specs[0].shape)[1:]), np.dtype(_np_dtype(specs[0].dtype))
    sizes = [int(np.prod(s.shape)) if all(d is not None for d in s.shape) else None for s in specs]
    dtype = np.result_type(*[np.dtype(_np_dtype(s.dtype)) for s in specs])
    return ((None if None in sizes else sum(sizes)),), dtype


def _np_dtype(dtype):
    return getattr(dtype, "as_numpy_dtype", dtype)


ALLREDUCE = OpDef("strategy_allreduce", _allreduce_kernel, _allreduce_rule, stateful=True,
                  doc="The sum (or mean, max, min, prod; or root's value: broadcast) over the processes of a "
                      "MultiWorkerMirroredStrategy, or of flowlab.horovod's ranks, of its inputs, concatenated "
                      "flat; or their allgather (a collective: every process's graph runs it, in the same order).")


def cross_process_reduce(group, tensors, op="sum", root=0):
    """``tensors`` reduced with ``op`` ("sum", "mean", "max", "min", "prod") over ``group``'s
    processes, or ``op="broadcast"``: process ``root``'s values; each back in its own shape and
    dtype: one ALLREDUCE node and the ``reshape`` (and ``cast``) nodes that cut the parts back out
    while ``@fl.function`` traces (or a compat.v1 graph is built); run at once, the same ops
    eagerly. Give tensors of one dtype where exact bits matter (the parts travel in their common
    dtype)."""
    import flowlab as fl
    shapes = []
    for t in tensors:
        shape = tuple(t.shape)
        if any(d is None for d in shape):
            raise ValueError(f"{_note(group)}: a value all-reduced inside @fl.function needs a "
                             f"static shape, got {list(shape)}")
        shapes.append(shape)
    attrs = {"group": group, "op": op, "root": int(root)} if op == "broadcast" else {"group": group, "op": op}
    flat = execute(ALLREDUCE, tuple(tensors), attrs)
    out, at = [], 0
    for t, shape in zip(tensors, shapes):
        size = int(np.prod(shape, dtype=np.int64))
        part = fl.reshape(flat[at:at + size], shape)
        if part.dtype != t.dtype:
            part = fl.cast(part, t.dtype)
        out.append(part)
        at += size
    return out


def cross_process_gather(group, tensor):
    """Every process's ``tensor`` of ``group``, concatenated along the first axis in process order
    (all processes give the same shape): one ALLREDUCE node with ``op="allgather"`` while tracing,
    the same op eagerly. The result's first dimension is unknown while tracing."""
    return execute(ALLREDUCE, (tensor,), {"group": group, "op": "allgather"})


# -- run --------------------------------------------------------------------------------------------
class TraceStep:
    """What the replicas of one traced ``run`` share: the ``apply_gradients`` calls made so far
    (the k-th call of every replica is one all-reduce and one update)."""

    group = None          # no thread group: the replicas are traced one after the other

    def __init__(self, strategy):
        self.strategy = strategy
        self.calls = [0] * strategy._num_local
        self.pending: dict = {}
        self.deferred: list = []    # (replica, k, graph length then, ids of the variables it will update)

    def sync(self):
        pass

    def all_reduce_sum(self, local_id, arrays):
        raise NotImplementedError(
            "ReplicaContext.all_reduce inside strategy.run inside @fl.function: the replicas are traced one "
            "after the other, so a replica cannot wait for the others' values. Return the value from the "
            "replica function and combine it with strategy.reduce(...) (also inside @fl.function)")

    def apply(self, ctx, optimizer, apply, grads_and_vars):
        """Replica ``ctx``'s k-th ``apply_gradients``: recorded; the last replica's adds the
        all-reduce and the update to the graph."""
        pairs = list(grads_and_vars)
        k = self.calls[ctx.local_id]
        self.calls[ctx.local_id] += 1
        slot = self.pending.setdefault(k, [])
        slot.append((ctx.local_id, optimizer, pairs))
        if len(slot) < self.strategy._num_local:
            self.deferred.append((ctx.local_id, k, len(state().graph.nodes),
                                  {id(v) for g, v in pairs if g is not None}))
            return optimizer.iterations
        return self._apply_all(k, slot, apply)

    def _apply_all(self, k, slot, apply):
        s = self.strategy
        _, optimizer, first = slot[0]
        for i, opt, pairs in slot[1:]:
            if opt is not optimizer:
                raise ValueError(f"apply_gradients call {k + 1}: replica {i} used optimizer {opt.name!r}, "
                                 f"replica 0 used {optimizer.name!r}; every replica must make the same calls")
            if len(pairs) != len(first) or any(v is not w for (_, v), (_, w) in zip(pairs, first)):
                raise ValueError(f"apply_gradients call {k + 1}: replica {i} passed variables "
                                 f"{[v.name for _, v in pairs]}, replica 0 passed {[v.name for _, v in first]}; "
                                 f"every replica must update the same variables in the same order")
            for (g, v), (g0, _) in zip(pairs, first):
                if (g is None) != (g0 is None):
                    raise ValueError(f"apply_gradients call {k + 1}: the gradient for {v.name!r} is None in "
                                     f"replica {i if g is None else 0} but not in replica {0 if g is None else i}")
        from ..core.device import device
        live = [j for j, (g, _) in enumerate(first) if g is not None]
        with device("/cpu:0" if s._central else s._devices[0]), _scope("all_reduce/"):
            summed = []
            for j in live:
                total = slot[0][2][j][0]
                for _, _, pairs in slot[1:]:
                    total = execute(_add_op(), (total, pairs[j][0]))
                summed.append(total)
            if s._comm is not None and s._comm.size > 1 and summed:
                summed = cross_process_reduce(s, summed)
            result = apply(optimizer, [(g, first[j][1]) for g, j in zip(summed, live)])
        return result if result is not None else optimizer.iterations

    def finish(self, ends):
        """Every replica made the same number of ``apply_gradients`` calls, and none but the last
        read a variable after its update was recorded (``ends[i]``: the graph's length when
        replica ``i`` was traced)."""
        if len(set(self.calls)) > 1:
            raise ValueError(f"the replicas made different numbers of apply_gradients calls while tracing "
                             f"({dict(enumerate(self.calls))}); every replica must make the same calls")
        nodes = state().graph.nodes
        for i, k, start, updated in self.deferred:
            stale = [n for n in nodes[start:ends[i]] if n.op.name == "read" and id(n.attrs["variable"]) in updated]
            if stale:
                names = sorted({n.attrs["variable"].name for n in stale})
                raise NotImplementedError(
                    f"replica {i} reads {names} after apply_gradients (call {k + 1}) inside strategy.run traced "
                    f"by @fl.function: the replicas are traced one after the other and the update is added "
                    f"after the last one, so this read would see the value before the update (eagerly it sees "
                    f"the value after). Read the variables before apply_gradients, or outside strategy.run")


def _add_op():
    from ..core.execute import get_op
    return get_op("add")


def _scope(name):
    graph = state().graph
    return graph.name_scope(name)


def run_traced(strategy, fn, args, kwargs):
    """``strategy.run(fn, args, kwargs)`` while tracing (see the module docstring)."""
    if strategy._no_traced_run:
        raise NotImplementedError(f"strategy.run inside @fl.function: {strategy._no_traced_run}")
    n = strategy._num_local
    step = TraceStep(strategy)
    results, ends = [], []
    for i in range(n):
        replica = strategy.worker_index * n + i       # its replica_id_in_sync_group
        try:
            with _scope(f"replica_{replica}"):
                results.append(strategy._call(fn, i, step, args, kwargs))
            ends.append(len(state().graph.nodes))
        except Exception as e:
            if hasattr(e, "add_note"):
                worker = f", worker {strategy.worker_index}" if strategy.num_workers > 1 else ""
                e.add_note(f"(in replica {replica} of {strategy.num_replicas_in_sync}, on {strategy._devices[i]}"
                           f"{worker}, while tracing strategy.run inside @fl.function)")
            raise
    step.finish(ends)
    return results[0] if n == 1 else PerReplica(results)


# -- reduce -----------------------------------------------------------------------------------------
def reduce_traced(strategy, reduce_op, value, axis):
    """``strategy.reduce`` while tracing: the same arithmetic as the eager one, as graph nodes."""
    import flowlab as fl
    op = ReduceOp.of(reduce_op)
    parts = [fl.convert_to_tensor(v) for v in strategy.experimental_local_results(value)]
    dtype = parts[0].dtype
    with _scope("reduce"):
        if axis is None:
            total = parts[0]
            if op is ReduceOp.MEAN and not dtype.is_floating:
                total = fl.cast(total, fl.float32)
            for p in parts[1:]:
                total = total + fl.cast(p, total.dtype) if p.dtype != total.dtype else total + p
            count = fl.constant(float(len(parts)), dtype=fl.float64)
        else:
            total = None
            count = None
            for p in parts:
                part_sum = fl.reduce_sum(p, axis=axis)
                total = part_sum if total is None else total + part_sum
                size = p.shape[axis]
                rows = fl.constant(float(size), dtype=fl.float64) if size is not None else \
                    fl.cast(fl.shape(p)[axis], fl.float64)
                count = rows if count is None else count + rows
        if strategy._comm is not None and strategy._comm.size > 1:
            if any(d is None for d in total.shape):
                raise ValueError(f"strategy.reduce inside @fl.function needs a value of static shape, got "
                                 f"{list(total.shape)}")
            both = execute(ALLREDUCE, (fl.reshape(fl.cast(total, fl.float64), [-1]), fl.reshape(count, [1])),
                           {"group": strategy})
            size = int(np.prod(tuple(total.shape), dtype=np.int64))
            total = fl.cast(fl.reshape(both[:size], tuple(total.shape)), total.dtype)
            count = both[size]
        if op is ReduceOp.MEAN:
            mean = fl.cast(total, fl.float64) / count
            total = fl.cast(mean, dtype) if dtype.is_floating else mean
    return total
