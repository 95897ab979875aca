"""Input for replicas: :class:`InputContext` and datasets whose batches are split per replica.

``strategy.experimental_distribute_dataset(ds)``: ``ds`` yields *global* batches; each is cut
along its first axis into ``num_replicas_in_sync`` nearly equal parts (in replica order), and
each process keeps the parts of its own replicas. Every process iterates the same dataset (same
seed, same order), so the split is deterministic and a step sees the same global batch on 1 or N
replicas.

``strategy.distribute_datasets_from_function(fn)``: ``fn(InputContext)`` is called once per
process (input pipeline) and yields *per-replica* batches; the local replicas take consecutive
elements in turn.
"""
from __future__ import annotations

import numpy as np

from .values import PerReplica, flatten, map_structure

__all__ = ["InputContext", "DistributedDataset", "DistributedDatasetFromFunction"]


class InputContext:
    """What an input function needs to know about the replicas it feeds."""

    def __init__(self, num_input_pipelines: int = 1, input_pipeline_id: int = 0, num_replicas_in_sync: int = 1):
        self.num_input_pipelines = int(num_input_pipelines)
        self.input_pipeline_id = int(input_pipeline_id)
        self.num_replicas_in_sync = int(num_replicas_in_sync)

    def get_per_replica_batch_size(self, global_batch_size: int) -> int:
        """``global_batch_size / num_replicas_in_sync``; raises if that is not a whole number."""
        if global_batch_size % self.num_replicas_in_sync:
            raise ValueError(f"the global batch size {global_batch_size} cannot be split evenly over "
                             f"{self.num_replicas_in_sync} replicas")
        return global_batch_size // self.num_replicas_in_sync

    def __repr__(self):
        return (f"InputContext(num_input_pipelines={self.num_input_pipelines}, input_pipeline_id="
                f"{self.input_pipeline_id}, num_replicas_in_sync={self.num_replicas_in_sync})")


def _split(leaf, parts: int):
    from ..core.tensor import Tensor, convert_to_tensor
    arr = leaf.numpy() if isinstance(leaf, Tensor) else np.asarray(leaf)
    if arr.ndim == 0:
        raise ValueError(f"cannot split a scalar element over {parts} replicas: batch the dataset first")
    bounds = np.linspace(0, arr.shape[0], parts + 1).round().astype(int)
    return [convert_to_tensor(arr[bounds[i]:bounds[i + 1]]) for i in range(parts)]


class DistributedDataset:
    """Global batches of ``dataset`` split over the strategy's replicas (see the module docstring)."""

    def __init__(self, dataset, strategy):
        self._dataset, self._strategy = dataset, strategy

    def __iter__(self):
        s = self._strategy
        total, local, first = s.num_replicas_in_sync, s._num_local, s._worker * s._num_local
        for element in self._dataset:
            leaves = flatten(element)
            pieces = [_split(leaf, total)[first:first + local] for leaf in leaves]
            per = []
            for i in range(local):
                it = iter(p[i] for p in pieces)
                per.append(map_structure(lambda _: next(it), element))
            yield per[0] if local == 1 else PerReplica(per)

    def __repr__(self):
        return f"<DistributedDataset over {self._strategy.num_replicas_in_sync} replica(s)>"


class DistributedDatasetFromFunction:
    """Per-replica batches from ``dataset_fn(InputContext)`` (see the module docstring)."""

    def __init__(self, dataset_fn, strategy):
        s = strategy
        self._strategy = s
        self._context = InputContext(s._num_workers, s._worker, s.num_replicas_in_sync)
        self._dataset = dataset_fn(self._context)

    def __iter__(self):
        local = self._strategy._num_local
        it = iter(self._dataset)
        while True:
            group = []
            for _ in range(local):
                try:
                    group.append(next(it))
                except StopIteration:
                    return              # a partial group of replicas is dropped: every replica needs input
            yield group[0] if local == 1 else PerReplica(group)
