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

import os

__all__ = ["AUTOTUNE", "Options", "AutotuneOptions", "ThreadingOptions"]

#: Pass as a parallelism or buffer size to let flowlab choose. For now the choice is a fixed default
#: (map and interleave: the core count; prefetch: 2 elements); tuning from measured throughput comes later.
AUTOTUNE = -1


class _Group:
    _fields: dict = {}     # field name -> default

    def __init__(self, **values):
        for name in self._fields:
            object.__setattr__(self, name, None)
        for name, value in values.items():
            setattr(self, name, value)

    def __setattr__(self, name, value):
        if name not in self._fields:
            raise AttributeError(f"{type(self).__name__} has no option {name!r}; options: {', '.join(self._fields)}")
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
    """``enabled`` (default True): whether AUTOTUNE may adjust stages. ``cpu_budget``: the most cores
    AUTOTUNE gives one stage (0: all of them)."""
    _fields = {"enabled": True, "cpu_budget": 0}


class ThreadingOptions(_Group):
    """``private_threadpool_size``: the most threads any one parallel stage starts (0: no limit).
    ``max_intra_op_parallelism`` is accepted for TensorFlow compatibility and not used."""
    _fields = {"private_threadpool_size": 0, "max_intra_op_parallelism": 1}


class Options(_Group):
    """Pipeline-wide settings. ``deterministic`` (default True): whether parallel stages keep input order
    when their own ``deterministic`` argument is None. ``autotune``, ``threading``: groups above."""
    _fields = {"deterministic": True, "autotune": None, "threading": None}

    def __init__(self, **values):
        super().__init__()
        object.__setattr__(self, "autotune", AutotuneOptions())
        object.__setattr__(self, "threading", ThreadingOptions())
        for name, value in values.items():
            setattr(self, name, value)

    def merge(self, other: "Options") -> "Options":
        """A new Options: ``other``'s set fields over this one's."""
        return self._merge(other)


def resolve_parallelism(value, options: Options, default=None) -> int | None:
    """How many threads a stage asked for ``value`` (None, a count or AUTOTUNE) really starts."""
    if value is None:
        return None
    value = int(value)
    if value == AUTOTUNE:
        value = default or os.cpu_count() or 1
        budget = options.autotune._get("cpu_budget")
        value = min(value, budget) if budget else value
    elif value < 1:
        raise ValueError(f"num_parallel_calls must be a positive count or fl.data.AUTOTUNE, got {value}")
    limit = options.threading._get("private_threadpool_size")
    return min(value, limit) if limit else value
