"""Every public op's forward pass against a numpy reference.

Shapes, dtypes and values come from hypothesis; elementwise ops get pairs (or triples) of
mutually broadcastable shapes, which include rank differences, size-1 axes and 0-d scalars.
Expected dtypes are written down (TensorFlow's rules), never read off numpy's result, so that a
kernel that silently widens a dtype fails here.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import flowlab as fl

FLOATS = [np.float32, np.float64]
INTS = [np.int32, np.int64]
NUMBERS = FLOATS + INTS
TOL = {np.dtype(np.float32): dict(rtol=1e-5, atol=1e-6), np.dtype(np.float64): dict(rtol=1e-12, atol=1e-12)}

# Budget: the whole file should run in well under 30 s on 2 cores. Parametrized families (one
# hypothesis test per op) get fewer examples each; together they still see hundreds of shapes.
fast = settings(max_examples=30, deadline=None)
family = settings(max_examples=20, deadline=None)
few = settings(max_examples=15, deadline=None)


# -- helpers ------------------------------------------------------------------------------------
def check(out, expected, dtype=None, atol=None):
    """``out`` is a flowlab Tensor equal to ``expected`` with dtype ``dtype`` (default: expected's)."""
    assert isinstance(out, fl.Tensor), f"expected a flowlab Tensor, got {type(out).__name__}"
    expected = np.asarray(expected)
    want = np.dtype(dtype if dtype is not None else expected.dtype)
    assert out.dtype == want, f"dtype {out.dtype.name}, expected {want.name}"
    got = np.asarray(out)
    assert got.shape == expected.shape, f"shape {got.shape}, expected {expected.shape}"
    if want.kind == "f":
        tol = dict(TOL[want])
        if atol is not None:
            tol["atol"] = atol
        np.testing.assert_allclose(got, expected.astype(np.float64), **tol)
    else:
        np.testing.assert_array_equal(got, expected)


def values(dtype, lo=-10, hi=10, nonzero=False):
    """Element strategy for ``dtype`` in [lo, hi] (no NaN/inf)."""
    dtype = np.dtype(dtype)
    if dtype.kind == "b":
        return st.booleans()
    if dtype.kind == "f":
        elems = st.floats(lo, hi, width=32 if dtype == np.float32 else 64, allow_subnormal=False)
    else:
        elems = st.integers(int(np.ceil(lo)), int(np.floor(hi)))
    # nonzero: also away from zero, so that float32 quotients do not overflow where float64 would not
    return elems.filter(lambda v: abs(v) >= 0.25) if nonzero else elems


def arrays(dtype, shape, **kw):
    return hnp.arrays(np.dtype(dtype), shape, elements=values(dtype, **kw))


def t(a):
    """A flowlab tensor holding exactly ``a`` (keeping its dtype)."""
    return fl.constant(np.asarray(a))


two_shapes = hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=4, min_side=1, max_side=4)
three_shapes = hnp.mutually_broadcastable_shapes(num_shapes=3, min_dims=0, max_dims=3, min_side=1, max_side=3)
any_shape = hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=4)
nonempty_shape = hnp.array_shapes(min_dims=0, max_dims=4, min_side=1, max_side=4)


def test_broadcast_shape_strategy_reaches_the_interesting_cases():
    """Guard against a strategy that never produces rank differences, size-1 axes or 0-d inputs."""
    seen = set()

    @settings(max_examples=100, deadline=None, derandomize=True)
    @given(two_shapes)
    def collect(shapes):
        a, b = shapes.input_shapes
        if len(a) != len(b):
            seen.add("rank difference")
        if 1 in a + b and shapes.result_shape != a:
            seen.add("size-1 axis broadcast")
        if a == () or b == ():
            seen.add("0-d")

    collect()
    assert seen == {"rank difference", "size-1 axis broadcast", "0-d"}


# -- binary arithmetic --------------------------------------------------------------------------
# name -> (flowlab function, numpy reference, element bounds for x, for y, expected dtype of int inputs)
BINARY = {
    "add": (fl.add, np.add, {}, {}, None),
    "subtract": (fl.subtract, np.subtract, {}, {}, None),
    "multiply": (fl.multiply, np.multiply, {}, {}, None),
    # true division: integers give float64, as in TensorFlow
    "divide": (fl.divide, lambda a, b: np.asarray(a, np.float64) / b, {}, {"nonzero": True}, np.float64),
    "floordiv": (fl.floordiv, np.floor_divide, {}, {"nonzero": True}, None),
    "floormod": (fl.floormod, np.mod, {}, {"nonzero": True}, None),
    "maximum": (fl.maximum, np.maximum, {}, {}, None),
    "minimum": (fl.minimum, np.minimum, {}, {}, None),
}


@pytest.mark.parametrize("name", sorted(BINARY))
@family
@given(dtype=st.sampled_from(NUMBERS), shapes=two_shapes, data=st.data())
def test_binary_ops_broadcast_like_numpy(name, dtype, shapes, data):
    fn, ref, xkw, ykw, int_dtype = BINARY[name]
    sx, sy = shapes.input_shapes
    x = data.draw(arrays(dtype, sx, **xkw), label="x")
    y = data.draw(arrays(dtype, sy, **ykw), label="y")
    want = int_dtype if (int_dtype is not None and np.dtype(dtype).kind == "i") else dtype
    # the reference runs in the input dtype: floor of a rounded quotient is discontinuous, so a
    # float64 reference could legitimately differ by one for float32 floordiv/floormod
    check(fn(t(x), t(y)), ref(x, y), want)


