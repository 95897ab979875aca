"""``fl.data.Dataset``: tf.data-style input pipelines that iterate in eager code.

A dataset is a recipe; iterating it makes a chain of Python iterators, one per stage, each pulling
from the one below. Sequential stages are generators; ``map(num_parallel_calls=k)``, ``prefetch``
and a parallel ``interleave`` run in daemon threads (see ``_parallel.py`` for how those threads stop),
and ``map(..., use_processes=True)`` in worker processes (``_processes.py``). Closing an iterator
closes the whole chain below it. Each iteration is a run (``_run.py``) that names its stages and
records what they do (``stats.py``); AUTOTUNE stages resize themselves from it (``autotune.py``).
"""
from __future__ import annotations

import builtins
import glob
import itertools
import os

import numpy as np

from ..core import dtypes as _dtypes
from ..core import random as _random
from ..core.errors import InvalidArgumentError
from ..core.function import TensorSpec
from ..core.ops import stack as _fl_stack
from ..core.tensor import Tensor, convert_to_tensor
from ._structure import (call, describe, flatten_with_paths, leaf_to_tensor, lists_to_tuples,  # noqa: F401
                         map_structure, spec_of, to_element)
from ._padding import as_padded_shape, pad_batch, padded_spec, up_to
from ._parallel import ParallelMapIterator, PrefetchIterator, call_failed, close_iterator
from ._run import Run, current_run, iterate, run_scope
from .autotune import StageTuner
from .options import AUTOTUNE, Options, resolve_buffer_size, resolve_parallelism
from .stats import PipelineStats

__all__ = ["Dataset", "Iterator", "INFINITE_CARDINALITY", "UNKNOWN_CARDINALITY"]

#: ``cardinality()`` of a dataset that never ends (``repeat()``).
INFINITE_CARDINALITY = -1
#: ``cardinality()`` of a dataset whose length is known only by iterating it (``filter``, generators).
UNKNOWN_CARDINALITY = -2

_END = object()


def _row(t: Tensor, i: int) -> Tensor:
    if type(t) is np.ndarray:             # byte strings (an object array): a row is bytes or a smaller array
        return t[i]
    value = t._value[i]
    return Tensor(np.asarray(value) if isinstance(value, np.generic) else value, t._device)


def _stack_strings(leaves):
    """Byte-string leaves (``bytes``, or object arrays of bytes of one shape) stacked as one object
    array, or None if they are not all such."""
    if all(type(b) is bytes for b in leaves):
        out = np.empty(len(leaves), object)
        out[:] = leaves
        return out
    if all(type(a) is np.ndarray and a.dtype.kind == "O" for a in leaves) and len({a.shape for a in leaves}) == 1:
        return np.stack(leaves)
    return None


def _batched_spec(spec, leading):
    if isinstance(spec, TensorSpec):
        return TensorSpec([leading, *spec.shape], spec.dtype)
    return np.ndarray            # bytes (or an array of them) batch into an object array of bytes


def _stack(tensors, what="batch"):
    if not all(isinstance(t, Tensor) for t in tensors):
        strings = _stack_strings(tensors)
        if strings is not None:
            return strings
        raise InvalidArgumentError(f"{what}: only tensors can be stacked, got {type(tensors[0]).__name__} "
                                   f"components; decode them into arrays with map first", op=what)
    values = [t._value for t in tensors]
    if all(type(v) is np.ndarray for v in values):
        shapes = {v.shape for v in values}
        if len(shapes) > 1:
            raise InvalidArgumentError(
                f"{what}: cannot stack elements of different shapes {sorted(shapes)}; make them one shape "
                f"first (e.g. with map), or batch them one at a time (batch(1))", op=what)
        return Tensor(np.stack(values))
    return _fl_stack(tensors)


def _closing(source, generator):
    """Run ``generator`` (which reads ``source``), closing ``source`` when it ends, fails or is closed."""
    try:
        yield from generator
    finally:
        close_iterator(source)


