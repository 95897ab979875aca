"""Input for replicas: :class:`InputContext` and datasets whose batches are split per replica.

``strategy.experimental_distribute_dataset(ds)``: ``ds`` yields *global* batches (its batch size
is the global batch size). How they reach the replicas when there are several worker processes
(MultiWorkerMirroredStrategy) is the pipeline's own option
``ds.options().experimental_distribute.auto_shard_policy`` (``fl.data.AutoShardPolicy``, set with
``ds.with_options(...)``):

- ``AUTO`` (the default): every worker iterates the whole dataset (same seed, same order) and cuts
  each global batch along its first axis into ``num_replicas_in_sync`` nearly equal parts (in
  replica order), keeping the parts of its own replicas. Exact: a step sees the same global batch
  on 1 or N replicas, so training gives the same weights as one process. The cost: every worker
  reads (and maps, decodes...) all of the input.
- ``FILE``: every worker reads only its share of the input files: the pipeline's file source
  (``Dataset.list_files`` or ``RecordDataset([...files])``) is sharded by worker before anything
  else (worker ``i`` of ``N`` reads files ``i, i+N, ...`` of the sorted list), and the batch stage
  nearest the output makes batches of ``global_batch_size / N`` (an error if ``N`` does not divide
  it). Each worker's batches are then split over its local replicas. A step still sees
  ``global_batch_size`` elements, but not the same ones as on one process. It needs at least ``N``
  files, a file source (a generator has none: the error says to use DATA), and, to keep the workers
  in step, the same number of batches on every worker (files of equal size, or ``repeat()`` with a
  fixed number of steps): a worker that runs out first leaves the others waiting in their next
  collective until its deadline.
- ``DATA``: every worker reads everything but keeps every ``N``-th element (a ``shard(N, i)`` just
  before the batch stage), batched by ``global_batch_size / N``: batch ``k`` of the workers together
  holds exactly the elements of global batch ``k``. Like AUTO it needs the same element order on
  every worker (seed any shuffle); to keep the workers in step, use ``drop_remainder=True`` or a
  dataset size divisible by the global batch size.
- ``OFF``: no sharding: each worker's batches are its own, split over its local replicas only
  (warned once: the workers see the same data unless their input differs, e.g. built from
  ``fl.cluster.rank()``).

With one worker process (MirroredStrategy, CentralStorageStrategy, a one-worker cluster) every
policy is AUTO's behaviour. The rewrite itself is ``flowlab/data/_autoshard.py``; it runs when
``experimental_distribute_dataset`` is called, so its errors show there.

``strategy.distribute_datasets_from_function(fn)``: ``fn(InputContext)`` is called once per
process (input pipeline) and yields *per-replica* batches; the local replicas take consecutive
elements in turn.
"""
from __future__ import annotations

import warnings

import numpy as np

from ..data import Dataset, auto_shard
from ..data.options import AutoShardPolicy
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

    _warned_off = False          # OFF's warning is given once per process

    def __init__(self, dataset, strategy):
        s = strategy
        self._strategy = s
        self._policy, self._dataset = AutoShardPolicy.AUTO, dataset     # any iterable of global batches
        if isinstance(dataset, Dataset):
            self._policy = AutoShardPolicy(dataset.options().experimental_distribute._get("auto_shard_policy"))
            self._dataset = auto_shard(dataset, s._num_workers, s._worker, self._policy)
        self._own_batches = s._num_workers > 1 and self._policy is not AutoShardPolicy.AUTO
        if s._num_workers > 1 and self._policy is AutoShardPolicy.OFF and not DistributedDataset._warned_off:
            DistributedDataset._warned_off = True
            warnings.warn(f"AutoShardPolicy.OFF: each of the {s._num_workers} workers iterates the whole dataset "
                          "and trains on all of it, so they all see the same data unless their input pipelines "
                          "differ (e.g. built from fl.cluster.rank()); AUTO, FILE or DATA split it", UserWarning,
                          stacklevel=3)

    def __iter__(self):
        s = self._strategy
        local = s._num_local
        if self._own_batches:          # this worker's batches, split over its replicas only
            total, first = local, 0
        else:                          # global batches: keep this worker's replicas' parts
            total, first = s.num_replicas_in_sync, s._worker * local
        for element in self._dataset:
            leaves = flatten(element)
            pieces = [_split(leaf, total)[first:first + local] for leaf in leaves]
            per = []
            for i in range(local):
                it = iter(p[i] for p in pieces)
                per.append(map_structure(lambda _: next(it), element))
            yield per[0] if local == 1 else PerReplica(per)

    def __repr__(self):
        policy = f", {self._policy.name}" if self._strategy._num_workers > 1 else ""
        return f"<DistributedDataset over {self._strategy.num_replicas_in_sync} replica(s){policy}>"


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
