"""02 · Graphs: a function that traces once.

The answer is ``normalize``, an ``@fl.function`` called as ``normalize(x, eps)``: ``x`` is a float32
batch ``[rows, features]`` (a tensor or a numpy array; any number of rows and of features) and
``eps`` a Python number (or a scalar tensor). It returns ``x`` with each column standardised:
``(x - mean) / sqrt(var + eps)``, with the mean and the variance (divided by rows, not rows - 1) of
that column over the rows.

For each case the check calls ``normalize`` a few times, with batches of different sizes and
different ``eps``, and reads two things:

- every call's values, against numpy (float64) within float32's precision;
- how many new traces those calls made, from the ``fl.function``'s own trace count
  (``Function.experimental_get_tracing_count``, read from flowlab's class, so an answer cannot
  report its own): at most 1. A plain ``@fl.function`` traces again for every new shape and every
  new Python number; an answer that is not an ``fl.function`` at all has no trace count and fails.
"""
import numpy as np

import flowlab as fl
from flowlab.core.function import Function
from flowlab.grading import Case

POINTS = 2
HINTS = [
    "A plain @fl.function traces again for every new input shape and every new Python number. "
    "Print normalize.experimental_get_tracing_count() after each call to see it.",
    "Give the decorator an input_signature: @fl.function(input_signature=[fl.TensorSpec([None, None], fl.float32), "
    "fl.TensorSpec([], fl.float32)]). None matches any size, and a Python number for eps becomes a float32 tensor.",
    "Inside: mean = fl.reduce_mean(x, axis=0, keepdims=True); var = fl.reduce_mean(fl.square(x - mean), axis=0, "
    "keepdims=True); return (x - mean) / fl.sqrt(var + eps).",
]
TOLERANCE = {"rtol": 1e-4, "atol": 1e-4}   # the answer computes in float32, the reference in float64
AT_MOST_ONE = "at most 1"


def _batch(rows, features, seed, as_tensor=True):
    rng = np.random.default_rng(seed)
    x = (rng.normal(0.0, 1.0, (rows, features)) * rng.uniform(0.5, 5.0, features)
         + rng.uniform(-10.0, 10.0, features)).astype(np.float32)
    return fl.constant(x) if as_tensor else x


def _standardise(x, eps):
    x = np.asarray(x, dtype=np.float64)
    eps = float(np.asarray(eps))
    return (x - x.mean(axis=0)) / np.sqrt(x.var(axis=0) + eps)


def _expected(args):
    calls = args[0]
    return {"values": [_standardise(x, eps) for x, eps in calls], "new traces": AT_MOST_ONE}


def _case(name, calls):
    """``calls``: the (x, eps) of each call, in order."""
    return Case(name, args=(calls,), expected=_expected)


def cases():
    yield _case("batches of 4, 9 and 30 rows", [(_batch(n, 3, seed=n), 1e-3) for n in (4, 9, 30)])
    yield _case("eps = 0.1, 0.001, 1e-5 as Python numbers",
                [(_batch(6, 2, seed=10), eps) for eps in (0.1, 0.001, 1e-5)])
    yield _case("rows, features and eps all change",
                [(_batch(n, f, seed=20 + n), eps) for n, f, eps in ((3, 5, 0.5), (17, 1, 0.01), (8, 4, 2.0))])


### BEGIN HIDDEN TESTS
def hidden_cases():
    yield _case("a batch of 1 row, then 2 rows (eps keeps it finite)",
                [(_batch(1, 3, seed=30), 1e-3), (_batch(2, 3, seed=31), 1e-3)])
    yield _case("numpy batches of 64 and 65 rows",
                [(_batch(n, 10, seed=n, as_tensor=False), 1e-5) for n in (64, 65)])
    yield _case("eps as an int, a float and a scalar tensor",
                [(_batch(5, 3, seed=40), 1), (_batch(5, 3, seed=40), 1.5), (_batch(5, 3, seed=40), fl.constant(0.25))])
### END HIDDEN TESTS


def _values(out):
    value = out.numpy() if hasattr(out, "numpy") else out
    return np.asarray(value, dtype=np.float64)


def run(answer, case):
    calls = case.args[0]
    if not isinstance(answer, Function):
        return {"values": [_values(answer(x, eps)) for x, eps in calls],
                "new traces": f"none to count: {type(answer).__name__} is not an @fl.function"}
    before = Function.experimental_get_tracing_count(answer)
    values = [_values(answer(x, eps)) for x, eps in calls]
    traces = Function.experimental_get_tracing_count(answer) - before
    return {"values": values, "new traces": AT_MOST_ONE if traces <= 1 else str(traces)}
