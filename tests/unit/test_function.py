"""``@fl.function`` against eager execution: every op, composite programs, the trace cache,
variables, random ops.

The reference for a traced function is the same Python function run eagerly (JAX's core_test
does this for every transform): same values, dtype and shape, and the same gradients when a
GradientTape runs *inside* the traced function. Inputs are passed as arguments, so they become
placeholders and the graph really computes with them (a value closed over would be a constant,
and a graph of constants proves little).
"""
from __future__ import annotations

import io
import warnings

import numpy as np
import pytest

import flowlab as fl
from flowlab.core.execute import execute, get_op

TOL = {np.dtype(np.float32): dict(rtol=1e-6, atol=1e-6), np.dtype(np.float64): dict(rtol=1e-12, atol=1e-12)}
_rng = np.random.default_rng(20240601)


# -- inputs: fixed values, away from kinks, ties and jumps --------------------------------------
def F32(*shape):
    return fl.constant(_rng.standard_normal(shape).astype(np.float32))


def F64(*shape):
    return fl.constant(_rng.standard_normal(shape))


def POS(*shape, dtype=np.float32):
    return fl.constant(_rng.uniform(0.5, 2.0, shape).astype(dtype))


def AWAY(*shape, dtype=np.float32):
    """No element near 0 (relu, abs and sign have a kink there)."""
    signs = _rng.choice([-1.0, 1.0], size=shape)
    return fl.constant((signs * _rng.uniform(0.3, 2.0, shape)).astype(dtype))


def DISTINCT(*shape, dtype=np.float32):
    """No two elements within 0.2 of each other (no ties for max/min)."""
    n = int(np.prod(shape))
    return fl.constant((_rng.permutation(n) * 0.5 - n / 4).reshape(shape).astype(dtype))


def INT(*shape, low=-4, high=5, dtype=np.int32):
    return fl.constant(_rng.integers(low, high, shape).astype(dtype))


def BOOL(*shape):
    return fl.constant(_rng.integers(0, 2, shape).astype(bool))


def IDX(*values):
    return fl.constant(np.array(values, dtype=np.int32))


# -- the op table -------------------------------------------------------------------------------
class Case:
    """``fn(*args)`` through the public API. ``op``: the op its forward graph must contain;
    ``grad_ops``: ops its gradient graph must contain. Marks: on the forward/gradient test."""

    def __init__(self, op, label, fn, args, grad_ops=(), marks=(), grad_marks=()):
        self.op, self.label, self.fn, self.args = op, label, fn, list(args)
        self.grad_ops, self.marks, self.grad_marks = tuple(grad_ops), marks, grad_marks
        self.id = f"{op}-{label}" if label else op


CAST_BUG = ()   # was a bug: fl.cast read x._value (fixed)

