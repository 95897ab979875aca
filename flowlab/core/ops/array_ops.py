"""Shape manipulation, indexing, gathering and tensor creation."""
from __future__ import annotations

import builtins

import numpy as np

from .. import dtypes
from ..backends import array_module
from ..errors import InvalidArgumentError
from ..execute import defop, execute, op_error, unary
from ..tensor import Tensor, _python_array, convert_to_tensor, in_scope
from . import _rules as R
from . import reduction_ops

_builtin_slice = builtins.slice  # NOTE: this module defines fl.slice, which shadows the builtin


def _ints(shape):
    if isinstance(shape, Tensor):
        shape = shape.numpy().tolist()
    if isinstance(shape, (int, np.integer)):
        return (int(shape),)
    return tuple(int(d) for d in shape)


def unbroadcast(g, shape, like=None):
    """Sum a broadcast gradient back down to ``shape`` (the shape of the input ``like`` it flowed
    from). An unknown (None) dimension is taken as not broadcast; when either rank is unknown, the
    sum is left to run time (``sum_to_like``)."""
    gshape = R.shape_of(g)
    if shape is None or gshape is None:
        return execute(_sum_to_op, (g, like))
    if gshape == shape:
        return g
    lead = len(gshape) - len(shape)
    if lead:
        g = reduction_ops.sum_over(g, tuple(builtins.range(lead)))
    ones = tuple(i for i, d in enumerate(shape) if d == 1 and gshape[lead + i] != 1)
    if ones:
        g = reduction_ops.sum_over(g, ones, keepdims=True)
    return g


def _sum_to_kernel(g, x):
    if g.shape == x.shape:
        return g
    lead = g.ndim - x.ndim
    axes = (*builtins.range(lead), *(lead + i for i, d in enumerate(x.shape) if d == 1 and g.shape[lead + i] != 1))
    return g.sum(axis=axes, dtype=g.dtype).reshape(x.shape)


def _sum_to_grad(c, gg):
    from .math_ops import zeros_like
    return gg + zeros_like(c.inputs[0]), None   # spread back over g's shape: broadcasting does it


_sum_to_op = defop("sum_to_like", _sum_to_kernel, lambda g, x: (R.spec(x)[0], R.spec(g)[1]), _sum_to_grad,
                   doc="g summed down to the shape x has when the graph runs (gradients of broadcasting ops).")
_reshape_like_op = defop("reshape_like", lambda g, x: g.reshape(x.shape), lambda g, x: (R.spec(x)[0], R.spec(g)[1]),
                         lambda c, gg: (reshape_like(gg, c.inputs[0]), None),
                         doc="g with the shape x has when the graph runs (for gradients of reshapes).")


def reshape_like(g, x):
    """``g`` reshaped to ``x``'s shape at run time (works when dimensions are unknown while tracing)."""
    return execute(_reshape_like_op, (g, x))


