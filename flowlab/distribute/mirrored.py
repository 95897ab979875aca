"""Strategies with every replica in this process: :class:`MirroredStrategy` (one replica per
device, variables mirrored) and :class:`CentralStorageStrategy` (variables on the CPU)."""
from __future__ import annotations

from .strategy import Strategy

__all__ = ["MirroredStrategy", "CentralStorageStrategy"]


def _local_devices(devices):
    if devices is not None:
        if isinstance(devices, str):
            devices = [devices]
        return list(devices)
    from ..core import config
    gpus = config.logical_device_count("GPU")
    if gpus:
        return [f"/gpu:{i}" for i in range(gpus)]
    return [f"/cpu:{i}" for i in range(config.logical_device_count("CPU"))]


class MirroredStrategy(Strategy):
    """Synchronous data parallelism over the devices of this process: ``devices`` (strings), by
    default every logical GPU, else every logical CPU (``fl.config.set_logical_devices("CPU", 4)``
    gives four). Gradients are summed with a ring all-reduce among the replicas' threads, or with the
    algorithm ``cross_device_ops`` stands for (``NcclAllReduce()``: ring, ``HierarchicalCopyAllReduce()``:
    tree, ``ReductionToOneDevice()``: naive; see :mod:`.cross_device_ops`)."""

    def __init__(self, devices=None, cross_device_ops=None):
        from .cross_device_ops import algorithm_of
        super().__init__(_local_devices(devices), algorithm=algorithm_of(cross_device_ops))
        self._cross_device_ops = cross_device_ops


class CentralStorageStrategy(Strategy):
    """Replicas compute on this process's devices; variables live once on the CPU, and gradients
    are summed there (the "naive" all-reduce: everything through one replica) before the update."""

    _central = True

    def __init__(self, compute_devices=None, parameter_device=None):
        super().__init__(_local_devices(compute_devices), algorithm="naive")
