"""Every op of the table on /gpu:0, on the simulated GPU (tests/unit/_simgpu.py, a stand-in for
CuPy): eager and traced results equal the CPU's, gradients too, and results say where they are
(``.device`` ends with GPU:0, the value is a device array). Then whole programs: ``fit`` under a
GPU scope, a custom loop with a tape, MirroredStrategy over two logical GPUs, a compat.v1 Session.

Each case is (op, function of tensors, numpy inputs); the inputs are made on the GPU. Shapes are
tiny: this checks placement and CuPy's rules, not numerics (tests/unit/test_gradients.py does).
"""
from __future__ import annotations

import io

import numpy as np
import pytest
from _simgpu import DeviceArray

import flowlab as fl
from flowlab.core._context import state
from flowlab.core.execute import execute, get_op, list_ops

GPU = "/gpu:0"
rng = np.random.default_rng(3)


def f32(*shape, low=0.5, high=2.0):
    return rng.uniform(low, high, shape).astype(np.float32)


def f64(*shape):
    return rng.uniform(0.5, 2.0, shape)


def i32(*shape, high=3):
    return rng.integers(0, high, shape).astype(np.int32)


def bools(*shape):
    return rng.integers(0, 2, shape).astype(bool)


def grad_of(fn):
    """x -> the gradient of sum(fn(x)) at x: runs fn's backward ops."""
    def grad(x):
        with fl.GradientTape() as tape:
            tape.watch(x)
            y = fn(x)
        return tape.gradient(y, x)
    return grad


def with_variable(fn):
    """A case for ops that read or change variables: its first input becomes a Variable (made
    before any trace, where the other inputs are)."""
    fn.variable = True
    return fn


def then(first, fn):
    """fn(x) after ``first(x)`` ran (an op whose own result is not the point)."""
    def both(x):
        with fl.control_dependencies([first(x)]):
            return fn(x)
    return both


def step(optimizer, v):
    """v after one step of ``optimizer`` with gradient 2v (side effects run in program order)."""
    optimizer.apply_gradients([(v * 2.0, v)])
    return v.read_value()


_POOL_ATTRS = {"ksize": (2, 2), "strides": (2, 2), "padding": "SAME"}
nn_ops = fl.core.ops.nn_ops