@fast
@given(dtype=st.sampled_from(NUMBERS), shapes=two_shapes, data=st.data())
def test_pow_broadcasts_like_numpy(dtype, shapes, data):
    sx, sy = shapes.input_shapes
    if np.dtype(dtype).kind == "f":
        x = data.draw(arrays(dtype, sx, lo=0.5, hi=3))
        y = data.draw(arrays(dtype, sy, lo=-2, hi=2))
    else:   # integers to negative powers are undefined; keep results small
        x = data.draw(arrays(dtype, sx, lo=-5, hi=5))
        y = data.draw(arrays(dtype, sy, lo=0, hi=3))
    check(fl.pow(t(x), t(y)), np.power(x, y), dtype)


def test_floordiv_and_floormod_round_toward_negative_infinity():
    x = fl.constant([7, -7, 7, -7])
    y = fl.constant([2, 2, -2, -2])
    check(fl.floordiv(x, y), [3, -4, -4, 3], np.int32)
    check(fl.floormod(x, y), [1, 1, -1, -1], np.int32)   # the sign of y, as Python's %
    check(fl.floormod(fl.constant([5.5, -5.5]), 2.0), [1.5, 0.5], np.float32)


def test_divide_of_integers_is_true_division_in_float64():
    check(fl.divide(fl.constant([7, -7]), fl.constant([2, 2])), [3.5, -3.5], np.float64)


def test_binary_op_with_python_scalar_keeps_the_tensor_dtype():
    for dtype in NUMBERS:
        x = t(np.array([1, 2, 3], dtype))
        check(fl.add(x, 2), np.array([3, 4, 5], dtype), dtype)
        check(fl.multiply(3, x), np.array([3, 6, 9], dtype), dtype)
    check(fl.add(fl.constant([1.0]), 0.5), [1.5], np.float32)


# -- unary math ---------------------------------------------------------------------------------
def _sigmoid_ref(x):
    return 1.0 / (1.0 + np.exp(-np.asarray(x, np.float64)))


# name -> (flowlab function, numpy reference on float64, dtypes accepted, element bounds)
UNARY = {
    "negative": (fl.negative, np.negative, NUMBERS, {}),
    "abs": (fl.abs, np.abs, NUMBERS, {}),
    "sign": (fl.sign, np.sign, NUMBERS, {}),
    "square": (fl.square, np.square, NUMBERS, {}),
    "relu": (fl.relu, lambda x: np.maximum(x, 0), NUMBERS, {}),
    "sqrt": (fl.sqrt, np.sqrt, FLOATS, {"lo": 0, "hi": 100}),
    "exp": (fl.exp, np.exp, FLOATS, {}),
    "log": (fl.log, np.log, FLOATS, {"lo": 0.0625, "hi": 100}),
    "sin": (fl.sin, np.sin, FLOATS, {}),
    "cos": (fl.cos, np.cos, FLOATS, {}),
    "tanh": (fl.tanh, np.tanh, FLOATS, {}),
    "sigmoid": (fl.sigmoid, _sigmoid_ref, FLOATS, {}),
}


@pytest.mark.parametrize("name", sorted(UNARY))
@family
@given(shape=any_shape, data=st.data())
def test_unary_ops_match_numpy(name, shape, data):
    fn, ref, accepted, kw = UNARY[name]
    dtype = data.draw(st.sampled_from(accepted), label="dtype")
    x = data.draw(arrays(dtype, shape, **kw), label="x")
    expected = ref(x.astype(np.float64)) if np.dtype(dtype).kind == "f" else ref(x)
    # float32 transcendental results: relative error a few ulps, plus cancellation near zero
    check(fn(t(x)), expected, dtype, atol=1e-5 if dtype == np.float32 else None)


def test_sigmoid_saturates_without_overflow():
    with np.errstate(all="raise"):
        out = fl.sigmoid(fl.constant([-1000.0, 0.0, 1000.0]))
    check(out, [0.0, 0.5, 1.0], np.float32)


def test_relu_zeroes_negatives_only():
    check(fl.relu(fl.constant([-2.0, -0.0, 0.0, 3.0])), [0.0, 0.0, 0.0, 3.0], np.float32)


# -- comparisons and logic ----------------------------------------------------------------------
COMPARISONS = {
    "equal": (fl.equal, np.equal),
    "not_equal": (fl.not_equal, np.not_equal),
    "less": (fl.less, np.less),
    "less_equal": (fl.less_equal, np.less_equal),
    "greater": (fl.greater, np.greater),
    "greater_equal": (fl.greater_equal, np.greater_equal),
}


@pytest.mark.parametrize("name", sorted(COMPARISONS))
@family
@given(dtype=st.sampled_from(NUMBERS), shapes=two_shapes, data=st.data())
def test_comparisons_match_numpy(name, dtype, shapes, data):
    fn, ref = COMPARISONS[name]
    sx, sy = shapes.input_shapes
    # few distinct values, so that ties (where == and <= differ from < ) are common
    x = data.draw(arrays(dtype, sx, lo=-2, hi=2))
    y = data.draw(arrays(dtype, sy, lo=-2, hi=2))
    check(fn(t(x), t(y)), ref(x, y), np.bool_)


