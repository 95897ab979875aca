"""Elements of a dataset are nested structures: tuples (and namedtuples) and dicts whose leaves are
tensors (or bytes / str). These helpers walk, convert and describe them; every stage uses them, and so
do the worker processes of a process-pool map, which is why they live apart from ``dataset.py``.
"""
from __future__ import annotations

import numpy as np

from ..core.function import TensorSpec
from ..core.tensor import Tensor, convert_to_tensor

__all__ = ["map_structure", "flatten_with_paths", "describe", "lists_to_tuples", "leaf_to_tensor",
           "to_element", "spec_of", "call", "to_wire", "from_wire", "nbytes"]


def map_structure(fn, *structures):
    """``fn`` over the leaves of same-shaped structures, rebuilding the first one's shape."""
    first = structures[0]
    if isinstance(first, tuple):
        if any(not isinstance(s, tuple) or len(s) != len(first) for s in structures):
            raise ValueError(f"structures do not match: {[describe(s) for s in structures]}")
        items = [map_structure(fn, *parts) for parts in zip(*structures)]
        return type(first)(*items) if hasattr(first, "_fields") else tuple(items)
    if isinstance(first, dict):
        if any(not isinstance(s, dict) or s.keys() != first.keys() for s in structures):
            raise ValueError(f"structures do not match: {[describe(s) for s in structures]}")
        return {k: map_structure(fn, *(s[k] for s in structures)) for k in first}
    return fn(*structures)


def flatten_with_paths(structure, path=""):
    """[(path, leaf)], paths written as in Python: ``[0]['image']``."""
    if isinstance(structure, tuple):
        return [p for i, s in enumerate(structure) for p in flatten_with_paths(s, f"{path}[{i}]")]
    if isinstance(structure, dict):
        return [p for k, s in structure.items() for p in flatten_with_paths(s, f"{path}[{k!r}]")]
    return [(path, structure)]


def describe(structure):
    return map_structure(lambda t: f"{t.dtype.name}{list(t.shape)}" if hasattr(t, "dtype") else type(t).__name__,
                         structure)


def lists_to_tuples(x):
    # NOTE: as tf.data does for a function's output: a list is a structure there, not a tensor
    if isinstance(x, list):
        return tuple(lists_to_tuples(v) for v in x)
    if isinstance(x, tuple):
        items = [lists_to_tuples(v) for v in x]
        return type(x)(*items) if hasattr(x, "_fields") else tuple(items)
    if isinstance(x, dict):
        return {k: lists_to_tuples(v) for k, v in x.items()}
    return x


def leaf_to_tensor(x):
    # NOTE: bytes and str stay as they are (flowlab has no string dtype): record payloads are bytes,
    # and several byte strings are a numpy object array of bytes (a batch of records, a parsed
    # fl.string feature with a shape); those stay numpy arrays too
    if isinstance(x, (Tensor, bytes, str)) or (type(x) is np.ndarray and x.dtype.kind == "O"):
        return x
    if x is None:
        raise TypeError("a dataset element cannot hold None; return a tensor, an array or a number")
    return convert_to_tensor(x)


def to_element(value):
    """A function's output as an element: lists become tuples, leaves become tensors. (One walk
    doing what ``map_structure(leaf_to_tensor, lists_to_tuples(value))`` does: it runs per element.)"""
    kind = type(value)
    if kind is Tensor:
        return value
    if kind is tuple or kind is list:
        return tuple([to_element(v) for v in value])
    if kind is np.ndarray:
        return value if value.dtype.kind == "O" else convert_to_tensor(value)
    if isinstance(value, tuple):
        items = [to_element(v) for v in value]
        return kind(*items) if hasattr(value, "_fields") else tuple(items)
    if isinstance(value, list):
        return tuple([to_element(v) for v in value])
    if isinstance(value, dict):
        return {k: to_element(v) for k, v in value.items()}
    return leaf_to_tensor(value)


def spec_of(element):
    """The nested TensorSpec of an element (the Python type for a bytes or str component)."""
    return map_structure(lambda t: TensorSpec(t.shape, t.dtype) if isinstance(t, Tensor) else type(t), element)


def call(fn, element):
    # NOTE: a plain tuple is passed as separate arguments, as tf.data does; a namedtuple or dict is not
    return fn(*element) if type(element) is tuple else fn(element)


def to_wire(element):
    """The element with every tensor as a plain numpy array: what crosses a process boundary."""
    return map_structure(lambda t: t.__array__() if isinstance(t, Tensor) else t, element)


def from_wire(element):
    """The inverse of ``to_wire``: numpy arrays become tensors again."""
    return map_structure(lambda v: Tensor(v) if isinstance(v, np.ndarray) and v.dtype.kind != "O" else v, element)


def nbytes(element) -> int:
    """Bytes held by an element's leaves (tensors, arrays, bytes, str)."""
    total = 0
    for _, leaf in flatten_with_paths(element):
        value = leaf._value if isinstance(leaf, Tensor) else leaf
        total += getattr(value, "nbytes", None) or (len(value) if isinstance(value, (bytes, str)) else 0)
    return total