# op -> (function of tensors, inputs); random: only shape, dtype and place are compared
CASES = {
    "abs": (fl.abs, [f32(2, 3, low=-1)]),
    "add": (fl.add, [f32(2, 3), f32(3)]),
    "argmax": (lambda x: fl.argmax(x, axis=1), [f32(2, 3)]),
    "argmin": (lambda x: fl.argmin(x, axis=0), [f32(2, 3)]),
    "assign": (with_variable(lambda v: v.assign_add(v * 2.0).read_value()), [f32(2, 3)]),
    "broadcast_to": (lambda x: fl.broadcast_to(x, [2, 3]), [f32(3)]),
    "cast": (lambda x: fl.cast(x, fl.int32), [f32(2, 3, high=5)]),
    "ceil": (fl.math.ceil, [f32(3)]),
    "check_numerics": (lambda x: fl.debugging.check_numerics(x, "x"), [f32(3)]),
    "concat": (lambda x, y: fl.concat([x, y], axis=1), [f32(2, 3), f32(2, 1)]),
    "concat_grad": (grad_of(lambda x: fl.concat([x, x * 2.0], axis=0)), [f32(2, 3)]),
    "const": (lambda x: x + 1.0, [f32(2)]),
    "conv2d": (lambda x, w: fl.nn.conv2d(x, w, 1, "SAME"), [f32(1, 4, 4, 2), f32(3, 3, 2, 3)]),
    "conv2d_backprop_filter": (lambda x, w: fl.nn.conv2d(x, w, 2, "VALID"), [f32(1, 5, 5, 2), f32(3, 3, 2, 2)]),
    "conv2d_backprop_input": (lambda x, w: fl.nn.conv2d(x, w, 2, "SAME"), [f32(1, 5, 5, 2), f32(3, 3, 2, 2)]),
    "cos": (fl.cos, [f64(3)]),
    "divide": (fl.divide, [f32(2, 3), f32(3)]),
    "dropout_mask": (lambda x: fl.nn.dropout(x, 0.5, seed=0), [f32(3, 4)]),
    "equal": (fl.equal, [i32(2, 3), i32(3)]),
    "exp": (fl.exp, [f32(3)]),
    "expand_dims": (lambda x: fl.expand_dims(x, -1), [f32(2, 3)]),
    "expm1": (fl.math.expm1, [f64(3)]),
    "floor": (fl.floor, [f32(3)]),
    "floordiv": (fl.floordiv, [i32(2, 3, high=9), i32(3) + 1]),
    "floormod": (fl.floormod, [f64(3) * 5, f64(3)]),
    "gather": (lambda x: fl.gather(x, [2, 0, 2], axis=1), [f32(2, 3)]),
    "gather_grad": (grad_of(lambda x: fl.gather(x, [2, 0, 2], axis=1)), [f32(2, 3)]),
    "getitem": (lambda x: x[1:, ::2], [f32(3, 4)]),
    "getitem_grad": (grad_of(lambda x: x[1:, ::2]), [f32(3, 4)]),
    "greater": (fl.greater, [f32(2, 3), f32(3)]),
    "greater_equal": (fl.greater_equal, [f32(2, 3), f32(3)]),
    "identity": (fl.identity, [i32(2, 2)]),
    "is_finite": (fl.math.is_finite, [f32(3)]),
    "is_inf": (fl.math.is_inf, [f64(2)]),
    "is_nan": (fl.math.is_nan, [f32(3)]),
    "less": (fl.less, [i32(2, 3), i32(3)]),
    "less_equal": (fl.less_equal, [f64(2), f64(2)]),
    "log": (fl.log, [f32(2, 2)]),
    "log1p": (fl.math.log1p, [f32(3)]),
    "log_softmax": (fl.nn.log_softmax, [f32(2, 4)]),
    "logical_and": (fl.logical_and, [bools(2, 3), bools(3)]),
    "logical_not": (fl.logical_not, [bools(4)]),
    "logical_or": (fl.logical_or, [bools(2, 3), bools(3)]),
    "matmul": (fl.matmul, [f32(2, 3), f32(3, 4)]),
    "max_pool2d": (lambda x: fl.nn.max_pool2d(x, 2, 2, "SAME"), [f32(1, 5, 5, 2)]),
    "max_pool2d_grad": (grad_of(lambda x: fl.nn.max_pool2d(x, 2, 2, "SAME")), [f32(1, 5, 5, 2)]),
    "max_pool2d_grad_grad": (lambda g, x: execute(get_op("max_pool2d_grad"), (g, x), _POOL_ATTRS),
                             [f32(1, 2, 3, 2), f32(1, 4, 5, 2)]),
    "maximum": (fl.maximum, [f32(2, 3), f32(3)]),
    "minimum": (fl.minimum, [f32(2, 3), f32(3)]),
    "multiply": (fl.multiply, [f64(2, 3), f64()]),
    "negative": (fl.negative, [f32(2)]),
    "not_equal": (fl.not_equal, [bools(2), bools(3, 1)]),
    "one_hot": (lambda i: fl.one_hot(i, 4), [i32(3)]),
    "ones_like": (fl.ones_like, [f32(2, 3)]),
    "optimizer_advance": (with_variable(lambda v: step(fl.optimizers.SGD(0.1), v)), [f32(2, 3)]),
    "optimizer_update": (with_variable(lambda v: step(fl.optimizers.Adam(0.1), v)), [f32(2, 3)]),
    "pow": (fl.pow, [f32(2, 3), f32(3)]),
    "print": (then(lambda x: fl.print("x", x, output_stream=io.StringIO()), fl.identity), [f32(2)]),
    "random": (lambda x: fl.random.normal([2, 3]) + x, [f32(3)]),
    "random_shuffle": (fl.random.shuffle, [f32(4, 2)]),
    "read": (with_variable(lambda v: v * 2.0), [f32(2, 3)]),
    "read_variable": (with_variable(lambda v: v * 2.0), [f32(2, 3)]),
    "reciprocal": (fl.math.reciprocal, [f32(2)]),
    "reduce_all": (lambda x: fl.reduce_all(x, axis=1), [bools(2, 3)]),
    "reduce_any": (lambda x: fl.reduce_any(x, axis=0), [bools(2, 3)]),
    "reduce_grad": (grad_of(lambda x: fl.reduce_mean(x, axis=1)), [f32(2, 3)]),
    "reduce_max": (lambda x: fl.reduce_max(x, axis=-1), [f32(2, 3)]),
    "reduce_mean": (fl.reduce_mean, [f32(2, 3)]),
    "reduce_min": (fl.reduce_min, [i32(2, 3)]),
    "reduce_prod": (lambda x: fl.reduce_prod(x, axis=-1), [f64(2, 3)]),
    "reduce_sum": (lambda x: fl.reduce_sum(x, axis=0), [f32(2, 3)]),
    "relu": (fl.nn.relu, [f32(2, 3, low=-1)]),
    "relu_grad": (grad_of(fl.nn.relu), [f32(2, 3, low=-1)]),
    "reshape": (lambda x: fl.reshape(x, [3, -1]), [f32(2, 3)]),
    "reshape_like": (grad_of(lambda x: fl.reshape(x, [3, 2])), [f32(2, 3)]),
    "round": (fl.round, [f32(3, high=5)]),
    "rsqrt": (fl.math.rsqrt, [f64(2)]),
    "shape": (lambda x: fl.shape(x), [f32(2, 3)]),
    "sigmoid": (fl.sigmoid, [f64(3)]),
    "sign": (fl.sign, [f32(3, low=-1)]),
    "sin": (fl.sin, [f32(2)]),
    "softmax": (fl.nn.softmax, [f64(2, 5)]),
    "softmax_cross_entropy_with_logits": (lambda y, z: fl.nn.softmax_cross_entropy_with_logits(y, z),
                                          [f32(3, 2), f32(3, 2)]),
    "softplus": (fl.nn.softplus, [f32(3)]),
    "sparse_softmax_cross_entropy_grad": (lambda y, z: grad_of(
        lambda z: fl.nn.sparse_softmax_cross_entropy_with_logits(y, z))(z), [i32(2), f32(2, 3)]),
    "sparse_softmax_cross_entropy_mean": (lambda y, z: nn_ops.sparse_softmax_cross_entropy_mean(y, z),
                                          [i32(2), f32(2, 3)]),
    "sparse_softmax_cross_entropy_mean_grad": (lambda y, z: grad_of(
        lambda z: nn_ops.sparse_softmax_cross_entropy_mean(y, z))(z), [i32(2), f32(2, 3)]),
    "sparse_softmax_cross_entropy_with_logits": (lambda y, z: fl.nn.sparse_softmax_cross_entropy_with_logits(y, z),
                                                 [i32(2), f32(2, 3)]),
    "sqrt": (fl.sqrt, [f32(2, 3)]),
    "square": (fl.square, [i32(3)]),
    "squeeze": (lambda x: fl.squeeze(x, axis=0), [f32(1, 3)]),
    "stack": (lambda x, y: fl.stack([x, y], axis=1), [f32(2, 3), f32(2, 3)]),
    "stop_gradient": (fl.stop_gradient, [f32(3)]),
    "subtract": (fl.subtract, [f32(2, 2), f32(2)]),
    "sum_to_like": (lambda x, y: fl.core.ops.array_ops.unbroadcast(x, None, y), [f32(2, 3, 4), f32(3, 1)]),
    "tanh": (fl.tanh, [f32(2)]),
    "top_k_indices": (lambda x: fl.math.top_k(x, 2).indices, [f32(2, 5)]),
    "transpose": (lambda x: fl.transpose(x, [1, 0]), [f32(2, 3)]),
    "where": (lambda c, x, y: fl.where(c, x, y), [bools(2, 3), f32(2, 3), f32(3)]),
    "where_indices": (lambda c: fl.where(c), [bools(2, 3)]),
    "zeros_like": (fl.zeros_like, [i32(2, 3)]),
}
RANDOM = {"dropout_mask", "random", "random_shuffle"}
# seen only when a traced function runs (eagerly, variables and the global generator update themselves)
GRAPH_ONLY = {"const", "read", "concat_grad", "assign", "optimizer_advance", "optimizer_update", "random",
              "read_variable", "shape"}