CASES = [
    # elementwise arithmetic, function and operator spellings, broadcasting and Python numbers
    Case("add", "broadcast", fl.add, [F32(2, 1, 3), F32(4, 1)]),
    Case("add", "operator and python float", lambda x: x + 1.5, [F32(3)]),
    Case("subtract", "", fl.subtract, [F32(2, 3), F32(3)]),
    Case("subtract", "reflected operator", lambda x, y: 2.0 - x - y, [F32(2, 3), F32(1, 3)]),
    Case("multiply", "", fl.multiply, [F32(2, 3), F32(1)]),
    Case("multiply", "operator", lambda x, y: x * y * 3.0, [F64(3, 1), F64(2)]),
    Case("divide", "float", lambda x, y: x / y, [F32(2, 3), AWAY(3)]),
    Case("divide", "int gives float64", fl.divide, [INT(2, 3), IDX(1, -2, 3)]),
    Case("floordiv", "", lambda x, y: x // y, [INT(2, 3), IDX(2, -3, 4)]),
    Case("floormod", "", fl.floormod, [fl.constant([1.3, -2.6, 4.1]), fl.constant([[1.0], [-0.7]])]),
    Case("floormod", "operator on ints", lambda x: x % 3, [INT(4)]),
    Case("pow", "", fl.pow, [POS(2, 3), F32(3)]),
    Case("pow", "operators", lambda x: x ** 2.0 + 2.0 ** x, [F32(3)]),
    Case("maximum", "", fl.maximum, [DISTINCT(2, 3), fl.constant([0.1, -0.35, 0.6], dtype=fl.float32)]),
    Case("minimum", "", fl.minimum, [DISTINCT(2, 3), fl.constant([0.1, -0.35, 0.6], dtype=fl.float32)]),
    Case("negative", "operator", lambda x: -x, [F32(2, 2)]),
    Case("sign", "", fl.sign, [INT(5)]),
    Case("abs", "", abs, [AWAY(2, 3)]),
    Case("square", "", fl.square, [F64(3)]),
    Case("sqrt", "", fl.sqrt, [POS(2, 3)]),
    Case("exp", "", fl.exp, [F32(3)]),
    Case("log", "", fl.log, [POS(3)]),
    Case("sin", "", fl.sin, [F32(3)]),
    Case("cos", "", fl.cos, [F64(3)]),
    Case("tanh", "", fl.tanh, [F32(2, 2)]),
    Case("sigmoid", "", fl.nn.sigmoid, [F64(4)]),
    Case("relu", "", fl.nn.relu, [AWAY(2, 3)], grad_ops=["relu_grad"]),
    Case("log1p", "", fl.math.log1p, [POS(3)]),
    Case("expm1", "", fl.math.expm1, [F32(3)]),
    Case("softplus", "", fl.nn.softplus, [F64(4)]),
    Case("reciprocal", "", fl.math.reciprocal, [AWAY(2, 3)]),
    Case("rsqrt", "", fl.math.rsqrt, [POS(3)]),
    Case("round", "", fl.round, [F32(5)]),
    Case("floor", "", fl.floor, [F32(3)]),
    Case("ceil", "", fl.math.ceil, [F64(3)]),
    Case("is_nan", "", fl.math.is_nan, [F32(3)]),
    Case("is_inf", "", fl.math.is_inf, [F32(3)]),
    Case("is_finite", "", fl.math.is_finite, [F64(2)]),
    # comparisons and logic (no gradients)
    Case("equal", "", fl.equal, [INT(2, 3, low=0, high=2), INT(3, low=0, high=2)]),
    Case("not_equal", "operator", lambda x, y: x != y, [INT(4, low=0, high=2), INT(4, low=0, high=2)]),
    Case("less", "operator", lambda x, y: x < y, [F32(2, 3), F32(3)]),
    Case("less_equal", "", fl.less_equal, [INT(3), INT(2, 1)]),
    Case("greater", "operator and python float", lambda x: x > 0.0, [F32(4)]),
    Case("greater_equal", "", fl.greater_equal, [INT(3), INT(3)]),
    Case("logical_and", "operator", lambda a, b: a & b, [BOOL(2, 3), BOOL(3)]),
    Case("logical_or", "", fl.logical_or, [BOOL(4), BOOL(4)]),
    Case("logical_not", "operator", lambda a: ~a, [BOOL(2, 2)]),
    Case("where", "", fl.where, [BOOL(2, 3), F32(2, 3), F32(3)]),
    Case("where_indices", "", fl.where, [BOOL(3, 2)]),
    # casts and fills
    Case("cast", "float to int", lambda x: fl.cast(x, fl.int32), [F32(3)], marks=CAST_BUG),
    Case("cast", "float32 to float64", lambda x: fl.cast(x, fl.float64) * 2.0, [F32(3)],
         marks=CAST_BUG, grad_marks=CAST_BUG),
    Case("zeros_like", "", fl.zeros_like, [INT(2, 3)]),
    Case("ones_like", "new dtype", lambda x: fl.ones_like(x, dtype=fl.float64), [F32(2)]),
    # matmul
    Case("matmul", "", fl.matmul, [F32(2, 3), F32(3, 4)]),
    Case("matmul", "transposed", lambda a, b: fl.matmul(a, b, transpose_a=True, transpose_b=True),
         [F32(3, 2), F32(4, 3)]),
    Case("matmul", "operator, batched", lambda a, b: a @ b, [F64(2, 1, 3, 4), F64(5, 4, 2)]),
    # shapes
    Case("reshape", "with -1", lambda x: fl.reshape(x, [3, -1]), [F32(2, 3, 2)], grad_ops=["reshape_like"]),
    Case("broadcast_to", "", lambda x: fl.broadcast_to(x, [2, 3, 4]), [F32(3, 1)]),
    Case("transpose", "perm", lambda x: fl.transpose(x, [1, 2, 0]), [F32(2, 3, 4)]),
    Case("transpose", "default", fl.transpose, [F32(2, 3)]),
    Case("expand_dims", "", lambda x: fl.expand_dims(x, -1), [F32(2, 3)], grad_ops=["reshape_like"]),
    Case("squeeze", "", lambda x: fl.squeeze(x, axis=[0, 2]), [F32(1, 3, 1, 2)], grad_ops=["reshape_like"]),
    Case("identity", "", fl.identity, [F32(3)]),
    Case("stop_gradient", "", lambda x, y: fl.stop_gradient(x) * y, [F32(3), F32(3)]),
    Case("concat", "axis 1", lambda a, b: fl.concat([a, b], axis=1), [F32(2, 3), F32(2, 1)]),
    Case("stack", "axis 1", lambda a, b: fl.stack([a, b], axis=1), [F32(2, 3), F32(2, 3)]),
    Case("getitem", "basic", lambda x: x[1:, ::2, -1], [F32(3, 4, 2)], grad_ops=["getitem_grad"]),
    Case("getitem", "int arrays", lambda x: x[[0, 2, 0], [1, 1, 3]], [F32(3, 4)], grad_ops=["getitem_grad"]),
    Case("getitem", "unstack", lambda x: fl.unstack(x, axis=1)[1], [F32(2, 3)], grad_ops=["getitem_grad"]),
    Case("getitem", "slice", lambda x: fl.slice(x, [0, 1], [2, -1]), [F32(3, 4)], grad_ops=["getitem_grad"]),
    Case("gather", "indices fed", lambda p, i: fl.gather(p, i, axis=1), [F32(2, 4), IDX(3, 0, 3)],
         grad_ops=["gather_grad"]),
    Case("one_hot", "indices fed", lambda i: fl.one_hot(i, 4, axis=0), [IDX(1, 3, 0, 7)]),
    # reductions
    Case("reduce_sum", "axis, keepdims", lambda x: fl.reduce_sum(x, axis=0, keepdims=True), [F32(2, 3)],
         grad_ops=["reduce_grad"]),
    Case("reduce_sum", "int, all axes", fl.reduce_sum, [INT(2, 3)]),
    Case("reduce_mean", "", lambda x: fl.reduce_mean(x, axis=-1), [F32(2, 3)], grad_ops=["reduce_grad"]),
    Case("reduce_max", "", lambda x: fl.reduce_max(x, axis=1), [DISTINCT(2, 3)], grad_marks=CAST_BUG),
    Case("reduce_min", "keepdims", lambda x: fl.reduce_min(x, axis=(0, 1), keepdims=True), [DISTINCT(2, 3)],
         grad_marks=CAST_BUG),
    Case("reduce_prod", "", lambda x: fl.reduce_prod(x, axis=1), [POS(2, 3)], grad_ops=["reduce_grad"]),
    Case("argmax", "", lambda x: fl.argmax(x, axis=1), [DISTINCT(2, 3)]),
    Case("argmin", "int32", lambda x: fl.argmin(x, output_type=fl.int32), [DISTINCT(3, 2)]),
    Case("reduce_any", "", lambda x: fl.reduce_any(x, axis=1), [BOOL(2, 3)]),
    Case("reduce_all", "", fl.math.reduce_all, [BOOL(2, 3)]),
    Case("top_k_indices", "values and indices", lambda x: fl.math.top_k(x, 2).values * 2.0, [DISTINCT(3, 4)],
         grad_ops=["gather_grad"]),
    # nn
    Case("softmax", "", fl.nn.softmax, [F32(2, 4)]),
    Case("log_softmax", "axis 0", lambda x: fl.nn.log_softmax(x, axis=0), [F64(3, 2)]),
    Case("softmax_cross_entropy_with_logits", "", fl.nn.softmax_cross_entropy_with_logits, [POS(2, 3), F32(2, 3)]),
    Case("sparse_softmax_cross_entropy_with_logits", "labels fed",
         fl.nn.sparse_softmax_cross_entropy_with_logits, [IDX(2, 0), F32(2, 3)],
         grad_ops=["sparse_softmax_cross_entropy_grad"]),
    Case("conv2d", "same, stride 2", lambda x, w: fl.nn.conv2d(x, w, 2, "SAME"), [F32(2, 5, 6, 3), F32(3, 3, 3, 4)],
         grad_ops=["conv2d_backprop_input", "conv2d_backprop_filter"]),
    Case("conv2d_backprop_input", "second order",
         lambda g, w, x: execute(get_op("conv2d_backprop_input"), (g, w, x), {"strides": (1, 1), "padding": "VALID"}),
         [F32(2, 3, 2, 4), F32(2, 3, 3, 4), F32(2, 4, 4, 3)], grad_ops=["conv2d", "conv2d_backprop_filter"]),
    Case("conv2d_backprop_filter", "second order",
         lambda x, g, w: execute(get_op("conv2d_backprop_filter"), (x, g, w), {"strides": (1, 1), "padding": "VALID"}),
         [F32(2, 4, 4, 3), F32(2, 3, 2, 4), F32(2, 3, 3, 4)], grad_ops=["conv2d", "conv2d_backprop_input"]),
    Case("max_pool2d", "valid", lambda x: fl.nn.max_pool2d(x, 2, 2, "VALID"), [DISTINCT(2, 4, 5, 3)],
         grad_ops=["max_pool2d_grad"]),
    Case("max_pool2d_grad", "second order",
         lambda g, x: execute(get_op("max_pool2d_grad"), (g, x), {"ksize": (3, 3), "strides": (2, 2), "padding": "SAME"}),
         [F32(2, 3, 3, 2), DISTINCT(2, 5, 6, 2)], grad_ops=["max_pool2d_grad_grad"]),
    Case("dropout_mask", "seeded", lambda x: fl.nn.dropout(x, 0.5, seed=7), [F32(4, 5)]),
    Case("sum_to_like", "", lambda g, x: execute(get_op("sum_to_like"), (g, x)), [F32(2, 3, 4), F32(3, 1)]),
    Case("sparse_softmax_cross_entropy_mean", "labels fed", fl.core.ops.nn_ops.sparse_softmax_cross_entropy_mean,
         [IDX(2, 0, 1), F32(3, 4)], grad_ops=["sparse_softmax_cross_entropy_mean_grad"]),
    Case("check_numerics", "", lambda x: fl.debugging.check_numerics(x, "x"), [F32(3)]),
    # public functions that are not ops of their own
    Case("add", "add_n", lambda a, b, c: fl.add_n([a, b, c]), [F32(2), F32(2), F32(2)]),
    Case("const", "zeros, ones, range", lambda x: x * fl.ones([3]) + fl.zeros([3]) + fl.cast(fl.range(3), fl.float32),
         [F32(3)]),
    Case("const", "shape, size, rank of known shapes", lambda x: fl.shape(x) * fl.size(x) + fl.rank(x), [F32(2, 3)]),
    Case("broadcast_to", "fill with a traced value", lambda x: fl.fill([2], x[0]) * x, [F32(2)]),
    Case("shape", "", lambda x: fl.cast(fl.shape(x), fl.float32) * fl.reduce_sum(x), [F32(2, 3)]),
]

# Ops a traced program never shows as ops of the table above, and why:
GRAPH_ONLY = {
    "placeholder",      # a traced function's arguments (test_graph.py)
    "const",            # values baked into a graph (test_graph.py)
    "read_variable",    # eager tapes only: a graph reads a variable with a `read` node
    "concat_grad",      # only for sizes unknown while tracing (test_gradient_of_concat_along_an_unknown_axis)
}
# Stateful ops: reached through variables, optimizers and fl.random (test_stateful_ops_are_traced).
STATEFUL = {"read", "assign", "random", "random_shuffle", "optimizer_update", "optimizer_advance",
            "print"}   # fl.print: tests/unit/test_tf_names_ops.py


def _float_positions(case):
    return [i for i, a in enumerate(case.args) if a.dtype.is_floating]


def _differentiable(case):
    """Float inputs and a float output (stop_gradient included: its gradient is zero)."""
    return bool(_float_positions(case)) and case.fn(*case.args).dtype.is_floating


def check_same(got, want):
    """``got`` (from the graph) equals ``want`` (eager): a flowlab Tensor of the same dtype, shape
    and values."""
    assert type(got) is fl.Tensor, f"expected an eager Tensor, got {type(got).__name__}"
    assert got.dtype == want.dtype, f"dtype {got.dtype.name}, eager gives {want.dtype.name}"
    assert got.shape == want.shape, f"shape {got.shape}, eager gives {want.shape}"
    w = np.asarray(want)
    if w.dtype.kind == "f":
        np.testing.assert_allclose(np.asarray(got), w, **TOL[w.dtype])
    else:
        np.testing.assert_array_equal(np.asarray(got), w)


def with_gradients(fn, floats):
    """``(w, *args) -> gradients of sum(w * fn(*args))`` for the inputs at ``floats``: a fixed
    weight checks every output element, not just their sum."""
    def grads(w, *args):
        with fl.GradientTape() as tape:
            for i in floats:
                tape.watch(args[i])
            out = fn(*args)
            target = fl.reduce_sum(out * w)
        return tape.gradient(target, [args[i] for i in floats], unconnected_gradients="zero")
    return grads


def traced_ops(fn, args):
    """The op names that ``fn`` records into a fresh graph, its arguments fed as placeholders."""
    g = fl.Graph("ops")
    with g.as_default():
        fn(*[g.placeholder(a.dtype, a.shape) for a in args])
    return {n.op.name for n in g.nodes}


# -- 1. every op: traced == eager ---------------------------------------------------------------
def test_every_public_op_has_a_case():
    covered = {c.op for c in CASES} | {op for c in CASES for op in c.grad_ops}
    ops = {n for n in fl.core.list_ops() if not get_op(n).peers}   # collectives: test_collectives_ops.py
    assert ops - GRAPH_ONLY - STATEFUL - covered == set(), "ops without a traced-vs-eager case: add one to CASES"
    assert covered - ops == set(), "CASES names ops that are not in the table"
    unchecked = [c.id for c in CASES if c.grad_ops and not _differentiable(c)]
    assert unchecked == [], "cases whose gradient ops would never be checked"


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id, marks=c.marks) for c in CASES])
def test_traced_equals_eager(case):
    want = case.fn(*case.args)
    traced = fl.function(case.fn)
    got = traced(*case.args)
    check_same(got, want)
    concrete = traced.get_concrete_function(*case.args)
    assert len(concrete.inputs) == len(case.args), "every argument is a placeholder"
    assert case.op in traced_ops(case.fn, case.args), f"the case never records op {case.op!r}"
    assert traced.experimental_get_tracing_count() == 1


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id, marks=c.grad_marks) for c in CASES if _differentiable(c)])
def test_gradients_inside_the_function_equal_eager(case):
    floats = _float_positions(case)
    out = case.fn(*case.args)
    w = fl.constant(np.random.default_rng(0).standard_normal(tuple(out.shape)).astype(out.dtype.as_numpy_dtype))
    grads = with_gradients(case.fn, floats)
    want = grads(w, *case.args)
    traced = fl.function(grads)
    got = traced(w, *case.args)
    assert traced.experimental_get_tracing_count() == 1, "the gradients came from a graph"
    assert len(got) == len(want) == len(floats)
    for i, g, e in zip(floats, got, want):
        check_same(g, e)
        assert g.shape == case.args[i].shape
    backward = traced_ops(grads, [w, *case.args])
    for op in case.grad_ops:
        assert op in backward, f"the gradient never records op {op!r}; ran {sorted(backward)}"


