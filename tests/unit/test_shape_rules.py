"""Every op's shape rule agrees with its eager kernel.

The graph builder will trust ``op.shape_rule`` to know a node's shape and dtype without running
it, so for each op in ``list_ops()`` we make a representative call through the public API, catch
the (op, inputs, attrs, output) that ``execute`` saw with a debug hook, and ask the rule the same
question. A new op without a case here fails ``test_every_op_has_a_case``.
"""
from __future__ import annotations

import contextlib

import numpy as np
import pytest

import flowlab as fl
from flowlab.core._context import ACTIVE, state
from flowlab.core.execute import get_op

# Ops whose output size depends on the values, not only the shapes: the rule may answer None there.
DATA_DEPENDENT = {"where_indices"}


def f32(shape, start=1.0):
    return fl.constant(np.arange(start, start + np.prod(shape), dtype=np.float32).reshape(shape))


def f64(shape, start=0.5):
    return fl.constant(np.arange(start, start + np.prod(shape), dtype=np.float64).reshape(shape))


def i32(shape, start=1):
    return fl.constant(np.arange(start, start + np.prod(shape), dtype=np.int32).reshape(shape))


def bools(shape):
    return fl.constant(np.arange(np.prod(shape)).reshape(shape) % 3 == 0)


def read_in_tape():
    """Under a tape, an op that reads a Variable records a ``read_variable`` of its current value."""
    v = fl.Variable([[1.0, 2.0, 3.0]])
    with fl.GradientTape():
        return v * 2.0


def grad_of(fn, x):
    """Run ``fn(x)`` under a tape and differentiate it (the backward pass runs the *_grad ops)."""
    with fl.GradientTape() as tape:
        tape.watch(x)
        y = fn(x)
    return tape.gradient(y, x)


