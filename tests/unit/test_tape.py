"""GradientTape semantics: what it watches, what ``gradient`` returns, and how it behaves around
assignment, threads and exceptions. Gradient values of each op are in test_gradients.py."""
from __future__ import annotations

import threading

import numpy as np
import pytest

import flowlab as fl
from flowlab.core._context import ACTIVE, state
from flowlab.errors import InvalidArgumentError


def f64(value):
    return fl.constant(np.asarray(value, dtype=np.float64))


@pytest.fixture(autouse=True)
def no_tape_left_open():
    """Every test must leave the thread with no recording tape and the process-wide count as it was."""
    before = ACTIVE.count
    yield
    leaked = list(state().tapes)
    for tape in leaked:          # clean up so one failure does not spread to later tests
        state().pop("tapes", tape)
    assert not leaked, f"tapes still recording after the test: {leaked}"
    assert ACTIVE.count == before


# -- what is watched ------------------------------------------------------------------------
def test_trainable_variables_are_watched_and_non_trainable_are_not():
    w = fl.Variable([1.0, 2.0])
    frozen = fl.Variable([3.0, 4.0], trainable=False)
    with fl.GradientTape() as tape:
        y = fl.reduce_sum(w * frozen)
    grad_w, grad_frozen = tape.gradient(y, [w, frozen])
    np.testing.assert_array_equal(grad_w.numpy(), [3.0, 4.0])
    assert grad_frozen is None
    assert tape.watched_variables() == (w,)


def test_a_non_trainable_variable_can_be_watched_explicitly():
    frozen = fl.Variable(3.0, trainable=False)
    with fl.GradientTape() as tape:
        tape.watch(frozen)
        y = frozen * frozen
    assert float(tape.gradient(y, frozen)) == 6.0
    assert tape.watched_variables() == (frozen,)


def test_watch_accessed_variables_false_watches_only_what_is_asked():
    a, b = fl.Variable(2.0), fl.Variable(5.0)
    with fl.GradientTape(watch_accessed_variables=False) as tape:
        tape.watch(a)
        y = a * b
    grad_a, grad_b = tape.gradient(y, [a, b])
    assert float(grad_a) == 5.0
    assert grad_b is None
    assert tape.watched_variables() == (a,)


def test_constants_are_not_watched_unless_asked():
    x = fl.constant(3.0)
    with fl.GradientTape() as tape:
        y = x * x
    assert tape.gradient(y, x) is None
    assert tape._entries == []    # ops on constants cost the tape nothing


def test_watch_takes_nested_structures():
    a, b, c = fl.constant(1.0), fl.constant(2.0), fl.constant(3.0)
    with fl.GradientTape() as tape:
        tape.watch({"pair": [a, b], "single": (c,)})
        y = a * b * c
    assert [float(g) for g in tape.gradient(y, [a, b, c])] == [6.0, 3.0, 2.0]


def test_watch_rejects_non_tensors():
    with fl.GradientTape() as tape:
        with pytest.raises(TypeError, match="watch"):
            tape.watch([fl.constant(1.0), 2.0])


def test_watched_variables_in_order_first_seen():
    a, b, c = fl.Variable(1.0), fl.Variable(2.0), fl.Variable(3.0)
    with fl.GradientTape() as tape:
        y = c * a
        y = y * c + b
    assert tape.watched_variables() == (c, a, b)


# -- what gradient() returns ----------------------------------------------------------------
def _three_sources():
    a, b, c = fl.Variable(1.0), fl.Variable(2.0), fl.Variable(3.0)
    with fl.GradientTape(persistent=True) as tape:
        y = a * 10.0 + b * 20.0 + c * 30.0
    return tape, y, a, b, c


