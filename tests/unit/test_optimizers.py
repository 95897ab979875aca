"""Optimizers against their published update rules, written out here in numpy step by step,
plus the bookkeeping around them (apply_gradients, minimize, slots, schedules) and convergence."""
from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

import flowlab as fl
from flowlab.errors import InvalidArgumentError

STEPS = 4
START = {"w": np.array([[0.5, -1.0, 2.0], [0.0, 3.0, -0.25]]), "b": np.array([0.1, -0.2])}
# A fixed gradient for every step, with a tiny entry where epsilon's placement matters.
GRADS = [{"w": np.random.default_rng(step).standard_normal((2, 3)) * [[1, 1, 1], [1, 1e-6, 1]],
          "b": np.random.default_rng(100 + step).standard_normal(2)} for step in range(STEPS)]


# -- the reference rules, one step each: (weights, grad, state, step t from 1) -> (weights, state)
def sgd_step(w, g, state, t, lr):
    return w - lr * g, state


def momentum_step(w, g, state, t, lr, momentum, nesterov):
    # Keras SGD: velocity = momentum * velocity - lr * g; w += velocity
    # (nesterov, after Sutskever et al. 2013: w += momentum * velocity - lr * g)
    velocity = momentum * state.get("momentum", 0.0) - lr * g
    w = w + momentum * velocity - lr * g if nesterov else w + velocity
    return w, {"momentum": velocity}


def adam_step(w, g, state, t, lr, beta_1, beta_2, epsilon):
    # Kingma & Ba 2015, Algorithm 1 with the more efficient ordering of section 2 (as Keras does):
    #   alpha_t = lr * sqrt(1 - beta_2^t) / (1 - beta_1^t);  w -= alpha_t * m / (sqrt(v) + epsilon)
    m = beta_1 * state.get("m", 0.0) + (1 - beta_1) * g
    v = beta_2 * state.get("v", 0.0) + (1 - beta_2) * g**2
    alpha = lr * math.sqrt(1 - beta_2**t) / (1 - beta_1**t)
    return w - alpha * m / (np.sqrt(v) + epsilon), {"m": m, "v": v}


def adadelta_step(w, g, state, t, lr, rho, epsilon):
    # Zeiler 2012, Algorithm 1, with the step scaled by lr as Keras does:
    #   E[g^2] = rho E[g^2] + (1 - rho) g^2;   dx = -RMS[dx]_{t-1} / RMS[g]_t * g
    #   E[dx^2] = rho E[dx^2] + (1 - rho) dx^2;   w += lr * dx
    accum_grad = rho * state.get("accum_grad", 0.0) + (1 - rho) * g**2
    dx = -np.sqrt(state.get("accum_var", 0.0) + epsilon) / np.sqrt(accum_grad + epsilon) * g
    accum_var = rho * state.get("accum_var", 0.0) + (1 - rho) * dx**2
    return w + lr * dx, {"accum_grad": accum_grad, "accum_var": accum_var}


# (label, make the optimizer, the reference step with its hyperparameters)
OPTIMIZERS = [
    ("sgd", lambda: fl.optimizers.SGD(0.1), lambda *a: sgd_step(*a, lr=0.1)),
    ("momentum", lambda: fl.optimizers.SGD(0.1, momentum=0.9),
     lambda *a: momentum_step(*a, lr=0.1, momentum=0.9, nesterov=False)),
    ("nesterov", lambda: fl.optimizers.SGD(0.05, momentum=0.8, nesterov=True),
     lambda *a: momentum_step(*a, lr=0.05, momentum=0.8, nesterov=True)),
    ("adam", lambda: fl.optimizers.Adam(0.1, beta_1=0.8, beta_2=0.95, epsilon=1e-3),
     lambda *a: adam_step(*a, lr=0.1, beta_1=0.8, beta_2=0.95, epsilon=1e-3)),
    ("adam-defaults", lambda: fl.optimizers.Adam(),
     lambda *a: adam_step(*a, lr=0.001, beta_1=0.9, beta_2=0.999, epsilon=1e-7)),
    ("adadelta", lambda: fl.optimizers.Adadelta(1.0, rho=0.9, epsilon=1e-4),
     lambda *a: adadelta_step(*a, lr=1.0, rho=0.9, epsilon=1e-4)),
    ("adadelta-defaults", lambda: fl.optimizers.Adadelta(),
     lambda *a: adadelta_step(*a, lr=0.001, rho=0.95, epsilon=1e-7)),
]
SLOTS = {"sgd": [], "momentum": ["momentum"], "nesterov": ["momentum"], "adam": ["m", "v"],
         "adam-defaults": ["m", "v"], "adadelta": ["accum_grad", "accum_var"],
         "adadelta-defaults": ["accum_grad", "accum_var"]}


