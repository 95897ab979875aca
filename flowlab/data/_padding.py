"""``padded_batch``: stack elements whose components differ in shape by padding each to a common shape.

``padded_shapes`` and ``padding_values`` follow the element's structure down to its components (a
component's padded shape is itself a list, so it is read as a shape, not as more structure). A
padded dimension of None (or -1) grows to the largest size in the batch; a fixed one must hold every
element's size.
"""
from __future__ import annotations

import numpy as np

from ..core.errors import InvalidArgumentError
from ..core.function import TensorSpec
from ..core.tensor import Tensor
from ._structure import flatten_with_paths, map_structure

__all__ = ["up_to", "as_padded_shape", "pad_components", "pad_batch", "padded_spec"]


def up_to(template, value, what: str, path: str = ""):
    """``value`` cut to ``template``'s structure: [(path, part)] in template leaf order. Where the
    template has structure and ``value`` has none, ``value`` applies to every leaf below (so one
    padding value, or None, serves all components)."""
    if isinstance(template, tuple):
        if isinstance(value, (tuple, list)):
            if len(value) != len(template):
                raise ValueError(f"padded_batch: {what}{path} has {len(value)} parts, but the element has "
                                 f"{len(template)} there")
            return [p for i, (t, v) in enumerate(zip(template, value)) for p in up_to(t, v, what, f"{path}[{i}]")]
        return [(p, value) for p, _ in flatten_with_paths(template, path)]
    if isinstance(template, dict):
        if isinstance(value, dict):
            if value.keys() != template.keys():
                raise ValueError(f"padded_batch: {what}{path} has keys {sorted(value)}, the element has "
                                 f"{sorted(template)}")
            return [p for k in template for p in up_to(template[k], value[k], what, f"{path}[{k!r}]")]
        return [(p, value) for p, _ in flatten_with_paths(template, path)]
    return [(path, value)]


def as_padded_shape(shape, path: str):
    """A component's padded shape as a tuple of int or None, or None for "every dimension grows"."""
    if shape is None:
        return None
    if isinstance(shape, Tensor):
        shape = shape.numpy().tolist()
    try:
        dims = tuple(None if d is None or int(d) == -1 else int(d) for d in shape)
    except TypeError:
        raise ValueError(f"padded_batch: padded_shapes{path} must be a shape (a list of sizes, None or -1), "
                         f"got {shape!r}") from None
    if any(d is not None and d < 0 for d in dims):
        raise ValueError(f"padded_batch: padded_shapes{path} has a negative size: {shape!r}")
    return dims


def padded_spec(spec: TensorSpec, shape, batch) -> TensorSpec:
    dims = [None] * len(spec.shape) if shape is None else list(shape)
    return TensorSpec([batch, *dims], spec.dtype)


def pad_components(column, path: str, shape, value) -> Tensor:
    """Component ``path`` of every element in a batch (``column``), padded and stacked."""
    if not all(isinstance(t, Tensor) for t in column):
        raise InvalidArgumentError(f"padded_batch: only tensors can be padded, but component {path or '(the element)'} "
                                   f"is {type(column[0]).__name__}", op="padded_batch")
    arrays = [np.asarray(t) for t in column]
    where = f"component {path}" if path else "the element"
    ranks = {a.ndim for a in arrays}
    if len(ranks) > 1:
        raise InvalidArgumentError(f"padded_batch: {where} has different ranks in one batch: "
                                   f"{sorted({a.shape for a in arrays})}", op="padded_batch")
    rank = ranks.pop()
    if shape is None:
        shape = (None,) * rank
    elif len(shape) != rank:
        raise InvalidArgumentError(f"padded_batch: padded_shapes for {where} is {list(shape)} (rank {len(shape)}), "
                                   f"but the element has shape {list(arrays[0].shape)} (rank {rank})",
                                   op="padded_batch")
    target = []
    for d, fixed in enumerate(shape):
        largest = max(a.shape[d] for a in arrays)
        if fixed is not None and largest > fixed:
            bad = next(i for i, a in enumerate(arrays) if a.shape[d] > fixed)
            raise InvalidArgumentError(
                f"padded_batch: {where} of element {bad} in the batch has shape {list(arrays[bad].shape)}, "
                f"larger than its padded shape {list(shape)} in dimension {d}", op="padded_batch")
        target.append(largest if fixed is None else fixed)
    dtype = arrays[0].dtype
    try:
        fill = np.asarray(0 if value is None else value, dtype=dtype)
    except (TypeError, ValueError) as e:
        raise InvalidArgumentError(f"padded_batch: padding value {value!r} for {where} does not fit its dtype "
                                   f"{dtype}: {e}", op="padded_batch") from None
    if fill.ndim:
        raise InvalidArgumentError(f"padded_batch: the padding value for {where} must be a scalar, got shape "
                                   f"{list(fill.shape)}", op="padded_batch")
    out = np.full((len(arrays), *target), fill, dtype=dtype)
    for i, a in enumerate(arrays):
        out[(i, *(slice(0, n) for n in a.shape))] = a
    return Tensor(out)


def pad_batch(elements, shapes, values):
    """One padded batch from ``elements`` (a list of same-structured elements); ``shapes`` and
    ``values`` are the per-component lists from ``up_to`` (in leaf order)."""
    columns = [[leaf for _, leaf in flatten_with_paths(e)] for e in elements]
    widths = {len(c) for c in columns}
    if len(widths) > 1:
        raise InvalidArgumentError("padded_batch: elements of one batch have different structures", op="padded_batch")
    leaves = iter([pad_components([c[i] for c in columns], path, shape, value)
                   for i, ((path, shape), (_, value)) in enumerate(zip(shapes, values))])
    return map_structure(lambda _: next(leaves), elements[0])