def test_gradient_mirrors_the_structure_of_sources():
    tape, y, a, b, c = _three_sources()
    single = tape.gradient(y, a)
    as_list = tape.gradient(y, [a, b])
    as_tuple = tape.gradient(y, (a, b))
    as_dict = tape.gradient(y, {"z": a, "b": [b, (c,)]})
    assert isinstance(single, fl.Tensor) and float(single) == 10.0
    assert isinstance(as_list, list) and [float(g) for g in as_list] == [10.0, 20.0]
    assert isinstance(as_tuple, tuple) and [float(g) for g in as_tuple] == [10.0, 20.0]
    assert isinstance(as_dict, dict) and set(as_dict) == {"z", "b"}
    assert float(as_dict["z"]) == 10.0
    assert isinstance(as_dict["b"], list) and float(as_dict["b"][0]) == 20.0
    assert isinstance(as_dict["b"][1], tuple) and float(as_dict["b"][1][0]) == 30.0


@pytest.mark.parametrize("how", ["zero", fl.UnconnectedGradients.ZERO])
def test_unconnected_sources_give_none_or_zeros(how):
    x = fl.Variable([1.0, 2.0])
    unused = fl.Variable([[1.0, 2.0, 3.0]], dtype=fl.float64)
    with fl.GradientTape(persistent=True) as tape:
        y = fl.reduce_sum(x * x)
    assert tape.gradient(y, [x, unused])[1] is None
    zeros = tape.gradient(y, unused, unconnected_gradients=how)
    assert zeros.shape == unused.shape and zeros.dtype == fl.float64
    np.testing.assert_array_equal(zeros.numpy(), np.zeros((1, 3)))


def test_integer_sources_give_none():
    n = fl.constant([1, 2, 3])
    with fl.GradientTape() as tape:
        tape.watch(n)
        y = fl.reduce_sum(fl.cast(n, fl.float32) * 2.0)
    assert tape.gradient(y, n) is None


def test_output_gradients_weight_a_non_scalar_target():
    x = f64([1.0, 2.0, 3.0])
    weights = np.array([0.5, -1.0, 2.0])
    with fl.GradientTape(persistent=True) as tape:
        tape.watch(x)
        y = x * x
    np.testing.assert_allclose(tape.gradient(y, x, output_gradients=weights).numpy(), 2 * x.numpy() * weights)
    np.testing.assert_allclose(tape.gradient(y, x).numpy(), 2 * x.numpy())   # no weights: summed


def test_a_list_of_targets_is_summed():
    x = f64(2.0)
    with fl.GradientTape(persistent=True) as tape:
        tape.watch(x)
        square, cube = x * x, x * x * x
    assert float(tape.gradient([square, cube], x)) == 4.0 + 12.0
    assert float(tape.gradient([square, cube], x, output_gradients=[f64(1.0), f64(-2.0)])) == 4.0 - 24.0
    with pytest.raises(ValueError, match="output_gradients"):
        tape.gradient([square, cube], x, output_gradients=[f64(1.0)])


def test_sources_must_be_tensors():
    x = fl.Variable(1.0)
    with fl.GradientTape() as tape:
        y = x * x
    with pytest.raises(TypeError, match="sources"):
        tape.gradient(y, [x, "x"])


def test_a_non_persistent_tape_computes_gradients_once():
    x = fl.Variable(3.0)
    with fl.GradientTape() as tape:
        y = x * x
    assert float(tape.gradient(y, x)) == 6.0
    with pytest.raises(RuntimeError, match="persistent"):
        tape.gradient(y, x)


def test_a_persistent_tape_computes_gradients_many_times():
    x = fl.Variable(3.0)
    with fl.GradientTape(persistent=True) as tape:
        y = x * x
        z = y * x
    assert float(tape.gradient(y, x)) == 6.0
    assert float(tape.gradient(z, x)) == 27.0
    assert float(tape.gradient(y, x)) == 6.0


def test_a_tape_cannot_be_entered_twice():
    tape = fl.GradientTape()
    with tape:
        with pytest.raises(RuntimeError, match="already recording"):
            tape.__enter__()


# -- recording control ----------------------------------------------------------------------
def test_stop_recording_hides_ops_from_the_tape():
    x = fl.Variable(3.0)
    with fl.GradientTape() as tape:
        y = x * x
        with tape.stop_recording():
            hidden = x * 100.0
        y = y + hidden
    assert float(tape.gradient(y, x)) == 6.0


