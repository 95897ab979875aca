"""fl.custom_gradient: a function that brings its own gradient."""
import numpy as np
import pytest

import flowlab as fl


@fl.custom_gradient
def scaled_identity(x, y):
    """Forward: x + y; backward: 10 for x and 100 for y (not what the ops inside would give)."""
    return x + y, lambda g: (g * 10.0, g * 100.0)


def test_tapes_use_the_given_gradient_not_the_ops_inside():
    x, y = fl.constant([1.0, 2.0]), fl.constant([3.0, 4.0])
    with fl.GradientTape(persistent=True) as tape:
        tape.watch([x, y])
        z = fl.reduce_sum(scaled_identity(x, y) * 2.0)
    np.testing.assert_allclose(tape.gradient(z, x).numpy(), [20.0, 20.0])
    np.testing.assert_allclose(tape.gradient(z, y).numpy(), [200.0, 200.0])
    assert scaled_identity(x, y).numpy().tolist() == [4.0, 6.0]          # no tape: just the value


def test_variables_and_traced_functions():
    v = fl.Variable([1.0, 2.0])
    with fl.GradientTape() as tape:
        z = fl.reduce_sum(scaled_identity(v, fl.constant([1.0, 1.0])))
    np.testing.assert_allclose(tape.gradient(z, v).numpy(), [10.0, 10.0])

    @fl.function
    def grad(x):
        with fl.GradientTape() as t:
            t.watch(x)
            out = fl.reduce_sum(scaled_identity(x, x))
        return t.gradient(out, x)
    np.testing.assert_allclose(grad(fl.constant([1.0])).numpy(), [110.0])


def test_second_order_through_a_custom_gradient():
    @fl.custom_gradient
    def square(x):
        return x * x, lambda g: g * 2.0 * x
    x = fl.constant(3.0)
    with fl.GradientTape() as outer:
        outer.watch(x)
        with fl.GradientTape() as inner:
            inner.watch(x)
            y = square(x)
        dy = inner.gradient(y, x)
    assert dy.numpy() == 6.0 and outer.gradient(dy, x).numpy() == 2.0


def test_a_wrong_number_of_gradients_is_a_clear_error():
    @fl.custom_gradient
    def bad(x, y):
        return x * y, lambda g: g
    x = fl.constant(1.0)
    with fl.GradientTape() as tape:
        tape.watch(x)
        z = bad(x, fl.constant(2.0))
    with pytest.raises(ValueError, match="returned 1 gradients for 2 inputs"):
        tape.gradient(z, x)