@pytest.mark.parametrize("fn,ref", [(fl.logical_and, np.logical_and), (fl.logical_or, np.logical_or)])
@family
@given(shapes=two_shapes, data=st.data())
def test_logical_binary_ops_match_numpy(fn, ref, shapes, data):
    sx, sy = shapes.input_shapes
    x = data.draw(arrays(np.bool_, sx))
    y = data.draw(arrays(np.bool_, sy))
    check(fn(t(x), t(y)), ref(x, y), np.bool_)


@fast
@given(shape=any_shape, data=st.data())
def test_logical_not_matches_numpy(shape, data):
    x = data.draw(arrays(np.bool_, shape))
    check(fl.logical_not(t(x)), np.logical_not(x), np.bool_)


# -- where, cast, zeros_like, ones_like ---------------------------------------------------------
@fast
@given(dtype=st.sampled_from(NUMBERS), shapes=three_shapes, data=st.data())
def test_where_three_args_broadcasts_all_three(dtype, shapes, data):
    sc, sx, sy = shapes.input_shapes
    cond = data.draw(arrays(np.bool_, sc))
    x = data.draw(arrays(dtype, sx))
    y = data.draw(arrays(dtype, sy))
    check(fl.where(t(cond), t(x), t(y)), np.where(cond, x, y), dtype)


def test_where_takes_python_scalars_in_the_tensor_dtype():
    x = fl.constant([1.0, 2.0, 3.0])
    check(fl.where(x > 1.5, x, 0.0), [0.0, 2.0, 3.0], np.float32)
    check(fl.where([True, False], 1, 2), [1, 2], np.int32)


@fast
@given(shape=any_shape, data=st.data())
def test_where_one_arg_gives_int64_coordinates(shape, data):
    cond = data.draw(arrays(np.bool_, shape))
    out = fl.where(t(cond))
    check(out, np.argwhere(cond), np.int64)
    assert out.shape == (int(cond.sum()), len(shape))


def test_where_needs_both_or_neither_branch():
    with pytest.raises(ValueError):
        fl.where(fl.constant([True]), fl.constant([1.0]))


@fast
@given(src=st.sampled_from(NUMBERS + [np.bool_]), dst=st.sampled_from(NUMBERS + [np.bool_]),
       shape=any_shape, data=st.data())
def test_cast_matches_numpy_astype(src, dst, shape, data):
    x = data.draw(arrays(src, shape, lo=-100, hi=100))
    check(fl.cast(t(x), dst), x.astype(dst), dst)


def test_cast_float_to_int_truncates_toward_zero():
    check(fl.cast(fl.constant([1.7, -1.7, 2.5, -0.5]), fl.int32), [1, -1, 2, 0], np.int32)


@pytest.mark.parametrize("fn,fill_value", [(fl.zeros_like, 0), (fl.ones_like, 1)])
@few
@given(dtype=st.sampled_from(NUMBERS + [np.bool_]), shape=any_shape,
       out_dtype=st.sampled_from([None, np.float32, np.int64]), data=st.data())
def test_zeros_like_and_ones_like(fn, fill_value, dtype, shape, out_dtype, data):
    x = data.draw(arrays(dtype, shape))
    want = dtype if out_dtype is None else out_dtype
    check(fn(t(x), dtype=out_dtype), np.full(shape, fill_value, want), want)


# -- reductions ---------------------------------------------------------------------------------
@st.composite
def reduction_case(draw, dtypes=NUMBERS, lo=-10, hi=10, max_side=4):
    """(x, axis, keepdims): axis is None, an int (maybe negative) or a tuple of distinct axes."""
    dtype = draw(st.sampled_from(dtypes))
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=4, min_side=1, max_side=max_side))
    x = draw(arrays(dtype, shape, lo=lo, hi=hi))
    rank = len(shape)
    kinds = ["none"] + (["int", "tuple"] if rank else [])
    kind = draw(st.sampled_from(kinds))
    if kind == "none":
        axis = None
    elif kind == "int":
        axis = draw(st.integers(-rank, rank - 1))
    else:
        picked = draw(st.lists(st.integers(0, rank - 1), min_size=1, max_size=rank, unique=True))
        axis = tuple(a - rank if draw(st.booleans()) else a for a in picked)   # mix negative axes in
    return x, axis, draw(st.booleans())


def _scale(x):
    """An absolute tolerance for sums of float32 values: cancellation loses digits near zero."""
    return 1e-5 * (np.abs(x.astype(np.float64)).sum() + 1) if x.dtype == np.float32 else None


@fast
@given(reduction_case())
def test_reduce_sum_matches_numpy(case):
    x, axis, keepdims = case
    expected = np.sum(x.astype(np.float64) if x.dtype.kind == "f" else x.astype(np.int64), axis=axis, keepdims=keepdims)
    out = fl.reduce_sum(t(x), axis=axis, keepdims=keepdims)
    check(out, expected, out.dtype.as_numpy_dtype, atol=_scale(x))   # dtype: see test_reductions_keep_the_dtype


