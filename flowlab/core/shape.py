"""TensorShape: a tuple of dimensions, where ``None`` is a dimension not known until run time;
``TensorShape(None)`` is a shape whose rank is not known either (``tf.placeholder(tf.float32)``)."""
from __future__ import annotations

__all__ = ["TensorShape"]


class TensorShape(tuple):
    """The shape of a tensor. It is a tuple, so ``t.shape == (2, 3)`` and ``t.shape[0]`` just work.

    >>> import flowlab as fl
    >>> fl.zeros([2, 3]).shape.as_list()
    [2, 3]
    >>> s = fl.TensorShape(None)      # unknown rank
    >>> s.rank is None, str(s), s.is_compatible_with([2, 3])
    (True, '<unknown>', True)
    """

    __slots__ = ()

    def __new__(cls, dims=()):
        if dims is None or dims.__class__ is _UnknownRank:
            return UNKNOWN_RANK
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
        if other.rank is None:
            return True
        return len(self) == len(other) and all(a is None or b is None or a == b for a, b in zip(self, other))

    def __getitem__(self, key):
        out = tuple.__getitem__(self, key)
        return TensorShape(out) if isinstance(key, slice) else out

    def __repr__(self):
        return f"TensorShape({list(self)})"


class _UnknownRank(TensorShape):
    """The one shape of unknown rank: any shape fits it. Asking for its length, its dimensions as a
    list, or iterating it raises ValueError (as TensorFlow does): there is nothing to list."""

    __slots__ = ()
    rank = None

    def _no_dims(self, what):
        raise ValueError(f"{what} is not defined on a shape of unknown rank (TensorShape(None)); check "
                         "`shape.rank is None` first, or give the tensor a shape")

    def __len__(self):
        self._no_dims("len()")

    def __iter__(self):
        self._no_dims("iterating")

    def as_list(self):
        self._no_dims("as_list()")

    def __bool__(self):
        return False

    def __getitem__(self, key):
        return self if isinstance(key, slice) else None

    def num_elements(self):
        return None

    def is_fully_defined(self):
        return False

    def is_compatible_with(self, other):
        return True

    def __eq__(self, other):
        return other.__class__ is _UnknownRank

    def __ne__(self, other):
        return other.__class__ is not _UnknownRank

    def __hash__(self):
        return hash("TensorShape(None)")

    def __reduce__(self):
        return TensorShape, (None,)

    def __repr__(self):
        return "TensorShape(None)"

    def __str__(self):
        return "<unknown>"


UNKNOWN_RANK = tuple.__new__(_UnknownRank, ())
