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
- over the worker processes (MultiWorkerMirroredStrategy): the gradients, cast to their common
  dtype, flattened and concatenated, go through one ``allreduce`` node, the collective op of core's
  table (flowlab/cluster/collectives/ops.py) that ``flowlab.cluster.collectives.allreduce`` runs
  eagerly on Tensors (so the bits are the same), over the strategy's communicator; the parts are
  then cut back out with ``getitem`` and ``reshape`` nodes. A failed collective (a peer gone, a
  deadline passed) raises the same ``CollectiveError`` as eagerly, naming the missing ranks, the
  op and its sequence number, with a note saying which strategy's step it was.

The variables are shared by the local replicas, so the update (the optimizer's own graph nodes)
is added once, with the summed gradients, as the eager path applies it once per process.

What differs from eager ``run``: replicas are traced one after the other, not side by side, so a
replica learns the all-reduced value only if it is the last to ask. ``ReplicaContext.all_reduce``
inside a traced ``run`` is therefore refused (reduce the PerReplica result with
``strategy.reduce`` instead), and so is reading an updated variable after ``apply_gradients`` in
a replica other than the last (that read would come before the update in the graph; eagerly it
comes after): both raise an error that says what to do instead. The usual step, which computes
the loss and gradients, applies them and returns the loss, traces as it runs eagerly.

The same ops carry ``flowlab.horovod``'s collectives on tensors (:func:`cross_process_reduce`,
:func:`cross_process_gather`): the gradient average of ``DistributedOptimizer`` and
``DistributedGradientTape``, ``hvd.allreduce``, ``hvd.broadcast_variables``, ``hvd.broadcast`` and
``hvd.allgather``; eagerly they run now, while traced (``Model.fit``'s step, any ``@fl.function``,
a compat.v1 graph) they are nodes. The collective ops are stateful, so graph passes never fold,
merge, drop or reorder them: every worker runs its collectives in the order it traced them.
"""
from __future__ import annotations

import numpy as np

from ..cluster.collectives.ops import ALLGATHER, ALLREDUCE, BROADCAST, attrs_for
from ..core import name_scope
from ..core.interpreters import current_graph
from ..core.execute import execute
from ..core.graph import READ
from .reduce_op import ReduceOp
from .values import PerReplica

__all__ = ["TraceStep", "run_traced", "reduce_traced", "cross_process_reduce", "cross_process_gather"]


# -- the collectives of a group ------------------------------------------------------------------------
# ``group`` is what reduces across processes: a strategy (MultiWorkerMirrored), or the ranks of
# flowlab.horovod (its DistributedOptimizer, eager or traced). It gives ``_comm`` (a communicator),
# or ``_comm_source`` (a function giving one, called each time the op runs: hvd.init may be called
# again), ``_algorithm`` and ``_timeout``; a group that is not a strategy also gives
# ``_collective_note()``, which says where the collective is in a failing call's error.
def _attrs(group, **more):
    source = getattr(group, "_comm_source", None)
    return attrs_for(source if source is not None else group._comm, group._algorithm, group._timeout,
                     lambda: _note(group), **more)


def _note(group) -> str:
    own = getattr(group, "_collective_note", None)
    if own is not None:
        return own()
    return (f"in the all-reduce of {type(group).__name__}.run traced by @fl.function, on worker "
            f"{group.worker_index} of {group.num_workers}")


def _flat(tensors):
    """``tensors`` in their common dtype, flattened and concatenated (one tensor: just flattened)."""
    import flowlab as fl
    dtype = np.result_type(*[t.dtype.as_numpy_dtype for t in tensors])
    flat = [fl.reshape(t if t.dtype.as_numpy_dtype == dtype else fl.cast(t, dtype), [-1]) for t in tensors]
    return flat[0] if len(flat) == 1 else fl.concat(flat, 0)


def cross_process_reduce(group, tensors, op="sum", root=0):
    """``tensors`` reduced with ``op`` ("sum", "mean", "max", "min", "prod") over ``group``'s
    processes, or ``op="broadcast"``: process ``root``'s values; each back in its own shape and
    dtype: one ``allreduce`` (or ``broadcast``) op on their flat concatenation, and the ``reshape``
    (and ``cast``) ops that cut the parts back out: graph nodes while ``@fl.function`` traces (or a
    compat.v1 graph is built), run at once otherwise. Give tensors of one dtype where exact bits
    matter (the parts travel in their common dtype)."""
    if len(tensors) == 1:            # the op keeps the shape: nothing to flatten or cut out
        if op == "broadcast":
            return [execute(BROADCAST, (tensors[0],), _attrs(group, root=int(root)))]
        return [execute(ALLREDUCE, (tensors[0],), _attrs(group, op=op))]
    import flowlab as fl
    shapes = []
    for t in tensors:
        shape = tuple(t.shape)
        if any(d is None for d in shape):
            raise ValueError(f"{_note(group)}: a value all-reduced inside @fl.function needs a "
                             f"static shape, got {list(shape)}")
        shapes.append(shape)
    if op == "broadcast":
        flat = execute(BROADCAST, (_flat(tensors),), _attrs(group, root=int(root)))
    else:
        flat = execute(ALLREDUCE, (_flat(tensors),), _attrs(group, op=op))
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
    (all processes give the same shape): the ``allgather`` op."""
    return execute(ALLGATHER, (tensor,), _attrs(group))


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
            self.deferred.append((ctx.local_id, k, len(current_graph().nodes),
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
        with device("/cpu:0" if s._central else s._devices[0]), name_scope("all_reduce/"):
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
        nodes = current_graph().nodes
        for i, k, start, updated in self.deferred:
            stale = [n for n in nodes[start:ends[i]] if n.op is READ and id(n.attrs["variable"]) in updated]
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
            with name_scope(f"replica_{replica}"):
                results.append(strategy._call(fn, i, step, args, kwargs))
            ends.append(len(current_graph().nodes))
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
    with name_scope("reduce"):
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
            both = execute(ALLREDUCE, (_flat([fl.cast(total, fl.float64), fl.reshape(count, [1])]),),
                           _attrs(strategy, op="sum"))
            size = int(np.prod(tuple(total.shape), dtype=np.int64))
            total = fl.cast(fl.reshape(both[:size], tuple(total.shape)), total.dtype)
            count = both[size]
        if op is ReduceOp.MEAN:
            mean = fl.cast(total, fl.float64) / count
            total = fl.cast(mean, dtype) if dtype.is_floating else mean
    return total