def test_second_order_gradients_inside_a_function():
    def d2(x):
        with fl.GradientTape() as outer:
            outer.watch(x)
            with fl.GradientTape() as inner:
                inner.watch(x)
                y = x * x * x
            dy = inner.gradient(y, x)
        return dy, outer.gradient(dy, x)

    x = fl.constant([1.0, -2.0, 0.5])
    dy, d2y = fl.function(d2)(x)
    np.testing.assert_allclose(dy.numpy(), 3 * x.numpy() ** 2)
    np.testing.assert_allclose(d2y.numpy(), 6 * x.numpy())


def test_output_gradients_fed_to_the_function():
    def weighted(x, w):
        with fl.GradientTape() as tape:
            tape.watch(x)
            y = x * x
        return tape.gradient(y, x, output_gradients=w)

    x, w = fl.constant([1.0, 2.0]), fl.constant([3.0, -1.0])
    check_same(fl.function(weighted)(x, w), weighted(x, w))


# -- 2. composite programs ----------------------------------------------------------------------
def init_params(seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((3, 8)).astype(np.float32) * 0.5, np.zeros(8, np.float32),
            rng.standard_normal((8, 4)).astype(np.float32) * 0.5, np.zeros(4, np.float32)]


def mlp_loss(params, x, labels):
    w1, b1, w2, b2 = params
    hidden = fl.nn.relu(x @ w1 + b1)
    # NOTE: the reshape is a no-op on purpose: its gradient (reshape_like) must take its shape at run time
    logits = fl.reshape(hidden @ w2, [-1, 4]) + b2
    return fl.reduce_mean(fl.nn.sparse_softmax_cross_entropy_with_logits(labels, logits))


