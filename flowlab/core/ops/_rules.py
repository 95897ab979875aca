"""Shape rules shared by many ops. A rule takes input specs (anything with ``.shape`` and
``.dtype``: eager tensors, graph tensors, TensorSpecs) plus the op's attributes and returns
``(shape, numpy dtype)``, or raises InvalidArgumentError saying what does not fit."""
from __future__ import annotations

from itertools import zip_longest

import numpy as np

from ..dtypes import numpy_dtype
from ..errors import InvalidArgumentError

BOOL = np.dtype(np.bool_)


def spec(x):
    """(shape tuple, numpy dtype) of a tensor or spec; eager tensors without building a TensorShape.
    The shape is None when the rank is unknown (shape rules never see that: ``Graph.add_node``)."""
    v = getattr(x, "_value", None)
    if v is not None:
        return v.shape, v.dtype
    return shape_of(x), numpy_dtype(x.dtype)


def shape_of(x):
    """The shape tuple of a tensor or spec, or None when its rank is unknown."""
    v = getattr(x, "_value", None)
    if v is not None:
        return v.shape
    s = x.shape
    return None if getattr(s, "rank", 0) is None else tuple(s)


def fail(message: str):
    raise InvalidArgumentError(message)


def norm_axis(axis: int, rank: int, what="axis") -> int:
    if not -rank <= axis < max(rank, 1):
        fail(f"{what} {axis} is out of range for a tensor of rank {rank} (valid: {-rank}..{rank - 1})")
    return axis % rank if rank else 0


def broadcast_shapes(a, b):
    """numpy broadcasting, where None is an unknown dimension."""
    out = []
    for da, db in zip_longest(reversed(a), reversed(b), fillvalue=1):
        if da == 1 or da == db:
            out.append(db)
        elif db == 1:
            out.append(da)
        elif da is None or db is None:
            out.append(da if db is None else db)
        else:
            fail(f"incompatible shapes {tuple(a)} and {tuple(b)}: dimension {da} cannot broadcast with {db}")
    return tuple(reversed(out))


def same(x, **_):
    return spec(x)


def floating(x, **_):
    shape, dtype = spec(x)
    if dtype.kind != "f":
        fail(f"needs a floating-point input, got {dtype.name}; use fl.cast(x, fl.float32)")
    return shape, dtype


def elementwise(*xs):
    specs = [spec(x) for x in xs]
    dtype = specs[0][1]
    for _, d in specs[1:]:
        if d != dtype:
            fail(f"inputs must have the same dtype, got {', '.join(d.name for _, d in specs)}")
    shape = ()
    for s, _ in specs:
        shape = broadcast_shapes(shape, s)
    return shape, dtype


def compare(x, y):
    return elementwise(x, y)[0], BOOL


def logical(*xs):
    for x in xs:
        if spec(x)[1] != BOOL:
            fail(f"needs bool inputs, got {spec(x)[1].name}")
    return elementwise(*xs)


def same_shape(a, b) -> bool:
    """Shapes that can be equal: the same rank, and equal where both dimensions are known."""
    return len(a) == len(b) and all(x is None or y is None or x == y for x, y in zip(a, b))


def reduce(x, axis=None, keepdims=False, dtype=None):
    shape, xdtype = spec(x)
    if axis is None:
        axes = set(range(len(shape)))
    else:
        axes = {norm_axis(a, len(shape)) for a in axis}
    out = tuple(1 if i in axes else d for i, d in enumerate(shape) if keepdims or i not in axes)
    return out, (xdtype if dtype is None else np.dtype(dtype))