class Iterator:
    """What ``iter(dataset)`` returns: ``next()`` gives elements; ``close()`` (or a ``with`` block, or
    dropping it) stops every stage, threads included."""

    def __init__(self, dataset: "Dataset", _record: bool = True):
        self._dataset = dataset
        self._run = Run(dataset, record=_record)
        if _record:
            dataset._last_stats = self._run.stats
        with run_scope(self._run):
            self._iterator = iterate(dataset)

    @property
    def element_spec(self):
        return self._dataset.element_spec

    def stats(self) -> PipelineStats:
        """What this iteration's stages did so far (see ``Dataset.stats``)."""
        return self._run.stats

    def __iter__(self):
        return self

    def __next__(self):
        return next(self._iterator)

    def get_next(self):
        return next(self._iterator)

    def close(self) -> None:
        close_iterator(self._iterator)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Dataset:
    """A sequence of elements, each a nested structure (tuples, dicts) of tensors, built from sources
    and transformations and iterated in eager code.

    >>> import flowlab as fl
    >>> ds = fl.data.Dataset.range(10).map(lambda x: x * x).filter(lambda x: x % 2 == 0).batch(3)
    >>> [b.tolist() for b in ds.as_numpy_iterator()]
    [[0, 4, 16], [36, 64]]

    Parallel work runs in threads: ``map(f, num_parallel_calls=k)`` calls ``f`` in ``k`` threads
    (numpy releases the GIL, so array work overlaps), ``prefetch(n)`` keeps ``n`` elements ready in a
    background thread. An error in a user function raises ``fl.data.PipelineError`` naming the stage
    and the element's index, chained to the original exception. ``fl.data.AUTOTUNE`` lets a stage
    size itself while it runs; ``stats()`` shows what every stage did and what AUTOTUNE decided.

    Extension point (how a new source such as ``RecordDataset`` plugs in): subclass ``Dataset`` and
    implement

    - ``_make_iterator(self)``: a new Python iterator over the elements (a generator is fine); called
      once per iteration, so every ``iter(ds)`` starts over. If it reads other datasets, create their
      iterators here with ``flowlab.data._run.iterate(other)`` and close them when done
      (``close_iterator``).
    - ``element_spec``: optional; set ``self._element_spec`` to the nested ``fl.TensorSpec`` structure
      if known, else the base class computes it from the first element.
    - ``_inputs(self)``: optional; the datasets it reads, so that their options reach the pipeline.
    - ``_cardinality(self)``: optional; the number of elements if known without iterating, else
      ``UNKNOWN_CARDINALITY`` (the default) or ``INFINITE_CARDINALITY``.
    - ``_kind``: optional; the stage's name in stats and events (default: the class name).
    """

    _element_spec = None
    _options = None
    _kind = None
    _last_stats = None

    # -- the extension point -------------------------------------------------------------------
    def _cardinality(self) -> int:
        return UNKNOWN_CARDINALITY

    def _stage_kind(self):
        return self._kind or type(self).__name__

    def _make_iterator(self):
        raise NotImplementedError(f"{type(self).__name__} must implement _make_iterator()")

    def _inputs(self):
        return ()

    @property
    def element_spec(self):
        """The nested ``fl.TensorSpec`` of one element (the first element's, if not declared)."""
        if self._element_spec is None:
            self._element_spec = self._compute_element_spec()
        return self._element_spec

    def _compute_element_spec(self):
        iterator = Iterator(self, _record=False)
        try:
            first = next(iterator, _END)
        finally:
            iterator.close()
        if first is _END:
            raise ValueError(f"{type(self).__name__}: element_spec of an empty dataset is unknown")
        return spec_of(first)

    # -- iterating -----------------------------------------------------------------------------
    def __iter__(self) -> Iterator:
        return Iterator(self)

    def as_numpy_iterator(self):
        """Iterate with every tensor as numpy (a numpy scalar for 0-d tensors)."""
        iterator = Iterator(self)
        try:
            for element in iterator:
                yield map_structure(lambda t: t.numpy() if isinstance(t, Tensor) else t, element)
        finally:
            iterator.close()

    def stats(self) -> PipelineStats:
        """What the stages of this dataset's latest iteration did (still counting while it runs): per
        stage its elements, produce and wait time, throughput, workers, buffer size and AUTOTUNE's
        decisions with their reasons. Prints as a table; ``stats().events()`` gives the run's events
        for ``fl.data.timeline``. ``Options.stats`` turns the counting off."""
        if self._last_stats is None:
            raise ValueError("stats(): this dataset has not been iterated yet; iterate it (a for loop, "
                             "list(ds), fit) and ask again")
        return self._last_stats

    def cardinality(self) -> Tensor:
        """The number of elements as an int64 scalar tensor, known without iterating:
        ``fl.data.INFINITE_CARDINALITY`` (-1) for a dataset that never ends and
        ``fl.data.UNKNOWN_CARDINALITY`` (-2) when only iterating would tell (after ``filter``, say).

        >>> import flowlab as fl
        >>> ds = fl.data.Dataset.range(10).batch(3)
        >>> int(ds.cardinality()), len(ds), int(ds.repeat().cardinality())
        (4, 4, -1)
        """
        return Tensor(np.asarray(self._cardinality(), np.int64))

    def __len__(self) -> int:
        n = self._cardinality()
        if n == INFINITE_CARDINALITY:
            raise TypeError("len() of an infinite dataset (it repeats forever); use take() to bound it")
        if n < 0:
            raise TypeError("len() of a dataset whose length is unknown without iterating it (it has a filter, "
                            "a generator or another stage that can change the count); see cardinality()")
        return n

    def __bool__(self):
        return True          # a dataset is never "false", whatever its length (len() may not be known)

    def options(self) -> Options:
        """The options of the whole pipeline: its inputs' merged, then this dataset's own."""
        merged = Options()
        for dataset in self._inputs():
            merged = merged.merge(dataset.options())
        return merged.merge(self._options) if self._options is not None else merged

    def __repr__(self):
        return f"<{type(self).__name__}>"

    # -- sources -------------------------------------------------------------------------------
    @staticmethod
    def from_tensor_slices(tensors) -> "Dataset":
        """One element per index of axis 0 of every component (all must have the same length).

        >>> import flowlab as fl
        >>> ds = fl.data.Dataset.from_tensor_slices(({"x": [[1, 2], [3, 4]]}, [0, 1]))
        >>> [(e[0]["x"].tolist(), int(e[1])) for e in ds.as_numpy_iterator()]
        [([1, 2], 0), ([3, 4], 1)]
        """
        return _SlicesDataset(tensors)

    @staticmethod
    def from_tensors(tensors) -> "Dataset":
        """A dataset of exactly one element, ``tensors``."""
        element = map_structure(leaf_to_tensor, tensors)
        return _FunctionDataset(lambda: iter((element,)), spec_of(element), "from_tensors", 1)

    @staticmethod
    def from_generator(generator, output_signature=None) -> "Dataset":
        """Elements from ``generator()`` (a callable returning an iterable, called once per iteration),
        converted to the dtypes of ``output_signature`` (a nested ``fl.TensorSpec``) and checked
        against its shapes; without a signature, each element is converted as it is.

        >>> import flowlab as fl
        >>> ds = fl.data.Dataset.from_generator(lambda: ((i, [i] * 2) for i in range(2)),
        ...     output_signature=(fl.TensorSpec([], fl.int64), fl.TensorSpec([2], fl.float32)))
        >>> [(int(a), b.tolist()) for a, b in ds.as_numpy_iterator()]
        [(0, [0.0, 0.0]), (1, [1.0, 1.0])]
        """
        if not callable(generator):
            raise TypeError("from_generator needs a callable that returns an iterable (e.g. a generator "
                            f"function), got {type(generator).__name__}")
        signature = lists_to_tuples(output_signature) if output_signature is not None else None

        def elements():
            for index, value in enumerate(generator()):
                if signature is None:       # a list is a tensor here, as in from_tensor_slices
                    yield map_structure(leaf_to_tensor, value)
                    continue
                try:
                    yield _conform_structure(signature, value)
                except (ValueError, TypeError) as e:
                    raise InvalidArgumentError(f"from_generator: element {index} does not match output_signature "
                                               f"{signature}: {e}", op="from_generator") from e
        return _FunctionDataset(elements, signature, "from_generator")

    @staticmethod
    def range(*args, dtype=_dtypes.int64) -> "Dataset":
        """``range(stop)``, ``range(start, stop)``, ``range(start, stop, step)`` as scalar tensors."""
        numbers = builtins.range(*args)
        want = _dtypes.as_dtype(dtype).as_numpy_dtype
        return _FunctionDataset(lambda: (Tensor(np.asarray(i, want)) for i in numbers), TensorSpec([], dtype),
                                "range", len(numbers))

    @staticmethod
    def list_files(file_pattern, shuffle=None, seed=None) -> "Dataset":
        """The paths (as str) matching ``file_pattern``: a glob pattern (``*``, ``?``, ``[...]``) or a
        list of them, matched now. Shuffled each iteration unless ``shuffle=False`` (sorted then);
        ``seed`` (or ``fl.random.set_seed``) makes the orders repeatable. No match is an error.

        >>> import os, tempfile
        >>> import flowlab as fl
        >>> folder = tempfile.mkdtemp()
        >>> for name in ("b.txt", "a.txt", "c.csv"):
        ...     open(os.path.join(folder, name), "w").close()
        >>> ds = fl.data.Dataset.list_files(os.path.join(folder, "*.txt"), shuffle=False)
        >>> [os.path.basename(p) for p in ds]
        ['a.txt', 'b.txt']
        """
        single = isinstance(file_pattern, (str, bytes, os.PathLike, np.str_, np.bytes_))
        patterns = [file_pattern] if single else list(np.asarray(file_pattern).reshape(-1)) if isinstance(
            file_pattern, np.ndarray) else list(file_pattern)
        patterns = [os.fsdecode(bytes(p) if isinstance(p, np.bytes_) else os.fspath(str(p) if isinstance(
            p, np.str_) else p)) for p in patterns]
        names = sorted({path for pattern in patterns for path in glob.glob(pattern)})
        if not names:
            raise InvalidArgumentError(f"list_files: no files match {patterns[0] if single else patterns}",
                                       op="list_files")
        ds = _FunctionDataset(lambda: iter(names), str, "list_files", len(names))
        return ds if shuffle is not None and not shuffle else ds.shuffle(len(names), seed=seed)

    @staticmethod
    def zip(*datasets) -> "Dataset":
        """Elements of several datasets side by side, until the shortest ends. Takes datasets as
        arguments or one nested tuple/dict of datasets (the elements take that structure)."""
        structure = datasets[0] if len(datasets) == 1 and isinstance(datasets[0], (tuple, dict)) else datasets
        leaves = [d for _, d in flatten_with_paths(structure)]
        if not leaves or not all(isinstance(d, Dataset) for d in leaves):
            raise TypeError(f"zip takes datasets, got {map_structure(lambda d: type(d).__name__, structure)}")
        return _ZipDataset(structure)

    # -- transformations -----------------------------------------------------------------------
    def map(self, map_func, num_parallel_calls=None, deterministic=None, use_processes=False) -> "Dataset":
        """``map_func`` on every element (a tuple element is passed as separate arguments).

        With ``num_parallel_calls=k``, ``k`` threads call it; with AUTOTUNE, one thread to start with
        and more while the consumer waits (up to one per core). Order is kept unless
        ``deterministic=False`` (None: ``Options.deterministic``). A worker takes a few consecutive
        elements at once when the function is fast (about 4 ms of calls, at most 16), and at most two
        such chunks per worker are in flight.

        ``use_processes=True`` runs the calls in ``k`` worker processes instead, for Python-heavy
        functions that hold the GIL (numpy work runs fine in threads). The function must be picklable
        by reference, a ``def`` at the top level of an importable module, and elements travel to the
        workers and back pickled, so the work per element should outweigh that copy."""
        return _MapDataset(self, map_func, num_parallel_calls, deterministic, use_processes)

    def filter(self, predicate) -> "Dataset":
        """The elements for which ``predicate`` returns True (a bool or a scalar bool tensor)."""
        def run(source):
            for index, element in enumerate(source):
                try:
                    keep = call(predicate, element)
                    if isinstance(keep, Tensor) and (keep.dtype != _dtypes.bool_ or keep.ndim):
                        raise TypeError(f"the predicate must return a scalar bool, got {describe(keep)}")
                    keep = builtins.bool(keep)
                except Exception as e:
                    raise call_failed("filter", index, e) from e
                if keep:
                    yield element
        return _Stage(self, run, "same", "filter", None)

    def batch(self, batch_size, drop_remainder=False) -> "Dataset":
        """Stack ``batch_size`` consecutive elements into one (a new leading axis on every component).
        The last, smaller batch is kept unless ``drop_remainder``."""
        batch_size = _positive(batch_size, "batch_size")

        def run(source):
            while True:
                elements = list(itertools.islice(source, batch_size))
                if not elements or (drop_remainder and len(elements) < batch_size):
                    return
                yield map_structure(lambda *ts: _stack(ts), *elements)
        leading = batch_size if drop_remainder else None
        stage = _Stage(self, run, lambda spec: map_structure(
            lambda s: _batched_spec(s, leading), spec), "batch", _batches(batch_size, drop_remainder))
        return _batch_stage(stage, batch_size, drop_remainder, lambda ds, n: ds.batch(n, drop_remainder))

    def padded_batch(self, batch_size, padded_shapes=None, padding_values=None, drop_remainder=False) -> "Dataset":
        """Like ``batch``, for elements whose components differ in shape: each component is padded to
        ``padded_shapes`` (a shape per component, following the element's structure; a None or -1
        dimension, or a None shape, grows to the batch's largest) with ``padding_values`` (one scalar
        per component, or one for all; default 0).

        >>> import flowlab as fl
        >>> ds = fl.data.Dataset.range(1, 4).map(lambda n: fl.fill([n], n))
        >>> [b.tolist() for b in ds.padded_batch(3).as_numpy_iterator()]
        [[[1, 0, 0], [2, 2, 0], [3, 3, 3]]]
        """
        batch_size = _positive(batch_size, "batch_size")

        def run(source):
            shapes = values = None
            while True:
                elements = list(itertools.islice(source, batch_size))
                if not elements or (drop_remainder and len(elements) < batch_size):
                    return
                if shapes is None:      # the first element shows the structure the arguments follow
                    shapes = [(p, as_padded_shape(v, p)) for p, v in up_to(elements[0], padded_shapes, "padded_shapes")]
                    values = up_to(elements[0], padding_values, "padding_values")
                yield pad_batch(elements, shapes, values)

        leading = batch_size if drop_remainder else None

        def spec_rule(spec):
            shapes = iter([as_padded_shape(v, p) for p, v in up_to(spec, padded_shapes, "padded_shapes")])
            return map_structure(lambda s: padded_spec(s, next(shapes), leading), spec)
        stage = _Stage(self, run, spec_rule, "padded_batch", _batches(batch_size, drop_remainder))
        return _batch_stage(stage, batch_size, drop_remainder,
                            lambda ds, n: ds.padded_batch(n, padded_shapes, padding_values, drop_remainder))

    def unbatch(self) -> "Dataset":
        """Split every element along axis 0 into its rows (the inverse of ``batch``)."""
        def run(source):
            for element in source:
                leaves = flatten_with_paths(element)
                sizes = {t.shape[0] if isinstance(t, (Tensor, np.ndarray)) and t.ndim else None for _, t in leaves}
                if len(sizes) != 1 or None in sizes:
                    raise InvalidArgumentError(f"unbatch: every component needs the same leading dimension, got "
                                               f"{describe(element)}", op="unbatch")
                for i in builtins.range(sizes.pop()):
                    yield map_structure(lambda t: _row(t, i), element)
        return _Stage(self, run, lambda spec: map_structure(
            lambda s: TensorSpec(s.shape[1:], s.dtype) if isinstance(s, TensorSpec) else bytes, spec),
                      "unbatch", None)

    def shuffle(self, buffer_size, seed=None, reshuffle_each_iteration=True) -> "Dataset":
        """Randomly shuffle with a buffer of ``buffer_size`` elements (a full shuffle when it is at least
        the dataset's size). ``seed`` (or ``fl.random.set_seed``) makes the orders repeatable; a new
        order each iteration unless ``reshuffle_each_iteration=False``."""
        return _ShuffleDataset(self, _positive(buffer_size, "buffer_size"), seed, reshuffle_each_iteration)

    def repeat(self, count=None) -> "Dataset":
        """The dataset ``count`` times (None or -1: forever), restarting its iterator each time."""
        return _RepeatDataset(self, -1 if count is None else int(count))

    def take(self, count) -> "Dataset":
        """The first ``count`` elements (-1: all)."""
        count = int(count)

        def card(n):
            if n == UNKNOWN_CARDINALITY:
                return n
            if n == INFINITE_CARDINALITY:
                return INFINITE_CARDINALITY if count < 0 else count
            return n if count < 0 else min(n, count)
        return _Stage(self, lambda source: source if count < 0 else itertools.islice(source, count), "same", "take",
                      card)

    def skip(self, count) -> "Dataset":
        """All but the first ``count`` elements (-1: skip all)."""
        count = int(count)

        def run(source):
            if count < 0:
                for _ in source:
                    pass
                return
            yield from itertools.islice(source, count, None)
        return _Stage(self, run, "same", "skip", lambda n: n if n < 0 else 0 if count < 0 else max(0, n - count))

    def shard(self, num_shards, index) -> "Dataset":
        """Every ``num_shards``-th element starting at ``index``: worker ``index`` of ``num_shards``."""
        num_shards = _positive(num_shards, "num_shards")
        if not 0 <= int(index) < num_shards:
            raise ValueError(f"shard: index must be in [0, {num_shards}), got {index}")
        index = int(index)
        return _Stage(self, lambda source: itertools.islice(source, index, None, num_shards), "same", "shard",
                      lambda n: n if n < 0 else n // num_shards + (index < n % num_shards))

    def enumerate(self, start=0) -> "Dataset":
        """Pairs ``(i, element)`` with an int64 counter ``i`` from ``start``."""
        def run(source):
            for i, element in enumerate(source, int(start)):
                yield Tensor(np.asarray(i, np.int64)), element
        return _Stage(self, run, lambda spec: (TensorSpec([], _dtypes.int64), spec), "enumerate")

    def cache(self, filename="") -> "Dataset":
        """Keep the elements of the first complete iteration; later iterations replay them without
        running the stages above. In memory by default; with ``filename``, in that file, which later
        programs reuse too (delete it to rebuild the cache). A file cache is checksummed (a damaged
        one raises ``DataLossError``) and appears only once a pass completes."""
        return _CacheDataset(self, os.fspath(filename) if filename else None)

    def prefetch(self, buffer_size) -> "Dataset":
        """Prepare up to ``buffer_size`` elements ahead in a background thread, so the stages above run
        while the consumer works; order is kept. AUTOTUNE starts with 1 and grows the buffer when the
        consumer waits while the producer is held up by a full buffer."""
        resolve_buffer_size(buffer_size, Options())      # a bad value fails here, not when iterated
        return _PrefetchDataset(self, buffer_size)

    def interleave(self, map_func, cycle_length=None, block_length=1, num_parallel_calls=None,
                   deterministic=None) -> "Dataset":
        """``map_func`` turns each element into a dataset; their elements are mixed, ``block_length`` at
        a time from ``cycle_length`` open datasets in turn (an exhausted one is replaced by the next).
        With ``num_parallel_calls`` set, each open dataset is read ahead in its own thread."""
        return _InterleaveDataset(self, map_func, cycle_length, _positive(block_length, "block_length"),
                                  num_parallel_calls)

    def apply(self, transformation_func) -> "Dataset":
        """``transformation_func(self)``: a reusable chain of transformations as one call."""
        result = transformation_func(self)
        if not isinstance(result, Dataset):
            raise TypeError(f"apply: the function must return a Dataset, got {type(result).__name__}")
        return result

    def with_options(self, options: Options) -> "Dataset":
        """The same dataset with ``options`` merged over the pipeline's (takes effect when iterated)."""
        if not isinstance(options, Options):
            raise TypeError(f"with_options takes fl.data.Options, got {type(options).__name__}")
        stage = _Stage(self, None, "same", None)
        stage._options = options
        return stage


def _batch_stage(stage, batch_size, drop_remainder, rebatch):
    """Mark ``stage`` as a batch stage for auto-sharding (``_autoshard.py``): its batch size, and
    ``rebatch(input, n)``, the same stage over another input with ``n`` elements a batch."""
    stage._batch = (batch_size, drop_remainder, rebatch)
    return stage


def _batches(batch_size, drop_remainder):
    """The cardinality rule of a batch: whole batches, plus the partial one unless dropped."""
    return lambda n: n if n < 0 else n // batch_size if drop_remainder else -(-n // batch_size)


def _positive(value, name):
    value = int(value)
    if value < 1:
        raise ValueError(f"{name} must be positive, got {value}")
    return value


def _conform_structure(spec, value):
    if isinstance(spec, tuple):
        if not isinstance(value, (tuple, list)) or len(value) != len(spec):
            raise ValueError(f"expected a structure of {len(spec)} components, got {type(value).__name__}")
        items = [_conform_structure(s, v) for s, v in zip(spec, value)]
        return type(spec)(*items) if hasattr(spec, "_fields") else tuple(items)
    if isinstance(spec, dict):
        if not isinstance(value, dict) or value.keys() != spec.keys():
            raise ValueError(f"expected a dict with keys {sorted(spec)}, got {type(value).__name__}")
        return {k: _conform_structure(s, value[k]) for k, s in spec.items()}
    return _conform(value, spec)


def _conform(value, spec: TensorSpec):
    tensor = convert_to_tensor(value, dtype=spec.dtype) if not isinstance(value, Tensor) else value
    if not spec.is_compatible_with(tensor):
        raise ValueError(f"got {tensor.dtype.name}{list(tensor.shape)}, expected {spec}")
    return tensor


# -- the dataset classes behind the methods ----------------------------------------------------------
class _FunctionDataset(Dataset):
    def __init__(self, make_iterator, element_spec=None, kind=None, cardinality=UNKNOWN_CARDINALITY):
        self._make = make_iterator
        self._element_spec = element_spec
        self._kind = kind
        self._count = cardinality

    def _cardinality(self):
        return self._count

    def _make_iterator(self):
        return iter(self._make())


class _SlicesDataset(Dataset):
    _kind = "from_tensor_slices"

    def __init__(self, tensors):
        def component(x):
            if isinstance(x, np.ndarray):
                x = np.array(x)          # a copy: later changes to the caller's array do not leak in
                x.flags.writeable = False
            return leaf_to_tensor(x)
        self._components = map_structure(component, tensors)   # a list is a tensor here, as in tf.data
        leaves = flatten_with_paths(self._components)
        lengths = {path or "tensors": (t.shape[0] if t.ndim else None) for path, t in leaves}
        if None in lengths.values():
            raise ValueError(f"from_tensor_slices: every component needs an axis 0 to slice, but "
                             f"{[p for p, n in lengths.items() if n is None]} are scalars")
        if len(set(lengths.values())) > 1:
            raise ValueError(f"from_tensor_slices: the components have different lengths along axis 0: "
                             f"{', '.join(f'{p}: {n}' for p, n in lengths.items())}")
        self._length = next(iter(lengths.values()))
        self._element_spec = map_structure(lambda t: TensorSpec(t.shape[1:], t.dtype), self._components)

    def _cardinality(self):
        return self._length

    def _make_iterator(self):
        components = self._components
        return (map_structure(lambda t: _row(t, i), components) for i in builtins.range(self._length))


class _Stage(Dataset):
    """A dataset made from one input by ``transform(source) -> iterator`` (None: pass through).
    ``spec_rule``: "same", or a function of the input's element_spec, or None (from the first element).
    ``kind``: its name in stats (None: a pass-through, unnamed). ``card``: "same", a function of the
    input's cardinality, or None (unknown)."""

    def __init__(self, input_dataset, transform, spec_rule=None, kind=None, card="same"):
        self._input = input_dataset
        self._transform = transform
        self._spec_rule = spec_rule
        self._kind = kind
        self._card = card

    def _inputs(self):
        return (self._input,)

    def _stage_kind(self):
        return self._kind

    def _cardinality(self):
        if self._card == "same":
            return self._input._cardinality()
        return UNKNOWN_CARDINALITY if self._card is None else self._card(self._input._cardinality())

    def _compute_element_spec(self):
        if self._spec_rule == "same":
            return self._input.element_spec
        if self._spec_rule is not None:
            return self._spec_rule(self._input.element_spec)
        return super()._compute_element_spec()

    def _make_iterator(self):
        source = iterate(self._input)
        if self._transform is None:
            return source
        return _closing(source, self._transform(source))


class _MapDataset(_Stage):
    _kind = "map"

    def __init__(self, input_dataset, map_func, num_parallel_calls, deterministic, use_processes=False):
        super().__init__(input_dataset, None, None, "map")
        self._map_func = map_func
        self._num_parallel_calls = num_parallel_calls
        self._deterministic = deterministic
        self._payload = None
        if num_parallel_calls is not None:
            resolve_parallelism(num_parallel_calls, Options())   # a bad value fails here, not when iterated
        if use_processes:
            if num_parallel_calls is None:
                raise ValueError("map: use_processes=True needs num_parallel_calls (a count of worker processes "
                                 "or fl.data.AUTOTUNE)")
            from ._processes import pickle_function
            self._payload = pickle_function(map_func, "map")

    def _make_iterator(self):
        run = current_run()
        options = run.options if run is not None else Options()
        map_func = self._map_func
        source = iterate(self._input)
        calls = self._num_parallel_calls
        if calls is None and self._payload is None and options.experimental_optimization._get("map_parallelization"):
            calls = AUTOTUNE          # the option asks for it: see OptimizationOptions in options.py
        parallelism = resolve_parallelism(calls, options)
        if parallelism is None:
            return _closing(source, self._sequential(source, map_func))
        deterministic = self._deterministic if self._deterministic is not None else options._get("deterministic")
        recorder = run.recorder(self) if run is not None else None
        tune, workers = None, parallelism.limit
        if parallelism.tuned and recorder is not None:
            workers = parallelism.start
            tune = lambda grow, held: StageTuner(recorder, run.budget, "parallelism", parallelism.start,  # noqa: E731
                                                 parallelism.limit, grow, held=held)
        make_call = None
        if self._payload is not None:
            from ._processes import ProcessWorkers
            make_call = ProcessWorkers(self._payload, recorder.name if recorder is not None else "map", recorder)
        return ParallelMapIterator(source, lambda element: to_element(call(map_func, element)), workers,
                                   deterministic, stage="map", recorder=recorder, tune=tune, make_call=make_call)

    @staticmethod
    def _sequential(source, map_func):
        for index, element in enumerate(source):
            try:
                result = to_element(call(map_func, element))
            except Exception as e:
                raise call_failed("map", index, e) from e
            yield result


class _PrefetchDataset(_Stage):
    def __init__(self, input_dataset, buffer_size):
        super().__init__(input_dataset, None, "same", "prefetch")
        self._buffer_size = buffer_size

    def _make_iterator(self):
        run = current_run()
        size = resolve_buffer_size(self._buffer_size, run.options if run is not None else Options())
        source = iterate(self._input)
        if size.limit == 0:
            return source
        recorder = run.recorder(self) if run is not None else None
        tune, start = None, size.limit
        if size.tuned and recorder is not None:
            start = size.start
            tune = lambda resize, stalls: StageTuner(recorder, run.budget, "buffer_size", size.start,  # noqa: E731
                                                     size.limit, resize, stalls)
        return PrefetchIterator(source, start, "prefetch", recorder, tune)


class _ZipDataset(Dataset):
    _kind = "zip"

    def __init__(self, structure):
        self._structure = structure

    def _inputs(self):
        return tuple(d for _, d in flatten_with_paths(self._structure))

    def _cardinality(self):
        counts = [d._cardinality() for d in self._inputs()]
        if UNKNOWN_CARDINALITY in counts:
            return UNKNOWN_CARDINALITY
        finite = [n for n in counts if n != INFINITE_CARDINALITY]
        return min(finite) if finite else INFINITE_CARDINALITY

    def _compute_element_spec(self):
        return map_structure(lambda d: d.element_spec, self._structure)

    def _make_iterator(self):
        iterators = map_structure(iterate, self._structure)
        return self._run(iterators)

    @staticmethod
    def _run(iterators):
        leaves = [it for _, it in flatten_with_paths(iterators)]
        try:
            while True:
                values = [next(it, _END) for it in leaves]
                if any(v is _END for v in values):
                    return
                yield map_structure(lambda _, value=iter(values): next(value), iterators)
        finally:
            for it in leaves:
                close_iterator(it)


class _ShuffleDataset(_Stage):
    def __init__(self, input_dataset, buffer_size, seed, reshuffle_each_iteration):
        super().__init__(input_dataset, None, "same", "shuffle")
        self._buffer_size = buffer_size
        # without a seed, draw one from fl.random's generator: fl.random.set_seed makes it repeatable
        self._seed = int(seed) if seed is not None else int(_random.generator().integers(2**62))
        self._reshuffle = reshuffle_each_iteration
        self._epochs = itertools.count()

    def _make_iterator(self):
        seed = [self._seed, next(self._epochs)] if self._reshuffle else self._seed
        source = iterate(self._input)
        return _closing(source, self._run(source, self._buffer_size, np.random.default_rng(seed)))

    @staticmethod
    def _run(source, buffer_size, rng):
        buffer = list(itertools.islice(source, buffer_size))
        for element in source:      # the buffer is full: a random one out, the new one in its place
            i = int(rng.integers(len(buffer)))
            yield buffer[i]
            buffer[i] = element
        for i in rng.permutation(len(buffer)):
            yield buffer[i]


class _RepeatDataset(_Stage):
    def __init__(self, input_dataset, count):
        super().__init__(input_dataset, None, "same", "repeat")
        self._count = count

    def _cardinality(self):
        n = self._input._cardinality()
        if self._count < 0:
            return 0 if n == 0 else INFINITE_CARDINALITY
        if self._count == 0:
            return 0
        return n if n < 0 else n * self._count

    def _make_iterator(self):
        return self._run(current_run())

    def _run(self, run):
        epoch = 0
        while self._count < 0 or epoch < self._count:
            with run_scope(run):
                source = iterate(self._input)
            produced = False
            try:
                for element in source:
                    produced = True
                    yield element
            finally:
                close_iterator(source)
            if not produced:
                return       # repeating an empty dataset forever would hang
            epoch += 1


class _CacheDataset(_Stage):
    def __init__(self, input_dataset, filename=None):
        super().__init__(input_dataset, None, "same", "cache")
        self._cached = None
        self._filename = filename

    def _make_iterator(self):
        if self._filename is not None:
            from ._filecache import read_cache, write_through
            if os.path.exists(self._filename):
                return read_cache(self._filename)
            source = iterate(self._input)
            return _closing(source, write_through(source, self._filename))
        if self._cached is not None:
            return iter(self._cached)
        source = iterate(self._input)
        return _closing(source, self._fill(source))

    def _fill(self, source):
        elements = []
        for element in source:
            elements.append(element)
            yield element
        self._cached = tuple(elements)    # only a complete pass is kept


class _InterleaveDataset(_Stage):
    def __init__(self, input_dataset, map_func, cycle_length, block_length, num_parallel_calls):
        super().__init__(input_dataset, None, None, "interleave", None)
        self._map_func = map_func
        self._cycle_length = cycle_length
        self._block_length = block_length
        self._num_parallel_calls = num_parallel_calls

    def _make_iterator(self):
        run = current_run()
        options = run.options if run is not None else Options()
        cycle = self._cycle_length
        cycle = resolve_parallelism(AUTOTUNE if cycle is None or int(cycle) == AUTOTUNE else cycle, Options()).limit
        parallel = resolve_parallelism(self._num_parallel_calls, options) is not None
        source = iterate(self._input)
        return _closing(source, self._run(source, cycle, parallel, run))

    def _open(self, index, element, parallel, run):
        try:
            dataset = call(self._map_func, element)
        except Exception as e:
            raise call_failed("interleave", index, e) from e
        if not isinstance(dataset, Dataset):
            raise TypeError(f"interleave: map_func must return a Dataset, got {type(dataset).__name__}")
        with run_scope(run):
            iterator = iterate(dataset)
        return PrefetchIterator(iterator, self._block_length, stage="interleave") if parallel else iterator

    def _run(self, source, cycle_length, parallel, run):
        slots = [None] * cycle_length
        index, input_done, i = 0, False, 0
        try:
            while True:
                if slots[i] is None and not input_done:
                    element = next(source, _END)
                    if element is _END:
                        input_done = True
                    else:
                        slots[i] = self._open(index, element, parallel, run)
                        index += 1
                if slots[i] is not None:
                    for _ in builtins.range(self._block_length):
                        value = next(slots[i], _END)
                        if value is _END:
                            close_iterator(slots[i])
                            slots[i] = None
                            break
                        yield value
                if input_done and all(s is None for s in slots):
                    return
                i = (i + 1) % cycle_length
        finally:
            for iterator in slots:
                if iterator is not None:
                    close_iterator(iterator)
