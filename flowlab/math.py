"""``fl.math``: elementwise math, comparisons and reductions under the names TensorFlow tutorials
use (``tf.math.reduce_sum``, ``tf.math.log1p``...). Most are the same functions as ``fl.<name>``;
the few written here are built from those ops (so gradients and tracing work as for any op).

>>> import flowlab as fl
>>> float(fl.math.reduce_sum(fl.math.square(fl.constant([1.0, 2.0]))))
5.0
"""
from __future__ import annotations

from . import _names
from .core import dtypes
from .core.ops import (abs, add, add_n, argmax, argmin, ceil, cos, divide, equal, exp, expm1, floor,  # noqa: F401
                       floordiv, floormod, greater, greater_equal, is_finite, is_inf, is_nan, less, less_equal,
                       log, log1p, log_softmax, logical_and, logical_not, logical_or, maximum, minimum, multiply,
                       negative, not_equal, pow, reciprocal, reduce_all, reduce_any, reduce_max, reduce_mean,
                       reduce_min, reduce_prod, reduce_sum, round, rsqrt, sigmoid, sign, sin, softmax, softplus,
                       sqrt, square, stop_gradient, subtract, tanh, top_k, where)
from .core.ops import cast as _cast
from .core.ops import squeeze as _squeeze

truediv = divide
mod = floormod


def squared_difference(x, y, name=None):
    """(x - y) ** 2 elementwise."""
    return square(subtract(x, y))


def log_sigmoid(x, name=None):
    """log(sigmoid(x)) = -softplus(-x), without overflow."""
    return negative(softplus(negative(x)))


def logical_xor(x, y, name=None):
    """x != y for bool tensors."""
    return logical_and(logical_or(x, y), logical_not(logical_and(x, y)))


def divide_no_nan(x, y, name=None):
    """x / y, but 0 where y == 0 (and no NaN in the gradient there)."""
    zero = equal(y, 0)
    return where(zero, 0 * x, divide(x, where(zero, 1 + 0 * y, y)))


def count_nonzero(input, axis=None, keepdims=False, dtype=dtypes.int64, name=None):  # noqa: A002 - TF's signature
    """How many elements are not zero (not False), over ``axis``."""
    return reduce_sum(_cast(not_equal(input, 0 if getattr(input, "dtype", None) != dtypes.bool_ else False), dtype),
                      axis=axis, keepdims=keepdims)


def reduce_logsumexp(input_tensor, axis=None, keepdims=False, name=None):
    """log(sum(exp(x))) over ``axis``, computed after subtracting the maximum (no overflow)."""
    top = stop_gradient(reduce_max(input_tensor, axis=axis, keepdims=True))
    out = log(reduce_sum(exp(input_tensor - top), axis=axis, keepdims=True)) + top
    return out if keepdims else _squeeze(out, axis)


def reduce_variance(input_tensor, axis=None, keepdims=False, name=None):
    """The mean of squared deviations from the mean over ``axis`` (divides by n, as TensorFlow does)."""
    centered = input_tensor - reduce_mean(input_tensor, axis=axis, keepdims=True)
    return reduce_mean(square(centered), axis=axis, keepdims=keepdims)


def reduce_std(input_tensor, axis=None, keepdims=False, name=None):
    """The square root of ``reduce_variance``."""
    return sqrt(reduce_variance(input_tensor, axis=axis, keepdims=keepdims))


def l2_normalize(x, axis=None, epsilon=1e-12, name=None):
    """x / sqrt(max(sum(x ** 2), epsilon)) over ``axis``."""
    return x * rsqrt(maximum(reduce_sum(square(x), axis=axis, keepdims=True), epsilon))


def in_top_k(targets, predictions, k, name=None):
    """Whether each row's target class is among the ``k`` largest predictions (bool [batch]).
    NOTE: ties are decided by position (the lower index first), where TensorFlow counts every tie in."""
    return reduce_any(equal(top_k(predictions, k).indices, _cast(targets, dtypes.int32)[:, None]), axis=-1)


__all__ = sorted(n for n in dir() if not n.startswith("_") and n not in ("annotations", "dtypes"))


def __getattr__(name):
    raise _names.missing_attribute("flowlab.math", name, __all__)


def __dir__():
    return __all__