@fast
@given(reduction_case())
def test_reduce_mean_matches_numpy(case):
    x, axis, keepdims = case
    if x.dtype.kind == "f":
        expected = np.mean(x.astype(np.float64), axis=axis, keepdims=keepdims)
        atol = _scale(x)
    else:   # integer mean truncates toward zero, as in TensorFlow
        expected = np.trunc(np.mean(x.astype(np.float64), axis=axis, keepdims=keepdims)).astype(x.dtype)
        atol = None
    check(fl.reduce_mean(t(x), axis=axis, keepdims=keepdims), expected, x.dtype, atol=atol)


def test_reduce_mean_of_integers_truncates_toward_zero():
    check(fl.reduce_mean(fl.constant([-1, -2])), -1, np.int32)
    check(fl.reduce_mean(fl.constant([[1, 2], [4, 4]]), axis=1), [1, 4], np.int32)


@pytest.mark.parametrize("fl_fn,np_fn", [(fl.reduce_max, np.max), (fl.reduce_min, np.min)])
@family
@given(case=reduction_case())
def test_reduce_max_min_match_numpy(fl_fn, np_fn, case):
    x, axis, keepdims = case
    check(fl_fn(t(x), axis=axis, keepdims=keepdims), np_fn(x, axis=axis, keepdims=keepdims), x.dtype)


@fast
@given(reduction_case(lo=-2, hi=2, max_side=3))
def test_reduce_prod_matches_numpy(case):
    x, axis, keepdims = case
    expected = np.prod(x.astype(np.float64) if x.dtype.kind == "f" else x.astype(np.int64), axis=axis, keepdims=keepdims)
    out = fl.reduce_prod(t(x), axis=axis, keepdims=keepdims)
    check(out, expected, out.dtype.as_numpy_dtype)


@pytest.mark.parametrize("name", ["reduce_sum", "reduce_mean", "reduce_max", "reduce_min", "reduce_prod"])
@pytest.mark.parametrize("dtype", NUMBERS)
@pytest.mark.parametrize("axis", [None, 0])
def test_reductions_keep_the_dtype(name, dtype, axis):
    out = getattr(fl, name)(t(np.arange(1, 7, dtype=dtype).reshape(2, 3)), axis=axis)
    assert out.dtype == dtype


def test_reduce_with_an_empty_axis_tuple_is_the_identity():
    x = np.arange(6.0, dtype=np.float32).reshape(2, 3)
    check(fl.reduce_sum(t(x), axis=()), x, np.float32)


@pytest.mark.parametrize("fl_fn,np_fn", [(fl.argmax, np.argmax), (fl.argmin, np.argmin)])
@family
@given(dtype=st.sampled_from(NUMBERS), shape=hnp.array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=4),
       output_type=st.sampled_from([None, np.int32, np.int64]), data=st.data())
def test_argmax_argmin_match_numpy(fl_fn, np_fn, dtype, shape, output_type, data):
    x = data.draw(arrays(dtype, shape, lo=-3, hi=3))   # few values: ties pick the first index in both
    axis = data.draw(st.one_of(st.none(), st.integers(-len(shape), len(shape) - 1)))
    kw = {} if output_type is None else {"output_type": output_type}
    want = np.int64 if output_type is None else output_type
    check(fl_fn(t(x), axis=axis, **kw), np_fn(x, axis=0 if axis is None else axis), want)


# -- matmul -------------------------------------------------------------------------------------
@fast
@given(dtype=st.sampled_from(NUMBERS), batch=hnp.mutually_broadcastable_shapes(num_shapes=2, max_dims=2, max_side=3),
       m=st.integers(1, 4), k=st.integers(1, 4), n=st.integers(1, 4),
       transpose_a=st.booleans(), transpose_b=st.booleans(), data=st.data())
def test_matmul_matches_numpy(dtype, batch, m, k, n, transpose_a, transpose_b, data):
    ba, bb = batch.input_shapes
    a = data.draw(arrays(dtype, ba + ((k, m) if transpose_a else (m, k))), label="a")
    b = data.draw(arrays(dtype, bb + ((n, k) if transpose_b else (k, n))), label="b")
    expected = np.matmul(a.swapaxes(-1, -2) if transpose_a else a, b.swapaxes(-1, -2) if transpose_b else b)
    out = fl.matmul(t(a), t(b), transpose_a=transpose_a, transpose_b=transpose_b)
    check(out, expected, dtype, atol=1e-4 if dtype == np.float32 else None)
    if not (transpose_a or transpose_b):
        check(t(a) @ t(b), expected, dtype, atol=1e-4 if dtype == np.float32 else None)


def test_matmul_takes_nested_lists():
    check(fl.matmul([[1.0, 2.0]], [[3.0], [4.0]]), [[11.0]], np.float32)


# -- shape manipulation -------------------------------------------------------------------------
@fast
@given(shape=nonempty_shape, data=st.data())
def test_reshape_with_and_without_minus_one(shape, data):
    x = np.arange(int(np.prod(shape)), dtype=np.int32).reshape(shape)
    new = list(data.draw(st.permutations(list(shape)))) + data.draw(st.lists(st.just(1), max_size=2))
    if new and data.draw(st.booleans()):
        new[data.draw(st.integers(0, len(new) - 1))] = -1
    check(fl.reshape(t(x), new), x.reshape(new), np.int32)


