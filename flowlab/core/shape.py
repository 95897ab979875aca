"""TensorShape: a tuple of dimensions, where ``None`` is a dimension not known until run time."""
from __future__ import annotations

__all__ = ["TensorShape"]


class TensorShape(tuple):
    """The shape of a tensor. It is a tuple, so ``t.shape == (2, 3)`` and ``t.shape[0]`` just work.

    >>> import flowlab as fl
    >>> fl.zeros([2, 3]).shape.as_list()
    [2, 3]
    """

    __slots__ = ()

    def __new__(cls, dims=()):
        if dims is None:
            raise ValueError("TensorShape(None) (unknown rank) is not supported; give the dimensions")
        return super().__new__(cls, (None if d is None else int(d) for d in dims))

    rank = property(len)

    def as_list(self) -> list:
        return list(self)

    def num_elements(self):
        """Number of elements, or None when a dimension is unknown."""
        n = 1
        for d in self:
            if d is None:
                return None
            n *= d
        return n

    def is_fully_defined(self) -> bool:
        return None not in self

    def is_compatible_with(self, other) -> bool:
        other = TensorShape(other)
        return len(self) == len(other) and all(a is None or b is None or a == b for a, b in zip(self, other))

    def __getitem__(self, key):
        out = tuple.__getitem__(self, key)
        return TensorShape(out) if isinstance(key, slice) else out

    def __repr__(self):
        return f"TensorShape({list(self)})"