BACKWARD = {"conv2d_backprop_filter", "conv2d_backprop_input", "max_pool2d_grad_grad"}   # seen in the gradient test
# ops that cannot run on a GPU by their nature, and why
NOT_ON_A_GPU = {
    "placeholder": "fed, never run: a graph's input, which takes the value given",
}
# ops whose result stays on the host by its nature (it is checked there)
ON_THE_HOST = {
    "shape": "a shape is metadata, known on the host (TensorFlow keeps Shape's output in host memory)",
}


def _tensors(inputs, fn=None):
    out = [fl.constant(x) for x in inputs]
    if getattr(fn, "variable", False):
        out[0] = fl.Variable(out[0])
    return out


def _ran(fn, *args):
    names = []
    hook = lambda op, inputs, attrs, out: names.append(op.name)  # noqa: E731
    state().push("hooks", hook)
    try:
        return fn(*args), names
    finally:
        state().pop("hooks", hook)


def _outputs(out):
    out = list(out) if isinstance(out, (list, tuple)) else [out]
    return [t for t in out if isinstance(t, fl.Tensor)]


def _same(name, got, want):
    got, want = _outputs(got), _outputs(want)
    assert len(got) == len(want) > 0
    for g, w in zip(got, want):
        if name in ON_THE_HOST:
            assert g.device.endswith("CPU:0") and type(g._value) is np.ndarray, (name, g.device)
        else:
            assert g.device.endswith("GPU:0"), f"{name}: the result says it is on {g.device}"
            assert isinstance(g._value, DeviceArray), f"{name}: the result's value is a {type(g._value).__name__}"
        assert g.shape == w.shape and g.dtype == w.dtype, (name, g.shape, w.shape, g.dtype, w.dtype)
        if name not in RANDOM:
            np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-6, atol=1e-7, err_msg=name)