def train_step(params, optimizer, x, labels):
    with fl.GradientTape() as tape:
        loss = mlp_loss(params, x, labels)
    grads = tape.gradient(loss, params)
    optimizer.apply_gradients(zip(grads, params))
    return loss


def batch(n, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 3)).astype(np.float32)
    return fl.constant(x), fl.constant(rng.integers(0, 4, n).astype(np.int32))


def test_mlp_forward_and_loss():
    params = [fl.constant(p) for p in init_params()]
    x, labels = batch(5, 1)
    check_same(fl.function(mlp_loss)(params, x, labels), mlp_loss(params, x, labels))


OPTIMIZERS = {
    "sgd": lambda: fl.optimizers.SGD(0.1),
    "sgd-momentum": lambda: fl.optimizers.SGD(0.1, momentum=0.9),
    "adam": lambda: fl.optimizers.Adam(0.05),
}


@pytest.mark.parametrize("make_optimizer", OPTIMIZERS.values(), ids=OPTIMIZERS.keys())
def test_training_step_matches_eager_over_three_steps(make_optimizer):
    eager_params = [fl.Variable(p) for p in init_params()]
    graph_params = [fl.Variable(p) for p in init_params()]
    eager_opt, graph_opt = make_optimizer(), make_optimizer()
    step = fl.function(lambda x, labels: train_step(graph_params, graph_opt, x, labels))
    for i in range(3):
        x, labels = batch(6, seed=i)
        check_same(step(x, labels), train_step(eager_params, eager_opt, x, labels))
        for g, e in zip(graph_params, eager_params):
            np.testing.assert_allclose(g.numpy(), e.numpy(), rtol=1e-5, atol=1e-6)
    assert step.experimental_get_tracing_count() == 1
    assert int(graph_opt.iterations) == int(eager_opt.iterations) == 3
    assert not np.allclose(graph_params[0].numpy(), init_params()[0]), "the weights must have moved"


