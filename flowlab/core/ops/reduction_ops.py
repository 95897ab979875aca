"""Reductions over axes: sum, mean, max, min, prod, and argmax/argmin."""
from __future__ import annotations

import math

import numpy as np

from .. import dtypes
from ..backends import array_module
from ..errors import InvalidArgumentError
from ..execute import defop, execute, op_error
from ..tensor import Tensor, convert_to_tensor
from . import _rules as R
from . import array_ops, math_ops


def _axes(x, axis):
    """Normalize ``axis`` (None, int or sequence, negatives allowed) to None or a sorted tuple
    (negative axes stay negative when the rank is unknown: the kernels take them as numpy does)."""
    if axis is None:
        return None
    shape = R.shape_of(x)
    if isinstance(axis, Tensor):
        axis = axis.numpy().tolist()
    if isinstance(axis, (int, np.integer)):
        axis = (axis,)
    return tuple(sorted({int(a) if shape is None else R.norm_axis(int(a), len(shape)) for a in axis}))


def _spread_kernel(g, x, axis, keepdims, mean):
    if not keepdims:
        g = g.reshape(tuple(1 if axis is None or i in axis or i - x.ndim in axis else d for i, d in enumerate(x.shape)))
    out = array_module(g).empty(x.shape, dtype=g.dtype)
    if mean:
        np.multiply(g, 1 / max(x.size // max(g.size, 1), 1), out=out)
    else:
        np.copyto(out, g)
    return out


def _spread_rule(g, x, axis, keepdims, mean):
    return R.spec(x)[0], R.spec(g)[1]


def _spread_grad(c, gg):
    reduce = reduce_mean if c.attrs["mean"] else reduce_sum   # the transpose of spreading
    return reduce(gg, axis=c.attrs["axis"], keepdims=c.attrs["keepdims"]), None


# The backward pass of a reduction is one op: reshape the upstream gradient to the kept shape,
# divide by the count for a mean, and broadcast it over the reduced axes. The input x is an input
# only for its shape at run time, so a graph whose batch size is unknown (None) still works
# (``shape_only``: constant folding needs only x's static shape).
_spread_op = defop("reduce_grad", _spread_kernel, _spread_rule, _spread_grad, fresh=True, shape_only=(1,))


def _spread(c, g, mean=False):
    """Broadcast an upstream gradient back over the reduced axes (divided by the count for a mean)."""
    return execute(_spread_op, (g, c.inputs[0]), {"axis": c.attrs["axis"], "keepdims": c.attrs["keepdims"],
                                                  "mean": mean})


def _extreme_grad(c, g):
    # NOTE: ties share the gradient equally, so the sum over the inputs stays g (as TensorFlow does).
    x = c.inputs[0]
    y = c.output
    if R.shape_of(x) is None:     # rank unknown while building: spread y over x's shape when it runs
        y = _spread(c, y)
    elif not c.attrs["keepdims"]:   # put the reduced axes back as size 1 (works for unknown sizes)
        for a in (range(len(R.shape_of(x))) if c.attrs["axis"] is None else c.attrs["axis"]):
            y = array_ops.expand_dims(y, a)
    mask = math_ops.cast(math_ops.equal(x, y), x.dtype)
    ties = reduce_sum(mask, axis=c.attrs["axis"], keepdims=True)
    return (_spread(c, g) * mask / ties,)


# NOTE: kernels call array methods (x.sum) rather than np.sum: the same on numpy and cupy arrays,
# and numpy's np.sum wrapper costs about 4 us more per call on small arrays.
_REDUCE_OPS = {}


def sum_over(x, axes, keepdims=False):
    """reduce_sum over already-normalized ``axes`` (a sorted tuple): for gradient rules."""
    return execute(_REDUCE_OPS["reduce_sum"], (x,), {"axis": axes, "keepdims": keepdims})


def _mean_kernel(x, axis, keepdims):
    total = x.sum(axis=axis, keepdims=keepdims)   # x.mean() costs 13 us on a 4x4 array; this 3 us
    n = x.size // total.size if total.size else 0
    if x.dtype.kind in "iub":
        return (total / n).astype(x.dtype)        # integer mean truncates, as in TensorFlow
    return total / n


def _defreduce(name, kernel, grad, doc, **facets):
    op = defop(name, kernel, R.reduce, grad, doc=doc, **facets)
    _REDUCE_OPS[name] = op

    def fn(input_tensor, axis=None, keepdims=False, name=None):
        x = convert_to_tensor(input_tensor) if not isinstance(input_tensor, Tensor) else input_tensor
        try:
            axes = _axes(x, axis)
        except InvalidArgumentError as e:
            raise op_error(op, (x,), {"axis": axis}, str(e)) from None
        return execute(op, (x,), {"axis": axes, "keepdims": bool(keepdims)})

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = doc
    return fn


def _keep_int(x):
    """numpy sums int32 into int64; TensorFlow (and the shape rule) keep the input's dtype."""
    return x.dtype if x.dtype.kind in "iu" else None


reduce_sum = _defreduce("reduce_sum", lambda x, axis, keepdims: x.sum(axis=axis, keepdims=keepdims, dtype=_keep_int(x)),
                        lambda c, g: (_spread(c, g),),
                        "Sum over ``axis`` (all axes when None); ``keepdims`` keeps them as size 1.", fresh=True)
reduce_mean = _defreduce("reduce_mean", _mean_kernel, lambda c, g: (_spread(c, g, mean=True),),
                         "Mean over ``axis`` (integers give an integer mean, as in TensorFlow).", fresh=True)
reduce_max = _defreduce("reduce_max", lambda x, axis, keepdims: x.max(axis=axis, keepdims=keepdims),
                        _extreme_grad, "Maximum over ``axis``.", fresh=True)
reduce_min = _defreduce("reduce_min", lambda x, axis, keepdims: x.min(axis=axis, keepdims=keepdims),
                        _extreme_grad, "Minimum over ``axis``.", fresh=True)
reduce_prod = _defreduce("reduce_prod", lambda x, axis, keepdims: x.prod(axis=axis, keepdims=keepdims, dtype=_keep_int(x)),
                         # NOTE: y/x is undefined where x == 0; this rule assumes no zeros.
                         lambda c, g: (_spread(c, g) * _spread(c, c.output) / c.inputs[0],),
                         "Product over ``axis``.")
reduce_any = _defreduce("reduce_any", lambda x, axis, keepdims: x.any(axis=axis, keepdims=keepdims), None,
                        "Logical or over ``axis`` (bool input).")
reduce_all = _defreduce("reduce_all", lambda x, axis, keepdims: x.all(axis=axis, keepdims=keepdims), None,
                        "Logical and over ``axis`` (bool input).")


def _arg_rule(x, axis, output_type):
    shape, _ = R.spec(x)
    a = R.norm_axis(axis, len(shape))
    return shape[:a] + shape[a + 1:], np.dtype(output_type)


_argmax_op = defop("argmax", lambda x, axis, output_type: np.argmax(x, axis=axis).astype(output_type), _arg_rule)
_argmin_op = defop("argmin", lambda x, axis, output_type: np.argmin(x, axis=axis).astype(output_type), _arg_rule)


def argmax(input, axis=None, output_type=dtypes.int64, name=None):  # noqa: A002 - TF's signature
    """Index of the largest value along ``axis`` (default 0)."""
    return execute(_argmax_op, (input,), {"axis": 0 if axis is None else int(axis),
                                          "output_type": dtypes.numpy_dtype(output_type)})


def argmin(input, axis=None, output_type=dtypes.int64, name=None):  # noqa: A002 - TF's signature
    """Index of the smallest value along ``axis`` (default 0)."""
    return execute(_argmin_op, (input,), {"axis": 0 if axis is None else int(axis),
                                          "output_type": dtypes.numpy_dtype(output_type)})


def _top_k_rule(x, k, flat):
    shape, dtype = R.spec(x)
    if not shape or (shape[-1] is not None and shape[-1] < k):
        R.fail(f"k={k} needs a last axis of at least {k} elements, got shape {tuple(shape)}")
    return shape[:-1] + (k,), np.dtype(np.int64 if flat else np.int32)


def _top_k_kernel(x, k, flat):
    # NOTE: a stable sort of -x: of equal values the lower index comes first, as in TensorFlow
    top = np.argsort(-x, axis=-1, kind="stable")[..., :k]
    return top + array_module(x).arange(0, x.size, x.shape[-1]).reshape(x.shape[:-1] + (1,)) if flat else top.astype(np.int32)


_top_k_op = defop("top_k_indices", _top_k_kernel, _top_k_rule, strict=True)


def top_k(input, k=1, sorted=True, name=None):  # noqa: A002 - TF's signature
    """The ``k`` largest entries along the last axis, largest first: a pair ``(values, indices)`` that
    also has ``.values`` and ``.indices``. Gradients flow into ``values``."""
    x = convert_to_tensor(input)
    indices = execute(_top_k_op, (x,), {"k": int(k), "flat": False})
    at = execute(_top_k_op, (x,), {"k": int(k), "flat": True})   # positions in the flattened x
    return TopK(array_ops.reshape_like(array_ops.gather(array_ops.reshape(x, [-1]), at), indices), indices)


class TopK(tuple):
    values = property(lambda self: self[0])
    indices = property(lambda self: self[1])

    def __new__(cls, values, indices):
        return super().__new__(cls, (values, indices))

    def __repr__(self):
        return f"TopK(values={self[0]!r}, indices={self[1]!r})"


__all__ = ["reduce_sum", "reduce_mean", "reduce_max", "reduce_min", "reduce_prod", "reduce_any", "reduce_all",
           "argmax", "argmin", "top_k"]
