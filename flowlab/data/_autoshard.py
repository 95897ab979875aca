"""Auto-sharding: the rewrite of a pipeline of *global* batches into one worker's share of it.

``auto_shard(dataset, num_workers, worker_index, policy)`` returns a new pipeline (the given one is
not changed; stages it shares with the result keep working for both):

- ``FILE``: the file source is sharded by worker (``list_files`` gets a ``shard(num_workers,
  worker_index)`` right above it, before any shuffle, so the workers' files never overlap; a
  ``RecordDataset`` of a list of files keeps files ``worker_index::num_workers``), and the pipeline's
  batch stage (the one nearest its output) makes batches ``num_workers`` times smaller.
- ``DATA``: a ``shard(num_workers, worker_index)`` right below that batch stage, which makes batches
  ``num_workers`` times smaller: batch ``k`` of the workers together holds exactly the elements of
  global batch ``k``.
- ``AUTO`` and ``OFF``: the pipeline as it is (what the strategy does with it is in
  ``flowlab/distribute/input.py``).

How it walks: every dataset says what it reads (``_inputs``; ``_Stage._input`` for one-input
stages); a stage above a rewritten input is copied with the new input in place of the old one,
and everything below the rewrite is shared, untouched. A batch stage carries what rebuilding it
needs (``_batch``, set by ``Dataset.batch`` and ``padded_batch``).
"""
from __future__ import annotations

import copy
import itertools

from .options import AutoShardPolicy

__all__ = ["auto_shard"]


def _fail(policy, reason, instead):
    return ValueError(f"AutoShardPolicy.{policy.name}: {reason}; {instead}")


def auto_shard(dataset, num_workers: int, worker_index: int, policy=None):
    """Worker ``worker_index``'s share of ``dataset`` under ``policy`` (None: the pipeline's own
    ``options().experimental_distribute.auto_shard_policy``). One worker: ``dataset`` itself."""
    num_workers, worker_index = int(num_workers), int(worker_index)
    if num_workers < 1 or not 0 <= worker_index < num_workers:
        raise ValueError(f"auto_shard: worker_index must be in [0, {num_workers}), got {worker_index}")
    if policy is None:
        policy = dataset.options().experimental_distribute._get("auto_shard_policy")
    policy = AutoShardPolicy(policy)
    if num_workers == 1 or policy in (AutoShardPolicy.AUTO, AutoShardPolicy.OFF):
        return dataset
    rebatched = _rebatch(dataset, num_workers, worker_index, policy)
    if policy is AutoShardPolicy.DATA:
        return rebatched
    found = []
    sharded = _shard_files(rebatched, num_workers, worker_index, found)
    if not found:
        raise _fail(policy, f"the pipeline has no file source to shard (it reads {_sources(dataset)}; FILE "
                    "needs Dataset.list_files(...) or RecordDataset([...files]))",
                    "use AutoShardPolicy.DATA (every worker reads everything and keeps its share of the "
                    "elements) or AUTO")
    return sharded


# -- walking the pipeline ----------------------------------------------------------------------------
def _inputs(dataset):
    from .records import RecordDataset
    from .dataset import Dataset
    if isinstance(dataset, RecordDataset):
        return (dataset._filenames,) if isinstance(dataset._filenames, Dataset) else ()
    return tuple(dataset._inputs())


def _sources(dataset) -> str:
    """The kinds of the pipeline's sources, for error messages."""
    seen, stack = [], [dataset]
    while stack:
        d = stack.pop()
        below = _inputs(d)
        if not below:
            kind = d._stage_kind() or type(d).__name__
            if kind not in seen:
                seen.append(kind)
        stack.extend(below)
    return " and ".join(seen) or "nothing"


def _copy(dataset, **replace):
    """A shallow copy of ``dataset`` with attributes replaced and nothing remembered from iterating."""
    from .dataset import _CacheDataset, _ShuffleDataset
    new = copy.copy(dataset)
    for name in ("_last_stats", "_element_spec"):
        new.__dict__.pop(name, None)            # recomputed from the new input
    if isinstance(new, _CacheDataset):
        new._cached = None                      # a cache of the whole input is not this worker's share
    if isinstance(new, _ShuffleDataset):
        new._epochs = itertools.count()
    for name, value in replace.items():
        setattr(new, name, value)
    return new


