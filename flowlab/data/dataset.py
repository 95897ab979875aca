"""``fl.data.Dataset``: tf.data-style input pipelines that iterate in eager code.

A dataset is a recipe; iterating it makes a chain of Python iterators, one per stage, each pulling
from the one below. Sequential stages are generators; ``map(num_parallel_calls=k)``, ``prefetch``
and a parallel ``interleave`` run in daemon threads (see ``_parallel.py`` for how those threads stop).
Closing an iterator closes the whole chain below it.
"""
from __future__ import annotations

import builtins
import contextlib
import itertools
import threading

import numpy as np

from ..core import dtypes as _dtypes
from ..core import random as _random
from ..core.errors import InvalidArgumentError
from ..core.function import TensorSpec
from ..core.ops import stack as _fl_stack
from ..core.tensor import Tensor, convert_to_tensor
from ._parallel import ParallelMapIterator, PrefetchIterator, call_failed, close_iterator
from .options import AUTOTUNE, Options, resolve_parallelism

__all__ = ["Dataset", "Iterator"]

_END = object()


# -- nested structures: tuples (and namedtuples) and dicts of tensors ------------------------------
def map_structure(fn, *structures):
    """``fn`` over the leaves of same-shaped structures, rebuilding the first one's shape."""
    first = structures[0]
    if isinstance(first, tuple):
        if any(not isinstance(s, tuple) or len(s) != len(first) for s in structures):
            raise ValueError(f"structures do not match: {[_describe(s) for s in structures]}")
        items = [map_structure(fn, *parts) for parts in zip(*structures)]
        return type(first)(*items) if hasattr(first, "_fields") else tuple(items)
    if isinstance(first, dict):
        if any(not isinstance(s, dict) or s.keys() != first.keys() for s in structures):
            raise ValueError(f"structures do not match: {[_describe(s) for s in structures]}")
        return {k: map_structure(fn, *(s[k] for s in structures)) for k in first}
    return fn(*structures)


def flatten_with_paths(structure, path=""):
    """[(path, leaf)], paths written as in Python: ``[0]['image']``."""
    if isinstance(structure, tuple):
        return [p for i, s in enumerate(structure) for p in flatten_with_paths(s, f"{path}[{i}]")]
    if isinstance(structure, dict):
        return [p for k, s in structure.items() for p in flatten_with_paths(s, f"{path}[{k!r}]")]
    return [(path, structure)]


def _describe(structure):
    return map_structure(lambda t: f"{t.dtype.name}{list(t.shape)}" if hasattr(t, "dtype") else type(t).__name__,
                         structure)


def _lists_to_tuples(x):
    # NOTE: as tf.data does for a function's output: a list is a structure there, not a tensor
    if isinstance(x, list):
        return tuple(_lists_to_tuples(v) for v in x)
    if isinstance(x, tuple):
        items = [_lists_to_tuples(v) for v in x]
        return type(x)(*items) if hasattr(x, "_fields") else tuple(items)
    if isinstance(x, dict):
        return {k: _lists_to_tuples(v) for k, v in x.items()}
    return x


def _leaf_to_tensor(x):
    # NOTE: bytes and str stay as they are (flowlab has no string dtype): record payloads are bytes
    if isinstance(x, (Tensor, bytes, str)):
        return x
    if x is None:
        raise TypeError("a dataset element cannot hold None; return a tensor, an array or a number")
    return convert_to_tensor(x)


def to_element(value):
    """A function's output as an element: lists become tuples, leaves become tensors."""
    return map_structure(_leaf_to_tensor, _lists_to_tuples(value))


def spec_of(element):
    """The nested TensorSpec of an element (the Python type for a bytes or str component)."""
    return map_structure(lambda t: TensorSpec(t.shape, t.dtype) if isinstance(t, Tensor) else type(t), element)


def _call(fn, element):
    # NOTE: a plain tuple is passed as separate arguments, as tf.data does; a namedtuple or dict is not
    return fn(*element) if type(element) is tuple else fn(element)


def _row(t: Tensor, i: int) -> Tensor:
    value = t._value[i]
    return Tensor(np.asarray(value) if isinstance(value, np.generic) else value, t._device)


def _stack(tensors, what="batch"):
    if not all(isinstance(t, Tensor) for t in tensors):
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