def test_training_step_with_unknown_batch_size():
    eager_params = [fl.Variable(p) for p in init_params()]
    graph_params = [fl.Variable(p) for p in init_params()]
    eager_opt, graph_opt = fl.optimizers.Adam(0.05), fl.optimizers.Adam(0.05)
    step = fl.function(lambda x, labels: train_step(graph_params, graph_opt, x, labels),
                       input_signature=[fl.TensorSpec([None, 3]), fl.TensorSpec([None], fl.int32)])
    for i, n in enumerate([2, 7, 1, 4]):
        x, labels = batch(n, seed=10 + i)
        check_same(step(x, labels), train_step(eager_params, eager_opt, x, labels))
        for g, e in zip(graph_params, eager_params):
            np.testing.assert_allclose(g.numpy(), e.numpy(), rtol=1e-5, atol=1e-6)
    assert step.experimental_get_tracing_count() == 1
    ops = {n.op.name for n in step.get_concrete_function().graph.nodes}
    # the gradient ops that take their shapes at run time
    assert {"reduce_grad", "reshape_like", "sparse_softmax_cross_entropy_grad"} <= ops


def test_gradient_of_concat_along_an_unknown_axis():
    @fl.function(input_signature=[fl.TensorSpec([None, 2])])
    def grad(x):
        with fl.GradientTape() as tape:
            tape.watch(x)
            y = fl.reduce_sum(fl.concat([x, 2.0 * x], axis=0))
        return tape.gradient(y, x)

    np.testing.assert_allclose(grad(fl.ones([3, 2])).numpy(), np.full((3, 2), 3.0))
    assert "concat_grad" in {n.op.name for n in grad.get_concrete_function().graph.nodes}


def test_second_gradient_through_concat_along_an_unknown_axis():
    @fl.function(input_signature=[fl.TensorSpec([None]), fl.TensorSpec([None])])
    def grads(x, y):
        with fl.GradientTape() as outer:
            outer.watch(x)
            with fl.GradientTape() as inner:
                inner.watch(x)
                z = fl.concat([x * x, y], axis=0)
                s = fl.reduce_sum(z * z)
            gx = inner.gradient(s, x)           # 4 x^3, through concat_grad
            t = fl.reduce_sum(gx)
        return gx, outer.gradient(t, x)         # 12 x^2, through concat_grad's own gradient

    x, y = fl.constant([1.0, 2.0]), fl.constant([5.0, 6.0, 7.0])
    gx, ggx = grads(x, y)
    np.testing.assert_allclose(gx.numpy(), [4.0, 32.0])
    np.testing.assert_allclose(ggx.numpy(), [12.0, 48.0])


def test_gradient_of_reduce_max_with_unknown_batch_size():
    @fl.function(input_signature=[fl.TensorSpec([None, 3])])
    def grad(x):
        with fl.GradientTape() as tape:
            tape.watch(x)
            y = fl.reduce_sum(fl.reduce_max(x, axis=1))
        return tape.gradient(y, x)

    x = fl.constant([[1.0, 5.0, 2.0], [7.0, 0.0, 3.0]])
    np.testing.assert_array_equal(grad(x).numpy(), [[0, 1, 0], [1, 0, 0]])


