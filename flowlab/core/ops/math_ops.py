"""Elementwise math, comparisons and matmul. Each entry: kernel, shape rule, gradient, and what the
graph passes need of it (``OpDef``): an elementwise op's fusible form (``elementwise``, the same
ufuncs as its kernel, with ``out=``), its C expression for compiled fusion (``c_expr``, and
``c_block``: a float32 function of core/passes/_cfusion_prelude.c), and whether its kernel returns
a new array (``fresh``)."""
from __future__ import annotations

import numpy as np

from .. import dtypes
from ..execute import NO_ATTRS, binary, defop, execute, reflected, unary
from ..tensor import Tensor, convert_to_tensor
from . import _rules as R
from . import array_ops, reduction_ops


def _unb(g, x):
    return array_ops.unbroadcast(g, R.shape_of(x), x)


def _binary_op(name, kernel, grad, doc, operator=None, rule=R.elementwise, strict=False, **facets):
    op = defop(name, kernel, rule, grad, same_dtype=(0, 1), strict=strict, doc=doc, **facets)
    fn = binary(op)
    if operator:
        setattr(Tensor, f"__{operator}__", fn)
        setattr(Tensor, f"__r{operator}__", reflected(fn))
    return fn


def _unary_op(name, kernel, grad, doc, rule=R.same, **facets):
    # ops on floats only (sqrt, exp...) are strict: numpy would quietly turn an int32 input into
    # float64, so only float inputs take the fast path and the rest meet the rule's error
    if rule is R.floating:
        return unary(defop(name, kernel, rule, grad, strict=True, doc=doc, **facets), kinds="f")
    if rule is R.logical:
        return unary(defop(name, kernel, rule, grad, strict=True, doc=doc, **facets), kinds="b")
    return unary(defop(name, kernel, rule, grad, doc=doc, **facets))


def _fusible(ufunc, c_expr=None, c_block=None, c_bool=False):
    """The graph passes' facets of an elementwise op whose kernel is ``ufunc`` (or computes exactly
    what it does): fusible as ``ufunc``, its result a new array, and its C expression if it has one."""
    return {"elementwise": ufunc, "fresh": True, "c_expr": c_expr, "c_block": c_block, "c_bool": c_bool}


def _divide_rule(x, y):
    shape, dtype = R.elementwise(x, y)
    return shape, dtype if dtype.kind == "f" else np.dtype(np.float64)


# -- arithmetic: forward (kernel) and backward (grad) side by side ----------------------------
def _pair(c, gx, gy):
    """Gradients for (x, y) from the rules ``gx()``, ``gy()``, computing only the ones needed."""
    x, y = c.inputs
    return (_unb(gx(), x) if c.needs[0] else None), (_unb(gy(), y) if c.needs[1] else None)


add = _binary_op("add", np.add, lambda c, g: _pair(c, lambda: g, lambda: g),
                 "x + y, broadcasting as numpy does.", "add", **_fusible(np.add, "{a} + {b}"))
subtract = _binary_op("subtract", np.subtract, lambda c, g: _pair(c, lambda: g, lambda: -g),
                      "x - y, broadcasting.", "sub", **_fusible(np.subtract, "{a} - {b}"))
multiply = _binary_op("multiply", np.multiply,
                      lambda c, g: _pair(c, lambda: g * c.inputs[1], lambda: g * c.inputs[0]),
                      "x * y elementwise, broadcasting.", "mul", **_fusible(np.multiply, "{a} * {b}"))
# d(x/y) = 1/y dx - x/y^2 dy = (dx - z dy) / y
divide = _binary_op("divide", np.true_divide,
                    lambda c, g: _pair(c, lambda: g / c.inputs[1], lambda: -g * c.output / c.inputs[1]),
                    "x / y (true division: integers give float64, as in TensorFlow).", "truediv",
                    rule=_divide_rule, **_fusible(np.true_divide, "{a} / {b}"))
floordiv = _binary_op("floordiv", np.floor_divide, None, "x // y, rounding toward -inf. No gradient.", "floordiv",
                      **_fusible(np.floor_divide))
floormod = _binary_op("floormod", np.mod,
                      lambda c, g: (_unb(g, c.inputs[0]), _unb(-g * floordiv(c.inputs[0], c.inputs[1]), c.inputs[1])),
                      "x % y with the sign of y (Python's %).", "mod", **_fusible(np.mod))