# (op name, label, zero-arg call through the public API)
CASES = [
    ("abs", "int", lambda: fl.abs(i32([2, 3], start=-3))),
    ("add", "broadcast", lambda: fl.add(f32([2, 1, 3]), f32([4, 1]))),
    ("add", "scalar and python number", lambda: fl.add(i32([]), 2)),
    ("argmax", "axis 1", lambda: fl.argmax(f32([2, 3, 4]), axis=1)),
    ("argmin", "negative axis, int32", lambda: fl.argmin(f32([2, 3]), axis=-1, output_type=fl.int32)),
    ("broadcast_to", "add axes", lambda: fl.broadcast_to(f32([3, 1]), [2, 3, 4])),
    ("cast", "float to int", lambda: fl.cast(f32([2, 3]), fl.int64)),
    ("cast", "int to bool", lambda: fl.cast(i32([3]), fl.bool)),
    ("check_numerics", "", lambda: fl.debugging.check_numerics(f32([2, 3]), "x")),
    ("concat", "axis 1", lambda: fl.concat([f32([2, 3]), f32([2, 1]), f32([2, 2])], axis=1)),
    ("concat", "negative axis", lambda: fl.concat([i32([1, 2]), i32([1, 2])], axis=-2)),
    ("cos", "", lambda: fl.cos(f64([2, 3]))),
    ("divide", "float broadcast", lambda: fl.divide(f32([2, 3]), f32([3]))),
    pytest.param("divide", "int gives float64", lambda: fl.divide(i32([2, 3]), i32([3]))),
    ("equal", "broadcast", lambda: fl.equal(i32([2, 1]), i32([3]))),
    ("exp", "", lambda: fl.exp(f32([4]))),
    ("expand_dims", "negative axis", lambda: fl.expand_dims(f32([2, 3]), -1)),
    ("expand_dims", "axis 0 of a scalar", lambda: fl.expand_dims(f32([]), 0)),
    ("floordiv", "", lambda: fl.floordiv(i32([2, 3]), 2)),
    ("floormod", "", lambda: fl.floormod(f64([3]), f64([2, 1]))),
    ("gather", "axis 1, 2-d indices", lambda: fl.gather(f32([3, 4, 2]), [[0, 3], [1, 1], [2, 0]], axis=1)),
    ("gather_grad", "", lambda: grad_of(lambda x: fl.gather(x, [[0, 2], [2, 2]], axis=1), f32([2, 3]))),
    ("reshape_like", "", lambda: grad_of(lambda x: fl.reshape(x, [3, 2]), f32([2, 3]))),
    ("sum_to_like", "", lambda: fl.core.ops.array_ops.unbroadcast(f32([2, 3, 4]), None, f32([3, 1]))),
    ("reduce_grad", "mean, axis 1", lambda: grad_of(lambda x: fl.reduce_mean(x, axis=1), f32([2, 3]))),
    ("reduce_grad", "sum, keepdims", lambda: grad_of(lambda x: fl.reduce_sum(x, axis=0, keepdims=True), f32([2, 3]))),
    ("sparse_softmax_cross_entropy_grad", "", lambda: grad_of(
        lambda z: fl.nn.sparse_softmax_cross_entropy_with_logits([[0, 2], [1, 1]], z), f32([2, 2, 3]))),
    ("getitem", "basic", lambda: f32([4, 5, 6])[1:, ::2, -1]),
    ("getitem", "None and Ellipsis", lambda: f32([4, 5, 6])[None, ..., 0]),
    ("getitem", "int arrays", lambda: f32([4, 5])[[0, 3, 1], [4, 4, 0]]),
    ("getitem", "bool mask", lambda: f32([4, 5])[np.arange(20).reshape(4, 5) % 2 == 0]),
    ("getitem_grad", "", lambda: grad_of(lambda x: x[1:, ::2], f32([3, 4]))),
    ("greater", "", lambda: fl.greater(f32([2, 3]), 2.0)),
    ("greater_equal", "", lambda: fl.greater_equal(f32([3]), f32([2, 1]))),
    ("identity", "", lambda: fl.identity(i32([2, 2]))),
    ("less", "", lambda: fl.less(i32([2, 3]), i32([1, 3]))),
    ("less_equal", "", lambda: fl.less_equal(f64([1]), f64([2, 2]))),
    ("log", "", lambda: fl.log(f32([2, 2]))),
    ("log_softmax", "axis 0", lambda: fl.log_softmax(f32([3, 4]), axis=0)),
    ("logical_and", "broadcast", lambda: fl.logical_and(bools([2, 3]), bools([3]))),
    ("logical_not", "", lambda: fl.logical_not(bools([4]))),
    ("logical_or", "", lambda: fl.logical_or(bools([1, 2]), bools([3, 1]))),
    ("matmul", "batched, broadcast", lambda: fl.matmul(f32([2, 1, 3, 4]), f32([5, 4, 2]))),
    ("matmul", "transposed", lambda: fl.matmul(f32([4, 3]), f32([2, 4]), transpose_a=True, transpose_b=True)),
    ("maximum", "", lambda: fl.maximum(f32([2, 3]), 2.5)),
    ("minimum", "", lambda: fl.minimum(i32([3]), i32([2, 1]))),
    ("multiply", "", lambda: fl.multiply(f64([2, 3]), f64([]))),
    ("negative", "", lambda: fl.negative(f32([2]))),
    ("not_equal", "", lambda: fl.not_equal(bools([2]), bools([3, 1]))),
    ("one_hot", "axis 0, int32", lambda: fl.one_hot([[0, 2], [1, 5]], 3, axis=0, dtype=fl.int32)),
    ("one_hot", "default axis", lambda: fl.one_hot([0, 2, 1], 4)),
    ("ones_like", "new dtype", lambda: fl.ones_like(f32([2, 3]), dtype=fl.int32)),
    ("pow", "", lambda: fl.pow(f32([2, 3]), f32([3]))),
    ("read_variable", "", read_in_tape),
    ("reduce_max", "axis tuple, keepdims", lambda: fl.reduce_max(f32([2, 3, 4]), axis=(0, -1), keepdims=True)),
    ("reduce_mean", "axis int", lambda: fl.reduce_mean(f32([2, 3]), axis=1)),
    ("reduce_mean", "int input", lambda: fl.reduce_mean(i32([2, 3]), axis=0)),
    ("reduce_min", "all axes", lambda: fl.reduce_min(i32([2, 3]))),
    ("reduce_prod", "float", lambda: fl.reduce_prod(f64([2, 3]), axis=-1)),
    pytest.param("reduce_prod", "int32", lambda: fl.reduce_prod(i32([2, 3]), axis=0)),
    ("reduce_sum", "float, keepdims", lambda: fl.reduce_sum(f32([2, 3]), axis=0, keepdims=True)),
    pytest.param("reduce_sum", "int32", lambda: fl.reduce_sum(i32([2, 3]))),
    ("relu", "", lambda: fl.relu(f32([2, 3], start=-3))),
    ("relu_grad", "", lambda: grad_of(fl.relu, f32([2, 3], start=-3))),
    ("reshape", "with -1", lambda: fl.reshape(f32([2, 3, 4]), [4, -1])),
    ("sigmoid", "", lambda: fl.sigmoid(f64([3]))),
    ("log1p", "", lambda: fl.math.log1p(f32([2, 3]))),
    ("expm1", "", lambda: fl.math.expm1(f64([3]))),
    ("softplus", "", lambda: fl.nn.softplus(f32([3]))),
    ("reciprocal", "", lambda: fl.math.reciprocal(f32([2]))),
    ("rsqrt", "", lambda: fl.math.rsqrt(f64([2]))),
    ("round", "int", lambda: fl.round(i32([3]))),
    ("floor", "", lambda: fl.floor(f32([3]))),
    ("ceil", "", lambda: fl.math.ceil(f64([2, 1]))),
    ("is_nan", "", lambda: fl.math.is_nan(f32([3]))),
    ("is_inf", "", lambda: fl.math.is_inf(f64([2]))),
    ("is_finite", "", lambda: fl.math.is_finite(f32([1, 2]))),
    ("reduce_any", "", lambda: fl.reduce_any(bools([2, 3]), axis=0)),
    ("reduce_all", "keepdims", lambda: fl.reduce_all(bools([2, 3]), axis=1, keepdims=True)),
    ("top_k_indices", "", lambda: fl.math.top_k(f32([2, 5]), 3)),
    ("print", "", lambda: fl.print("x", f32([2]), output_stream=__import__("io").StringIO())),
    ("sign", "", lambda: fl.sign(i32([3], start=-1))),
    ("sin", "", lambda: fl.sin(f32([2]))),
    ("softmax", "", lambda: fl.softmax(f64([2, 5]))),
    ("softmax_cross_entropy_with_logits", "axis 0",
     lambda: fl.softmax_cross_entropy_with_logits(fl.softmax(f32([3, 2])), f32([3, 2]), axis=0)),
    ("sparse_softmax_cross_entropy_with_logits", "",
     lambda: fl.sparse_softmax_cross_entropy_with_logits([[0, 2], [1, 1]], f32([2, 2, 3]))),
    ("sqrt", "", lambda: fl.sqrt(f32([2, 3]))),
    ("square", "", lambda: fl.square(i32([3]))),
    ("squeeze", "all size-1 axes", lambda: fl.squeeze(f32([1, 3, 1, 2]))),
    ("squeeze", "one axis", lambda: fl.squeeze(f32([1, 3, 1, 2]), axis=-2)),
    ("stack", "axis 1", lambda: fl.stack([f32([2, 3]), f32([2, 3])], axis=1)),
    ("stop_gradient", "", lambda: fl.stop_gradient(f32([3]))),
    ("subtract", "", lambda: fl.subtract(2.0, f32([2, 2]))),
    ("tanh", "", lambda: fl.tanh(f32([2]))),
    ("transpose", "perm", lambda: fl.transpose(f32([2, 3, 4]), [1, 2, 0])),
    ("transpose", "default", lambda: fl.transpose(i32([2, 3]))),
    pytest.param("where", "float branches", lambda: fl.where(bools([2, 1]), f32([3]), 0.0)),
    ("where_indices", "", lambda: fl.where(bools([2, 3]))),
    ("zeros_like", "", lambda: fl.zeros_like(i32([2, 3]))),
    # graph-only ops: seen when a traced function runs node by node (hooks make it interpret)
    ("const", "", lambda: _traced(lambda x: x + 1.0, f32([2]))),
    ("read", "", lambda: _traced_with_variable(lambda v: v * 2.0)),
    ("assign", "add", lambda: _traced_with_variable(lambda v: v.assign_add(f32([2, 3])))),
    ("random", "normal", lambda: _traced(lambda: fl.random.normal([2, 3]))),
    ("random_shuffle", "", lambda: fl.random.shuffle(f32([4, 2]))),
    ("shape", "in a graph", lambda: _traced(lambda x: fl.shape(x), f32([2, 3]))),
    ("concat_grad", "unknown sizes", lambda: _traced_concat_grad()),
    ("random", "integers", lambda: _traced(lambda: fl.random.uniform([4], 0, 5, dtype=fl.int32))),
    # convolution, pooling, dropout (nn_ops) and their backward ops
    ("conv2d", "valid, stride 1", lambda: fl.nn.conv2d(f32([2, 5, 6, 3]), f32([3, 2, 3, 4]), 1, "VALID")),
    ("conv2d", "same, stride 2", lambda: fl.nn.conv2d(f64([1, 7, 5, 2]), f64([3, 3, 2, 1]), [2, 2], "SAME")),
    ("conv2d_backprop_input", "", lambda: grad_of(lambda x: fl.nn.conv2d(x, f32([3, 3, 2, 4]), 2, "SAME"),
                                                  f32([2, 5, 5, 2]))),
    ("conv2d_backprop_filter", "", lambda: grad_of(lambda w: fl.nn.conv2d(f32([2, 5, 4, 2]), w, 1, "VALID"),
                                                   f32([2, 3, 2, 3]))),
    ("max_pool2d", "valid", lambda: fl.nn.max_pool2d(f32([2, 5, 4, 3]), 2, 2, "VALID")),
    ("max_pool2d", "same, 3x3 stride 2", lambda: fl.nn.max_pool2d(f64([1, 5, 6, 2]), 3, 2, "SAME")),
    ("max_pool2d_grad", "", lambda: grad_of(lambda x: fl.nn.max_pool2d(x, 2, 2, "SAME"), f32([2, 5, 5, 2]))),
    ("max_pool2d_grad_grad", "", lambda: grad_of(
        lambda g: fl.core.execute.execute(get_op("max_pool2d_grad"), (g, f32([1, 4, 5, 2])),
                                          {"ksize": (2, 2), "strides": (2, 2), "padding": "SAME"}), f32([1, 2, 3, 2]))),
    ("dropout_mask", "", lambda: fl.nn.dropout(f32([3, 4]), 0.5, seed=0)),
    ("sparse_softmax_cross_entropy_mean", "", lambda: fl.core.ops.nn_ops.sparse_softmax_cross_entropy_mean(
        [[0, 2], [1, 1]], f32([2, 2, 3]))),
    ("sparse_softmax_cross_entropy_mean_grad", "", lambda: grad_of(
        lambda z: fl.core.ops.nn_ops.sparse_softmax_cross_entropy_mean([0, 2], z), f32([2, 3]))),
    ("optimizer_update", "", lambda: _traced_with_variable(
        lambda v, opt=fl.optimizers.Adam(0.1): opt.apply_gradients([(f32([2, 3]), v)]))),
    ("optimizer_advance", "", lambda: _traced_with_variable(
        lambda v, opt=fl.optimizers.SGD(0.1): opt.apply_gradients([(f32([2, 3]), v)]))),
]
NOT_RUN = {"placeholder"}   # fed, never run: checked by test_placeholder_rule


