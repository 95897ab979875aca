"""Per-step costs that the graph and the optimizers save, and the promises they keep while saving.

An optimizer writes a variable's new value into the variable's own array only when nothing else
holds that array (a tensor read earlier, a view, a value a traced function returned): otherwise
the holder would see it change. A traced training step lets the update scale the gradient in
place when the plan made it and nothing else reads it. Constant folding computes the gradient of a
mean over a batch of fixed size once. None of this may change a single bit of the results.
"""
from __future__ import annotations

import threading
import weakref

import numpy as np
import pytest

import flowlab as fl
from flowlab.core.executor import compile_plan
from flowlab.core.passes import DEFAULT_PASSES


def mlp(seed=0):
    rng = np.random.default_rng(seed)
    shapes = [(8, 16), (16,), (16, 4), (4,)]
    return [fl.Variable(rng.standard_normal(s).astype(np.float32) * 0.3) for s in shapes]


def step_fn(variables, opt, returns=("loss",)):
    def step(x, y):
        w1, b1, w2, b2 = variables
        with fl.GradientTape() as tape:
            h = fl.nn.relu(x @ w1 + b1)
            loss = fl.reduce_mean(fl.nn.sparse_softmax_cross_entropy_with_logits(y, h @ w2 + b2))
        grads = tape.gradient(loss, variables)
        opt.apply_gradients(zip(grads, variables))
        return (loss, *grads) if "grads" in returns else loss
    return step


def batches(n=6, seed=1):
    rng = np.random.default_rng(seed)
    return [(fl.constant(rng.standard_normal((5, 8)).astype(np.float32)),
             fl.constant(rng.integers(0, 4, 5).astype(np.int64))) for _ in range(n)]


@pytest.mark.parametrize("make", [lambda: fl.optimizers.SGD(0.1), lambda: fl.optimizers.SGD(0.1, momentum=0.9),
                                  lambda: fl.optimizers.Adam(0.01)])
def test_eager_and_traced_training_give_the_same_bits(make):
    data = batches()
    runs = []
    for traced in (False, True, True):
        variables = mlp()
        step = step_fn(variables, make())
        fn = fl.function(step) if traced else step
        losses = [fn(x, y).numpy() for x, y in data]
        runs.append((losses, [v.numpy().copy() for v in variables]))
    for losses, values in runs[1:]:
        assert [a.tobytes() for a in losses] == [a.tobytes() for a in runs[0][0]]
        assert all(a.tobytes() == b.tobytes() for a, b in zip(values, runs[0][1]))


@pytest.mark.parametrize("traced", [False, True])
def test_an_update_writes_in_place_only_when_no_one_else_holds_the_array(traced):
    variables = mlp()
    step = step_fn(variables, fl.optimizers.SGD(0.1))
    fn = fl.function(step) if traced else step
    data = batches()
    fn(*data[0])
    arrays = [id(v._value) for v in variables]
    fn(*data[1])
    if threading.active_count() == 1:    # (pytest-xdist workers run threads of their own)
        assert [id(v._value) for v in variables] == arrays      # nothing held them: written in place
    held_tensor = variables[0].read_value()                    # an eager read
    held_numpy = variables[2].numpy()                           # a (read-only) view
    copies = held_tensor.numpy().copy(), np.array(held_numpy)
    fn(*data[2])
    np.testing.assert_array_equal(held_tensor.numpy(), copies[0])
    np.testing.assert_array_equal(held_numpy, copies[1])
    assert not np.array_equal(variables[0].numpy(), copies[0])


def test_values_a_traced_step_returned_never_change_later():
    variables = mlp()

    @fl.function
    def step(x, y):
        w1 = variables[0].read_value()      # returned: the user holds the array it read
        step_fn(variables, fl.optimizers.SGD(0.5))(x, y)
        return w1

    data = batches()
    first = step(*data[0])
    kept = first.numpy().copy()
    for x, y in data[1:]:
        step(x, y)
    np.testing.assert_array_equal(first.numpy(), kept)
    assert not np.array_equal(variables[0].numpy(), kept)


def test_gradients_are_scaled_in_place_only_when_the_plan_owns_them():
    data = batches()
    for returns, donated in ((("loss",), True), (("loss", "grads"), False)):
        variables = mlp()
        f = fl.function(step_fn(variables, fl.optimizers.SGD(0.1), returns))
        concrete = f.get_concrete_function(*data[0])
        names = [n.op.name for n in concrete._plan.nodes if n.op.name.startswith("optimizer_update")]
        # the gradients come from matmul and reduce_sum: fresh arrays that the plan owns
        assert ("optimizer_update[in-place]" in names) is donated, names
        if not donated:   # fetched gradients come back unscaled, as eager gives them
            out = f(*data[0])
            variables_eager = mlp()
            want = step_fn(variables_eager, fl.optimizers.SGD(0.1), returns)(*data[0])
            for a, b in zip(out, want):
                assert a.numpy().tobytes() == b.numpy().tobytes()


def test_integer_variables_still_update_with_sgd():
    v = fl.Variable(np.array([10, 20], np.int64))
    opt = fl.optimizers.SGD(1.0)

    @fl.function
    def step(g):
        opt.apply_gradients([(g * 2, v)])

    step(fl.constant(np.array([1, 2], np.int64)))
    np.testing.assert_array_equal(v.numpy(), [8, 16])


def test_the_gradient_of_a_batch_mean_is_folded_when_the_batch_size_is_known():
    g = fl.Graph()
    with g.as_default():
        x = g.placeholder(fl.float32, [4, 3], name="x")
        with fl.GradientTape() as tape:
            tape.watch(x)
            y = fl.reduce_mean(fl.square(x))
        (dx,) = tape.gradient(y, [x])
    plan = compile_plan(g, [y, dx], [x], passes=DEFAULT_PASSES)
    plain = compile_plan(g, [y, dx], [x], passes=())
    assert "reduce_grad" in [n.op.name for n in plain.nodes]
    assert "reduce_grad" not in [n.op.name for n in plan.nodes]
    value = np.arange(12, dtype=np.float32).reshape(4, 3)
    for a, b in zip(plan(value), plain(value)):
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
    h = fl.Graph()
    with h.as_default():     # an unknown batch size: nothing to fold
        x = h.placeholder(fl.float32, [None, 3], name="x")
        with fl.GradientTape() as tape:
            tape.watch(x)
            y = fl.reduce_mean(fl.square(x))
        (dx,) = tape.gradient(y, [x])
    assert "reduce_grad" in [n.op.name for n in compile_plan(h, [dx], [x]).nodes]


def test_no_update_writes_in_place_while_another_thread_runs():
    variables = mlp()
    step = step_fn(variables, fl.optimizers.SGD(0.1))
    data = batches()
    step(*data[0])
    stop = threading.Event()
    other = threading.Thread(target=stop.wait, args=(30,))
    other.start()
    try:
        before = [weakref.ref(v._value) for v in variables]   # weak: they do not count as holders
        step(*data[1])
        assert all(ref() is not v._value for ref, v in zip(before, variables))   # new arrays
    finally:
        stop.set()
        other.join(timeout=30)
    assert not other.is_alive()
    if threading.active_count() == 1:
        before = [weakref.ref(v._value) for v in variables]
        step(*data[2])
        assert all(ref() is v._value for ref, v in zip(before, variables))       # alone again: in place
