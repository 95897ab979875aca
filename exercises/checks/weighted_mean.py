"""03 · Devices, exercise 2: slices of different sizes, combined by a size-weighted mean.

The answer is ``overall_mean(x, sizes)``: cut ``x`` into consecutive slices of the given sizes,
take each slice's mean on its own logical CPU, and combine the means into the mean of all of
``x``. The check compares it (as a float) with numpy's mean of the whole array."""
import numpy as np

from flowlab.grading import Case

POINTS = 1
HINTS = [
    "The mean of the slices' means treats a slice of 1 value like a slice of 90: weight each mean by its slice's size.",
    "overall = (size_1 * mean_1 + size_2 * mean_2 + ...) / (size_1 + size_2 + ...); fl.size(piece) gives a slice's size.",
]
TOLERANCE = {"rtol": 1e-5, "atol": 1e-6}


def _data(seed, n):
    return np.random.default_rng(seed).normal(3.0, 2.0, n).astype(np.float32)


def _mean(args):
    return float(np.mean(args[0].astype(np.float64)))


def cases():
    yield Case("two equal slices (50, 50)", args=(_data(0, 100), [50, 50]), expected=_mean)
    yield Case("two slices (10, 90)", args=(_data(1, 100), [10, 90]), expected=_mean)
    yield Case("three slices (5, 20, 75)", args=(_data(2, 100), [5, 20, 75]), expected=_mean)


### BEGIN HIDDEN TESTS
def hidden_cases():
    yield Case("four slices (1, 2, 3, 994)", args=(_data(3, 1000), [1, 2, 3, 994]), expected=_mean)
    yield Case("one slice (7,)", args=(_data(4, 7), [7]), expected=_mean)
    yield Case("slices (600, 1)", args=(np.concatenate([np.zeros(600, np.float32), [601.0]]).astype(np.float32),
                                      [600, 1]), expected=_mean)
### END HIDDEN TESTS


def run(answer, case):
    return float(np.asarray(answer(*case.args, **case.kwargs), dtype=np.float64))