def _cpu(fn, inputs):
    with fl.device("/cpu:0"):
        return fn(*_tensors(inputs, fn))


def test_every_op_has_a_case():
    ops = {n for n in list_ops() if not get_op(n).peers}    # collectives: tests/unit/test_collectives_ops.py
    assert ops - set(CASES) - set(NOT_ON_A_GPU) == set(), "ops without a GPU case: add one to CASES"
    assert set(CASES) - ops == set(), "CASES names ops that are not in the table"


@pytest.mark.parametrize("name", sorted(set(CASES) - GRAPH_ONLY))
def test_eager_on_the_gpu_equals_the_cpu(gpus, name):
    fn, inputs = CASES[name]
    with fl.device(GPU):
        got, ran = _ran(fn, *_tensors(inputs, fn))
    assert name in ran or name in BACKWARD, f"the case for {name} ran only {ran}"
    _same(name, got, _cpu(fn, inputs))


@pytest.mark.parametrize("name", sorted(CASES))
def test_traced_on_the_gpu_equals_the_cpu(gpus, name):
    fn, inputs = CASES[name]
    with fl.device(GPU):
        args = _tensors(inputs, fn)
        got = fl.function(fn)(*args)
    _same(name, got, _cpu(fn, inputs))


def _gradients(fn, inputs, traced):
    def grads(*args):
        floats = [a for a in args if a.dtype.is_floating]
        with fl.GradientTape() as tape:
            tape.watch(floats)
            out = fn(*args)
        return tape.gradient(out, floats, output_gradients=fl.ones_like(out), unconnected_gradients="zero")
    return (fl.function(grads) if traced else grads)(*_tensors(inputs, fn))


DIFFERENTIABLE = sorted(n for n in CASES if get_op(n).grad is not None and n not in RANDOM
                        and not getattr(CASES[n][0], "variable", False)
                        and any(np.asarray(x).dtype.kind == "f" for x in CASES[n][1]))


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
@pytest.mark.parametrize("name", DIFFERENTIABLE)
def test_gradients_on_the_gpu_equal_the_cpu(gpus, name, traced):
    fn, inputs = CASES[name]
    with fl.device(GPU):
        got = _gradients(fn, inputs, traced)
    with fl.device("/cpu:0"):
        want = _gradients(fn, inputs, traced)
    _same(name, got, want)


# -- whole programs ---------------------------------------------------------------------------
def _chain(x):
    """A long elementwise chain: traced, it becomes one fused kernel (core/passes/fusion.py)."""
    for _ in range(5):
        x = fl.tanh(x * 1.5 + 0.25) - fl.sigmoid(x) * 0.5
    return x