@pytest.mark.parametrize("label, make, reference", OPTIMIZERS, ids=[o[0] for o in OPTIMIZERS])
def test_steps_match_the_published_update_rule(label, make, reference):
    opt = make()
    variables = {k: fl.Variable(v.copy(), name=k) for k, v in START.items()}
    expected = {k: v.copy() for k, v in START.items()}
    states = {k: {} for k in START}
    for t, grads in enumerate(GRADS, start=1):
        opt.apply_gradients([(fl.constant(grads[k]), variables[k]) for k in START])
        for k in START:
            expected[k], states[k] = reference(expected[k], grads[k], states[k], t)
            np.testing.assert_allclose(variables[k].numpy(), expected[k], rtol=1e-12, atol=1e-14,
                                       err_msg=f"{label}: {k} after step {t}")
    assert opt.get_slot_names() == SLOTS[label]
    for k in START:
        for slot in SLOTS[label]:
            np.testing.assert_allclose(opt.get_slot(variables[k], slot).numpy(), states[k][slot], rtol=1e-12,
                                       atol=1e-14, err_msg=f"{label}: slot {slot} of {k}")
    assert int(opt.iterations) == STEPS


@pytest.mark.parametrize("label, make, reference", OPTIMIZERS, ids=[o[0] for o in OPTIMIZERS])
def test_float32_variables_stay_float32(label, make, reference):
    opt = make()
    w = fl.Variable(START["w"].astype(np.float32))
    expected, state = START["w"].copy(), {}
    for t, grads in enumerate(GRADS, start=1):
        opt.apply_gradients([(fl.constant(grads["w"]), w)])   # a float64 gradient, cast to the variable
        expected, state = reference(expected, grads["w"].astype(np.float32).astype(np.float64), state, t)
    assert w.dtype == fl.float32
    np.testing.assert_allclose(w.numpy(), expected, rtol=1e-5, atol=1e-5)


def test_default_hyperparameters_are_keras_defaults():
    assert fl.optimizers.SGD().get_config() == {"name": "SGD", "learning_rate": 0.01, "momentum": 0.0,
                                                "nesterov": False}
    adam = fl.optimizers.Adam().get_config()
    assert (adam["learning_rate"], adam["beta_1"], adam["beta_2"], adam["epsilon"]) == (0.001, 0.9, 0.999, 1e-7)
    adadelta = fl.optimizers.Adadelta().get_config()
    assert (adadelta["learning_rate"], adadelta["rho"], adadelta["epsilon"]) == (0.001, 0.95, 1e-7)


@pytest.mark.parametrize("momentum", [-0.1, 1.5])
def test_sgd_rejects_momentum_outside_zero_to_one(momentum):
    with pytest.raises(ValueError, match="momentum"):
        fl.optimizers.SGD(0.1, momentum=momentum)