def test_python_loop_unrolls_at_trace_time():
    def repeat(x, n):
        for _ in range(n):
            x = x * 2.0
        return x

    traced = fl.function(repeat)
    x = fl.constant([1.0, 3.0])
    check_same(traced(x, 3), repeat(x, 3))
    ops = [n.op.name for n in traced.get_concrete_function(x, 3).graph.nodes]
    assert ops.count("multiply") == 3


def test_python_if_picks_a_branch_per_trace():
    def branch(x, square):
        if square:
            return x * x
        return -x

    traced = fl.function(branch)
    x = fl.constant([2.0, -3.0])
    check_same(traced(x, True), branch(x, True))
    check_same(traced(x, False), branch(x, False))
    assert traced.experimental_get_tracing_count() == 2
    on = {n.op.name for n in traced.get_concrete_function(x, True).graph.nodes}
    off = {n.op.name for n in traced.get_concrete_function(x, False).graph.nodes}
    assert "multiply" in on and "negative" not in on
    assert "negative" in off and "multiply" not in off


def test_if_on_a_tensor_raises_a_clear_type_error():
    @fl.function
    def relu_by_hand(x):
        if fl.reduce_sum(x) > 0:
            return x
        return -x

    with pytest.raises(TypeError, match=r"Python's `if`.*graph tensor.*fl\.where"):
        relu_by_hand(fl.constant([1.0, 2.0]))
    # eagerly the same code runs
    assert relu_by_hand.python_function(fl.constant([1.0])).numpy().tolist() == [1.0]


# -- 3. the trace cache -------------------------------------------------------------------------
def test_same_shapes_and_dtypes_share_one_trace():
    traced = fl.function(lambda x, y: x * y + 1.0)
    for i in range(4):
        out = traced(fl.constant([float(i), 1.0]), np.array([2.0, 3.0], dtype=np.float32))
        assert out.numpy().tolist() == [2.0 * i + 1.0, 4.0]
    assert traced.experimental_get_tracing_count() == 1


@pytest.mark.parametrize("second,why", [
    ((fl.zeros([3]), 1.0), "new shape"),
    ((fl.zeros([2], fl.float64), 1.0), "new dtype"),
    ((fl.zeros([2]), 2.0), "new Python value"),
    ((fl.zeros([2]), 1), "a Python int, not a float"),
])
def test_a_new_signature_traces_again(second, why):
    traced = fl.function(lambda x, scale: x * scale)
    traced(fl.zeros([2]), 1.0)
    traced(fl.ones([2]), 1.0)
    assert traced.experimental_get_tracing_count() == 1
    traced(*second)
    assert traced.experimental_get_tracing_count() == 2, why
    traced(*second)
    assert traced.experimental_get_tracing_count() == 2, "and that trace is cached too"


def test_python_value_is_baked_into_its_trace():
    traced = fl.function(lambda x, scale: x * scale)
    x = fl.constant([1.0, 2.0])
    assert traced(x, 2.0).numpy().tolist() == [2.0, 4.0]
    assert traced(x, 3.0).numpy().tolist() == [3.0, 6.0]
    assert traced(x, 2.0).numpy().tolist() == [2.0, 4.0]
    assert traced.experimental_get_tracing_count() == 2


def test_retrace_warning_after_five_traces():
    traced = fl.function(lambda x: x + 1.0)
    with warnings.catch_warnings(record=True) as early:
        warnings.simplefilter("always")
        for n in range(1, 6):
            traced(fl.zeros([n]))
    assert early == [], "five traces are fine"
    with pytest.warns(UserWarning, match="traced 6 times") as sixth:
        traced(fl.zeros([6]))
    assert sixth[0].filename == __file__, "the warning points at the caller's line"
    assert "input_signature" in str(sixth[0].message)
    with warnings.catch_warnings(record=True) as later:
        warnings.simplefilter("always")
        traced(fl.zeros([7]))
    assert later == [], "the warning is given once"


def test_input_signature_traces_once_for_every_batch_size():
    traced = fl.function(lambda x: fl.reduce_sum(x * 2.0, axis=1), input_signature=[fl.TensorSpec([None, 3])])
    for n in (1, 4, 7):
        x = np.arange(3 * n, dtype=np.float32).reshape(n, 3)
        out = traced(fl.constant(x))
        assert out.shape == (n,)
        np.testing.assert_allclose(out.numpy(), (x * 2).sum(axis=1))
    assert traced.experimental_get_tracing_count() == 1
    assert traced.get_concrete_function().inputs[0].shape == (None, 3)


@pytest.mark.parametrize("arg", [fl.zeros([2, 4]), fl.zeros([3]), fl.zeros([2, 3], fl.float64)],
                         ids=["wrong size", "wrong rank", "wrong dtype"])
def test_input_signature_refuses_what_does_not_fit(arg):
    traced = fl.function(lambda x: x + 1.0, input_signature=[fl.TensorSpec([None, 3])])
    with pytest.raises(TypeError, match=r"TensorSpec\(shape=\(None, 3\), dtype=fl\.float32"):
        traced(arg)
    assert traced.experimental_get_tracing_count() == 0


