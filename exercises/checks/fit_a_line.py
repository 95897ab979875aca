"""01 · Eager tensors and gradients: fit a line with a gradient tape.

The answer is ``fit_line(x, y, steps, lr)``: ``x`` and ``y`` are 1-d numpy arrays (float32 or
float64) of the same length. Starting from ``w = 0, b = 0``, it takes ``steps`` steps of plain
gradient descent with learning rate ``lr`` on the mean squared error ``mean((w * x + b - y) ** 2)``,
each step's gradients taken by a ``fl.GradientTape``, and returns ``(w, b)``.

The check reads two things:

- ``w`` and ``b``, against the same descent done here in float64 numpy, with the gradient derived by
  hand: dL/dw = 2 mean((w x + b - y) x), dL/db = 2 mean(w x + b - y). The case "one step from
  (0, 0)" is that gradient at a point: after one step, (w, b) = -lr * gradient at (0, 0).
- how many times a tape was asked for gradients while the answer ran (``GradientTape.gradient`` is
  wrapped for the duration of the case): at least once per step. Gradients worked out by hand in
  numpy give the right numbers but 0 tape calls, and fail.
"""
import numpy as np

from flowlab.core.tape import GradientTape
from flowlab.grading import Case

POINTS = 2
HINTS = [
    "Start from fl.Variable(0.0) for w and b. In each step, compute the loss inside `with fl.GradientTape() as tape:`, "
    "then `dw, db = tape.gradient(loss, [w, b])` and move each variable against its gradient with assign_sub.",
    "float64 data next to float32 variables is an error: convert the data first, e.g. "
    "`x = fl.constant(np.asarray(x, np.float32))`. Update w and b only after taking both gradients, "
    "and return float(w.numpy()), float(b.numpy()).",
    "One step: with fl.GradientTape() as tape: loss = fl.reduce_mean(fl.square(w * x + b - y)); "
    "dw, db = tape.gradient(loss, [w, b]); w.assign_sub(lr * dw); b.assign_sub(lr * db). Repeat `steps` times.",
]
TOLERANCE = {"rtol": 1e-4, "atol": 1e-5}   # the answer computes in float32, the reference in float64
EVERY_STEP = "one or more per step"


def _data(n, w, b, seed, dtype=np.float32, low=-1.0, high=1.0, noise=0.1):
    rng = np.random.default_rng(seed)
    x = rng.uniform(low, high, n)
    y = w * x + b + rng.normal(0.0, noise, n)
    return x.astype(dtype), y.astype(dtype)


def _descent(x, y, steps, lr):
    """The reference: gradient descent on mean((w x + b - y)^2) from (0, 0), gradient by hand."""
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    w = b = 0.0
    for _ in range(steps):
        r = w * x + b - y
        dw, db = 2.0 * np.mean(r * x), 2.0 * np.mean(r)
        w, b = w - lr * dw, b - lr * db
    return w, b


def _expected(args):
    w, b = _descent(*args)
    return {"w": float(w), "b": float(b), "tape.gradient calls": EVERY_STEP}


def _case(name, data, steps, lr):
    return Case(name, args=(*data, steps, lr), expected=_expected)


def cases():
    yield _case("one step from (0, 0)", _data(8, 3.0, 2.0, seed=0), 1, 0.5)
    yield _case("100 steps, float32 data", _data(50, 3.0, 2.0, seed=1), 100, 0.1)
    yield _case("50 steps, float64 data", _data(40, -1.5, 0.5, seed=2, dtype=np.float64), 50, 0.2)


### BEGIN HIDDEN TESTS
def hidden_cases():
    yield _case("no steps: still (0, 0)", _data(5, 1.0, 1.0, seed=3), 0, 0.1)
    yield _case("1000 points, 300 steps", _data(1000, 0.7, -4.0, seed=4), 300, 0.3)
    yield _case("x between 2 and 4 (slow, w and b pull together)",
                _data(60, -2.0, 5.0, seed=5, dtype=np.float64, low=2.0, high=4.0), 200, 0.04)
### END HIDDEN TESTS


def run(answer, case):
    x, y, steps, lr = case.args
    calls = 0
    original = GradientTape.gradient

    def counting(self, *args, **kwargs):
        nonlocal calls
        calls += 1
        return original(self, *args, **kwargs)

    GradientTape.gradient = counting
    try:
        w, b = answer(x.copy(), y.copy(), steps, lr)
    finally:
        if GradientTape.gradient is counting:   # (a case that ran past its time may still hold its own)
            GradientTape.gradient = original
    return {"w": float(w), "b": float(b),
            "tape.gradient calls": EVERY_STEP if calls >= steps else f"{calls} in {steps} steps"}