def test_reshape_accepts_a_shape_tensor():
    check(fl.reshape(fl.range(6), fl.constant([3, -1])), np.arange(6).reshape(3, 2), np.int32)


@fast
@given(target=hnp.array_shapes(min_dims=0, max_dims=4, min_side=1, max_side=4), data=st.data())
def test_broadcast_to_matches_numpy(target, data):
    drop = data.draw(st.integers(0, len(target)))
    src = tuple(1 if data.draw(st.booleans()) else d for d in target[drop:])
    x = data.draw(arrays(np.float32, src))
    check(fl.broadcast_to(t(x), target), np.broadcast_to(x, target), np.float32)


@fast
@given(shape=nonempty_shape, data=st.data())
def test_transpose_with_perm_and_default(shape, data):
    x = np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape)
    perm = data.draw(st.permutations(list(range(len(shape)))))
    check(fl.transpose(t(x), perm), np.transpose(x, perm), np.float64)
    check(fl.transpose(t(x)), x.T, np.float64)


@fast
@given(shape=hnp.array_shapes(min_dims=0, max_dims=4, min_side=1, max_side=3), data=st.data())
def test_expand_dims_any_valid_axis(shape, data):
    x = np.zeros(shape, np.int64)
    axis = data.draw(st.integers(-len(shape) - 1, len(shape)))
    check(fl.expand_dims(t(x), axis), np.expand_dims(x, axis), np.int64)


@fast
@given(shape=hnp.array_shapes(min_dims=0, max_dims=5, min_side=1, max_side=3), data=st.data())
def test_squeeze_all_or_selected_axes(shape, data):
    x = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    ones = [i for i, d in enumerate(shape) if d == 1]
    axis = None
    if ones and data.draw(st.booleans()):
        picked = data.draw(st.lists(st.sampled_from(ones), min_size=1, unique=True))
        axis = [a - len(shape) if data.draw(st.booleans()) else a for a in picked]
    expected = np.squeeze(x) if axis is None else np.squeeze(x, tuple(axis))
    check(fl.squeeze(t(x), axis), expected, np.float32)


@fast
@given(dtype=st.sampled_from(NUMBERS), shape=hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=3),
       data=st.data())
def test_concat_along_any_axis(dtype, shape, data):
    rank = len(shape)
    axis = data.draw(st.integers(-rank, rank - 1))
    sizes = data.draw(st.lists(st.integers(0, 3), min_size=1, max_size=3))
    parts = []
    for n in sizes:
        s = list(shape)
        s[axis] = n
        parts.append(data.draw(arrays(dtype, tuple(s))))
    check(fl.concat([t(p) for p in parts], axis), np.concatenate(parts, axis), dtype)


@fast
@given(dtype=st.sampled_from(NUMBERS), shape=hnp.array_shapes(min_dims=0, max_dims=3, min_side=1, max_side=3),
       n=st.integers(1, 3), data=st.data())
def test_stack_and_unstack_roundtrip(dtype, shape, n, data):
    parts = [data.draw(arrays(dtype, shape)) for _ in range(n)]
    axis = data.draw(st.integers(-len(shape) - 1, len(shape)))
    stacked = np.stack(parts, axis)
    out = fl.stack([t(p) for p in parts], axis)
    check(out, stacked, dtype)
    pieces = fl.unstack(out, axis)
    assert len(pieces) == n
    for piece, part in zip(pieces, parts):
        check(piece, part, dtype)


def test_unstack_negative_axis():
    x = np.arange(6).reshape(2, 3)
    pieces = fl.unstack(t(x), axis=-1)
    assert len(pieces) == 3
    for i, piece in enumerate(pieces):
        check(piece, x[:, i], x.dtype)


# -- indexing, slice, gather, one_hot -----------------------------------------------------------
ARR = np.arange(4 * 5 * 6, dtype=np.float32).reshape(4, 5, 6)
KEYS = {
    "int": 1,
    "negative int": -1,
    "int tuple": (1, -2, 3),
    "slice": slice(1, 3),
    "slice with step": slice(None, None, 2),
    "reversed slice": slice(None, None, -1),
    "negative bounds and step": (slice(-1, 0, -2), slice(-4, None)),
    "empty slice": slice(3, 1),
    "None": None,
    "None in the middle": (0, None, slice(1, 4)),
    "Ellipsis": (Ellipsis, 0),
    "Ellipsis and None": (1, Ellipsis, None),
    "int array": np.array([0, 2, 3]),
    "int list with negatives": [0, -1, 2],
    "2-d int array": (slice(None), np.array([[0, 1], [4, 3]])),
    "paired int arrays": (np.array([0, 1, 3]), np.array([4, 0, 2])),
    "bool mask on axis 0": np.array([True, False, True, True]),
    "bool mask over all axes": ARR % 7 == 0,
    "bool mask after a slice": (slice(None), np.array([True, False, False, True, True])),
}


@pytest.mark.parametrize("key", list(KEYS.values()), ids=list(KEYS))
def test_indexing_matches_numpy(key):
    check(t(ARR)[key], ARR[key], np.float32)