# -- reshape, broadcast_to, transpose, expand_dims, squeeze -----------------------------------
def _reshape_rule(x, shape):
    xshape, dtype = R.spec(x)
    known = [d for d in shape if d != -1]
    if builtins.sum(1 for d in shape if d == -1) > 1:
        R.fail(f"at most one dimension may be -1, got {shape}")
    n = int(np.prod(xshape)) if None not in xshape else None
    if n is not None:
        k = int(np.prod(known))
        if (-1 in shape and (k == 0 or n % k)) or (-1 not in shape and k != n):
            R.fail(f"cannot reshape a tensor of shape {tuple(xshape)} ({n} elements) into shape {tuple(shape)}")
        return tuple(n // k if d == -1 else d for d in shape), dtype
    return tuple(None if d == -1 else d for d in shape), dtype


_reshape_op = defop("reshape", lambda x, shape: np.reshape(x, shape), _reshape_rule,
                    lambda c, g: (reshape_like(g, c.inputs[0]),))


def reshape(tensor, shape, name=None):
    """The same elements in a new shape; one dimension may be -1 (inferred).

    >>> import flowlab as fl
    >>> fl.reshape(fl.range(6), [2, -1]).shape
    TensorShape([2, 3])
    """
    return execute(_reshape_op, (tensor,), {"shape": _ints(shape)})


def _broadcast_to_rule(x, shape):
    xshape, dtype = R.spec(x)
    out = R.broadcast_shapes(xshape, shape)
    if tuple(out) != tuple(shape):
        R.fail(f"cannot broadcast shape {tuple(xshape)} to {tuple(shape)}")
    return out, dtype


_broadcast_to_op = defop("broadcast_to", lambda x, shape: np.broadcast_to(x, shape), _broadcast_to_rule,
                         lambda c, g: (unbroadcast(g, R.shape_of(c.inputs[0]), c.inputs[0]),))


def broadcast_to(input, shape, name=None):  # noqa: A002 - TF's signature
    """Repeat ``input`` along size-1 (or missing leading) axes to reach ``shape``."""
    return execute(_broadcast_to_op, (input,), {"shape": _ints(shape)})


def _transpose_rule(x, perm):
    shape, dtype = R.spec(x)
    perm = builtins.range(len(shape) - 1, -1, -1) if perm is None else perm   # None: reverse (rank unknown)
    if sorted(perm) != list(builtins.range(len(shape))):
        R.fail(f"perm {list(perm)} is not a permutation of the {len(shape)} axes of shape {tuple(shape)}")
    return tuple(shape[p] for p in perm), dtype


_transpose_op = defop("transpose", lambda x, perm: np.transpose(x, perm), _transpose_rule,
                      lambda c, g: (transpose(g, c.attrs["perm"] and tuple(np.argsort(c.attrs["perm"]).tolist())),))


def transpose(a, perm=None, name=None):
    """Permute the axes (reverse them when ``perm`` is None)."""
    if perm is None and R.shape_of(convert_to_tensor(a)) is None:
        return execute(_transpose_op, (a,), {"perm": None})
    if perm is None:
        perm = tuple(builtins.range(len(R.shape_of(convert_to_tensor(a))) - 1, -1, -1))
    return execute(_transpose_op, (a,), {"perm": _ints(perm)})


def _expand_rule(x, axis):
    shape, dtype = R.spec(x)
    a = R.norm_axis(axis, len(shape) + 1)
    return shape[:a] + (1,) + shape[a:], dtype


def _expand_kernel(x, axis):
    if not -x.ndim - 1 <= axis <= x.ndim:
        raise ValueError(f"axis {axis} is out of range for expand_dims of a rank-{x.ndim} tensor")
    a = axis % (x.ndim + 1)
    return x.reshape(x.shape[:a] + (1,) + x.shape[a:])   # np.expand_dims costs 4x more


_expand_op = defop("expand_dims", _expand_kernel, _expand_rule,
                   lambda c, g: (reshape_like(g, c.inputs[0]),))


def expand_dims(input, axis, name=None):  # noqa: A002 - TF's signature
    """Insert a size-1 axis at ``axis``."""
    return execute(_expand_op, (input,), {"axis": int(axis)})


def _squeeze_rule(x, axis):
    shape, dtype = R.spec(x)
    axes = {R.norm_axis(a, len(shape)) for a in axis} if axis is not None else {
        i for i, d in enumerate(shape) if d == 1}
    for a in axes:
        if shape[a] not in (1, None):
            R.fail(f"cannot squeeze axis {a} of shape {tuple(shape)}: its size is {shape[a]}, not 1")
    return tuple(d for i, d in enumerate(shape) if i not in axes), dtype


_squeeze_op = defop("squeeze", lambda x, axis: np.squeeze(x, axis), _squeeze_rule,
                    lambda c, g: (reshape_like(g, c.inputs[0]),))


def squeeze(input, axis=None, name=None):  # noqa: A002 - TF's signature
    """Remove size-1 axes (all of them, or those in ``axis``)."""
    return execute(_squeeze_op, (input,), {"axis": None if axis is None else _ints(axis)})


identity = unary(defop("identity", lambda x: x, R.same, lambda c, g: (g,), doc="The same values."))
stop_gradient = unary(defop("stop_gradient", lambda x: x, R.same, None,
                            doc="The same values, but gradients do not flow through it."))


# -- concat and stack (any number of inputs) ---------------------------------------------------
def _concat_rule(*xs, axis):
    specs = [R.spec(x) for x in xs]
    rank = len(specs[0][0])
    a = R.norm_axis(axis, rank)
    for s, d in specs:
        if d != specs[0][1]:
            R.fail(f"inputs must have the same dtype, got {', '.join(d.name for _, d in specs)}")
        if len(s) != rank or any(s[i] != specs[0][0][i] for i in builtins.range(rank) if i != a):
            R.fail(f"shapes must match except along axis {axis}, got {', '.join(str(tuple(s)) for s, _ in specs)}")
    sizes = [s[a] for s, _ in specs]
    total = None if None in sizes else builtins.sum(sizes)
    return specs[0][0][:a] + (total,) + specs[0][0][a + 1:], specs[0][1]


def _concat_grad(c, g):
    a = R.norm_axis(c.attrs["axis"], len(R.shape_of(g)))
    sizes = [R.shape_of(x)[a] for x in c.inputs]
    if None in sizes:   # sizes known only when the graph runs: slice by the inputs' runtime shapes
        return tuple(execute(_concat_part_op, (g, *c.inputs), {"axis": a, "index": i})
                     for i in builtins.range(len(sizes)))
    out, start = [], 0
    for n in sizes:
        out.append(g[(_builtin_slice(None),) * a + (_builtin_slice(start, start + n),)])
        start += n
    return tuple(out)


def _concat_part_kernel(g, *xs, axis, index):
    start = builtins.sum(x.shape[axis] for x in xs[:index])
    return g[(_builtin_slice(None),) * axis + (_builtin_slice(start, start + xs[index].shape[axis]),)]


def _concat_part_rule(g, *xs, axis, index):
    shape, dtype = R.spec(g)
    part = R.shape_of(xs[index])
    return shape[:axis] + (part[axis],) + shape[axis + 1:], dtype


def _concat_part_grad(c, gg):
    """The part's gradient lands back in its place in the joined tensor; zeros elsewhere."""
    from .math_ops import zeros_like   # math_ops imports this module
    g, xs, i = c.inputs[0], c.inputs[1:], c.attrs["index"]
    pieces = [gg if j == i else zeros_like(x, dtype=R.spec(g)[1]) for j, x in enumerate(xs)]
    return (concat(pieces, c.attrs["axis"]),) + (None,) * len(xs)


# concat's backward op when the sizes along the axis are known only at run time: the index-th part of g
_concat_part_op = defop("concat_grad", _concat_part_kernel, _concat_part_rule, _concat_part_grad)


_concat_op = defop("concat", lambda *xs, axis: np.concatenate(xs, axis), _concat_rule, _concat_grad,
                   same_dtype="all", fresh=True)


def concat(values, axis, name=None):
    """Join tensors along an existing axis."""
    values = list(values)
    if not values:
        raise ValueError("concat needs at least one tensor")
    return execute(_concat_op, values, {"axis": int(axis)})


def _stack_rule(*xs, axis):
    specs = [R.spec(x) for x in xs]
    for s, d in specs:
        if tuple(s) != tuple(specs[0][0]) or d != specs[0][1]:
            R.fail(f"all inputs must have the same shape and dtype, got "
                   f"{', '.join(f'{d.name}{list(s)}' for s, d in specs)}")
    a = R.norm_axis(axis, len(specs[0][0]) + 1)
    return specs[0][0][:a] + (len(xs),) + specs[0][0][a:], specs[0][1]


def _stack_grad(c, g):
    a = R.norm_axis(c.attrs["axis"], len(R.shape_of(g)))
    return tuple(g[(_builtin_slice(None),) * a + (i,)] for i in builtins.range(len(c.inputs)))


_stack_op = defop("stack", lambda *xs, axis: np.stack(xs, axis), _stack_rule, _stack_grad, same_dtype="all",
                  fresh=True)


def stack(values, axis=0, name=None):
    """Join same-shaped tensors along a new axis."""
    values = list(values)
    if not values:
        raise ValueError("stack needs at least one tensor")
    return execute(_stack_op, values, {"axis": int(axis)})


def unstack(value, axis=0, name=None):
    """Split along ``axis`` into a list of tensors, one per index."""
    value = convert_to_tensor(value)
    a = R.norm_axis(axis, value.ndim)
    return [value[(_builtin_slice(None),) * a + (i,)] for i in builtins.range(R.shape_of(value)[a])]


def split(value, num_or_size_splits, axis=0, num=None, name=None):
    """Cut ``value`` along ``axis`` into a list of tensors: ``n`` equal parts for an int ``n``, or parts
    of the given sizes for a list (one size may be -1: the rest). ``num`` checks the number of parts."""
    x = convert_to_tensor(value)
    a = R.norm_axis(int(axis), x.ndim)
    n = R.shape_of(x)[a]
    sizes = _ints(num_or_size_splits)
    if isinstance(num_or_size_splits, (int, np.integer)) or (isinstance(num_or_size_splits, Tensor) and
                                                              num_or_size_splits.ndim == 0):
        if sizes[0] < 1 or n is None or n % sizes[0]:
            raise ValueError(f"split: cannot cut axis {axis} of shape {tuple(R.shape_of(x))} into {sizes[0]} equal "
                             f"parts; give a list of sizes instead")
        sizes = (n // sizes[0],) * sizes[0]
    elif builtins.sum(1 for s in sizes if s == -1) > 1 or builtins.any(s < -1 for s in sizes):
        raise ValueError(f"split: sizes {list(sizes)} may hold one -1 (the rest) and no other negative size")
    elif -1 in sizes and n is not None:
        sizes = tuple(n - builtins.sum(sizes) - 1 if s == -1 else s for s in sizes)
    if n is not None and (builtins.sum(sizes) != n or builtins.min(sizes) < 0):
        raise ValueError(f"split: sizes {list(_ints(num_or_size_splits))} do not add up to {n}, the size of axis "
                         f"{axis} of shape {tuple(R.shape_of(x))}")
    if num is not None and int(num) != len(sizes):
        raise ValueError(f"split: num={num} but the split makes {len(sizes)} parts")
    cut = sizes.index(-1) if -1 in sizes else len(sizes)   # -1 left only when the size is known at run time
    ends = np.cumsum(sizes[:cut]).tolist() + [-int(np.sum(sizes[i + 1:])) or None for i in builtins.range(cut, len(sizes))]
    return [x[(_builtin_slice(None),) * a + (_builtin_slice(b, e),)] for b, e in zip([0] + ends, ends)]


# -- indexing: x[key], slice, gather ----------------------------------------------------------
def _normalize_key(key):
    """A tuple of ints, slices, None, Ellipsis and int/bool numpy arrays (advanced indexing)."""
    if not isinstance(key, tuple):
        key = (key,)
    out = []
    for k in key:
        if isinstance(k, Tensor):
            k = k.numpy()
            if k.ndim == 0 and k.dtype.kind in "iu":
                k = int(k)
        if isinstance(k, (list, np.ndarray)):
            k = np.asarray(k)
            if k.dtype.kind not in "iub":
                raise TypeError(f"index arrays must hold integers or booleans, got {k.dtype}")
        elif isinstance(k, np.integer):
            k = int(k)
        elif not (k is None or k is Ellipsis or isinstance(k, (int, _builtin_slice))):
            raise TypeError(f"cannot index a tensor with {type(k).__name__} {k!r}: use ints, slices, None, "
                            "... or integer/boolean arrays")
        out.append(k)
    return tuple(out)


def _getitem_rule(x, key):
    shape, dtype = R.spec(x)
    if None not in shape:
        return np.empty(shape, dtype=np.bool_)[key].shape, dtype
    if builtins.any(isinstance(k, np.ndarray) for k in key):
        return _probe_shape(shape, key), dtype
    return _basic_index_shape(shape, key), dtype


def _basic_index_shape(shape, key):
    """The result shape of ints, slices, None and ... on a shape with unknown (None) sizes."""
    used = builtins.sum(1 for k in key if k is not None and k is not Ellipsis)
    if used > len(shape):
        R.fail(f"too many indices ({used}) for a rank-{len(shape)} tensor")
    out, axis = [], 0
    for k in key:
        if k is None:
            out.append(1)
        elif k is Ellipsis:
            out.extend(shape[axis:axis + len(shape) - used])
            axis += len(shape) - used
        else:
            d = shape[axis]
            if isinstance(k, int):
                if d is not None and not -d <= k < d:
                    R.fail(f"index {k} is out of bounds for axis {axis} of size {d}")
            else:
                out.append(None if d is None else len(builtins.range(*k.indices(d))))
            axis += 1
    return tuple(out) + tuple(shape[axis:])


def _probe_shape(shape, key):
    """Advanced indexing on unknown sizes: index two stand-in shapes (no memory is touched for the
    stand-ins) and call a result size unknown where the two disagree."""
    ints = [abs(int(v)) for k in key if isinstance(k, (int, np.ndarray)) for v in np.ravel(k)]
    ints += [abs(v) for k in key if isinstance(k, _builtin_slice) for v in (k.start, k.stop) if v is not None]
    p = builtins.max(ints, default=0) + 2
    try:
        a, b = (np.broadcast_to(np.zeros((), np.bool_), tuple(q if d is None else d for d in shape))[key].shape
                for q in (p, p + 1))
    except IndexError as e:
        R.fail(str(e))
    return tuple(None if i != j else i for i, j in zip(a, b))


def _scatter_kernel(g, *like, key, shape):
    out = array_module(g).zeros(like[0].shape if shape is None else shape, dtype=g.dtype)
    if builtins.any(isinstance(k, np.ndarray) for k in key):
        np.add.at(out, key, g)  # advanced indices may repeat: accumulate
    else:
        out[key] = g
    return out


def _getitem_grad(c, g):
    x, shape = c.inputs[0], R.shape_of(c.inputs[0])
    if None in shape:   # the input's shape is known only when the graph runs: pass x along for it
        return (execute(_scatter_op, (g, x), {"key": c.attrs["key"], "shape": None}),)
    return (execute(_scatter_op, (g,), {"key": c.attrs["key"], "shape": shape}),)


_scatter_op = defop("getitem_grad", _scatter_kernel,
                    lambda g, *like, key, shape: (R.shape_of(like[0]) if shape is None else shape, R.spec(g)[1]),
                    lambda c, gg: (_getitem(gg, c.attrs["key"]),) + (None,) * (len(c.inputs) - 1))
_getitem_op = defop("getitem", lambda x, key: x[key], _getitem_rule, _getitem_grad)


def _getitem(x, key):
    return execute(_getitem_op, (x,), {"key": key})


def getitem(tensor, key):
    """``tensor[key]``: numpy-style basic and advanced indexing (ints, slices, None, ..., arrays)."""
    return _getitem(tensor, _normalize_key(key))


Tensor.__getitem__ = getitem


def _no_setitem(self, key, value):
    raise TypeError("flowlab tensors are immutable; build a new tensor (e.g. with fl.where or fl.concat), "
                    "or use a fl.Variable and .assign()")


Tensor.__setitem__ = _no_setitem


def slice(input_, begin, size, name=None):  # noqa: A001 - TF's name
    """``size[i]`` elements from ``begin[i]`` along each axis (-1: to the end)."""
    x = convert_to_tensor(input_)
    begin, size = _ints(begin), _ints(size)
    if len(begin) != x.ndim or len(size) != x.ndim:
        raise ValueError(f"slice: begin {list(begin)} and size {list(size)} need one entry per axis of "
                         f"the input's shape {tuple(x.shape)}")
    return _getitem(x, tuple(_builtin_slice(b, None if s == -1 else b + s) for b, s in zip(begin, size)))


def _gather_rule(params, indices, axis):
    (ps, pd), (ixs, ixd) = R.spec(params), R.spec(indices)
    if ixd.kind not in "iu":
        R.fail(f"indices must be integers, got {ixd.name}")
    a = R.norm_axis(axis, len(ps))
    return ps[:a] + tuple(ixs) + ps[a + 1:], pd


def _gather_kernel(params, indices, axis):
    n = params.shape[axis]
    if indices.size and (indices.min() < 0 or indices.max() >= n):
        bad = indices[(indices < 0) | (indices >= n)].ravel()[0]
        raise IndexError(f"index {bad} is not in [0, {n}) along axis {axis}")
    return np.take(params, indices, axis=axis)


def _gather_grad_kernel(g, indices, axis, shape):
    out = array_module(g).zeros(shape, dtype=g.dtype)
    # move the gathered axis first so that np.add.at accumulates repeated indices
    np.add.at(np.moveaxis(out, axis, 0), indices,
              np.moveaxis(g, tuple(builtins.range(axis, axis + indices.ndim)), tuple(builtins.range(indices.ndim))))
    return out


_gather_grad_op = defop("gather_grad", _gather_grad_kernel, lambda g, i, axis, shape: (shape, R.spec(g)[1]),
                        lambda c, gg: (gather(gg, c.inputs[1], axis=c.attrs["axis"]), None))
_gather_op = defop("gather", _gather_kernel, _gather_rule,
                   lambda c, g: (execute(_gather_grad_op, (g, c.inputs[1]),
                                         {"axis": c.attrs["axis"], "shape": R.shape_of(c.inputs[0])}), None))


def gather(params, indices, axis=None, batch_dims=0, name=None):
    """Pick slices of ``params`` along ``axis`` (default 0) at ``indices``."""
    if batch_dims:
        raise NotImplementedError("gather: batch_dims is not supported yet; gather per batch element instead")
    params = convert_to_tensor(params)
    try:
        a = R.norm_axis(int(axis or 0), params.ndim)
    except InvalidArgumentError as e:
        raise op_error(_gather_op, (params,), {"axis": axis}, str(e)) from None
    return execute(_gather_op, (params, indices), {"axis": a})


def _one_hot_kernel(indices, depth, on_value, off_value, axis, dtype):
    xp = array_module(indices)
    hot = indices[..., None] == xp.arange(depth)   # out-of-range indices give an all-off row
    out = xp.where(hot, xp.asarray(on_value, dtype), xp.asarray(off_value, dtype))
    return out if axis == -1 else np.moveaxis(out, -1, axis)


def _one_hot_rule(indices, depth, on_value, off_value, axis, dtype):
    shape, d = R.spec(indices)
    if d.kind not in "iu":
        R.fail(f"indices must be integers, got {d.name}")
    shape = shape + (depth,)
    if axis != -1:
        a = R.norm_axis(axis, len(shape))
        shape = shape[:a] + (depth,) + shape[a:-1]
    return shape, np.dtype(dtype)


_one_hot_op = defop("one_hot", _one_hot_kernel, _one_hot_rule, strict=True)


def one_hot(indices, depth, on_value=None, off_value=None, axis=None, dtype=None, name=None):
    """A tensor with ``on_value`` (1) at each index along a new last axis of size ``depth`` and
    ``off_value`` (0) elsewhere; indices outside [0, depth) give an all-off row."""
    dtype = dtypes.numpy_dtype(dtype or dtypes.float32)
    return execute(_one_hot_op, (indices,), {
        "depth": int(depth), "on_value": 1 if on_value is None else on_value,
        "off_value": 0 if off_value is None else off_value, "axis": -1 if axis is None else int(axis),
        "dtype": dtype})


# -- creation ----------------------------------------------------------------------------------
def fill(dims, value, name=None):
    """A tensor of shape ``dims`` with every element ``value`` (differentiable in ``value``)."""
    return broadcast_to(value, dims)


def zeros(shape, dtype=dtypes.float32, name=None):
    """A tensor of zeros."""
    return in_scope(Tensor(np.zeros(_ints(shape), dtype=dtypes.numpy_dtype(dtype))))


def ones(shape, dtype=dtypes.float32, name=None):
    """A tensor of ones."""
    return in_scope(Tensor(np.ones(_ints(shape), dtype=dtypes.numpy_dtype(dtype))))


def range(start, limit=None, delta=1, dtype=None, name=None):  # noqa: A001 - TF's name
    """Numbers from ``start`` up to (not including) ``limit`` in steps of ``delta``, like Python's
    range; ints give int32 and floats float32 unless ``dtype`` says otherwise."""
    if limit is None:
        start, limit = 0, start
    start, limit, delta = (v.numpy() if isinstance(v, Tensor) else v for v in (start, limit, delta))
    return in_scope(Tensor(_python_array(np.arange(start, limit, delta), dtypes.numpy_dtype(dtype))))


_shape_op = defop("shape", lambda x, out_type: np.asarray(x.shape, dtype=out_type),
                  lambda x, out_type: ((len(R.spec(x)[0]),), np.dtype(out_type)), shape_only=(0,))


def shape(input, out_type=dtypes.int32, name=None):  # noqa: A002 - TF's signature
    """The shape of a tensor, as a 1-d integer tensor (in a graph: its shape when the graph runs)."""
    x = convert_to_tensor(input)
    if getattr(x, "_value", None) is None:
        return execute(_shape_op, (x,), {"out_type": dtypes.numpy_dtype(out_type)})
    return Tensor(np.asarray(R.shape_of(x), dtype=dtypes.numpy_dtype(out_type)))


def size(input, out_type=dtypes.int32, name=None):  # noqa: A002 - TF's signature
    """The number of elements, as a 0-d integer tensor (in a graph with unknown sizes: computed when
    the graph runs)."""
    x = convert_to_tensor(input)
    if None in R.shape_of(x):
        return reduction_ops.reduce_prod(shape(x, out_type))
    return Tensor(np.asarray(int(np.prod(R.shape_of(x))), dtype=dtypes.numpy_dtype(out_type)))


def rank(input, name=None):  # noqa: A002 - TF's signature
    """The number of axes, as a 0-d int32 tensor."""
    return Tensor(np.asarray(len(R.shape_of(convert_to_tensor(input))), dtype=np.int32))


__all__ = ["reshape", "broadcast_to", "transpose", "expand_dims", "squeeze", "identity", "stop_gradient",
           "concat", "stack", "unstack", "split", "slice", "gather", "one_hot", "fill", "zeros", "ones", "range",
           "shape", "size", "rank"]