# -- options in effect while a pipeline's iterators are made ----------------------------------------
_scope = threading.local()


def current_options() -> Options:
    """The merged options of the pipeline whose iterator is being made (defaults outside one)."""
    return getattr(_scope, "options", None) or Options()


@contextlib.contextmanager
def _options_scope(options):
    previous = getattr(_scope, "options", None)
    _scope.options = options
    try:
        yield
    finally:
        _scope.options = previous


def _closing(source, generator):
    """Run ``generator`` (which reads ``source``), closing ``source`` when it ends, fails or is closed."""
    try:
        yield from generator
    finally:
        close_iterator(source)


class Iterator:
    """What ``iter(dataset)`` returns: ``next()`` gives elements; ``close()`` (or a ``with`` block, or
    dropping it) stops every stage, threads included."""

    def __init__(self, dataset: "Dataset"):
        self._dataset = dataset
        with _options_scope(dataset.options()):
            self._iterator = dataset._make_iterator()

    @property
    def element_spec(self):
        return self._dataset.element_spec

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
    and the element's index, chained to the original exception. ``fl.data.AUTOTUNE`` picks fixed
    defaults for now.

    Extension point (how a new source such as ``RecordDataset`` plugs in): subclass ``Dataset`` and
    implement

    - ``_make_iterator(self)``: a new Python iterator over the elements (a generator is fine); called
      once per iteration, so every ``iter(ds)`` starts over. If it reads other datasets, create their
      iterators here with ``other._make_iterator()`` and close them when done (``close_iterator``).
    - ``element_spec``: optional; set ``self._element_spec`` to the nested ``fl.TensorSpec`` structure
      if known, else the base class computes it from the first element.
    - ``_inputs(self)``: optional; the datasets it reads, so that their options reach the pipeline.
    """

    _element_spec = None
    _options = None

    # -- the extension point -------------------------------------------------------------------
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
        iterator = Iterator(self)
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
        element = map_structure(_leaf_to_tensor, tensors)
        return _FunctionDataset(lambda: iter((element,)), spec_of(element))

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
        signature = _lists_to_tuples(output_signature) if output_signature is not None else None

        def elements():
            for index, value in enumerate(generator()):
                if signature is None:       # a list is a tensor here, as in from_tensor_slices
                    yield map_structure(_leaf_to_tensor, value)
                    continue
                try:
                    yield _conform_structure(signature, value)
                except (ValueError, TypeError) as e:
                    raise InvalidArgumentError(f"from_generator: element {index} does not match output_signature "
                                               f"{signature}: {e}", op="from_generator") from e
        return _FunctionDataset(elements, signature)

    @staticmethod
    def range(*args, dtype=_dtypes.int64) -> "Dataset":
        """``range(stop)``, ``range(start, stop)``, ``range(start, stop, step)`` as scalar tensors."""
        numbers = builtins.range(*args)
        want = _dtypes.as_dtype(dtype).as_numpy_dtype
        return _FunctionDataset(lambda: (Tensor(np.asarray(i, want)) for i in numbers), TensorSpec([], dtype))

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
    def map(self, map_func, num_parallel_calls=None, deterministic=None) -> "Dataset":
        """``map_func`` on every element (a tuple element is passed as separate arguments). With
        ``num_parallel_calls=k`` (or AUTOTUNE: one per core), ``k`` threads call it, at most ``2k``
        elements in flight; order is kept unless ``deterministic=False`` (None: ``Options.deterministic``)."""
        return _MapDataset(self, map_func, num_parallel_calls, deterministic)

    def filter(self, predicate) -> "Dataset":
        """The elements for which ``predicate`` returns True (a bool or a scalar bool tensor)."""
        def run(source):
            for index, element in enumerate(source):
                try:
                    keep = _call(predicate, element)
                    if isinstance(keep, Tensor) and (keep.dtype != _dtypes.bool_ or keep.ndim):
                        raise TypeError(f"the predicate must return a scalar bool, got {_describe(keep)}")
                    keep = builtins.bool(keep)
                except Exception as e:
                    raise call_failed("filter", index, e) from e
                if keep:
                    yield element
        return _Stage(self, run, "same")

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
        return _Stage(self, run, lambda spec: map_structure(
            lambda s: TensorSpec([leading, *s.shape], s.dtype), spec))

    def unbatch(self) -> "Dataset":
        """Split every element along axis 0 into its rows (the inverse of ``batch``)."""
        def run(source):
            for element in source:
                leaves = flatten_with_paths(element)
                sizes = {t.shape[0] if isinstance(t, Tensor) and t.ndim else None for _, t in leaves}
                if len(sizes) != 1 or None in sizes:
                    raise InvalidArgumentError(f"unbatch: every component needs the same leading dimension, got "
                                               f"{_describe(element)}", op="unbatch")
                for i in builtins.range(sizes.pop()):
                    yield map_structure(lambda t: _row(t, i), element)
        return _Stage(self, run, lambda spec: map_structure(lambda s: TensorSpec(s.shape[1:], s.dtype), spec))

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
        return _Stage(self, lambda source: source if count < 0 else itertools.islice(source, count), "same")

    def skip(self, count) -> "Dataset":
        """All but the first ``count`` elements (-1: skip all)."""
        count = int(count)

        def run(source):
            if count < 0:
                for _ in source:
                    pass
                return
            yield from itertools.islice(source, count, None)
        return _Stage(self, run, "same")

    def shard(self, num_shards, index) -> "Dataset":
        """Every ``num_shards``-th element starting at ``index``: worker ``index`` of ``num_shards``."""
        num_shards = _positive(num_shards, "num_shards")
        if not 0 <= int(index) < num_shards:
            raise ValueError(f"shard: index must be in [0, {num_shards}), got {index}")
        return _Stage(self, lambda source: itertools.islice(source, int(index), None, num_shards), "same")

    def enumerate(self, start=0) -> "Dataset":
        """Pairs ``(i, element)`` with an int64 counter ``i`` from ``start``."""
        def run(source):
            for i, element in enumerate(source, int(start)):
                yield Tensor(np.asarray(i, np.int64)), element
        return _Stage(self, run, lambda spec: (TensorSpec([], _dtypes.int64), spec))

    def cache(self, filename="") -> "Dataset":
        """Keep the elements in memory after the first complete iteration; later iterations replay
        them without running the stages above. (A file cache, ``filename``, is not implemented yet.)"""
        if filename:
            raise NotImplementedError("cache(filename=...): the file cache is not implemented yet; "
                                      "use cache() to cache in memory")
        return _CacheDataset(self)

    def prefetch(self, buffer_size) -> "Dataset":
        """Prepare up to ``buffer_size`` elements ahead in a background thread (AUTOTUNE: 2), so the
        stages above run while the consumer works. Order is kept."""
        size = 2 if int(buffer_size) == AUTOTUNE else int(buffer_size)
        if size < 0:
            raise ValueError(f"prefetch: buffer_size must be >= 0 or fl.data.AUTOTUNE, got {buffer_size}")
        return _Stage(self, None if size == 0 else (lambda source: PrefetchIterator(source, size)), "same")

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
        stage = _Stage(self, None, "same")
        stage._options = options
        return stage


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
    def __init__(self, make_iterator, element_spec=None):
        self._make = make_iterator
        self._element_spec = element_spec

    def _make_iterator(self):
        return iter(self._make())


class _SlicesDataset(Dataset):
    def __init__(self, tensors):
        def component(x):
            if isinstance(x, np.ndarray):
                x = np.array(x)          # a copy: later changes to the caller's array do not leak in
                x.flags.writeable = False
            return _leaf_to_tensor(x)
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

    def _make_iterator(self):
        components = self._components
        return (map_structure(lambda t: _row(t, i), components) for i in builtins.range(self._length))


class _Stage(Dataset):
    """A dataset made from one input by ``transform(source) -> iterator`` (None: pass through).
    ``spec_rule``: "same", or a function of the input's element_spec, or None (from the first element)."""

    def __init__(self, input_dataset, transform, spec_rule=None):
        self._input = input_dataset
        self._transform = transform
        self._spec_rule = spec_rule

    def _inputs(self):
        return (self._input,)

    def _compute_element_spec(self):
        if self._spec_rule == "same":
            return self._input.element_spec
        if self._spec_rule is not None:
            return self._spec_rule(self._input.element_spec)
        return super()._compute_element_spec()

    def _make_iterator(self):
        source = self._input._make_iterator()
        if self._transform is None:
            return source
        result = self._transform(source)
        # a stage that owns threads closes its own source; a generator stage gets _closing around it
        return result if isinstance(result, PrefetchIterator) else _closing(source, result)


