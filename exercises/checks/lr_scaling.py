"""10 · Data parallel: scale the learning rate with the number of workers.

The answer is ``scaled_lr(base_lr, workers, step, warmup_steps)``: the learning rate for ``step``
(0, 1, 2, ...) when ``workers`` workers each take a batch of the size ``base_lr`` was tuned for and
their gradients are averaged. After the warm-up it is ``base_lr * workers`` (the linear scaling
rule); during the first ``warmup_steps`` steps it climbs in a straight line from ``base_lr`` (step 0)
towards ``base_lr * workers``; with ``warmup_steps=0`` there is no warm-up. The check asks for a
whole schedule at once, as a list of floats."""
from flowlab.grading import Case

POINTS = 2
HINTS = [
    "With N workers, one averaged step sees N batches: the linear scaling rule makes that step N times larger.",
    "During warm-up, step s of W: base_lr * (1 + (workers - 1) * s / W); from step W on: base_lr * workers.",
]
TOLERANCE = {"rtol": 1e-9, "atol": 1e-12}


def _schedule(base_lr, workers, warmup_steps, steps):
    out = []
    for s in range(steps):
        if s < warmup_steps:
            out.append(base_lr * (1 + (workers - 1) * s / warmup_steps))
        else:
            out.append(base_lr * workers)
    return out


def _case(name, base_lr, workers, warmup_steps, steps):
    return Case(name, args=(base_lr, workers, warmup_steps, steps),
                expected=lambda args: _schedule(*args))


def cases():
    yield _case("1 worker, no warm-up", 0.1, 1, 0, 3)
    yield _case("4 workers, no warm-up", 0.1, 4, 0, 3)
    yield _case("4 workers, 4 warm-up steps", 0.1, 4, 4, 6)


### BEGIN HIDDEN TESTS
def hidden_cases():
    yield _case("8 workers, 5 warm-up steps", 0.05, 8, 5, 8)
    yield _case("1 worker, 3 warm-up steps", 0.2, 1, 3, 5)
    yield _case("2 workers, 1 warm-up step", 0.5, 2, 1, 3)
### END HIDDEN TESTS


def run(answer, case):
    base_lr, workers, warmup_steps, steps = case.args
    return [float(answer(base_lr, workers, step=s, warmup_steps=warmup_steps)) for s in range(steps)]