def test_indexing_with_tensors_as_indices():
    x = t(ARR)
    check(x[fl.constant(2)], ARR[2], np.float32)
    check(x[fl.constant([3, 0])], ARR[[3, 0]], np.float32)
    check(x[:, :, 0][t(ARR[:, :, 0] > 50)], ARR[:, :, 0][ARR[:, :, 0] > 50], np.float32)


def test_indexing_rejects_float_indices():
    with pytest.raises(TypeError):
        t(ARR)[1.0]


@st.composite
def basic_slices(draw, n):
    step = draw(st.one_of(st.none(), st.integers(-3, 3).filter(bool)))
    bound = st.one_of(st.none(), st.integers(-n - 2, n + 2))
    return slice(draw(bound), draw(bound), step)


@fast
@given(shape=hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=5), data=st.data())
def test_basic_slicing_matches_numpy(shape, data):
    x = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)
    key = tuple(data.draw(st.one_of(basic_slices(d), st.integers(-d, d - 1))) for d in shape)
    check(t(x)[key], x[key], np.int64)


@fast
@given(shape=hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=5), data=st.data())
def test_slice_matches_numpy(shape, data):
    x = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    begin = [data.draw(st.integers(0, d - 1)) for d in shape]
    size = [data.draw(st.one_of(st.just(-1), st.integers(0, d - b))) for b, d in zip(begin, shape)]
    key = tuple(slice(b, None if s == -1 else b + s) for b, s in zip(begin, size))
    check(fl.slice(t(x), begin, size), x[key], np.float32)


@fast
@given(dtype=st.sampled_from(NUMBERS), shape=hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=4),
       index_dtype=st.sampled_from(INTS), index_shape=hnp.array_shapes(min_dims=0, max_dims=2, max_side=3),
       data=st.data())
def test_gather_matches_numpy_take(dtype, shape, index_dtype, index_shape, data):
    params = data.draw(arrays(dtype, shape))
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    indices = data.draw(hnp.arrays(index_dtype, index_shape, elements=st.integers(0, shape[axis] - 1)))
    check(fl.gather(t(params), t(indices), axis=axis), np.take(params, indices, axis=axis), dtype)


def test_gather_axis_0_and_1_with_2d_indices():
    params = np.arange(12, dtype=np.float32).reshape(3, 4)
    idx = [[0, 2], [1, 1]]
    check(fl.gather(t(params), idx), params[np.array(idx)], np.float32)
    check(fl.gather(t(params), idx, axis=1), params[:, np.array(idx)], np.float32)
    assert fl.gather(t(params), idx, axis=1).shape == (3, 2, 2)


def _one_hot_ref(indices, depth, on, off, axis, dtype):
    indices = np.asarray(indices)
    valid = (indices >= 0) & (indices < depth)
    rows = np.eye(depth, dtype=bool)[np.where(valid, indices, 0)] & valid[..., None]
    out = np.where(rows, on, off).astype(dtype)
    return np.moveaxis(out, -1, axis)


@fast
@given(index_shape=hnp.array_shapes(min_dims=0, max_dims=2, max_side=3), depth=st.integers(1, 4),
       on_off=st.one_of(st.none(), st.tuples(st.integers(-5, 5), st.integers(-5, 5))),
       dtype=st.sampled_from([None, np.float32, np.float64, np.int32]), data=st.data())
def test_one_hot_matches_reference(index_shape, depth, on_off, dtype, data):
    # indices outside [0, depth) (here -2..depth+1) give an all-off row
    indices = data.draw(hnp.arrays(np.int32, index_shape, elements=st.integers(-2, depth + 1)))
    rank = len(index_shape) + 1
    axis = data.draw(st.one_of(st.none(), st.integers(0, rank - 1), st.just(-1)))
    on, off = (1, 0) if on_off is None else on_off
    kw = {} if on_off is None else {"on_value": on, "off_value": off}
    want = np.float32 if dtype is None else dtype
    out = fl.one_hot(t(indices), depth, axis=axis, dtype=dtype, **kw)
    check(out, _one_hot_ref(indices, depth, on, off, -1 if axis is None else axis, want), want)


def test_one_hot_out_of_range_rows_are_all_off():
    check(fl.one_hot([0, 3, -1, 2], 3), [[1, 0, 0], [0, 0, 0], [0, 0, 0], [0, 0, 1]], np.float32)
    check(fl.one_hot([1, 5], 2, on_value=7.0, off_value=-1.0), [[-1, 7], [-1, -1]], np.float32)


def test_one_hot_axis_0_puts_depth_first():
    check(fl.one_hot([[0, 1, 2]], 3, axis=0), np.eye(3, dtype=np.float32)[:, None, :], np.float32)


# -- softmax and cross-entropy ------------------------------------------------------------------
def _log_softmax_ref(z, axis=-1):
    z = np.asarray(z, np.float64)
    m = z.max(axis=axis, keepdims=True)
    return z - m - np.log(np.exp(z - m).sum(axis=axis, keepdims=True))


@fast
@given(dtype=st.sampled_from(FLOATS), shape=hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=4),
       data=st.data())
