"""Data types: a thin, named wrapper over numpy dtypes (``fl.float32`` reads like ``tf.float32``)."""
from __future__ import annotations

import numpy as np

__all__ = ["DType", "as_dtype", "bool_", "int8", "int16", "int32", "int64", "uint8",
           "float16", "float32", "float64", "default_float", "default_int"]


class DType:
    """A tensor element type. Compares equal to its name, its numpy dtype and itself.

    >>> import flowlab as fl
    >>> fl.float32 == "float32", fl.float32.is_floating
    (True, True)
    """

    __slots__ = ("name", "as_numpy_dtype")

    def __init__(self, np_dtype):
        self.as_numpy_dtype = np.dtype(np_dtype)
        self.name = "bool" if self.as_numpy_dtype.kind == "b" else self.as_numpy_dtype.name

    is_floating = property(lambda self: self.as_numpy_dtype.kind == "f")
    is_integer = property(lambda self: self.as_numpy_dtype.kind in "iu")
    is_bool = property(lambda self: self.as_numpy_dtype.kind == "b")
    size = property(lambda self: self.as_numpy_dtype.itemsize)

    @property
    def min(self):
        return np.finfo(self.as_numpy_dtype).min if self.is_floating else np.iinfo(self.as_numpy_dtype).min

    @property
    def max(self):
        return np.finfo(self.as_numpy_dtype).max if self.is_floating else np.iinfo(self.as_numpy_dtype).max

    def __eq__(self, other):
        if other is None:
            return False
        try:
            return self.as_numpy_dtype == as_dtype(other).as_numpy_dtype
        except TypeError:
            return NotImplemented

    def __hash__(self):
        return hash(self.as_numpy_dtype)

    def __repr__(self):
        return f"fl.{self.name}"

    def __reduce__(self):
        return as_dtype, (self.name,)


_BY_NUMPY: dict[np.dtype, DType] = {}


def _register(np_dtype) -> DType:
    d = DType(np_dtype)
    _BY_NUMPY[d.as_numpy_dtype] = d
    return d


bool_ = _register(np.bool_)
int8, int16, int32, int64 = (_register(t) for t in (np.int8, np.int16, np.int32, np.int64))
uint8 = _register(np.uint8)
float16, float32, float64 = (_register(t) for t in (np.float16, np.float32, np.float64))
default_float, default_int = float32, int32


def as_dtype(value) -> DType:
    """Return the DType for ``value``: a DType, a name ("float32"), a numpy dtype or scalar type."""
    if isinstance(value, DType):
        return value
    if value is None:
        raise TypeError("a dtype is required here, got None")
    try:
        np_dtype = np.dtype(value)
        d = _BY_NUMPY.get(np_dtype) or _BY_NUMPY.get(np_dtype.newbyteorder("="))
    except TypeError:
        d = None
    if d is None:
        raise TypeError(f"flowlab has no dtype for {value!r}; use one of "
                        f"{', '.join(sorted(x.name for x in _BY_NUMPY.values()))}")
    return d


def numpy_dtype(value) -> np.dtype:
    """Fast path for internals: ``None`` stays ``None``, anything else becomes a numpy dtype."""
    return None if value is None else as_dtype(value).as_numpy_dtype