def _traced_concat_grad():
    """concat's backward op, which a graph uses when the sizes along the axis are unknown."""
    def grad(x):
        with fl.GradientTape() as tape:
            tape.watch(x)
            y = fl.concat([x, x * 2.0], axis=0)
        return tape.gradient(y, x)
    return fl.function(grad, input_signature=[fl.TensorSpec([None, 3])])(f32([2, 3]))


def _traced(fn, *args):
    """Run ``fn`` as a graph: the concrete function runs the graph even while a tape is open."""
    concrete = fl.function(fn).get_concrete_function(*args)
    return concrete(*args)


def _traced_with_variable(fn):
    v = fl.Variable(f32([2, 3]))
    return _traced(lambda: fn(v))


def _params():
    out = []
    for case in CASES:
        values, marks = (case.values, case.marks) if hasattr(case, "marks") else (case, ())
        name, label, _ = values
        out.append(pytest.param(*values, id=f"{name}-{label}" if label else name, marks=marks))
    return out


def _op_names():
    return {(case.values if hasattr(case, "marks") else case)[0] for case in CASES}


class _Recorder:
    """Stands in a thread's tape list: tapes are also shown ``read_variable``, which hooks never see."""

    def __init__(self, seen):
        self._record = lambda op, inputs, attrs, output: seen(op, inputs, attrs, output)
        self._record_read = lambda variable, read: seen(get_op("read_variable"), (variable,), {}, read)


