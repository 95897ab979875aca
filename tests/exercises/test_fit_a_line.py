"""The fit-a-line exercise (exercises/01_fit_a_line.ipynb, checks/fit_a_line.py): the reference
passes every case, visible and hidden, and typical learner mistakes fail with a reason that says
what went wrong."""
import sys
from pathlib import Path

import numpy as np
import pytest

import flowlab as fl
from flowlab.core.tape import GradientTape
from flowlab.grading.check import reset_attempts

sys.path.insert(0, str(Path(__file__).parent))
from _grade import EXERCISES, failures, outcomes   # noqa: E402

ID = "fit-a-line"


def _tensors(x, y):
    return fl.constant(np.asarray(x, np.float32)), fl.constant(np.asarray(y, np.float32))


def reference(x, y, steps, lr):
    x, y = _tensors(x, y)
    w, b = fl.Variable(0.0), fl.Variable(0.0)
    for _ in range(steps):
        with fl.GradientTape() as tape:
            loss = fl.reduce_mean(fl.square(w * x + b - y))
        dw, db = tape.gradient(loss, [w, b])
        w.assign_sub(lr * dw)
        b.assign_sub(lr * db)
    return float(w.numpy()), float(b.numpy())


def by_hand(x, y, steps, lr):
    """Right numbers, no tape: the gradients worked out in numpy."""
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    w = b = 0.0
    for _ in range(steps):
        r = w * x + b - y
        w, b = w - lr * 2 * np.mean(r * x), b - lr * 2 * np.mean(r)
    return w, b


def no_cast(x, y, steps, lr):
    """fl.constant of float64 data next to float32 variables."""
    x, y = fl.constant(x), fl.constant(y)
    w, b = fl.Variable(0.0), fl.Variable(0.0)
    for _ in range(steps):
        with fl.GradientTape() as tape:
            loss = fl.reduce_mean(fl.square(w * x + b - y))
        dw, db = tape.gradient(loss, [w, b])
        w.assign_sub(lr * dw)
        b.assign_sub(lr * db)
    return float(w.numpy()), float(b.numpy())


def one_at_a_time(x, y, steps, lr):
    """Moves w, then takes b's gradient at the new w: not the gradient at one point."""
    x, y = _tensors(x, y)
    w, b = fl.Variable(0.0), fl.Variable(0.0)
    for _ in range(steps):
        with fl.GradientTape() as tape:
            loss = fl.reduce_mean(fl.square(w * x + b - y))
        w.assign_sub(lr * tape.gradient(loss, w))
        with fl.GradientTape() as tape:
            loss = fl.reduce_mean(fl.square(w * x + b - y))
        b.assign_sub(lr * tape.gradient(loss, b))
    return float(w.numpy()), float(b.numpy())


def ascent(x, y, steps, lr):
    """Moves along the gradient instead of against it."""
    x, y = _tensors(x, y)
    w, b = fl.Variable(0.0), fl.Variable(0.0)
    for _ in range(steps):
        with fl.GradientTape() as tape:
            loss = fl.reduce_mean(fl.square(w * x + b - y))
        dw, db = tape.gradient(loss, [w, b])
        w.assign_add(lr * dw)
        b.assign_add(lr * db)
    return float(w.numpy()), float(b.numpy())


def test_the_reference_passes_every_case():
    results = outcomes(ID, reference)
    assert len(results) == 6
    assert all(ok for _, ok, _ in results), results


def test_the_tape_is_unwrapped_after_each_case():
    original = GradientTape.gradient
    outcomes(ID, reference)
    outcomes(ID, by_hand)
    assert GradientTape.gradient is original


def test_gradients_by_hand_fail_on_the_tape_count():
    failed = dict(failures(ID, by_hand))
    # steps = 0 asks for no tape at all: every other case fails, on the count and only on it
    assert set(failed) == {name for name, _, _ in outcomes(ID, reference)} - {"no steps: still (0, 0)"}
    assert "tape.gradient calls" in failed["100 steps, float32 data"]
    assert "0 in 100 steps" in failed["100 steps, float32 data"]


def test_float64_data_without_a_cast_raises_a_dtype_error():
    failed = dict(failures(ID, no_cast))
    assert set(failed) == {"50 steps, float64 data", "x between 2 and 4 (slow, w and b pull together)"}
    assert "raised InvalidArgumentError" in failed["50 steps, float64 data"]
    assert "same dtype" in failed["50 steps, float64 data"]


def test_updating_one_variable_before_the_other_gets_other_numbers():
    failed = dict(failures(ID, one_at_a_time))
    assert "one step from (0, 0)" in failed
    assert "expected" in failed["one step from (0, 0)"] and "b" in failed["one step from (0, 0)"]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")   # it climbs until the loss overflows
def test_gradient_ascent_fails_every_case_that_steps():
    failed = dict(failures(ID, ascent))
    assert "no steps: still (0, 0)" not in failed and len(failed) == 5
    assert "w" in failed["one step from (0, 0)"]


def test_check_in_place_shows_a_hint_after_a_failed_try():
    reset_attempts(ID)
    try:
        result = fl.grading.check(ID, by_hand, exercises=EXERCISES)
        assert not result.passed and result.points == 0
        assert result.hint and "GradientTape" in result.hint
        assert "0 in 100 steps" in repr(result)
        assert result.hidden == 3
        assert fl.grading.check(ID, reference, exercises=EXERCISES).passed
    finally:
        reset_attempts(ID)
