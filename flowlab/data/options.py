"""``fl.data.Options``: settings that apply to a whole pipeline, as ``tf.data.Options``.

Every field starts unset (None) and means its default; ``ds.with_options(o)`` merges ``o`` over the
options already in the pipeline (set fields win), and the merged options take effect when the
pipeline is iterated, so ``with_options`` may come last.

>>> import flowlab as fl
>>> options = fl.data.Options()
>>> options.deterministic = False
>>> options.threading.private_threadpool_size = 2
>>> ds = fl.data.Dataset.range(4).map(lambda x: x * 2, num_parallel_calls=fl.data.AUTOTUNE)
>>> sorted(int(x) for x in ds.with_options(options))
[0, 2, 4, 6]
"""
from __future__ import annotations

import enum
import os
from typing import NamedTuple

__all__ = ["AUTOTUNE", "Options", "AutotuneOptions", "StatsOptions", "ThreadingOptions", "DistributeOptions",
           "OptimizationOptions", "AutoShardPolicy"]

#: Pass as a map's parallelism or a prefetch buffer size to let flowlab choose. The stage starts small
#: (1 worker, 1 element) and grows while its consumer waits on it, within ``Options.autotune``'s limits
#: (see ``flowlab/data/autotune.py``). With ``options.autotune.enabled = False`` it is a fixed default
#: instead: a worker per core, 2 elements. A parallel interleave reads its cycle with one thread each.
AUTOTUNE = -1


class _Group:
    _fields: dict = {}     # field name -> default

    def __init__(self, **values):
        for name in self._fields:
            object.__setattr__(self, name, None)
        for name, value in values.items():
            setattr(self, name, value)

    _hints: dict = {}      # a name TensorFlow had here once -> where it lives now

    def __setattr__(self, name, value):
        if name not in self._fields:
            hint = self._hints.get(name)
            raise AttributeError(f"{type(self).__name__} has no option {name!r}; "
                                 + (f"{hint}" if hint else f"options: {', '.join(self._fields)}"))
        object.__setattr__(self, name, value)

    def _get(self, name):
        value = getattr(self, name)
        return self._fields[name] if value is None else value

    def _merge(self, other):
        merged = type(self)()
        for name in self._fields:
            mine, theirs = getattr(self, name), getattr(other, name)
            if isinstance(mine, _Group):
                object.__setattr__(merged, name, mine._merge(theirs))
            else:
                object.__setattr__(merged, name, mine if theirs is None else theirs)
        return merged

    def __eq__(self, other):
        return type(self) is type(other) and all(getattr(self, n) == getattr(other, n) for n in self._fields)

    def __repr__(self):
        set_fields = ", ".join(f"{n}={getattr(self, n)!r}" for n in self._fields if getattr(self, n) is not None)
        return f"{type(self).__name__}({set_fields})"


class AutotuneOptions(_Group):
    """``enabled`` (default True): whether AUTOTUNE stages adjust themselves while they run (if not,
    AUTOTUNE means a fixed default). ``cpu_budget``: the most workers AUTOTUNE gives one stage (0: one
    per usable core). ``ram_budget``: the most bytes AUTOTUNE lets the buffers it grows hold, over the
    whole pipeline (0: half the physical memory). ``max_buffer_size`` (default 64): the largest prefetch
    buffer AUTOTUNE picks."""
    _fields = {"enabled": True, "cpu_budget": 0, "ram_budget": 0, "max_buffer_size": 64}


class StatsOptions(_Group):
    """``enabled`` (default True): every stage counts its elements, produce and wait times (read them
    with ``dataset.stats()``). ``events`` (default True): also record one event per element and stage
    (kinds "produce" and "wait") for a timeline. ``log``: the ``EventLog`` to record into (None: the
    process's ``flowlab.core.events.default_log()``). AUTOTUNE decisions are always recorded."""
    _fields = {"enabled": True, "events": True, "log": None}


class ThreadingOptions(_Group):
    """``private_threadpool_size``: the most threads any one parallel stage starts (0: no limit).
    ``max_intra_op_parallelism`` is accepted for TensorFlow compatibility and not used: a flowlab op
    runs on one thread of the pipeline (numpy's BLAS threads are set by ``FLOWLAB_BLAS_THREADS``)."""
    _fields = {"private_threadpool_size": 0, "max_intra_op_parallelism": 1}


