"""Values with one component per replica, and helpers over nested structures."""
from __future__ import annotations

__all__ = ["PerReplica", "map_structure", "flatten"]


class PerReplica:
    """One value per replica of this process (``values[i]`` for local replica ``i``), as what
    ``strategy.run`` returns and what a distributed dataset yields.

    ``@fl.function`` takes it apart into its components (``_flowlab_components_``): each
    component's tensors become arguments of their own, and a trace is keyed by every replica's
    shapes and dtypes (a distributed batch passed to a traced function is fed, not baked in). It is
    deliberately not a tuple: ``x, y = batch`` on a distributed batch would silently give replica 0
    and replica 1. Inside ``strategy.run`` each replica sees its own component."""

    __slots__ = ("values",)

    def __init__(self, values):
        self.values = tuple(values)

    def __len__(self):
        return len(self.values)

    def _flowlab_components_(self) -> tuple:
        return self.values

    @classmethod
    def _flowlab_from_components_(cls, parts) -> "PerReplica":
        return cls(parts)

    def __reduce__(self):
        return (PerReplica, (self.values,))

    def __repr__(self):
        inner = ",\n".join(f"  {i}: {v!r}" for i, v in enumerate(self.values))
        return f"PerReplica({{\n{inner}\n}})"


def map_structure(fn, value):
    """``fn`` applied to every leaf of tuples, lists and dicts (the structure is kept)."""
    if isinstance(value, tuple) and hasattr(value, "_fields"):      # namedtuple
        return type(value)(*(map_structure(fn, v) for v in value))
    if isinstance(value, (tuple, list)):
        return type(value)(map_structure(fn, v) for v in value)
    if isinstance(value, dict):
        return {k: map_structure(fn, v) for k, v in value.items()}
    return fn(value)


def flatten(value) -> list:
    """The leaves of a nested structure, in order."""
    out = []
    map_structure(out.append, value)
    return out