class _MapDataset(_Stage):
    def __init__(self, input_dataset, map_func, num_parallel_calls, deterministic):
        super().__init__(input_dataset, None)
        self._map_func = map_func
        self._num_parallel_calls = num_parallel_calls
        self._deterministic = deterministic
        if num_parallel_calls is not None:
            resolve_parallelism(num_parallel_calls, Options())   # a bad value fails here, not when iterated

    def _make_iterator(self):
        options = current_options()
        map_func = self._map_func
        source = self._input._make_iterator()
        workers = resolve_parallelism(self._num_parallel_calls, options)
        if workers is None:
            return _closing(source, self._sequential(source, map_func))
        deterministic = self._deterministic if self._deterministic is not None else options._get("deterministic")
        return ParallelMapIterator(source, lambda element: to_element(_call(map_func, element)), workers,
                                   deterministic, stage="map")

    @staticmethod
    def _sequential(source, map_func):
        for index, element in enumerate(source):
            try:
                result = to_element(_call(map_func, element))
            except Exception as e:
                raise call_failed("map", index, e) from e
            yield result


class _ZipDataset(Dataset):
    def __init__(self, structure):
        self._structure = structure

    def _inputs(self):
        return tuple(d for _, d in flatten_with_paths(self._structure))

    def _compute_element_spec(self):
        return map_structure(lambda d: d.element_spec, self._structure)

    def _make_iterator(self):
        iterators = map_structure(lambda d: d._make_iterator(), self._structure)
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
        super().__init__(input_dataset, None, "same")
        self._buffer_size = buffer_size
        # without a seed, draw one from fl.random's generator: fl.random.set_seed makes it repeatable
        self._seed = int(seed) if seed is not None else int(_random._rng(None).integers(2**62))
        self._reshuffle = reshuffle_each_iteration
        self._epochs = itertools.count()

    def _make_iterator(self):
        seed = [self._seed, next(self._epochs)] if self._reshuffle else self._seed
        source = self._input._make_iterator()
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
        super().__init__(input_dataset, None, "same")
        self._count = count

    def _make_iterator(self):
        return self._run(current_options())

    def _run(self, options):
        epoch = 0
        while self._count < 0 or epoch < self._count:
            with _options_scope(options):
                source = self._input._make_iterator()
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
    def __init__(self, input_dataset):
        super().__init__(input_dataset, None, "same")
        self._cached = None

    def _make_iterator(self):
        if self._cached is not None:
            return iter(self._cached)
        source = self._input._make_iterator()
        return _closing(source, self._fill(source))

    def _fill(self, source):
        elements = []
        for element in source:
            elements.append(element)
            yield element
        self._cached = tuple(elements)    # only a complete pass is kept


