"""Every gradient rule in the op table against central differences, and gradients of gradients.

Each differentiable op has one or more cases below. A case draws input shapes with hypothesis
(broadcasting included) and values with a seeded numpy generator, kept away from the points where
the op is not differentiable (relu/abs at 0, ties in max/min, floormod's jumps, log/sqrt of
non-positive numbers, pow of a non-positive base). The check weights the output by a fixed random
tensor (``output_gradients``), so every element of a non-scalar output is checked, and compares
the tape's gradient with central differences of that weighted sum, in float64.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import flowlab as fl
from flowlab.core._context import state
from flowlab.core.execute import execute, get_op, list_ops

FD_STEP = 1e-6
MARGIN = 1e-3   # distance kept from kinks and ties: far larger than FD_STEP
MAX_SIDE = 3

gradient_settings = settings(max_examples=30, deadline=None, derandomize=True,
                             suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# -- the check ------------------------------------------------------------------------------
def _ops_run_during(fn, *args):
    names = []

    def hook(op, inputs, attrs, out):
        names.append(op.name)

    thread_state = state()
    thread_state.push("hooks", hook)
    try:
        out = fn(*args)
    finally:
        thread_state.pop("hooks", hook)
    return out, names


def central_differences(scalar_fn, x, step):
    """d scalar_fn / dx by central differences, one element at a time."""
    grad = np.zeros(x.shape, dtype=np.float64)
    flat = grad.reshape(-1)
    for i in range(x.size):
        plus, minus = x.copy(), x.copy()
        plus.reshape(-1)[i] += step
        minus.reshape(-1)[i] -= step
        flat[i] = (scalar_fn(plus) - scalar_fn(minus)) / (2 * step)
    return grad


def assert_gradients_match(op_name, fn, inputs, step=FD_STEP, rtol=1e-6, atol=1e-7, seed=0):
    """Tape gradients of ``sum(w * fn(*inputs))`` for a fixed random ``w`` equal central
    differences, for every floating-point input; ``op_name`` must run in the forward pass."""
    inputs = [np.asarray(x) for x in inputs]
    tensors = [fl.constant(x) for x in inputs]
    floats = [i for i, x in enumerate(inputs) if x.dtype.kind == "f"]
    with fl.GradientTape() as tape:
        for i in floats:
            tape.watch(tensors[i])
        out, ran = _ops_run_during(fn, *tensors)
    assert op_name in ran, f"the case for {op_name} ran only {ran}"
    out_value = out.numpy()
    weight = np.random.default_rng(seed).standard_normal(out_value.shape).astype(out_value.dtype)
    grads = tape.gradient(out, [tensors[i] for i in floats], output_gradients=fl.constant(weight),
                          unconnected_gradients="zero")
    for i, grad in zip(floats, grads):
        def weighted(xi, i=i):
            args = [fl.constant(xi if j == i else x) for j, x in enumerate(inputs)]
            return float(np.sum(weight.astype(np.float64) * np.asarray(fn(*args).numpy(), np.float64)))

        expected = central_differences(weighted, inputs[i], step)
        assert grad.shape == inputs[i].shape, f"gradient of input {i} has shape {grad.shape}"
        assert grad.dtype.as_numpy_dtype == inputs[i].dtype, f"gradient of input {i} is {grad.dtype.name}"
        np.testing.assert_allclose(grad.numpy(), expected, rtol=rtol, atol=atol,
                                   err_msg=f"{op_name}: gradient of input {i}")


# -- values, kept away from non-differentiable points ---------------------------------------
def normal(rng, shape):
    return rng.standard_normal(shape)


def away_from_zero(rng, shape, low=0.2, high=2.0):
    return rng.choice([-1.0, 1.0], size=shape) * rng.uniform(low, high, shape)


def positive(rng, shape, low=0.3, high=2.0):
    return rng.uniform(low, high, shape)


def distinct(rng, shape):
    """No two elements within 0.1 of each other (no ties for max/min reductions)."""
    n = int(np.prod(shape))
    return (rng.permutation(n) * 0.3 + rng.uniform(-0.1, 0.1, n) - 0.15 * n).reshape(shape)


def apart(rng, shape_x, shape_y):
    """x and y whose broadcast elements never tie (maximum/minimum are not differentiable there)."""
    while True:
        x, y = normal(rng, shape_x), normal(rng, shape_y)
        bx, by = np.broadcast_arrays(x, y)
        if np.all(np.abs(bx - by) > MARGIN):
            return x, y


def off_the_jumps(rng, shape_x, shape_y):
    """x and y with x / y never near an integer (where floormod jumps)."""
    while True:
        x, y = 3 * normal(rng, shape_x), away_from_zero(rng, shape_y, 0.5, 2.0)
        q = np.divide(*np.broadcast_arrays(x, y))
        if np.all(np.abs(q - np.round(q)) > MARGIN):
            return x, y


# -- shape strategies -----------------------------------------------------------------------
seeds = st.integers(0, 2**32 - 1)
shapes = hnp.array_shapes(min_dims=0, max_dims=3, min_side=1, max_side=MAX_SIDE)
nonscalar_shapes = hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=MAX_SIDE)


def broadcasting(n):
    return hnp.mutually_broadcastable_shapes(num_shapes=n, min_dims=0, max_dims=3, min_side=1,
                                             max_side=MAX_SIDE).map(lambda b: b.input_shapes)


def axes_of(rank):
    """None, one axis, or a tuple of axes, with negative spellings mixed in."""
    if rank == 0:
        return st.none()
    one = st.integers(-rank, rank - 1)
    several = st.lists(st.integers(0, rank - 1), unique=True, max_size=rank).flatmap(
        lambda axes: st.tuples(*[st.sampled_from([a, a - rank]) for a in axes]))
    return st.none() | one | several


# -- the cases: (op, label, strategy of (fn, inputs)) ---------------------------------------
class Case:
    def __init__(self, op, label, strategy):
        self.op, self.label, self.strategy = op, label, strategy

    def __repr__(self):
        return self.label


CASES: list[Case] = []


def case(op, label=None):
    def register(build):
        CASES.append(Case(op, label or op, st.composite(build)()))
        return build
    return register


def unary_case(op, fn, values):
    @st.composite
    def build(draw):
        rng = np.random.default_rng(draw(seeds))
        return fn, [values(rng, draw(shapes))]
    CASES.append(Case(op, op, build()))


unary_case("negative", fl.negative, normal)
unary_case("abs", fl.abs, away_from_zero)
unary_case("square", fl.square, normal)
unary_case("sqrt", fl.sqrt, positive)
unary_case("exp", fl.exp, normal)
unary_case("log", fl.log, positive)
unary_case("sin", fl.sin, normal)
unary_case("cos", fl.cos, normal)
unary_case("tanh", fl.tanh, normal)
unary_case("sigmoid", fl.sigmoid, lambda rng, s: 3 * normal(rng, s))
unary_case("relu", fl.nn.relu, away_from_zero)
unary_case("identity", fl.identity, normal)
unary_case("check_numerics", lambda x: fl.debugging.check_numerics(x, "x"), normal)
unary_case("log1p", fl.math.log1p, positive)
unary_case("expm1", fl.math.expm1, normal)
unary_case("softplus", fl.nn.softplus, lambda rng, s: 3 * normal(rng, s))
unary_case("reciprocal", fl.math.reciprocal, away_from_zero)
unary_case("rsqrt", fl.math.rsqrt, positive)
# what a tape records when an op reads a Variable: the value at that moment, gradient passes through
unary_case("read_variable", lambda x: execute(get_op("read_variable"), (x,)), normal)


def _normal_pair(rng, sx, sy):
    return normal(rng, sx), normal(rng, sy)


BINARY = {  # op -> (fn, values(rng, shape_x, shape_y))
    "add": (fl.add, _normal_pair),
    "subtract": (fl.subtract, _normal_pair),
    "multiply": (fl.multiply, _normal_pair),
    "divide": (fl.divide, lambda rng, sx, sy: (normal(rng, sx), away_from_zero(rng, sy, 0.5, 2.0))),
    "floormod": (fl.floormod, off_the_jumps),
    "pow": (fl.pow, lambda rng, sx, sy: (positive(rng, sx), 1.5 * normal(rng, sy))),
    "maximum": (fl.maximum, apart),
    "minimum": (fl.minimum, apart),
}


def binary_case(op, fn, values):
    @st.composite
    def build(draw):
        rng = np.random.default_rng(draw(seeds))
        shape_x, shape_y = draw(broadcasting(2))
        return fn, list(values(rng, shape_x, shape_y))
    CASES.append(Case(op, op, build()))


for _op, (_fn, _values) in BINARY.items():
    binary_case(_op, _fn, _values)


@case("relu_grad")
def _relu_grad(draw):
    # relu's backward op: relu_grad(g, y) = g * (y > 0), where g always has y's shape; y away from 0
    rng = np.random.default_rng(draw(seeds))
    shape = draw(shapes)
    return fl.core.ops.math_ops.relu_grad_, [normal(rng, shape), away_from_zero(rng, shape)]


@case("where")
def _where(draw):
    rng = np.random.default_rng(draw(seeds))
    shape_c, shape_x, shape_y = draw(broadcasting(3))
    cond = rng.random(shape_c) < 0.5
    return fl.where, [cond, normal(rng, shape_x), normal(rng, shape_y)]


@case("cast", "cast-float64-to-float32")
def _cast_down(draw):
    rng = np.random.default_rng(draw(seeds))
    return (lambda x: fl.cast(x, fl.float32)), [normal(rng, draw(shapes))]


@case("cast", "cast-float32-to-float64")
def _cast_up(draw):
    rng = np.random.default_rng(draw(seeds))
    return (lambda x: fl.cast(x, fl.float64)), [normal(rng, draw(shapes)).astype(np.float32)]


@case("matmul")
def _matmul(draw):
    rng = np.random.default_rng(draw(seeds))
    batch_a, batch_b = draw(hnp.mutually_broadcastable_shapes(num_shapes=2, max_dims=2, max_side=MAX_SIDE)
                            .map(lambda b: b.input_shapes))
    m, k, n = draw(st.tuples(*[st.integers(1, 3)] * 3))
    transpose_a, transpose_b = draw(st.booleans()), draw(st.booleans())
    a = normal(rng, batch_a + ((k, m) if transpose_a else (m, k)))
    b = normal(rng, batch_b + ((n, k) if transpose_b else (k, n)))
    return (lambda x, y: fl.matmul(x, y, transpose_a=transpose_a, transpose_b=transpose_b)), [a, b]


def reduction_case(op, fn, values):
    @st.composite
    def build(draw):
        rng = np.random.default_rng(draw(seeds))
        shape = draw(shapes)
        axis = draw(axes_of(len(shape)))
        keepdims = draw(st.booleans())
        return (lambda x: fn(x, axis=axis, keepdims=keepdims)), [values(rng, shape)]
    CASES.append(Case(op, op, build()))


reduction_case("reduce_sum", fl.reduce_sum, normal)
reduction_case("reduce_mean", fl.reduce_mean, normal)
reduction_case("reduce_max", fl.reduce_max, distinct)
reduction_case("reduce_min", fl.reduce_min, distinct)
reduction_case("reduce_prod", fl.reduce_prod, lambda rng, s: away_from_zero(rng, s, 0.5, 1.5))


@case("reshape")
def _reshape(draw):
    rng = np.random.default_rng(draw(seeds))
    shape = draw(shapes)
    n = int(np.prod(shape))
    factor = draw(st.sampled_from([d for d in range(1, n + 1) if n % d == 0]))
    target = draw(st.sampled_from([(n,), (-1,), (factor, -1), (1, n // factor, factor), (n, 1)]))
    return (lambda x: fl.reshape(x, target)), [normal(rng, shape)]


@case("broadcast_to")
def _broadcast_to(draw):
    rng = np.random.default_rng(draw(seeds))
    target = draw(shapes)
    # a suffix of the target with some sides set to 1: a shape that broadcasts to the target
    suffix = target[draw(st.integers(0, len(target))):]
    shape = tuple(1 if draw(st.booleans()) else d for d in suffix)
    return (lambda x: fl.broadcast_to(x, target)), [normal(rng, shape)]


@case("transpose")
def _transpose(draw):
    rng = np.random.default_rng(draw(seeds))
    shape = draw(shapes)
    perm = draw(st.none() | st.permutations(range(len(shape))))
    return (lambda x: fl.transpose(x, perm)), [normal(rng, shape)]


@case("expand_dims")
def _expand_dims(draw):
    rng = np.random.default_rng(draw(seeds))
    shape = draw(shapes)
    axis = draw(st.integers(-len(shape) - 1, len(shape)))
    return (lambda x: fl.expand_dims(x, axis)), [normal(rng, shape)]


@case("squeeze")
def _squeeze(draw):
    rng = np.random.default_rng(draw(seeds))
    shape = list(draw(shapes))
    for _ in range(draw(st.integers(1, 2))):
        shape.insert(draw(st.integers(0, len(shape))), 1)
    ones = [i for i, d in enumerate(shape) if d == 1]
    axis = draw(st.none() | st.lists(st.sampled_from(ones), min_size=1, unique=True))
    return (lambda x: fl.squeeze(x, axis)), [normal(rng, tuple(shape))]


@case("concat")
def _concat(draw):
    rng = np.random.default_rng(draw(seeds))
    shape = draw(nonscalar_shapes)
    axis = draw(st.integers(-len(shape), len(shape) - 1))
    sizes = draw(st.lists(st.integers(1, 3), min_size=1, max_size=3))
    inputs = [normal(rng, shape[:axis % len(shape)] + (s,) + shape[axis % len(shape) + 1:]) for s in sizes]
    return (lambda *xs: fl.concat(list(xs), axis)), inputs


@case("stack")
def _stack(draw):
    rng = np.random.default_rng(draw(seeds))
    shape = draw(shapes)
    axis = draw(st.integers(-len(shape) - 1, len(shape)))
    count = draw(st.integers(1, 3))
    return (lambda *xs: fl.stack(list(xs), axis)), [normal(rng, shape) for _ in range(count)]


@st.composite
def index_keys(draw, shape):
    """A numpy-style key for ``shape``: ints, slices (negative steps too), None, ..., and
    advanced int arrays (with repeats) or bool masks."""
    key = []
    for i, d in enumerate(shape):
        kind = draw(st.sampled_from(["int", "slice", "slice", "array", "mask"] if i == 0 else ["int", "slice"]))
        if kind == "int":
            key.append(draw(st.integers(-d, d - 1)))
        elif kind == "slice":
            key.append(draw(st.slices(d)))
        elif kind == "array":
            key.append(np.array(draw(st.lists(st.integers(0, d - 1), min_size=1, max_size=4))))
        else:
            key.append(np.array(draw(st.lists(st.booleans(), min_size=d, max_size=d))))
    if draw(st.booleans()):
        key.insert(draw(st.integers(0, len(key))), None)
    if key and draw(st.booleans()):
        key[draw(st.integers(0, len(key) - 1)):] = [Ellipsis]
    return tuple(key)


@case("getitem")
def _getitem(draw):
    rng = np.random.default_rng(draw(seeds))
    shape = draw(nonscalar_shapes)
    key = draw(index_keys(shape))
    return (lambda x: x[key]), [normal(rng, shape)]


@case("getitem_grad")
def _getitem_grad(draw):
    # getitem's backward op: scatters (adds, for repeated indices) g into zeros of the input's shape
    rng = np.random.default_rng(draw(seeds))
    shape = draw(nonscalar_shapes)
    key = draw(index_keys(shape))
    out_shape = np.empty(shape)[key].shape
    op = get_op("getitem_grad")
    return (lambda g: execute(op, (g,), {"key": key, "shape": shape})), [normal(rng, out_shape)]


@st.composite
def _gather_inputs(draw):
    rng = np.random.default_rng(draw(seeds))
    shape = draw(nonscalar_shapes)
    axis = draw(st.integers(0, len(shape) - 1))
    index_shape = draw(hnp.array_shapes(min_dims=0, max_dims=2, max_side=3))
    indices = rng.integers(0, shape[axis], index_shape)   # repeats included: gradients must add up
    return rng, shape, axis, indices


@case("gather")
def _gather(draw):
    rng, shape, axis, indices = draw(_gather_inputs())
    return (lambda p, i: fl.gather(p, i, axis=axis)), [normal(rng, shape), indices]


@case("gather_grad")
def _gather_grad(draw):
    rng, shape, axis, indices = draw(_gather_inputs())
    out_shape = shape[:axis] + indices.shape + shape[axis + 1:]
    op = get_op("gather_grad")
    return (lambda g, i: execute(op, (g, i), {"axis": axis, "shape": shape})), [normal(rng, out_shape), indices]


def _softmax_like(op, fn):
    @st.composite
    def build(draw):
        rng = np.random.default_rng(draw(seeds))
        shape = draw(nonscalar_shapes)
        axis = draw(st.integers(-len(shape), len(shape) - 1))
        return (lambda x: fn(x, axis=axis)), [2 * normal(rng, shape)]
    CASES.append(Case(op, op, build()))


_softmax_like("softmax", fl.nn.softmax)
_softmax_like("log_softmax", fl.nn.log_softmax)


@case("softmax_cross_entropy_with_logits")
def _xent(draw):
    rng = np.random.default_rng(draw(seeds))
    shape = draw(nonscalar_shapes)
    axis = draw(st.integers(-len(shape), len(shape) - 1))
    labels = rng.uniform(0.1, 1.0, shape)
    labels /= labels.sum(axis=axis, keepdims=True)   # each slice a probability distribution
    return (lambda y, z: fl.nn.softmax_cross_entropy_with_logits(y, z, axis=axis)), [labels, 2 * normal(rng, shape)]


@case("sparse_softmax_cross_entropy_with_logits")
def _sparse_xent(draw):
    rng = np.random.default_rng(draw(seeds))
    shape = draw(nonscalar_shapes)
    labels = rng.integers(0, shape[-1], shape[:-1])
    return (lambda y, z: fl.nn.sparse_softmax_cross_entropy_with_logits(y, z)), [labels, 2 * normal(rng, shape)]


@case("reduce_grad")
def _reduce_grad(draw):
    # a reduction's backward op: reshape to the kept shape, scale, broadcast over the reduced axes
    rng = np.random.default_rng(draw(seeds))
    shape = draw(nonscalar_shapes)
    axis = tuple(sorted(draw(st.sets(st.integers(0, len(shape) - 1), min_size=1))))
    keepdims = draw(st.booleans())
    mean = draw(st.booleans())
    g_shape = tuple(1 if i in axis else d for i, d in enumerate(shape) if keepdims or i not in axis)
    op = get_op("reduce_grad")
    attrs = {"axis": axis, "keepdims": keepdims, "mean": mean}
    x = np.zeros(shape)   # only its shape matters: its gradient is None
    return (lambda g: execute(op, (g, fl.constant(x)), attrs)), [normal(rng, g_shape)]


@case("concat_grad")
def _concat_grad(draw):
    # concat's backward op for sizes known only at run time: the index-th part of g along axis
    rng = np.random.default_rng(draw(seeds))
    shape = draw(nonscalar_shapes)
    axis = draw(st.integers(0, len(shape) - 1))
    sizes = [draw(st.integers(1, 3)) for _ in range(draw(st.integers(1, 3)))]
    index = draw(st.integers(0, len(sizes) - 1))
    xs = [fl.constant(np.zeros(shape[:axis] + (n,) + shape[axis + 1:])) for n in sizes]
    g_shape = shape[:axis] + (sum(sizes),) + shape[axis + 1:]
    op = get_op("concat_grad")
    return (lambda g: execute(op, (g, *xs), {"axis": axis, "index": index})), [normal(rng, g_shape)]


@case("reshape_like")
def _reshape_like(draw):
    # the backward op of reshape/expand_dims/squeeze: g takes x's shape at run time
    rng = np.random.default_rng(draw(seeds))
    shape = draw(nonscalar_shapes)
    x = np.zeros(shape[::-1])
    x = x.reshape(shape)   # same number of elements, a different arrangement than g gets
    g_shape = (int(np.prod(shape)),)
    return (lambda g: fl.core.ops.array_ops.reshape_like(g, fl.constant(x))), [normal(rng, g_shape)]


@case("sum_to_like")
def _sum_to_like(draw):
    # the backward op of broadcasting when a rank is unknown while building: g summed to x's shape at run time
    rng = np.random.default_rng(draw(seeds))
    shape = draw(nonscalar_shapes)
    x = np.zeros(tuple(1 if draw(st.booleans()) else d for d in shape[draw(st.integers(0, len(shape))):]))
    return (lambda g: execute(get_op("sum_to_like"), (g, fl.constant(x)))), [normal(rng, shape)]


@case("sparse_softmax_cross_entropy_grad")
def _sparse_xent_grad(draw):
    # the backward op of sparse cross-entropy: g * (softmax(z) - one_hot(labels)); differentiable
    # in g and z, so second-order gradients through the loss work
    rng = np.random.default_rng(draw(seeds))
    shape = draw(nonscalar_shapes)
    labels = rng.integers(0, shape[-1], shape[:-1])
    op = get_op("sparse_softmax_cross_entropy_grad")
    return (lambda g, y, z: execute(op, (g, y, z))), [normal(rng, shape[:-1]), labels, 2 * normal(rng, shape)]


def _image_geometry(draw):
    """Shapes for a small NHWC convolution or pooling: (x shape, window, strides, padding)."""
    n, c = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    kh, kw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    padding = draw(st.sampled_from(["VALID", "SAME"]))
    h, w = draw(st.integers(kh, 5)), draw(st.integers(kw, 5))
    strides = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    return (n, h, w, c), (kh, kw), strides, padding


def _pooled_shape(shape, window, strides, padding):
    def size(d, k, s):
        return (d - k) // s + 1 if padding == "VALID" else -(-d // s)
    return (shape[0], size(shape[1], window[0], strides[0]), size(shape[2], window[1], strides[1]), shape[3])


@case("conv2d")
def _conv2d(draw):
    rng = np.random.default_rng(draw(seeds))
    shape, window, strides, padding = _image_geometry(draw)
    filters = window + (shape[3], draw(st.integers(1, 3)))
    return (lambda x, w: fl.nn.conv2d(x, w, strides, padding)), [normal(rng, shape), normal(rng, filters)]


def _conv_backprop_case(op, order):
    @st.composite
    def build(draw):
        # linear in its first two inputs; the third only gives a shape (the input's or the filters')
        rng = np.random.default_rng(draw(seeds))
        shape, window, strides, padding = _image_geometry(draw)
        filters = window + (shape[3], draw(st.integers(1, 3)))
        g_shape = _pooled_shape(shape, window, strides, padding)[:3] + (filters[3],)
        arrays = {"x": normal(rng, shape), "w": normal(rng, filters), "g": normal(rng, g_shape)}
        attrs = {"strides": strides, "padding": padding}
        return (lambda a, b, c: execute(get_op(op), (a, b, c), attrs)), [arrays[k] for k in order]
    CASES.append(Case(op, op, build()))


_conv_backprop_case("conv2d_backprop_input", ("g", "w", "x"))
_conv_backprop_case("conv2d_backprop_filter", ("x", "g", "w"))


@case("max_pool2d")
def _max_pool2d(draw):
    rng = np.random.default_rng(draw(seeds))
    shape, window, strides, padding = _image_geometry(draw)
    return (lambda x: fl.nn.max_pool2d(x, window, strides, padding)), [distinct(rng, shape)]


def _pool_backward_case(op, grad_shape):
    @st.composite
    def build(draw):
        # linear in its first input; x (no two elements tied) only says where each window's max is
        rng = np.random.default_rng(draw(seeds))
        shape, window, strides, padding = _image_geometry(draw)
        attrs = {"ksize": window, "strides": strides, "padding": padding}
        g = normal(rng, grad_shape(shape, window, strides, padding))
        return (lambda g, x: execute(get_op(op), (g, x), attrs)), [g, distinct(rng, shape)]
    CASES.append(Case(op, op, build()))


_pool_backward_case("max_pool2d_grad", _pooled_shape)
_pool_backward_case("max_pool2d_grad_grad", lambda shape, *_: shape)


@case("sparse_softmax_cross_entropy_mean")
def _sparse_xent_mean(draw):
    rng = np.random.default_rng(draw(seeds))
    shape = draw(nonscalar_shapes)
    labels = rng.integers(0, shape[-1], shape[:-1])
    return fl.core.ops.nn_ops.sparse_softmax_cross_entropy_mean, [labels, 2 * normal(rng, shape)]


@case("sparse_softmax_cross_entropy_mean_grad")
def _sparse_xent_mean_grad(draw):
    # g / N * (softmax(z) - one_hot(labels)), g a scalar: differentiable in g and z
    rng = np.random.default_rng(draw(seeds))
    shape = draw(nonscalar_shapes)
    labels = rng.integers(0, shape[-1], shape[:-1])
    op = get_op("sparse_softmax_cross_entropy_mean_grad")
    return (lambda g, y, z: execute(op, (g, y, z))), [normal(rng, ()), labels, 2 * normal(rng, shape)]


FD_OPTIONS = {  # cast to float32 rounds: a long step (cast is linear, so the difference stays exact)
    "cast-float64-to-float32": {"step": 2.0**-4, "rtol": 1e-5, "atol": 1e-5},
    "cast-float32-to-float64": {"step": 2.0**-4, "rtol": 1e-5, "atol": 1e-5},
}


# -- the tests -------------------------------------------------------------------------------
def test_every_differentiable_op_has_a_gradient_case():
    differentiable = {name for name in list_ops() if get_op(name).grad is not None
                      and not get_op(name).peers}      # collectives: tests/unit/test_collectives_ops.py
    covered = {c.op for c in CASES}
    assert differentiable - covered == set(), "ops with a gradient rule but no gradient test"
    assert covered - differentiable == set(), "gradient cases for ops that are gone or have no gradient"


@pytest.mark.parametrize("grad_case", CASES, ids=repr)
@gradient_settings
@given(data=st.data())
def test_gradient_matches_central_differences(grad_case, data):
    fn, inputs = data.draw(grad_case.strategy)
    assert_gradients_match(grad_case.op, fn, inputs, **FD_OPTIONS.get(grad_case.label, {}))


def _tape_gradients(fn, inputs, weight_seed=0):
    tensors = [fl.constant(x) for x in inputs]
    floats = [tensors[i] for i, x in enumerate(inputs) if x.dtype.kind == "f"]
    with fl.GradientTape() as tape:
        tape.watch(floats)
        out = fn(*tensors)
    weight = np.random.default_rng(weight_seed).standard_normal(out.shape).astype(out.dtype.as_numpy_dtype)
    return tape.gradient(out, floats, output_gradients=weight, unconnected_gradients="zero")


@pytest.mark.parametrize("grad_case", CASES, ids=repr)
@settings(gradient_settings, max_examples=3)
@given(data=st.data())
def test_float32_gradients_stay_float32(grad_case, data):
    # float32 is what users train in: a rule must not promote it (or lose it) on the way back
    fn, inputs = data.draw(grad_case.strategy)
    inputs = [np.asarray(x) for x in inputs]
    narrow = [x.astype(np.float32) if x.dtype == np.float64 else x for x in inputs]
    for g32, g64 in zip(_tape_gradients(fn, narrow), _tape_gradients(fn, inputs)):
        assert g32.dtype == fl.float32
        np.testing.assert_allclose(g32.numpy(), g64.numpy(), rtol=1e-3, atol=1e-4)


BROADCAST_SHAPES = [((2, 3), (3,)), ((3,), (2, 3)), ((2, 1, 3), (4, 1)), ((), (2, 3)), ((2, 3), ()),
                    ((3, 1), (1, 3)), ((1,), (2, 2))]


@pytest.mark.parametrize("shape_x, shape_y", BROADCAST_SHAPES)
@pytest.mark.parametrize("op", sorted(BINARY))
def test_binary_gradient_sums_over_broadcast_axes(op, shape_x, shape_y):
    fn, values = BINARY[op]
    rng = np.random.default_rng(7)
    assert_gradients_match(op, fn, list(values(rng, shape_x, shape_y)))


def test_matmul_gradient_with_broadcast_batch_and_transposes():
    rng = np.random.default_rng(3)
    a, b = normal(rng, (2, 1, 4, 3)), normal(rng, (5, 2, 4))   # (2,1) x (5,) batch; a^T b^T
    assert_gradients_match("matmul", lambda x, y: fl.matmul(x, y, transpose_a=True, transpose_b=True), [a, b])


@pytest.mark.parametrize("op, values, expected", [
    ("reduce_max", [1.0, 3.0, 3.0, 2.0], [0.0, 0.5, 0.5, 0.0]),
    ("reduce_min", [1.0, 1.0, 1.0, 2.0], [1 / 3, 1 / 3, 1 / 3, 0.0]),
])
def test_ties_in_max_min_reductions_share_the_gradient(op, values, expected):
    # NOTE: a convention, not a derivative (there is none at a tie); it keeps the gradient's sum at g
    x = fl.constant(np.array(values))
    with fl.GradientTape() as tape:
        tape.watch(x)
        y = getattr(fl, op)(x)
    np.testing.assert_allclose(tape.gradient(y, x).numpy(), expected)


def test_ties_in_maximum_send_the_gradient_to_the_first_input():
    x, y = fl.constant(np.array([1.0, 2.0])), fl.constant(np.array([1.0, 0.0]))
    with fl.GradientTape() as tape:
        tape.watch([x, y])
        z = fl.maximum(x, y)
    gx, gy = tape.gradient(z, [x, y])
    np.testing.assert_array_equal(gx.numpy(), [1.0, 1.0])
    np.testing.assert_array_equal(gy.numpy(), [0.0, 0.0])


# -- second order: nested tapes --------------------------------------------------------------
def hessian_vector_product(fn, xs, vs):
    """(d/dxs) sum_i <d fn / d xs_i, vs_i>: the Hessian of scalar ``fn`` times ``vs``, by nested tapes."""
    with fl.GradientTape() as outer:
        outer.watch(xs)
        with fl.GradientTape() as inner:
            inner.watch(xs)
            y = fn(*xs)
        grads = inner.gradient(y, xs)
        inner_product = fl.add_n([fl.reduce_sum(g * v) for g, v in zip(grads, vs)])
    return outer.gradient(inner_product, xs, unconnected_gradients="zero")


def first_gradient(fn, xs):
    with fl.GradientTape() as tape:
        tape.watch(xs)
        y = fn(*xs)
    return [g.numpy() for g in tape.gradient(y, xs, unconnected_gradients="zero")]


def assert_hvp_matches_differences_of_gradient(fn, arrays, seed=0, step=1e-5, rtol=1e-5, atol=1e-6):
    """H v by nested tapes equals (grad(x + h v) - grad(x - h v)) / 2h."""
    rng = np.random.default_rng(seed)
    vs = [rng.standard_normal(a.shape) for a in arrays]
    hvp = hessian_vector_product(fn, [fl.constant(a) for a in arrays], [fl.constant(v) for v in vs])
    plus = first_gradient(fn, [fl.constant(a + step * v) for a, v in zip(arrays, vs)])
    minus = first_gradient(fn, [fl.constant(a - step * v) for a, v in zip(arrays, vs)])
    for got, p, m in zip(hvp, plus, minus):
        np.testing.assert_allclose(got.numpy(), (p - m) / (2 * step), rtol=rtol, atol=atol)
    return hvp, vs


X = np.array([[0.3, -1.2, 0.7], [1.5, -0.4, 0.9]])
POSITIVE_X = np.array([[0.3, 1.2, 0.7], [1.5, 0.4, 2.1]])


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


# op, fn, input, closed-form second derivative (elementwise: the Hessian of sum(f(x)) is diagonal)
ELEMENTWISE_SECOND = [
    ("exp", fl.exp, X, np.exp),
    ("log", fl.log, POSITIVE_X, lambda x: -1 / x**2),
    ("tanh", fl.tanh, X, lambda x: -2 * np.tanh(x) * (1 - np.tanh(x) ** 2)),
    ("sigmoid", fl.sigmoid, X, lambda x: _sigmoid(x) * (1 - _sigmoid(x)) * (1 - 2 * _sigmoid(x))),
    ("sin", fl.sin, X, lambda x: -np.sin(x)),
    ("square", fl.square, X, lambda x: 2 + 0 * x),
    ("pow", lambda x: fl.pow(x, 2.5), POSITIVE_X, lambda x: 2.5 * 1.5 * x**0.5),
    ("relu", fl.nn.relu, X, lambda x: 0 * x),    # zero away from 0
]


@pytest.mark.parametrize("name, fn, x, second", ELEMENTWISE_SECOND, ids=[c[0] for c in ELEMENTWISE_SECOND])
def test_second_derivative_of_elementwise_op_matches_closed_form(name, fn, x, second):
    v = np.random.default_rng(1).standard_normal(x.shape)
    (hvp,) = hessian_vector_product(lambda t: fl.reduce_sum(fn(t)), [fl.constant(x)], [fl.constant(v)])
    np.testing.assert_allclose(hvp.numpy(), second(x) * v, rtol=1e-10, atol=1e-12)


def test_second_derivative_of_relu_squared_keeps_the_active_mask():
    # d2/dx2 relu(x)^2 = 2 [x > 0]: the second pass goes through relu_grad's own gradient
    v = np.random.default_rng(2).standard_normal(X.shape)
    (hvp,) = hessian_vector_product(lambda t: fl.reduce_sum(fl.square(fl.nn.relu(t))), [fl.constant(X)],
                                    [fl.constant(v)])
    np.testing.assert_allclose(hvp.numpy(), 2 * (X > 0) * v)


def test_second_derivatives_of_multiply():
    # f = sum(x * y * x): d2f/dx2 = 2y, d2f/dxdy = 2x, d2f/dy2 = 0
    x, y = np.array([0.5, -1.5, 2.0]), np.array([1.2, 0.3, -0.7])
    vx, vy = np.array([1.0, -2.0, 0.5]), np.array([0.3, 0.7, -1.1])
    hx, hy = hessian_vector_product(lambda a, b: fl.reduce_sum(a * b * a), [fl.constant(x), fl.constant(y)],
                                    [fl.constant(vx), fl.constant(vy)])
    np.testing.assert_allclose(hx.numpy(), 2 * y * vx + 2 * x * vy)
    np.testing.assert_allclose(hy.numpy(), 2 * x * vx)


def test_mixed_second_derivatives_of_pow():
    # f = x^y: f_xx = y(y-1)x^(y-2), f_xy = x^(y-1)(1 + y log x), f_yy = x^y log(x)^2
    x, y = np.array([0.5, 1.5, 2.5]), np.array([1.3, -0.7, 2.2])
    vx, vy = np.array([1.0, -2.0, 0.5]), np.array([0.3, 0.7, -1.1])
    hx, hy = hessian_vector_product(lambda a, b: fl.reduce_sum(fl.pow(a, b)), [fl.constant(x), fl.constant(y)],
                                    [fl.constant(vx), fl.constant(vy)])
    f_xx, f_xy, f_yy = y * (y - 1) * x ** (y - 2), x ** (y - 1) * (1 + y * np.log(x)), x**y * np.log(x) ** 2
    np.testing.assert_allclose(hx.numpy(), f_xx * vx + f_xy * vy)
    np.testing.assert_allclose(hy.numpy(), f_xy * vx + f_yy * vy)


def test_second_derivative_of_softmax():
    w = np.random.default_rng(4).standard_normal((2, 4))
    logits = np.random.default_rng(5).standard_normal((2, 4))
    assert_hvp_matches_differences_of_gradient(lambda z: fl.reduce_sum(fl.constant(w) * fl.nn.softmax(z)), [logits])


def test_second_derivative_of_matmul_is_the_bilinear_form():
    # F = sum(C * (A @ B)): dF/dA = C B^T, so d/dB <dF/dA, V> = V^T C and d/dA <dF/dA, V> = 0
    rng = np.random.default_rng(6)
    a, b, c, v = rng.standard_normal((2, 3)), rng.standard_normal((3, 4)), rng.standard_normal((2, 4)), \
        rng.standard_normal((2, 3))
    with fl.GradientTape() as outer:
        ta, tb = fl.constant(a), fl.constant(b)
        outer.watch([ta, tb])
        with fl.GradientTape() as inner:
            inner.watch(ta)
            f = fl.reduce_sum(fl.constant(c) * fl.matmul(ta, tb))
        ga = inner.gradient(f, ta)
        np.testing.assert_allclose(ga.numpy(), c @ b.T)
        s = fl.reduce_sum(ga * fl.constant(v))
    d_a, d_b = outer.gradient(s, [ta, tb], unconnected_gradients="zero")
    np.testing.assert_allclose(d_b.numpy(), v.T @ c)
    np.testing.assert_array_equal(d_a.numpy(), np.zeros_like(a))


@pytest.mark.parametrize("axis", [None, 0, 1, (0, 1)])
def test_second_derivative_of_reductions(axis):
    # F = sum(reduce_sum(x)^2) and sum(reduce_mean(x)^2): H v = 2 * (sum of v over the group) / n^2
    x = np.arange(6.0).reshape(2, 3) - 2.5
    v = np.random.default_rng(8).standard_normal(x.shape)
    count = x.size if axis is None else int(np.prod([x.shape[a] for a in np.atleast_1d(axis)]))
    group_sum = np.broadcast_to(v.sum(axis=axis, keepdims=True), x.shape)
    for reduce, n in [(fl.reduce_sum, 1), (fl.reduce_mean, count)]:
        (hvp,) = hessian_vector_product(lambda t: fl.reduce_sum(fl.square(reduce(t, axis=axis))),
                                        [fl.constant(x)], [fl.constant(v)])
        np.testing.assert_allclose(hvp.numpy(), 2 * group_sum / n**2, err_msg=reduce.__name__)


def test_mlp_hessian_vector_product_matches_differences_of_gradient():
    rng = np.random.default_rng(9)
    data = fl.constant(rng.standard_normal((5, 3)))
    labels = fl.constant(np.eye(4)[rng.integers(0, 4, 5)])
    params = [rng.standard_normal((3, 6)) * 0.7, rng.standard_normal(6) * 0.1,
              rng.standard_normal((6, 4)) * 0.7, rng.standard_normal(4) * 0.1]

    def loss(w1, b1, w2, b2):
        hidden = fl.tanh(fl.matmul(data, w1) + b1)
        logits = fl.matmul(hidden, w2) + b2
        return fl.reduce_mean(fl.nn.softmax_cross_entropy_with_logits(labels, logits))

    hvp, vs = assert_hvp_matches_differences_of_gradient(loss, params)
    assert all(np.abs(h.numpy()).max() > 1e-3 for h in hvp)   # not a vacuous zero


def test_third_order_gradient_of_exp():
    x = fl.constant(np.array([0.2, -0.5]))
    with fl.GradientTape() as t3:
        t3.watch(x)
        with fl.GradientTape() as t2:
            t2.watch(x)
            with fl.GradientTape() as t1:
                t1.watch(x)
                y = fl.reduce_sum(fl.exp(2 * x))
            g1 = fl.reduce_sum(t1.gradient(y, x))
        g2 = fl.reduce_sum(t2.gradient(g1, x))
    g3 = t3.gradient(g2, x)
    np.testing.assert_allclose(g3.numpy(), 8 * np.exp(2 * x.numpy()))