def _pow_grad(c, g):
    x, y = c.inputs
    gx = g * y * pow(x, y - 1) if c.needs[0] else None
    # NOTE: d/dy x^y = x^y log x is taken as 0 where x <= 0 (log undefined there), as TensorFlow does.
    gy = g * c.output * where(greater(x, 0), log(where(greater(x, 0), x, 1)), 0) if c.needs[1] else None
    return (gx if gx is None else _unb(gx, x), gy if gy is None else _unb(gy, y))


pow = _binary_op("pow", np.power, _pow_grad, "x ** y elementwise.", "pow", **_fusible(np.power))  # noqa: A001


def _max_min_grad(pick):
    def grad(c, g):
        x, y = c.inputs
        mask = pick(x, y)  # NOTE: ties send the whole gradient to x, as TensorFlow does
        zero = zeros_like(g)
        return _unb(where(mask, g, zero), x), _unb(where(mask, zero, g), y)
    return grad


maximum = _binary_op("maximum", np.maximum, _max_min_grad(lambda x, y: greater_equal(x, y)),
                     "Elementwise max(x, y).", **_fusible(np.maximum, "FL_MAX({a}, {b})"))
minimum = _binary_op("minimum", np.minimum, _max_min_grad(lambda x, y: less_equal(x, y)),
                     "Elementwise min(x, y).", **_fusible(np.minimum, "FL_MIN({a}, {b})"))

negative = _unary_op("negative", np.negative, lambda c, g: (-g,), "-x.", **_fusible(np.negative, "-{a}"))
Tensor.__neg__ = negative
Tensor.__pos__ = lambda self: self
sign = _unary_op("sign", np.sign, None, "-1, 0 or 1 by the sign of x. No gradient (zero almost everywhere).",
                **_fusible(np.sign, "({a} > 0 ? ({T})1 : {a} < 0 ? ({T})-1 : {a} == 0 ? ({T})0 : {a})"))
abs = _unary_op("abs", np.abs, lambda c, g: (g * sign(c.inputs[0]),), "|x|.",  # noqa: A001 - TF's name
               **_fusible(np.abs, "FL_ABS_{T}({a})"))
Tensor.__abs__ = abs
square = _unary_op("square", np.square, lambda c, g: (g * 2 * c.inputs[0],), "x * x.",
                  **_fusible(np.square, "{a} * {a}"))
sqrt = _unary_op("sqrt", np.sqrt, lambda c, g: (g / (2 * c.output),), "Square root.", rule=R.floating,
                **_fusible(np.sqrt, "FL_SQRT_{T}({a})"))
exp = _unary_op("exp", np.exp, lambda c, g: (g * c.output,), "e ** x.", rule=R.floating,
               **_fusible(np.exp, "fl_expf({a})", "fl_expf"))
log = _unary_op("log", np.log, lambda c, g: (g / c.inputs[0],), "Natural logarithm.", rule=R.floating,
               **_fusible(np.log, "fl_logf({a})", "fl_logf"))
sin = _unary_op("sin", np.sin, lambda c, g: (g * cos(c.inputs[0]),), "sin(x).", rule=R.floating,
               **_fusible(np.sin))
cos = _unary_op("cos", np.cos, lambda c, g: (-g * sin(c.inputs[0]),), "cos(x).", rule=R.floating,
               **_fusible(np.cos))
tanh = _unary_op("tanh", np.tanh, lambda c, g: (g * (1 - square(c.output)),), "Hyperbolic tangent.",
                rule=R.floating, **_fusible(np.tanh, "fl_tanhf({a})", "fl_tanhf"))


def _sigmoid_kernel(x):
    # 1/(1+e^-x) overflows for very negative x; this form is exact and never overflows.
    return 0.5 * (np.tanh(0.5 * x) + 1)


def _sigmoid_out(x, out=None):
    """``_sigmoid_kernel`` with ``out=``: the same ufuncs in the same order (the same bits)."""
    t = np.multiply(x, 0.5, out=out)
    if type(t) is not np.ndarray:   # a 0-d input gives a numpy scalar, which cannot be written to
        return 0.5 * (np.tanh(t) + 1)
    np.tanh(t, out=t)
    np.add(t, 1, out=t)
    return np.multiply(t, 0.5, out=t)