class _InterleaveDataset(_Stage):
    def __init__(self, input_dataset, map_func, cycle_length, block_length, num_parallel_calls):
        super().__init__(input_dataset, None)
        self._map_func = map_func
        self._cycle_length = cycle_length
        self._block_length = block_length
        self._num_parallel_calls = num_parallel_calls

    def _make_iterator(self):
        options = current_options()
        cycle = self._cycle_length
        cycle = resolve_parallelism(AUTOTUNE if cycle is None or int(cycle) == AUTOTUNE else cycle, Options())
        parallel = resolve_parallelism(self._num_parallel_calls, options) is not None
        source = self._input._make_iterator()
        return _closing(source, self._run(source, cycle, parallel, options))

    def _open(self, index, element, parallel, options):
        try:
            dataset = _call(self._map_func, element)
        except Exception as e:
            raise call_failed("interleave", index, e) from e
        if not isinstance(dataset, Dataset):
            raise TypeError(f"interleave: map_func must return a Dataset, got {type(dataset).__name__}")
        with _options_scope(options):
            iterator = dataset._make_iterator()
        return PrefetchIterator(iterator, self._block_length, stage="interleave") if parallel else iterator

    def _run(self, source, cycle_length, parallel, options):
        slots = [None] * cycle_length
        index, input_done, i = 0, False, 0
        try:
            while True:
                if slots[i] is None and not input_done:
                    element = next(source, _END)
                    if element is _END:
                        input_done = True
                    else:
                        slots[i] = self._open(index, element, parallel, options)
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