def test_stop_recording_outside_the_with_block_raises():
    tape = fl.GradientTape()
    with pytest.raises(RuntimeError, match="recording"):
        with tape.stop_recording():
            pass


def test_gradient_inside_stop_recording_leaves_the_tape_as_it_was():
    # TensorFlow suggests exactly this for a persistent tape used inside its own context.
    x = fl.Variable(3.0)
    before = ACTIVE.count
    tape = fl.GradientTape(persistent=True)
    try:
        with tape:
            y = x * x
            with tape.stop_recording():
                assert float(tape.gradient(y, x)) == 6.0
                hidden = x * 100.0   # must not be recorded
            total = x * x + hidden   # hidden is a constant to the tape: d/dx = 2x = 6
        assert float(tape.gradient(total, x)) == 6.0
        assert ACTIVE.count == before
        assert tape not in state().tapes
    finally:
        while tape in state().tapes:
            state().pop("tapes", tape)


def test_reset_forgets_what_was_recorded():
    x = fl.Variable(3.0)
    with fl.GradientTape() as tape:
        before_reset = x * x
        tape.reset()
        after_reset = x * x * x
    assert float(tape.gradient([before_reset, after_reset], x)) == 27.0   # only the cube counts


def test_reset_lets_a_non_persistent_tape_compute_again():
    x = fl.Variable(3.0)
    with fl.GradientTape() as tape:
        y = x * x
        assert float(tape.gradient(y, x)) == 6.0
        tape.reset()
        z = x * x * x
    assert float(tape.gradient(z, x)) == 27.0


def test_stop_gradient_blocks_gradients():
    x = fl.Variable(3.0)
    with fl.GradientTape() as tape:
        y = x * fl.stop_gradient(x * x)   # d/dx = x^2, not 3 x^2
    assert float(tape.gradient(y, x)) == 9.0


def test_a_variable_used_twice_accumulates():
    x = fl.Variable(3.0)
    with fl.GradientTape() as tape:
        y = fl.sin(x) + x * 2.0 + x
    np.testing.assert_allclose(float(tape.gradient(y, x)), np.cos(3.0) + 3.0, rtol=1e-6)


def test_gradient_with_respect_to_an_intermediate_tensor():
    x = fl.Variable([1.0, 2.0])
    with fl.GradientTape() as tape:
        hidden = x * 3.0
        y = fl.reduce_sum(hidden * hidden)
    grad_hidden, grad_x = tape.gradient(y, [hidden, x])
    np.testing.assert_allclose(grad_hidden.numpy(), 2 * np.array([3.0, 6.0]))
    np.testing.assert_allclose(grad_x.numpy(), 18 * np.array([1.0, 2.0]))


def test_gradient_after_assign_uses_the_value_from_the_forward_pass():
    x = fl.Variable(2.0)
    with fl.GradientTape() as tape:
        y = x * x
    x.assign(5.0)
    assert float(tape.gradient(y, x)) == 4.0


# -- threads, pruning, exceptions -----------------------------------------------------------
def test_ops_in_another_thread_are_not_recorded_on_this_threads_tape():
    x = fl.Variable([1.0, 2.0])
    ready, done = threading.Event(), threading.Event()
    errors = []

    def worker():
        try:
            ready.wait(5)
            for _ in range(20):
                fl.reduce_sum(x * x * 100.0)   # the same trainable variable, on another thread
        except Exception as e:  # noqa: BLE001 - reported to the main thread
            errors.append(e)
        finally:
            done.set()

    thread = threading.Thread(target=worker)
    thread.start()
    with fl.GradientTape() as tape:
        y = fl.reduce_sum(x * x)
        entries = len(tape._entries)
        ready.set()
        assert done.wait(5)
        assert len(tape._entries) == entries
    thread.join()
    assert not errors
    np.testing.assert_array_equal(tape.gradient(y, x).numpy(), [2.0, 4.0])