class AutoShardPolicy(enum.IntEnum):
    """How ``strategy.experimental_distribute_dataset`` splits a pipeline's input over worker
    processes (set it in ``Options().experimental_distribute.auto_shard_policy``; what each one does
    is in :mod:`flowlab.distribute.input`). With one worker process every policy reads the same.

    - ``AUTO`` (the default): every worker reads the global batches and keeps its replicas' slices.
    - ``FILE``: every worker reads only its share of the input files.
    - ``DATA``: every worker reads everything and keeps every ``num_workers``-th element.
    - ``OFF``: no sharding; each worker's batches are its own."""
    OFF = -1
    AUTO = 0
    FILE = 1
    DATA = 2


class DistributeOptions(_Group):
    """``auto_shard_policy`` (default ``AutoShardPolicy.AUTO``): how a distribution strategy splits the
    pipeline over worker processes (see :class:`AutoShardPolicy`)."""
    _fields = {"auto_shard_policy": AutoShardPolicy.AUTO}

    def __setattr__(self, name, value):
        if name == "auto_shard_policy" and value is not None:
            try:
                value = AutoShardPolicy(value) if not isinstance(value, str) else AutoShardPolicy[value.upper()]
            except (KeyError, ValueError):
                raise ValueError(f"auto_shard_policy must be one of fl.data.AutoShardPolicy "
                                 f"{[p.name for p in AutoShardPolicy]}, got {value!r}") from None
        super().__setattr__(name, value)


class OptimizationOptions(_Group):
    """``Options().experimental_optimization``: the graph rewrites TensorFlow may apply to a pipeline.
    Every field TensorFlow's tutorials set is accepted (True, False or None); what each does here:

    - ``map_parallelization``: **honoured**. True turns every sequential ``map`` (no
      ``num_parallel_calls``) into a parallel one sized by AUTOTUNE, in threads, keeping the element
      order unless ``Options.deterministic`` is False. Off by default (TensorFlow turns it on by
      default, for functions it can prove stateless; flowlab cannot look inside a Python function,
      so it is yours to ask for): the function is then called from several threads at once, so it
      must not change shared Python state (a counter, a list it appends to, a random generator
      whose draws must come in element order). Maps with ``use_processes=True`` are left as written.
    - ``apply_default_optimizations``: accepted; flowlab applies no rewrite unless asked, so False
      changes nothing.
    - ``noop_elimination``: accepted; the stages it would remove (``take(-1)``, ``skip(0)``,
      ``repeat(1)``, ``prefetch(0)``, ``shard(1, 0)``) already hand elements straight through.
    - ``map_and_batch_fusion``, ``map_fusion``, ``map_and_filter_fusion``, ``filter_fusion``,
      ``shuffle_and_repeat_fusion``, ``parallel_batch``, ``filter_parallelization``,
      ``inject_prefetch``, ``hoist_random_uniform``, ``seq_interleave_prefetch``, ``warm_start``:
      accepted, no effect. Fusions save TensorFlow a function call between C++ kernels, which a
      Python pipeline does not have; ``batch`` is one ``np.stack`` at memory speed; add a
      ``prefetch`` yourself where you want one.
    """
    _fields = {"map_parallelization": False, "apply_default_optimizations": True, "noop_elimination": True,
               "map_and_batch_fusion": True, "map_fusion": False, "map_and_filter_fusion": False,
               "filter_fusion": False, "shuffle_and_repeat_fusion": True, "parallel_batch": False,
               "filter_parallelization": False, "inject_prefetch": False, "hoist_random_uniform": False,
               "seq_interleave_prefetch": False, "warm_start": False}
    _hints = {name: "AUTOTUNE settings moved to Options().autotune (enabled, cpu_budget, ram_budget) in TensorFlow "
              "2.x, and live there in flowlab too"
              for name in ("autotune", "autotune_buffers", "autotune_cpu_budget", "autotune_ram_budget")}
    _hints["map_vectorization"] = "TensorFlow removed map_vectorization; batch before a map instead"

    def __setattr__(self, name, value):
        if name in self._fields and value is not None and not isinstance(value, bool):
            raise TypeError(f"experimental_optimization.{name} takes True, False or None, got {value!r}")
        super().__setattr__(name, value)