sigmoid = _unary_op("sigmoid", _sigmoid_kernel, lambda c, g: (g * c.output * (1 - c.output),),
                    "1 / (1 + e ** -x).", rule=R.floating,
                    **_fusible(_sigmoid_out, "fl_sigmoidf({a})", "fl_sigmoidf"))
log1p = _unary_op("log1p", np.log1p, lambda c, g: (g / (1 + c.inputs[0]),), "log(1 + x), exact near 0.",
                  rule=R.floating)
expm1 = _unary_op("expm1", np.expm1, lambda c, g: (g * (c.output + 1),), "e ** x - 1, exact near 0.", rule=R.floating)
softplus = _unary_op("softplus", lambda x: np.logaddexp(0, x), lambda c, g: (g * sigmoid(c.inputs[0]),),
                     "log(1 + e ** x), without overflow.", rule=R.floating)
reciprocal = _unary_op("reciprocal", np.reciprocal, lambda c, g: (-g * square(c.output),), "1 / x.", rule=R.floating)
rsqrt = _unary_op("rsqrt", lambda x: 1 / np.sqrt(x), lambda c, g: (-0.5 * g * c.output ** 3,), "1 / sqrt(x).",
                  rule=R.floating)
# rounding has no gradient (zero almost everywhere), as in TensorFlow
round = _unary_op("round", np.round, None, "Round to the nearest integer, halves to even.")  # noqa: A001 - TF's name
floor = _unary_op("floor", np.floor, None, "Largest integer <= x.", rule=R.floating)
ceil = _unary_op("ceil", np.ceil, None, "Smallest integer >= x.", rule=R.floating)
is_nan, is_inf, is_finite = (
    _unary_op(n, k, None, f"{n[3:]} elementwise (bool).", rule=lambda x, **_: (R.spec(x)[0], R.BOOL))
    for n, k in (("is_nan", np.isnan), ("is_inf", np.isinf), ("is_finite", np.isfinite)))
# relu's gradient is its own op, so that the backward pass is one kernel and twice differentiable.
def _relu_grad_out(g, y, out=None):
    return np.multiply(g, np.greater(y, 0), out=out)


_relu_grad = binary(defop("relu_grad", lambda g, y: g * (y > 0), R.elementwise,
                          lambda c, gg: (relu_grad_(gg, c.inputs[1]), None), same_dtype=(0, 1),
                          **_fusible(_relu_grad_out, "{a} * ({b} > 0 ? ({T})1 : ({T})0)")))


def relu_grad_(g, y):
    return _relu_grad(g, y)


def _relu_out(x, out=None):
    return np.maximum(x, 0, out=out)


relu = _unary_op("relu", lambda x: np.maximum(x, 0), lambda c, g: (_relu_grad(g, c.output),),
                 "max(x, 0). NOTE: its gradient at exactly 0 is taken as 0.",
                 **_fusible(_relu_out, "FL_MAX({a}, ({T})0)"))

# -- comparisons and logic: no gradients ------------------------------------------------------
equal = _binary_op("equal", np.equal, None, "x == y elementwise (bool).", rule=R.compare,
                   **_fusible(np.equal, "({a} == {b} ? ({T})1 : ({T})0)", c_bool=True))
not_equal = _binary_op("not_equal", np.not_equal, None, "x != y elementwise (bool).", rule=R.compare,
                       **_fusible(np.not_equal, "({a} != {b} ? ({T})1 : ({T})0)", c_bool=True))
less = _binary_op("less", np.less, None, "x < y elementwise (bool).", rule=R.compare,
                  **_fusible(np.less, "({a} < {b} ? ({T})1 : ({T})0)", c_bool=True))
less_equal = _binary_op("less_equal", np.less_equal, None, "x <= y elementwise (bool).", rule=R.compare,
                        **_fusible(np.less_equal, "({a} <= {b} ? ({T})1 : ({T})0)", c_bool=True))
greater = _binary_op("greater", np.greater, None, "x > y elementwise (bool).", rule=R.compare,
                     **_fusible(np.greater, "({a} > {b} ? ({T})1 : ({T})0)", c_bool=True))