def test_tapes_in_two_threads_stay_separate():
    barrier = threading.Barrier(2)
    results, errors = {}, []

    def train(name, scale):
        try:
            x = fl.Variable([1.0, 2.0])
            with fl.GradientTape() as tape:
                barrier.wait(5)       # both tapes open at once
                y = fl.reduce_sum(x * x) * scale
                barrier.wait(5)       # both threads have run their ops
                # reads of the variable are entries too; count the ops this thread ran
                entries = sum(1 for e in tape._entries if e[0].name != "read_variable")
                watched = tape.watched_variables()
            results[name] = (tape.gradient(y, x).numpy(), entries, watched == (x,))
        except Exception as e:  # noqa: BLE001 - reported to the main thread
            errors.append(e)

    threads = [threading.Thread(target=train, args=(name, s)) for name, s in [("a", 1.0), ("b", 10.0)]]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    np.testing.assert_array_equal(results["a"][0], [2.0, 4.0])
    np.testing.assert_array_equal(results["b"][0], [20.0, 40.0])
    assert results["a"][1:] == results["b"][1:] == (3, True)   # multiply, reduce_sum, multiply: its own only


def _count_ops_while(fn, name):
    calls = []

    def hook(op, inputs, attrs, out):
        if op.name == name:
            calls.append(op)

    state().push("hooks", hook)
    try:
        result = fn()
    finally:
        state().pop("hooks", hook)
    return result, len(calls)


def test_backward_computes_no_gradient_for_a_constant_data_batch():
    data = fl.constant(np.ones((8, 3), np.float32))
    w = fl.Variable(np.ones((3, 2), np.float32))
    with fl.GradientTape() as tape:
        y = fl.reduce_sum(fl.matmul(data, w))
    grad, matmuls = _count_ops_while(lambda: tape.gradient(y, w), "matmul")
    np.testing.assert_array_equal(grad.numpy(), np.full((3, 2), 8.0))
    assert matmuls == 1      # data^T g only; no g w^T for the data


def test_backward_through_two_layers_skips_only_the_data_gradient():
    data = fl.constant(np.ones((8, 3), np.float32))
    w1, w2 = fl.Variable(np.ones((3, 4), np.float32)), fl.Variable(np.ones((4, 2), np.float32))
    with fl.GradientTape() as tape:
        y = fl.reduce_sum(fl.matmul(fl.tanh(fl.matmul(data, w1)), w2))
    _, matmuls = _count_ops_while(lambda: tape.gradient(y, [w1, w2]), "matmul")
    assert matmuls == 3      # d w2, d hidden, d w1


def test_an_exception_inside_the_with_block_leaves_no_tape_recording():
    x = fl.Variable(1.0)
    before = ACTIVE.count
    with pytest.raises(ZeroDivisionError):
        with fl.GradientTape() as tape:
            y = x * 2.0
            1 / 0
    assert ACTIVE.count == before
    assert tape not in state().tapes
    entries = len(tape._entries)
    x * 3.0
    assert len(tape._entries) == entries
    assert float(tape.gradient(y, x)) == 2.0   # what was recorded before the error is still usable


def test_an_exception_inside_gradient_keeps_the_tape_recording():
    x = fl.Variable(1.0)
    with fl.GradientTape(persistent=True) as tape:
        y = x * 2.0
        with pytest.raises(InvalidArgumentError):   # raised inside the backward pass
            tape.gradient(y, x, output_gradients=fl.constant(1))
        assert state().tapes[-1] is tape
        z = y * 3.0
    assert float(tape.gradient(z, x)) == 6.0


def test_nested_tapes_can_exit_out_of_order():
    x = fl.Variable(2.0)
    outer, inner = fl.GradientTape(), fl.GradientTape()
    outer.__enter__()
    inner.__enter__()
    outer.__exit__(None, None, None)
    y = x * x                       # only the inner tape is still recording
    inner.__exit__(None, None, None)
    assert outer._entries == []
    assert float(inner.gradient(y, x)) == 4.0