@contextlib.contextmanager
def captured_calls():
    """Every op run in this block, as (op, inputs, attrs, output), in order. The debug hook sees
    what ``execute`` runs, and turns off the fast paths (it makes ACTIVE.count nonzero), so
    fast-path ops are seen too; the recorder adds what only tapes are shown."""
    calls = {}

    def seen(op, inputs, attrs, output):
        calls.setdefault(id(output), (op, tuple(inputs), dict(attrs), output))

    recorder = _Recorder(seen)
    st = state()
    st.push("hooks", seen)
    st.push("tapes", recorder)
    try:
        yield calls
    finally:
        st.pop("tapes", recorder)
        st.pop("hooks", seen)


def test_placeholder_rule():
    g = fl.Graph()
    with g.as_default():
        p = g.placeholder(fl.float32, [None, 3])
    assert get_op("placeholder").shape_rule(**p.node.attrs) == ((None, 3), np.dtype(np.float32))
    assert p.shape == (None, 3)


def test_every_op_has_a_case():
    ops = {n for n in fl.core.list_ops() if not fl.core.get_op(n).peers} - NOT_RUN   # collectives: test_collectives_ops.py
    assert ops - _op_names() == set(), "ops without a shape-rule case: add one to CASES"
    assert _op_names() - ops == set(), "CASES names ops that are not in the table"