greater_equal = _binary_op("greater_equal", np.greater_equal, None, "x >= y elementwise (bool).", rule=R.compare,
                           **_fusible(np.greater_equal, "({a} >= {b} ? ({T})1 : ({T})0)", c_bool=True))
Tensor.__eq__ = lambda self, other: False if other is None else equal(self, other)
Tensor.__ne__ = lambda self, other: True if other is None else not_equal(self, other)
Tensor.__lt__, Tensor.__le__, Tensor.__gt__, Tensor.__ge__ = less, less_equal, greater, greater_equal
logical_and = _binary_op("logical_and", np.logical_and, None, "x and y elementwise (bool inputs).",
                         "and", rule=R.logical, strict=True,
                         **_fusible(np.logical_and, "(({a} != 0) & ({b} != 0) ? ({T})1 : ({T})0)", c_bool=True))
logical_or = _binary_op("logical_or", np.logical_or, None, "x or y elementwise (bool inputs).", "or",
                        rule=R.logical, strict=True,
                        **_fusible(np.logical_or, "(({a} != 0) | ({b} != 0) ? ({T})1 : ({T})0)", c_bool=True))
logical_not = _unary_op("logical_not", np.logical_not, None, "not x elementwise (bool input).", rule=R.logical,
                         **_fusible(np.logical_not, "({a} == 0 ? ({T})1 : ({T})0)", c_bool=True))
Tensor.__invert__ = logical_not


# -- where and cast ---------------------------------------------------------------------------
def _where_rule(cond, x, y):
    cshape, cdtype = R.spec(cond)
    if cdtype != R.BOOL:
        R.fail(f"condition must be bool, got {cdtype.name}")
    shape, dtype = R.elementwise(x, y)
    return R.broadcast_shapes(cshape, shape), dtype


def _where_grad(c, g):
    cond, x, y = c.inputs
    zero = zeros_like(g)
    return None, _unb(where(cond, g, zero), x), _unb(where(cond, zero, g), y)


_where_op = defop("where", np.where, _where_rule, _where_grad, same_dtype=(1, 2), strict=True, fresh=True)


def _nonzero_rule(c):
    if R.spec(c)[1] != R.BOOL:
        R.fail(f"condition must be bool, got {R.spec(c)[1].name}")
    return (None, len(R.shape_of(c))), np.dtype(np.int64)


_nonzero_op = defop("where_indices", lambda c: np.argwhere(c), _nonzero_rule, strict=True)


def where(condition, x=None, y=None, name=None):
    """Pick from ``x`` where ``condition`` is true and from ``y`` elsewhere (all three broadcast).
    With only ``condition``: the coordinates of its true elements, an int64 tensor [n, rank]."""
    if x is None and y is None:
        return execute(_nonzero_op, (condition,))
    if x is None or y is None:
        raise ValueError("where: give both x and y, or neither")
    return execute(_where_op, (condition, x, y))


def _cast_rule(x, dtype):
    return R.spec(x)[0], np.dtype(dtype)


def _cast_grad(c, g):
    src = R.spec(c.inputs[0])[1]
    if src.kind == "f" and R.spec(g)[1].kind == "f":
        return (cast(g, src),)
    return (None,)


_cast_op = defop("cast", lambda x, dtype: x.astype(dtype), _cast_rule, _cast_grad, fresh=True)


def cast(x, dtype, name=None):
    """Convert to ``dtype`` (floats to ints truncate toward zero, as in TensorFlow)."""
    want = dtypes.numpy_dtype(dtype)
    if isinstance(x, Tensor) and dtypes.numpy_dtype(x.dtype) == want:
        return x
    return execute(_cast_op, (x,), {"dtype": want})


def zeros_like(x, dtype=None, name=None):
    """Zeros with the shape (and, unless given, the dtype) of ``x``."""
    return execute(_zeros_like_op, (x,), {"dtype": dtypes.numpy_dtype(dtype)})


def ones_like(x, dtype=None, name=None):
    """Ones with the shape (and, unless given, the dtype) of ``x``."""
    return execute(_ones_like_op, (x,), {"dtype": dtypes.numpy_dtype(dtype)})


def _like_rule(x, dtype=None):
    shape, d = R.spec(x)
    return shape, d if dtype is None else np.dtype(dtype)