# -- apply_gradients bookkeeping ------------------------------------------------------------
def test_apply_gradients_skips_none_gradients():
    a, b = fl.Variable([1.0, 2.0], name="a"), fl.Variable([3.0], name="b")
    opt = fl.optimizers.Adam(0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")    # one live gradient: no warning
        opt.apply_gradients([(None, a), (fl.constant([1.0]), b)])
    np.testing.assert_array_equal(a.numpy(), [1.0, 2.0])
    assert float(b.numpy()[0]) < 3.0
    with pytest.raises(KeyError):
        opt.get_slot(a, "m")              # no state was made for the skipped variable
    assert int(opt.iterations) == 1


def test_apply_gradients_warns_when_every_gradient_is_none():
    a, b = fl.Variable([1.0], name="first"), fl.Variable([2.0], name="second")
    opt = fl.optimizers.SGD(0.1)
    with pytest.warns(UserWarning, match="no gradients.*first:0.*second:0"):
        opt.apply_gradients([(None, a), (None, b)])
    assert float(a.numpy()[0]) == 1.0 and float(b.numpy()[0]) == 2.0


def test_apply_gradients_shape_mismatch_names_the_variable():
    w = fl.Variable(np.zeros((2, 3)), name="dense/kernel")
    with pytest.raises(InvalidArgumentError, match=r"dense/kernel.*\(2, 3\)"):
        fl.optimizers.SGD(0.1).apply_gradients([(fl.constant(np.ones((3, 2))), w)])
    np.testing.assert_array_equal(w.numpy(), np.zeros((2, 3)))


def test_apply_gradients_needs_variables():
    with pytest.raises(TypeError, match="Variable"):
        fl.optimizers.SGD(0.1).apply_gradients([(fl.constant([1.0]), fl.constant([2.0]))])


def test_get_slot_rejects_unknown_slot_names():
    w = fl.Variable([1.0])
    opt = fl.optimizers.SGD(0.1)
    opt.apply_gradients([(fl.constant([1.0]), w)])
    with pytest.raises(KeyError, match="momentum"):
        opt.get_slot(w, "momentum")       # plain SGD keeps no state


def test_iterations_counts_steps():
    w = fl.Variable([1.0])
    opt = fl.optimizers.Adam(0.1)
    assert int(opt.iterations) == 0
    assert opt.iterations.dtype == fl.int64 and not opt.iterations.trainable
    for step in range(1, 4):
        assert opt.apply_gradients([(fl.constant([1.0]), w)]) is opt.iterations
        assert int(opt.iterations) == step


def test_learning_rate_may_be_a_function_of_the_step():
    seen = []

    def schedule(step):
        seen.append(int(step))
        return 0.5 / (1 + step)

    w = fl.Variable(np.array([1.0, -2.0]))
    opt = fl.optimizers.SGD(schedule)
    expected = w.numpy().copy()
    for step, grads in enumerate(GRADS):
        opt.apply_gradients([(fl.constant(grads["b"]), w)])
        expected = expected - 0.5 / (1 + step) * grads["b"]
    assert seen == [0, 1, 2, 3]    # called with the number of steps taken so far, as Keras schedules are
    np.testing.assert_allclose(w.numpy(), expected, rtol=1e-12)


# -- minimize -------------------------------------------------------------------------------
def _regression_data(n=32):
    fl.random.set_seed(1234)
    x = fl.random.normal([n, 1])
    return x, 3.0 * x + 2.0


def _mse(w, b, x, y):
    return fl.reduce_mean(fl.square(x * w + b - y))


def test_minimize_equals_tape_and_apply_gradients():
    x, y = _regression_data()
    w1, b1 = fl.Variable(0.5), fl.Variable(-0.5)
    w2, b2 = fl.Variable(0.5), fl.Variable(-0.5)
    by_minimize, by_hand = fl.optimizers.Adam(0.1), fl.optimizers.Adam(0.1)
    for _ in range(3):
        by_minimize.minimize(lambda: _mse(w1, b1, x, y), [w1, b1])
        with fl.GradientTape() as tape:
            loss = _mse(w2, b2, x, y)
        by_hand.apply_gradients(zip(tape.gradient(loss, [w2, b2]), [w2, b2]))
    assert float(w1) == float(w2) and float(b1) == float(b2)
    assert float(w1) != 0.5
    assert int(by_minimize.iterations) == 3


def test_minimize_takes_a_callable_var_list_and_a_recorded_tape():
    x, y = _regression_data()
    w, b = fl.Variable(0.0), fl.Variable(0.0)
    opt = fl.optimizers.SGD(0.1)
    opt.minimize(lambda: _mse(w, b, x, y), lambda: [w, b])
    first = (float(w), float(b))
    with fl.GradientTape() as tape:
        loss = _mse(w, b, x, y)
    opt.minimize(loss, [w, b], tape=tape)
    assert first != (0.0, 0.0) and (float(w), float(b)) != first
    with pytest.raises(TypeError, match="callable"):
        opt.minimize(loss, [w, b])


# -- convergence ----------------------------------------------------------------------------
@pytest.mark.parametrize("make, steps", [
    (lambda: fl.optimizers.SGD(0.1), 150),
    (lambda: fl.optimizers.SGD(0.05, momentum=0.9), 150),
    (lambda: fl.optimizers.SGD(0.05, momentum=0.9, nesterov=True), 150),
    (lambda: fl.optimizers.Adam(0.2), 200),
    (lambda: fl.optimizers.Adadelta(1.0, epsilon=1e-4), 200),   # Keras default epsilon crawls for ~1000 steps
], ids=["sgd", "momentum", "nesterov", "adam", "adadelta"])
def test_fitting_a_line_converges(make, steps):
    x, y = _regression_data(64)
    w, b = fl.Variable(fl.random.normal([])), fl.Variable(0.0)
    opt = make()
    start = float(_mse(w, b, x, y))
    for _ in range(steps):
        opt.minimize(lambda: _mse(w, b, x, y), [w, b])
    assert float(_mse(w, b, x, y)) < 1e-3 < start
    assert abs(float(w) - 3.0) < 0.05 and abs(float(b) - 2.0) < 0.05