def test_a_fused_chain_runs_on_the_gpu(gpus):
    x = f32(4, 3)
    with fl.device(GPU):
        got = fl.function(_chain)(fl.constant(x))
    _same("fused chain", got, _chain(fl.constant(x)))


def _data():
    x = np.linspace(-1, 1, 24, dtype=np.float32).reshape(8, 3)
    return x, (x.sum(axis=1) > 0).astype(np.int32)


def _model():
    return fl.keras.Sequential([fl.keras.layers.Dense(4, activation="relu", kernel_initializer="ones"),
                                fl.keras.layers.Dense(2, kernel_initializer="ones")])


def _fit(device):
    x, y = _data()
    with fl.device(device):
        model = _model()
        model.compile(optimizer=fl.optimizers.Adam(0.05),
                      loss=fl.keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
        history = model.fit(x, y, batch_size=4, epochs=2, verbose=0, shuffle=False)
    return model, history.history["loss"]


def _trains_on_the_gpu_as_on_the_cpu(train):
    """``train(device)`` -> (model, losses): on the GPU the weights stay in its memory, and the losses
    and weights are the CPU's."""
    model, losses = train(GPU)
    assert all(isinstance(w._value, DeviceArray) for w in model.trainable_variables)
    ref, ref_losses = train("/cpu:0")
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-6)
    for a, b in zip(model.get_weights(), ref.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-6)


def test_fit_under_a_gpu_scope_keeps_the_weights_on_the_gpu(gpus):
    _trains_on_the_gpu_as_on_the_cpu(_fit)


def _custom_loop(device):
    x, y = _data()
    with fl.device(device):
        model = _model()
        model.build((None, 3))
        opt = fl.optimizers.SGD(0.1, momentum=0.9)

        @fl.function
        def train_step(xb, yb):
            with fl.GradientTape() as tape:
                loss = fl.reduce_mean(fl.nn.sparse_softmax_cross_entropy_with_logits(yb, model(xb)))
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))
            return loss

        losses = [float(train_step(fl.constant(x[i:i + 4]), fl.constant(y[i:i + 4]))) for i in (0, 4, 0)]
    return model, losses


def test_a_custom_loop_with_a_tape_on_the_gpu(gpus):
    _trains_on_the_gpu_as_on_the_cpu(_custom_loop)


def test_mirrored_over_two_logical_gpus_with_momentum_and_cross_entropy(gpus):
    fl.config.set_logical_devices("GPU", 2)
    x, y = _data()

    def fit(strategy):
        with strategy.scope():
            model = _model()
            model.compile(optimizer=fl.optimizers.SGD(0.1, momentum=0.9),
                          loss=fl.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model, model.fit(x, y, batch_size=4, epochs=2, verbose=0, shuffle=False).history["loss"]

    strategy = fl.distribute.MirroredStrategy()
    assert strategy.num_replicas_in_sync == 2
    model, losses = fit(strategy)
    assert all(isinstance(w._value, DeviceArray) for w in model.trainable_variables)
    ref, ref_losses = fit(fl.distribute.MirroredStrategy(["/cpu:0"]))
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
    for a, b in zip(model.get_weights(), ref.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5)


def _session_run(device):
    v1 = fl.compat.v1
    x, y = _data()
    g = v1.Graph()
    with g.as_default(), v1.device(device):
        xs = v1.placeholder(fl.float32, [None, 3])
        w = v1.Variable(np.full((3, 1), 0.5, np.float32), name="w")
        loss = fl.reduce_mean((fl.matmul(xs, w) - 1.0) ** 2)
        train = v1.train.GradientDescentOptimizer(0.1).minimize(loss)
        init = v1.global_variables_initializer()
    with v1.Session(graph=g) as sess:
        sess.run(init)
        losses = [sess.run([loss, train], {xs: x})[0] for _ in range(3)]
        return losses, sess.run(w)


def test_a_compat_v1_session_runs_a_gpu_placed_graph(gpus):
    losses, w = _session_run(GPU)
    ref_losses, ref_w = _session_run("/cpu:0")
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-6)
    np.testing.assert_allclose(w, ref_w, rtol=1e-6)