def test_softmax_and_log_softmax_match_a_stable_formula(dtype, shape, data):
    z = data.draw(arrays(dtype, shape, lo=-50, hi=50))
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    expected = _log_softmax_ref(z, axis)
    check(fl.log_softmax(t(z), axis=axis), expected, dtype, atol=1e-5 if dtype == np.float32 else None)
    probs = fl.softmax(t(z), axis=axis)
    check(probs, np.exp(expected), dtype)
    np.testing.assert_allclose(np.asarray(probs).sum(axis=axis), 1.0, rtol=1e-5)


@pytest.mark.parametrize("dtype", FLOATS)
def test_softmax_is_finite_on_large_logits(dtype):
    z = np.array([[1000.0, 0.0, -1000.0], [1000.0, 1000.0, 999.0]], dtype)
    with np.errstate(over="raise", invalid="raise", divide="raise"):   # exp(-2000) may underflow to 0
        probs = np.asarray(fl.softmax(t(z)))
        logp = np.asarray(fl.log_softmax(t(z)))
    assert np.isfinite(probs).all() and np.isfinite(logp).all()
    np.testing.assert_allclose(probs.sum(axis=-1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(logp, _log_softmax_ref(z), rtol=1e-6)


def test_softmax_default_axis_is_last():
    z = np.array([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]], np.float32)
    check(fl.softmax(t(z)), np.exp(_log_softmax_ref(z, -1)), np.float32)


@fast
@given(dtype=st.sampled_from(FLOATS), shape=hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=4),
       data=st.data())
def test_softmax_cross_entropy_matches_reference(dtype, shape, data):
    logits = data.draw(arrays(dtype, shape, lo=-20, hi=20), label="logits")
    raw = data.draw(arrays(dtype, shape, lo=-3, hi=3), label="raw labels")
    labels = np.exp(_log_softmax_ref(raw)).astype(dtype)          # a distribution per row
    axis = data.draw(st.sampled_from([-1, len(shape) - 1, 0]))
    expected = -(labels.astype(np.float64) * _log_softmax_ref(logits, axis)).sum(axis=axis)
    out = fl.softmax_cross_entropy_with_logits(labels=t(labels), logits=t(logits), axis=axis)
    check(out, expected, dtype, atol=1e-4 if dtype == np.float32 else None)


@fast
@given(dtype=st.sampled_from(FLOATS), label_dtype=st.sampled_from(INTS),
       batch=hnp.array_shapes(min_dims=0, max_dims=2, min_side=1, max_side=4), depth=st.integers(1, 5),
       data=st.data())
def test_sparse_softmax_cross_entropy_matches_reference(dtype, label_dtype, batch, depth, data):
    logits = data.draw(arrays(dtype, batch + (depth,), lo=-20, hi=20))
    labels = data.draw(hnp.arrays(label_dtype, batch, elements=st.integers(0, depth - 1)))
    logp = _log_softmax_ref(logits)
    expected = -np.take_along_axis(logp, labels[..., None].astype(np.int64), axis=-1)[..., 0]
    out = fl.sparse_softmax_cross_entropy_with_logits(labels=t(labels), logits=t(logits))
    check(out, expected, dtype, atol=1e-5 if dtype == np.float32 else None)


def test_cross_entropies_agree_on_one_hot_labels():
    logits = fl.constant([[2.0, -1.0, 0.5], [0.0, 1000.0, 0.0]])
    dense = fl.softmax_cross_entropy_with_logits(labels=fl.one_hot([2, 0], 3), logits=logits)
    sparse = fl.sparse_softmax_cross_entropy_with_logits(labels=[2, 0], logits=logits)
    check(dense, np.asarray(sparse), np.float32)
    check(sparse, [-_log_softmax_ref([2.0, -1.0, 0.5])[2], 1000.0], np.float32)


# -- creation and metadata ----------------------------------------------------------------------
def test_fill_zeros_ones():
    check(fl.fill([2, 3], 7.0), np.full((2, 3), 7.0), np.float32)
    check(fl.fill((2,), 7), [7, 7], np.int32)
    check(fl.fill([], 1.5), 1.5, np.float32)
    check(fl.fill([2], fl.constant(3, fl.int64)), [3, 3], np.int64)
    check(fl.zeros([2, 0, 3]), np.zeros((2, 0, 3)), np.float32)
    check(fl.zeros(3, dtype=fl.int64), [0, 0, 0], np.int64)
    check(fl.ones([2, 2], fl.float64), np.ones((2, 2)), np.float64)
    check(fl.ones(fl.constant([1, 2]), "int32"), [[1, 1]], np.int32)


@pytest.mark.parametrize("args,kwargs,expected,dtype", [
    ((5,), {}, np.arange(5), np.int32),
    ((2, 9, 3), {}, [2, 5, 8], np.int32),
    ((5, 0, -2), {}, [5, 3, 1], np.int32),
    ((0.0, 1.0, 0.25), {}, [0.0, 0.25, 0.5, 0.75], np.float32),
    ((3,), {"dtype": fl.float64}, [0.0, 1.0, 2.0], np.float64),
    ((4,), {"dtype": fl.int64}, [0, 1, 2, 3], np.int64),
    ((0,), {}, np.zeros(0, np.int32), np.int32),
])
def test_range_like_python_range(args, kwargs, expected, dtype):
    check(fl.range(*args, **kwargs), expected, dtype)