def _with_input(dataset, new_input):
    from .dataset import _CacheDataset
    if isinstance(dataset, _CacheDataset) and dataset._filename is not None:
        raise ValueError(f"auto-sharding: cache({dataset._filename!r}) is above the part of the pipeline that is "
                         "sharded, and every worker would share that one file; give each worker its own file "
                         "name (e.g. with the worker's index in it), move the cache below the shard, or use "
                         "AutoShardPolicy.AUTO")
    return _copy(dataset, _input=new_input)


# -- the batch stage ---------------------------------------------------------------------------------
def _rebatch(dataset, num_workers, worker_index, policy):
    """``dataset`` with its batch stage nearest the output making batches ``num_workers`` times
    smaller (DATA: over a ``shard`` of its input)."""
    from .dataset import _Stage
    batch = getattr(dataset, "_batch", None)
    if batch is not None:
        size, drop_remainder, rebuild = batch
        if size % num_workers:
            raise _fail(policy, f"the batch size {size} of the pipeline's {dataset._kind} stage cannot be split "
                        f"evenly over {num_workers} workers",
                        f"make the global batch size a multiple of {num_workers}")
        below = dataset._input
        if policy is AutoShardPolicy.DATA:
            below = below.shard(num_workers, worker_index)
        rebuilt = rebuild(below, size // num_workers)
        rebuilt._options = dataset._options
        return rebuilt
    if isinstance(dataset, _Stage):
        return _with_input(dataset, _rebatch(dataset._input, num_workers, worker_index, policy))
    raise _fail(policy, f"found no batch stage between the pipeline's output and its {dataset._stage_kind()} "
                "(the dataset must yield global batches: call .batch(global_batch_size) on it)",
                "batch the dataset, or use AutoShardPolicy.AUTO")


# -- the file source ---------------------------------------------------------------------------------
def _shard_files(dataset, num_workers, worker_index, found):
    """``dataset`` with every file source below it sharded; each one sharded is added to ``found``."""
    from .dataset import Dataset, _FunctionDataset, _Stage, _ZipDataset
    from .records import RecordDataset
    policy = AutoShardPolicy.FILE
    if isinstance(dataset, _FunctionDataset) and dataset._kind == "list_files":
        _enough(dataset._cardinality(), num_workers)
        found.append(dataset)
        return dataset.shard(num_workers, worker_index)
    if isinstance(dataset, RecordDataset):
        names = dataset._filenames
        if isinstance(names, Dataset):      # a dataset of names: shard its file source, or else the names
            inner = []
            names = _shard_files(names, num_workers, worker_index, inner)
            if not inner:
                names = names.shard(num_workers, worker_index)
        else:
            names = list(names)
            _enough(len(names), num_workers)
            names = names[worker_index::num_workers]
        found.append(dataset)
        return _copy(dataset, _filenames=names)
    if isinstance(dataset, _Stage):
        below = _shard_files(dataset._input, num_workers, worker_index, found)
        return dataset if below is dataset._input else _with_input(dataset, below)
    if isinstance(dataset, _ZipDataset):
        from ._structure import map_structure
        structure = map_structure(lambda d: _shard_files(d, num_workers, worker_index, found), dataset._structure)
        return _copy(dataset, _structure=structure)
    if dataset._inputs():
        raise _fail(policy, f"cannot look inside {type(dataset).__name__} for a file source",
                    "use AutoShardPolicy.DATA or AUTO")
    return dataset


def _enough(files, num_workers):
    if 0 <= files < num_workers:
        raise _fail(AutoShardPolicy.FILE, f"the pipeline reads {files} file(s), fewer than the {num_workers} "
                    "workers, so some worker would read nothing",
                    "write the data in at least as many files as workers, or use AutoShardPolicy.DATA")