def test_input_signature_refuses_a_wrong_number_of_arguments():
    traced = fl.function(lambda x: x, input_signature=[fl.TensorSpec([None])])
    with pytest.raises(TypeError, match="input_signature of 1 tensors"):
        traced(fl.zeros([2]), fl.zeros([2]))


@pytest.mark.parametrize("dtype", [fl.float32, fl.float64])
def test_input_signature_accepts_a_python_list(dtype):
    traced = fl.function(lambda x: x * 2.0, input_signature=[fl.TensorSpec([None, 3], dtype)])
    out = traced([[1.0, 2.0, 3.0]])
    assert out.dtype == dtype
    assert out.numpy().tolist() == [[2.0, 4.0, 6.0]]


# -- 4. variables are captured by reference -----------------------------------------------------
def test_variable_changed_eagerly_changes_the_result_without_retracing():
    v = fl.Variable([1.0, 2.0])
    traced = fl.function(lambda x: x * v)
    x = fl.constant([3.0, 3.0])
    assert traced(x).numpy().tolist() == [3.0, 6.0]
    v.assign([10.0, 20.0])
    assert traced(x).numpy().tolist() == [30.0, 60.0]
    assert traced.experimental_get_tracing_count() == 1


def test_assign_add_runs_on_every_call_in_program_order():
    v = fl.Variable(0.0)

    @fl.function
    def bump(delta):
        before = v * 1.0
        v.assign_add(delta)
        after = v * 1.0
        return before, after

    for call in range(3):
        before, after = bump(fl.constant(2.0))
        assert (float(before), float(after)) == (2.0 * call, 2.0 * call + 2.0)
    assert float(v) == 6.0
    assert bump.experimental_get_tracing_count() == 1


def test_ops_on_an_assign_result_read_the_new_value():
    v = fl.Variable(1.0)
    traced = fl.function(lambda: v.assign_sub(0.5) * 10.0)
    assert [float(traced()) for _ in range(3)] == [5.0, 0.0, -5.0]


def test_assign_inside_a_function_refuses_a_wrong_shape_while_tracing():
    v = fl.Variable([1.0, 2.0])
    with pytest.raises(fl.InvalidArgumentError, match="assign"):
        fl.function(lambda x: v.assign(x))(fl.zeros([3]))
    assert v.numpy().tolist() == [1.0, 2.0]


def test_returning_a_variable_returns_its_value_at_run_time():
    v = fl.Variable([1.0, 2.0])
    counter = fl.Variable(0)
    plain = fl.function(lambda: v)
    counted = fl.function(lambda: counter.assign_add(1))
    assert plain().numpy().tolist() == [1.0, 2.0]
    v.assign([5.0, 6.0])
    out = plain()
    assert type(out) is fl.Tensor and out.numpy().tolist() == [5.0, 6.0]
    assert [int(counted()) for _ in range(3)] == [1, 2, 3]
    v.assign([7.0, 8.0])
    assert out.numpy().tolist() == [5.0, 6.0], "a returned value is a snapshot, not the variable"


def test_read_value_inside_a_function_reads_at_run_time():
    v = fl.Variable(1.0)
    traced = fl.function(lambda: v.read_value() * 2.0)
    assert float(traced()) == 2.0
    v.assign(5.0)
    assert float(traced()) == 10.0


def test_side_effects_run_at_most_once_when_the_graph_fails():
    v = fl.Variable(0.0)

    @fl.function
    def bump_then_gather(indices):
        v.assign_add(1.0)
        return fl.gather(fl.constant([1.0, 2.0]), indices)

    with pytest.raises(fl.InvalidArgumentError, match="gather"):
        bump_then_gather(IDX(5))
    assert float(v) in (0.0, 1.0)


# -- 5. random ops draw anew on every call ------------------------------------------------------
def draws():
    return fl.random.normal([3]), fl.random.uniform([2], 0, 10, dtype=fl.int32), fl.random.truncated_normal([2])


def test_random_ops_draw_new_values_on_every_call():
    traced = fl.function(draws)
    first, second = traced(), traced()
    assert not np.array_equal(first[0].numpy(), second[0].numpy())
    assert not np.array_equal(first[2].numpy(), second[2].numpy())
    assert traced.experimental_get_tracing_count() == 1
    assert first[1].dtype == fl.int32 and np.all(np.abs(first[2].numpy()) <= 2.0)


def test_set_seed_repeats_the_sequence_and_matches_eager():
    traced = fl.function(draws)
    fl.random.set_seed(7)
    run_a = [traced() for _ in range(2)]
    fl.random.set_seed(7)
    run_b = [traced() for _ in range(2)]
    fl.random.set_seed(7)
    eager = [draws() for _ in range(2)]
    for a, b, e in zip(run_a, run_b, eager):
        for x, y, z in zip(a, b, e):
            np.testing.assert_array_equal(x.numpy(), y.numpy())
            np.testing.assert_array_equal(x.numpy(), z.numpy())
    assert not np.array_equal(run_a[0][0].numpy(), run_a[1][0].numpy())


def test_shuffle_inside_a_function_shuffles_on_every_call():
    traced = fl.function(lambda: fl.random.shuffle(fl.range(20)))
    fl.random.set_seed(0)
    orders = {tuple(traced().numpy().tolist()) for _ in range(4)}
    assert len(orders) > 1