@pytest.mark.parametrize("shape", [(), (0,), (3,), (2, 1, 4)])
def test_shape_size_rank(shape):
    x = fl.zeros(shape)
    check(fl.shape(x), np.array(shape, np.int32).reshape(len(shape)), np.int32)
    check(fl.shape(x, out_type=fl.int64), np.array(shape, np.int64).reshape(len(shape)), np.int64)
    check(fl.size(x), int(np.prod(shape)), np.int32)
    check(fl.rank(x), len(shape), np.int32)
    check(fl.rank([[1, 2]]), 2, np.int32)


@pytest.mark.parametrize("fn", [fl.identity, fl.stop_gradient])
@few
@given(dtype=st.sampled_from(NUMBERS + [np.bool_]), shape=any_shape, data=st.data())
def test_identity_and_stop_gradient_return_the_values(fn, dtype, shape, data):
    x = data.draw(arrays(dtype, shape))
    check(fn(t(x)), x, dtype)


@fast
@given(dtype=st.sampled_from(NUMBERS), shape=any_shape, n=st.integers(1, 4), data=st.data())
def test_add_n_sums_its_inputs(dtype, shape, n, data):
    parts = [data.draw(arrays(dtype, shape)) for _ in range(n)]
    expected = parts[0].copy()
    for p in parts[1:]:
        expected = expected + p
    check(fl.add_n([t(p) for p in parts]), expected, dtype)


def test_add_n_takes_python_lists_and_rejects_empty():
    check(fl.add_n([[1.0, 2.0], [3.0, 4.0]]), [4.0, 6.0], np.float32)
    with pytest.raises(ValueError):
        fl.add_n([])


# -- operator overloads -------------------------------------------------------------------------
XA = np.array([[1.5, -2.0, 3.0], [4.0, 0.5, -6.0]], np.float32)
YA = np.array([2.0, -1.5, 0.25], np.float32)
OPERATORS = {
    "+": (lambda x, y: x + y, np.float32), "-": (lambda x, y: x - y, np.float32),
    "*": (lambda x, y: x * y, np.float32), "/": (lambda x, y: x / y, np.float32),
    "//": (lambda x, y: x // y, np.float32), "%": (lambda x, y: x % y, np.float32),
    "**": (lambda x, y: x ** y, np.float32),
    "==": (lambda x, y: x == y, np.bool_), "!=": (lambda x, y: x != y, np.bool_),
    "<": (lambda x, y: x < y, np.bool_), "<=": (lambda x, y: x <= y, np.bool_),
    ">": (lambda x, y: x > y, np.bool_), ">=": (lambda x, y: x >= y, np.bool_),
}


@pytest.mark.parametrize("symbol", list(OPERATORS))
@pytest.mark.parametrize("left,right", [("tensor", "tensor"), ("tensor", "numpy"), ("numpy", "tensor"),
                                        ("tensor", "python"), ("python", "tensor"), ("tensor", "list"),
                                        ("list", "tensor")])
def test_binary_operators(symbol, left, right):
    """Every operator, with the tensor on either side: the result is always a flowlab Tensor."""
    fn, dtype = OPERATORS[symbol]
    xa = np.abs(XA) if symbol == "**" else XA   # a negative base to a fractional power is NaN
    operands = {"tensor": (t(xa), t(YA)), "numpy": (xa, YA), "python": (2.0, 0.5), "list": (xa.tolist(), YA.tolist())}
    x, y = operands[left][0], operands[right][1]
    nx, ny = np.asarray(x, np.float32), np.asarray(y, np.float32)
    check(fn(x, y), fn(nx, ny), dtype)


def test_python_ints_on_either_side_of_an_int_tensor():
    x = fl.constant([1, 2, 3])
    check(2 * x, [2, 4, 6], np.int32)
    check(10 - x, [9, 8, 7], np.int32)
    check(7 // x, [7, 3, 2], np.int32)
    check(7 % x, [0, 1, 1], np.int32)
    check(2 ** x, [2, 4, 8], np.int32)
    check(x ** 2, [1, 4, 9], np.int32)


def test_matmul_operator_and_its_reflection():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.arange(12, dtype=np.float32).reshape(3, 4)
    check(t(a) @ t(b), a @ b, np.float32)
    check(a @ t(b), a @ b, np.float32)
    check(t(a) @ b, a @ b, np.float32)


def test_unary_operators():
    x = t(XA)
    check(-x, -XA, np.float32)
    check(+x, XA, np.float32)
    check(abs(x), np.abs(XA), np.float32)
    check(abs(fl.constant([-3, 2])), [3, 2], np.int32)


def test_logical_operators():
    p = fl.constant([True, True, False, False])
    q = np.array([True, False, True, False])
    check(p & t(q), [True, False, False, False], np.bool_)
    check(p | t(q), [True, True, True, False], np.bool_)
    check(~p, [False, False, True, True], np.bool_)
    check(q & p, [True, False, False, False], np.bool_)
    check(q | p, [True, True, True, False], np.bool_)
    check(True & p, [True, True, False, False], np.bool_)
    check(p | False, [True, True, False, False], np.bool_)


def test_python_float_next_to_an_int_tensor_raises_instead_of_truncating():
    x = fl.constant([1, 2])
    with pytest.raises(fl.errors.InvalidArgumentError):
        x + 2.5
    with pytest.raises(fl.errors.InvalidArgumentError):
        2.5 * x
