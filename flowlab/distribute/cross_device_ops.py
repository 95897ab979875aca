"""The cross-device-ops classes of ``MirroredStrategy(cross_device_ops=...)``: how the replicas'
gradients are summed inside one process, under TensorFlow's names, each mapped onto one of flowlab's
all-reduce algorithms (flowlab/cluster/collectives):

==============================  ======================================================================
``NcclAllReduce()``             ``"ring"``: the ring all-reduce, NCCL's own algorithm. flowlab has no
                                NCCL binding, so it says once per process what runs instead.
``HierarchicalCopyAllReduce()`` ``"tree"``: recursive halving and doubling, pairs of replicas, then
                                pairs of pairs (TensorFlow's version copies along a GPU topology)
``ReductionToOneDevice()``      ``"naive"``: every replica's gradient is added up on one of them, and
                                the sum is sent back to all (what CentralStorageStrategy does)
==============================  ======================================================================

All three give the sum of the same numbers; they differ in who sends what to whom (the timeline
widget shows it). ``reduce``/``batch_reduce`` combine a :class:`~.values.PerReplica` value with the
chosen algorithm directly, as TensorFlow's do.

>>> import flowlab as fl
>>> s = fl.distribute.MirroredStrategy(["/cpu:0"], cross_device_ops=fl.distribute.ReductionToOneDevice())
>>> s.extended._algorithm
'naive'
"""
from __future__ import annotations

import numpy as np

from .reduce_op import ReduceOp
from .values import PerReplica

__all__ = ["CrossDeviceOps", "NcclAllReduce", "HierarchicalCopyAllReduce", "ReductionToOneDevice",
           "AllReduceCrossDeviceOps"]


class CrossDeviceOps:
    """Base of the cross-device-ops classes: ``algorithm`` is the flowlab all-reduce they stand for."""

    algorithm = "ring"

    def reduce(self, reduce_op, per_replica_value, destinations=None, options=None):
        """``per_replica_value`` (a PerReplica, or one value) summed or averaged over its replicas
        with this object's algorithm; one tensor (every destination would hold the same values)."""
        return self.batch_reduce(reduce_op, [(per_replica_value, destinations)], options)[0]

    def batch_reduce(self, reduce_op, value_destination_pairs, options=None):
        """:meth:`reduce` of each ``(value, destinations)`` pair, in one pass over the replicas."""
        from ..cluster.collectives import LocalGroup, allreduce
        from ..core.tensor import convert_to_tensor
        op = ReduceOp.of(reduce_op)
        values = [v.values if isinstance(v, PerReplica) else (v,) for v, _ in value_destination_pairs]
        counts = {len(v) for v in values}
        if len(counts) > 1:
            raise ValueError(f"{type(self).__name__}.batch_reduce: the values have different numbers of replicas "
                             f"({sorted(counts)}); each PerReplica must have one component per replica")
        n = counts.pop() if counts else 1
        arrays = [[np.asarray(convert_to_tensor(c)._value) for c in v] for v in values]
        if n == 1:
            sums = [a[0] for a in arrays]
        else:
            with LocalGroup(n) as group:
                ranks = group.run(lambda comm: [allreduce(a[comm.rank], algorithm=self.algorithm, comm=comm)
                                                for a in arrays])
            sums = ranks[0]
        out = []
        for s, a in zip(sums, arrays):
            s = np.asarray(s)
            if op is ReduceOp.MEAN:
                s = s / n
                s = s.astype(a[0].dtype) if a[0].dtype.kind == "f" else s
            out.append(convert_to_tensor(s))
        return out

    def broadcast(self, tensor, destinations=None):
        """``tensor`` itself: the replicas of one process share their variables' memory."""
        from ..core.tensor import convert_to_tensor
        return convert_to_tensor(tensor)

    def __repr__(self):
        return f"<{type(self).__name__}: flowlab's {self.algorithm!r} all-reduce>"


class AllReduceCrossDeviceOps(CrossDeviceOps):
    """The base TensorFlow gives NcclAllReduce and HierarchicalCopyAllReduce; ``num_packs``
    (a whole number >= 0) is checked and kept, but flowlab sums each step's gradients as one pack."""

    def __init__(self, all_reduce_alg: str = "nccl", num_packs: int = 1):
        if isinstance(num_packs, bool) or not isinstance(num_packs, int) or num_packs < 0:
            raise ValueError(f"{type(self).__name__}: num_packs must be a whole number >= 0, got {num_packs!r}")
        self.num_packs = num_packs
        self.all_reduce_alg = all_reduce_alg


class NcclAllReduce(AllReduceCrossDeviceOps):
    """NCCL's all-reduce, in flowlab the ring all-reduce (see the module docstring)."""

    algorithm = "ring"

    def __init__(self, num_packs: int = 1):
        super().__init__("nccl", num_packs)
        from .collective_options import nccl_note
        nccl_note("NcclAllReduce")


class HierarchicalCopyAllReduce(AllReduceCrossDeviceOps):
    """TensorFlow's hierarchical copy, in flowlab the tree all-reduce (recursive halving/doubling)."""

    algorithm = "tree"

    def __init__(self, num_packs: int = 1):
        super().__init__("hierarchical_copy", num_packs)


class ReductionToOneDevice(CrossDeviceOps):
    """Everything added up on one replica and sent back: flowlab's naive all-reduce.
    ``reduce_to_device`` is accepted (the sum is in host memory either way); ``accumulation_fn``
    may only be None or ``fl.math.add_n``, since the sum is flowlab's own."""

    algorithm = "naive"

    def __init__(self, reduce_to_device=None, accumulation_fn=None):
        if accumulation_fn is not None and getattr(accumulation_fn, "__name__", "") != "add_n":
            raise ValueError("ReductionToOneDevice: flowlab adds the replicas' values itself; leave accumulation_fn "
                             f"unset (or fl.math.add_n), got {accumulation_fn!r}")
        self.reduce_to_device = reduce_to_device
        self.accumulation_fn = accumulation_fn


def algorithm_of(cross_device_ops) -> str:
    """The flowlab algorithm for ``MirroredStrategy(cross_device_ops=...)`` (None: the ring)."""
    if cross_device_ops is None:
        return "ring"
    if isinstance(cross_device_ops, type) and issubclass(cross_device_ops, CrossDeviceOps):
        raise TypeError(f"cross_device_ops takes an instance: write {cross_device_ops.__name__}() with parentheses")
    if not isinstance(cross_device_ops, CrossDeviceOps):
        raise TypeError(f"cross_device_ops must be one of fl.distribute.NcclAllReduce(), HierarchicalCopyAllReduce() "
                        f"or ReductionToOneDevice(), got {type(cross_device_ops).__name__}")
    return cross_device_ops.algorithm