def test_stateful_ops_are_traced():
    """The ops left out of CASES because they change state: each really is a graph node."""
    v = fl.Variable([1.0, 2.0])
    opt = fl.optimizers.SGD(0.1)

    def step(x):
        v.assign_add(x)
        opt.apply_gradients([(x + fl.random.normal([2]), v)])
        fl.print(x, output_stream=io.StringIO())
        return v * 1.0 + fl.random.shuffle(x)

    concrete = fl.function(step).get_concrete_function(fl.zeros([2]))
    assert STATEFUL <= {n.op.name for n in concrete.graph.nodes}
    assert all(get_op(name).stateful for name in STATEFUL)


# -- partly unknown shapes (input_signature with None) ----------------------------------------
UNKNOWN_ROWS = [
    ("slice then int", lambda x: x[1:, 0]),
    ("negative int", lambda x: x[-1]),
    ("step", lambda x: x[::2]),
    ("negative stop", lambda x: x[:-1]),
    ("None and Ellipsis", lambda x: x[None, ..., 1]),
    ("int array", lambda x: x[[0, 2]]),
    ("fl.slice to the end", lambda x: fl.slice(x, [1, 0], [-1, 2])),
    ("fl.size", lambda x: fl.size(x)),
]


@pytest.mark.parametrize("fn", [pytest.param(f, id=name) for name, f in UNKNOWN_ROWS])
def test_indexing_with_an_unknown_batch_size(fn):
    traced = fl.function(fn, input_signature=[fl.TensorSpec([None, 3])])
    for n in (4, 5):
        x = fl.constant(np.arange(n * 3, dtype=np.float32).reshape(n, 3))
        check_same(traced(x), fn(x))
    assert traced.experimental_get_tracing_count() == 1


def test_static_shapes_of_indexing_an_unknown_axis():
    seen = {}

    @fl.function(input_signature=[fl.TensorSpec([None, 3])])
    def f(x):
        seen["rows"], seen["neg"], seen["col"] = x[1:].shape, x[-1].shape, x[:, :2].shape
        seen["new"] = x[None, ..., 0].shape
        return x

    f(fl.zeros([2, 3]))
    assert [tuple(seen[k]) for k in ("rows", "neg", "col", "new")] == [(None, 3), (3,), (None, 2), (1, None)]


def test_gradient_of_indexing_with_an_unknown_batch_size():
    def grad(x):
        with fl.GradientTape() as tape:
            tape.watch(x)
            y = fl.reduce_sum(x[1:, :2] * 3.0) + fl.reduce_sum(x[-1])
        return tape.gradient(y, x)

    traced = fl.function(grad, input_signature=[fl.TensorSpec([None, 3])])
    for n in (2, 4):
        x = fl.constant(np.ones((n, 3), np.float32))
        check_same(traced(x), grad(x))


def test_bool_mask_on_an_unknown_axis_is_a_clear_error():
    f = fl.function(lambda x: x[np.array([True, False])], input_signature=[fl.TensorSpec([None, 3])])
    with pytest.raises(fl.errors.InvalidArgumentError, match="getitem"):
        f(fl.zeros([2, 3]))


def test_calls_with_eager_tensors_reuse_traces_by_shape_and_dtype():
    f = fl.function(lambda x, y: x * y)
    a, b = fl.constant([1.0, 2.0]), fl.constant([3.0, 4.0])
    assert f(a, b).numpy().tolist() == [3.0, 8.0] and f(b, a).numpy().tolist() == [3.0, 8.0]
    assert f.experimental_get_tracing_count() == 1
    f(fl.constant([1.0]), fl.constant([2.0]))                      # a new shape: a new trace
    f(fl.constant([1, 2]), fl.constant([3, 4]))                    # a new dtype: a new trace
    assert f.experimental_get_tracing_count() == 3
    assert f(a, 2.0).numpy().tolist() == [2.0, 4.0]                # a Python number: traced by value
    assert f.experimental_get_tracing_count() == 4


def test_a_signature_still_refuses_a_wrong_dtype_after_a_fast_call():
    f = fl.function(lambda x: x + 1.0, input_signature=[fl.TensorSpec([None])])
    f(fl.constant([1.0]))
    with pytest.raises(TypeError, match="input_signature"):
        f(fl.constant([1.0], dtype=fl.float64))
    assert f(fl.constant([1.0, 2.0, 3.0])).numpy().tolist() == [2.0, 3.0, 4.0]
    assert f.experimental_get_tracing_count() == 1


def test_unchecked_call_runs_the_trace_on_arrays_without_checks_or_wrapping():
    v = fl.Variable(np.float32(1.0))

    @fl.function
    def f(x, y):
        v.assign_add(fl.reduce_sum(x))
        return {"sum": x + y, "scaled": x * 2.0}

    x, y = np.arange(3, dtype=np.float32), np.ones(3, np.float32)
    concrete = f.get_concrete_function(fl.constant(x), fl.constant(y))
    out = concrete.unchecked_call(x, y)
    assert isinstance(out, tuple) and all(type(o) is np.ndarray for o in out)
    # the outputs, flat, in the order of concrete.outputs (dict keys sorted)
    checked = concrete(x, y)
    np.testing.assert_array_equal(out[0], checked["scaled"].numpy())
    np.testing.assert_array_equal(out[1], checked["sum"].numpy())
    assert float(v) == 1.0 + 2 * 3.0            # side effects ran on both calls
    with pytest.raises(TypeError, match="traced for"):   # the checked call still refuses a wrong dtype
        concrete(x.astype(np.float64), y)