def test_the_hook_sees_fast_path_ops():
    before = ACTIVE.count
    with captured_calls() as calls:
        assert ACTIVE.count > before
        fl.add(f32([2]), f32([2]))
        fl.negative(f32([2]))
    assert ACTIVE.count == before
    assert [op.name for op, *_ in calls.values()] == ["add", "negative"]


@pytest.mark.parametrize("name,label,call", _params())
def test_shape_rule_matches_the_kernel(name, label, call):
    with captured_calls() as calls:
        call()
    mine = [c for c in calls.values() if c[0].name == name]
    assert mine, f"the call never ran op {name!r}; ran {[c[0].name for c in calls.values()]}"
    assert mine[0][0] is get_op(name)
    for op, inputs, attrs, output in mine:
        rule_shape, rule_dtype = op.shape_rule(*inputs, **attrs)
        got_shape = tuple(output.shape)
        if name in DATA_DEPENDENT:
            assert len(rule_shape) == len(got_shape), (rule_shape, got_shape)
            assert all(r is None or r == g for r, g in zip(rule_shape, got_shape)), (rule_shape, got_shape)
        else:
            assert tuple(rule_shape) == got_shape
        # rules return numpy dtypes (see ops/_rules.py); np.dtype() is how a consumer reads one
        assert np.dtype(rule_dtype) == output._value.dtype, \
            f"rule says {np.dtype(rule_dtype).name}, kernel gave {output._value.dtype.name}"