class Options(_Group):
    """Pipeline-wide settings. ``deterministic`` (default True): whether parallel stages keep input order
    when their own ``deterministic`` argument is None. ``autotune``, ``stats``, ``threading``,
    ``experimental_distribute``, ``experimental_optimization``: groups above.

    TensorFlow's older names work too: ``experimental_deterministic`` is ``deterministic``,
    ``experimental_threading`` is ``threading``. ``experimental_slack`` and
    ``experimental_external_state_policy`` are accepted and have no effect.
    """
    _fields = {"deterministic": True, "autotune": None, "stats": None, "threading": None,
               "experimental_distribute": None, "experimental_optimization": None,
               "experimental_slack": False, "experimental_external_state_policy": None}
    _aliases = {"experimental_deterministic": "deterministic", "experimental_threading": "threading"}
    _hints = {"experimental_stats": "statistics are always on in flowlab; turn them off with Options().stats.enabled",
              "experimental_distribute_policy": "use Options().experimental_distribute.auto_shard_policy"}

    def __init__(self, **values):
        super().__init__()
        object.__setattr__(self, "autotune", AutotuneOptions())
        object.__setattr__(self, "stats", StatsOptions())
        object.__setattr__(self, "threading", ThreadingOptions())
        object.__setattr__(self, "experimental_distribute", DistributeOptions())
        object.__setattr__(self, "experimental_optimization", OptimizationOptions())
        for name, value in values.items():
            setattr(self, name, value)

    def __getattr__(self, name):          # only for names that are not fields: the old aliases
        alias = type(self)._aliases.get(name)
        if alias is None:
            raise AttributeError(f"Options has no option {name!r}; options: {', '.join(self._fields)}")
        return getattr(self, alias)

    def __setattr__(self, name, value):
        if name in self._aliases:
            name = self._aliases[name]
            if name == "threading":
                if not isinstance(value, ThreadingOptions):
                    raise TypeError(f"experimental_threading takes fl.data.ThreadingOptions, got {type(value).__name__}")
        if name in ("autotune", "stats", "threading", "experimental_distribute", "experimental_optimization"):
            expected = type(getattr(self, name))
            if not isinstance(value, expected):
                raise TypeError(f"Options.{name} is a group of settings ({expected.__name__}): set its fields, "
                                f"e.g. options.{name}.<field> = ...; got {type(value).__name__}")
        super().__setattr__(name, value)

    def merge(self, other: "Options") -> "Options":
        """A new Options: ``other``'s set fields over this one's."""
        return self._merge(other)


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def ram_budget(options: Options) -> int:
    """``options.autotune.ram_budget`` in bytes, or half the physical memory when it is 0."""
    budget = int(options.autotune._get("ram_budget"))
    if budget > 0:
        return budget
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2
    except (AttributeError, OSError, ValueError):
        return 1 << 31


class Parallelism(NamedTuple):
    """How many workers a stage starts with and the most it may grow to (``tuned``: AUTOTUNE will)."""
    start: int
    limit: int
    tuned: bool


def resolve_parallelism(value, options: Options) -> Parallelism | None:
    """What ``num_parallel_calls=value`` (None, a count or AUTOTUNE) means under ``options``: None for a
    sequential stage."""
    if value is None:
        return None
    value = int(value)
    threads = options.threading._get("private_threadpool_size")
    if value == AUTOTUNE:
        limit = options.autotune._get("cpu_budget") or usable_cores()
        limit = min(limit, threads) if threads else limit
        if options.autotune._get("enabled"):
            return Parallelism(1, limit, True)
        return Parallelism(limit, limit, False)
    if value < 1:
        raise ValueError(f"num_parallel_calls must be a positive count or fl.data.AUTOTUNE, got {value}")
    value = min(value, threads) if threads else value
    return Parallelism(value, value, False)


def resolve_buffer_size(value, options: Options, stage: str = "prefetch") -> Parallelism:
    """What ``buffer_size=value`` (a count >= 0 or AUTOTUNE) means: the same triple, in elements."""
    value = int(value)
    if value == AUTOTUNE:
        if options.autotune._get("enabled"):
            return Parallelism(1, max(1, int(options.autotune._get("max_buffer_size"))), True)
        return Parallelism(2, 2, False)
    if value < 0:
        raise ValueError(f"{stage}: buffer_size must be >= 0 or fl.data.AUTOTUNE, got {value}")
    return Parallelism(value, value, False)
