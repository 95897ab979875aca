"""11 · Parameter servers: spread the variables over the ps tasks by their bytes, not their count.

The answer is ``place_variables(sizes, num_ps)``: ``sizes`` lists the variables' sizes in bytes, in
the order the model creates them; it returns one ps task index (a whole number, 0 .. num_ps - 1)
per variable, in that same order. The lesson's strategy deals the variables out in turn (round
robin), which can pile every large kernel on one task and every small bias on another.

The check reads two things of the placement the answer returns:

- that it is one: a list with one whole number in 0 .. num_ps - 1 for every variable;
- the bytes on the busiest ps task. Greedy placement (each variable, in the order given, on the
  task that holds the fewest bytes so far) never puts more than
  ``(total + (num_ps - 1) * largest) // num_ps`` bytes on one task (when the busiest task got its
  last variable, of size s, it held the least, so at most (total - s) / num_ps). Round robin goes
  over that bound in the visible cases. Sorting the variables by size first (largest first) also
  stays within it, so either greedy passes.
"""
import numpy as np

from flowlab.grading import Case

POINTS = 2
HINTS = [
    "Count bytes, not variables: keep a running total of the bytes each ps task holds, and put each "
    "variable on the task that holds the fewest bytes so far.",
    "loads = [0] * num_ps; for each size in order: ps = loads.index(min(loads)); record ps for this "
    "variable; loads[ps] += size. Return the recorded indices, one per variable, in the order of sizes.",
]
TOLERANCE = {"rtol": 0.0, "atol": 0.0}


def _bound(sizes, num_ps):
    """The most bytes greedy placement can put on one task: (total + (m - 1) * largest) // m."""
    if not sizes:
        return 0
    return (sum(sizes) + (num_ps - 1) * max(sizes)) // num_ps


def _expected(args):
    sizes, num_ps = args
    return {"placement": f"one ps task in 0..{num_ps - 1} for each of the {len(sizes)} variables",
            "bytes on the busiest ps task": f"at most {_bound(sizes, num_ps)}"}


def _case(name, sizes, num_ps):
    return Case(name, args=(list(sizes), num_ps), expected=_expected)


def _dense_stack(layers):
    """The bytes of a Dense stack's variables (float32), kernel then bias, layer by layer."""
    out = []
    for fan_in, fan_out in zip(layers, layers[1:]):
        out += [4 * fan_in * fan_out, 4 * fan_out]
    return out


def cases():
    yield _case("Dense 64-32-32-10, 2 ps tasks", _dense_stack([64, 32, 32, 10]), 2)
    yield _case("4 kernels and 4 biases of one size, 2 ps tasks", [4096, 64] * 4, 2)
    yield _case("an embedding and a Dense stack, 3 ps tasks",
                [64000] + _dense_stack([16, 64, 64, 64, 5]), 3)


### BEGIN HIDDEN TESTS
def hidden_cases():
    yield _case("1 ps task", [800, 8, 400, 4], 1)
    yield _case("more ps tasks than variables", [1000, 12, 200], 5)
    yield _case("no variables", [], 2)
    yield _case("small ones first, then large ones, 3 ps tasks", [40] * 6 + [9000, 9000, 9000, 3000], 3)
### END HIDDEN TESTS


def _is_index(x):
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def run(answer, case):
    sizes, num_ps = case.args
    got = answer(list(sizes), num_ps)
    try:
        placement = list(got)
    except TypeError:
        placement = None
    if placement is None:
        problem = f"returned {type(got).__name__}, not a list of ps task indices"
    elif len(placement) != len(sizes):
        problem = f"{len(placement)} indices for {len(sizes)} variables"
    else:
        bad = next(((i, p) for i, p in enumerate(placement) if not _is_index(p) or not 0 <= p < num_ps), None)
        problem = None if bad is None else (f"variable {bad[0]} on {bad[1]!r}, not a ps task index "
                                            f"in 0..{num_ps - 1}")
    if problem:
        return {"placement": problem, "bytes on the busiest ps task": "unknown: the placement is not valid"}
    loads = [0] * num_ps
    for size, ps in zip(sizes, placement):
        loads[int(ps)] += size
    bound = _bound(sizes, num_ps)
    busiest = max(loads)
    return {"placement": f"one ps task in 0..{num_ps - 1} for each of the {len(sizes)} variables",
            "bytes on the busiest ps task": (f"at most {bound}" if busiest <= bound else
                                             f"{busiest} on ps task {loads.index(busiest)} (bytes per task: {loads})")}