# -- the other direction: inputs a rule rejects must not run ------------------------------------
# The graph builder will refuse these inputs (the rule raises), so eager must refuse them too, or
# the same code would work eagerly and fail when traced.
REJECTED = [
    ("sqrt", "int input", lambda: fl.sqrt(i32([3])), ()),
    ("exp", "int input", lambda: fl.exp(i32([3])), ()),
    ("log", "int input", lambda: fl.log(i32([3])), ()),
    ("sin", "int input", lambda: fl.sin(i32([3])), ()),
    ("cos", "int input", lambda: fl.cos(i32([3])), ()),
    ("tanh", "int input", lambda: fl.tanh(i32([3])), ()),
    ("sigmoid", "int input", lambda: fl.sigmoid(i32([3])), ()),
    ("softmax", "int input", lambda: fl.softmax(i32([2, 3])), ()),
    ("log_softmax", "int input", lambda: fl.log_softmax(i32([2, 3])), ()),
    ("softmax_cross_entropy_with_logits", "int inputs",
     lambda: fl.softmax_cross_entropy_with_logits(i32([2, 3]), i32([2, 3])), ()),
    ("one_hot", "float indices", lambda: fl.one_hot(f32([3]), 4), ()),
    ("logical_and", "int inputs", lambda: fl.logical_and(i32([3]), i32([3])), ()),
    ("logical_or", "int inputs", lambda: fl.logical_or(i32([3]), i32([3])), ()),
    ("logical_not", "int input", lambda: fl.logical_not(i32([3])), ()),
    ("where", "int condition", lambda: fl.where(i32([3]), f32([3]), f32([3])), ()),
    ("gather", "float indices", lambda: fl.gather(f32([3]), f32([2])), ()),
    ("sparse_softmax_cross_entropy_with_logits", "float labels",
     lambda: fl.sparse_softmax_cross_entropy_with_logits(f32([2]), f32([2, 3])), ()),
    ("matmul", "rank 1", lambda: fl.matmul(f32([3]), f32([3])), ()),
    ("concat", "mixed dtypes", lambda: fl.concat([f32([2]), i32([2])], 0), ()),
    ("stack", "mixed shapes", lambda: fl.stack([f32([2]), f32([3])]), ()),
    ("expand_dims", "axis out of range", lambda: fl.expand_dims(f32([2]), 2), ()),
    ("argmax", "axis out of range", lambda: fl.argmax(f32([2]), 1), ()),
    ("broadcast_to", "cannot broadcast", lambda: fl.broadcast_to(f32([2]), [3]), ()),
    ("conv2d", "rank 3 input", lambda: fl.nn.conv2d(f32([5, 5, 3]), f32([3, 3, 3, 2])), ()),
    ("conv2d", "channels differ", lambda: fl.nn.conv2d(f32([1, 5, 5, 3]), f32([3, 3, 2, 2])), ()),
    ("conv2d", "int input", lambda: fl.nn.conv2d(i32([1, 5, 5, 1]), i32([3, 3, 1, 1])), ()),
    ("conv2d", "filter larger than the image", lambda: fl.nn.conv2d(f32([1, 2, 2, 1]), f32([3, 3, 1, 1])), ()),
    ("max_pool2d", "rank 2 input", lambda: fl.nn.max_pool2d(f32([4, 4]), 2, 2), ()),
    ("max_pool2d", "int input", lambda: fl.nn.max_pool2d(i32([1, 4, 4, 1]), 2, 2), ()),
    ("dropout_mask", "int input", lambda: fl.nn.dropout(i32([3]), 0.5), ()),
    ("sparse_softmax_cross_entropy_mean", "float labels",
     lambda: fl.core.ops.nn_ops.sparse_softmax_cross_entropy_mean(f32([2]), f32([2, 3])), ()),
]


@pytest.mark.parametrize("name,label,call", [
    pytest.param(name, label, call, id=f"{name}-{label}", marks=marks) for name, label, call, marks in REJECTED])
def test_kernel_refuses_what_the_rule_refuses(name, label, call):
    with captured_calls() as calls:
        try:
            call()
        except fl.errors.InvalidArgumentError as e:
            assert str(e).startswith(f"{name}:"), str(e)
            return
    for op, inputs, attrs, output in calls.values():
        if op.name == name:
            try:
                op.shape_rule(*inputs, **attrs)
            except fl.errors.InvalidArgumentError as e:
                pytest.fail(f"{name} ran on inputs its shape rule rejects ({e}); got {output!r}")