_zeros_like_op = defop("zeros_like", lambda x, dtype=None: np.zeros_like(x, dtype=dtype), _like_rule)
_ones_like_op = defop("ones_like", lambda x, dtype=None: np.ones_like(x, dtype=dtype), _like_rule)


# -- matmul -----------------------------------------------------------------------------------
def _matmul_kernel(a, b, transpose_a=False, transpose_b=False):
    if a.ndim < 2 or b.ndim < 2:
        raise ValueError("matmul needs inputs of rank 2 or more")
    return np.matmul(a.swapaxes(-1, -2) if transpose_a else a, b.swapaxes(-1, -2) if transpose_b else b)


def _matmul_rule(a, b, transpose_a=False, transpose_b=False):
    (sa, da), (sb, db) = R.spec(a), R.spec(b)
    if len(sa) < 2 or len(sb) < 2:
        R.fail(f"needs inputs of rank 2 or more, got shapes {tuple(sa)} and {tuple(sb)}")
    if da != db:
        R.fail(f"inputs must have the same dtype, got {da.name} and {db.name}")
    m, ka = (sa[-1], sa[-2]) if transpose_a else (sa[-2], sa[-1])
    kb, n = (sb[-1], sb[-2]) if transpose_b else (sb[-2], sb[-1])
    if ka is not None and kb is not None and ka != kb:
        R.fail(f"inner dimensions do not match: a is {tuple(sa)}{' (transposed)' if transpose_a else ''}, "
               f"b is {tuple(sb)}{' (transposed)' if transpose_b else ''}, and {ka} != {kb}")
    return R.broadcast_shapes(sa[:-2], sb[:-2]) + (m, n), da


def _matmul_grad(c, g):
    a, b = c.inputs
    ta, tb = c.attrs.get("transpose_a", False), c.attrs.get("transpose_b", False)
    need_a, need_b = c.needs
    if not ta and not tb:
        ga = need_a and matmul(g, b, transpose_b=True)
        gb = need_b and matmul(a, g, transpose_a=True)
    elif ta and not tb:
        ga = need_a and matmul(b, g, transpose_b=True)
        gb = need_b and matmul(a, g)
    elif not ta and tb:
        ga = need_a and matmul(g, b)
        gb = need_b and matmul(g, a, transpose_a=True)
    else:
        ga = need_a and matmul(b, g, transpose_a=True, transpose_b=True)
        gb = need_b and matmul(g, a, transpose_a=True, transpose_b=True)
    return (_unb(ga, a) if need_a else None), (_unb(gb, b) if need_b else None)


_matmul_op = defop("matmul", _matmul_kernel, _matmul_rule, _matmul_grad, same_dtype=(0, 1), fresh=True,
                   doc="Matrix product of the last two axes; leading axes broadcast as batch axes.")
_matmul_fast = binary(_matmul_op)
Tensor.__matmul__ = _matmul_fast
Tensor.__rmatmul__ = reflected(_matmul_fast)


def matmul(a, b, transpose_a=False, transpose_b=False, name=None):
    """``a @ b`` over the last two axes (optionally transposing either); leading axes broadcast.

    >>> import flowlab as fl
    >>> fl.matmul([[1.0, 2.0]], [[3.0], [4.0]]).numpy().tolist()
    [[11.0]]
    """
    if not transpose_a and not transpose_b:
        return _matmul_fast(a, b)
    return execute(_matmul_op, (a, b), {"transpose_a": bool(transpose_a), "transpose_b": bool(transpose_b)})


def clip_by_value(t, clip_value_min, clip_value_max, name=None):
    """``t`` with every element limited to [clip_value_min, clip_value_max] (the gradient is 0 where clipped)."""
    return minimum(maximum(t, clip_value_min), clip_value_max)


def add_n(inputs, name=None):
    """The sum of a list of tensors of the same shape and dtype."""
    inputs = list(inputs)
    if not inputs:
        raise ValueError("add_n needs at least one input")
    total = inputs[0]
    for x in inputs[1:]:
        total = add(total, x)
    return convert_to_tensor(total)


__all__ = [n for n in dir() if not n.startswith("_") and n not in (
    "np", "annotations", "dtypes", "binary", "defop", "execute", "reflected", "unary", "Tensor",
    "convert_to_tensor", "R", "array_ops", "reduction_ops", "NO_ATTRS", "relu_grad_")]
