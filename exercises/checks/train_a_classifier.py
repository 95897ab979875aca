"""05 · Training: a classifier built with ``fl.keras`` layers, compiled, then trained with ``fit``.

The answer is ``build_model(n_features, n_classes)``: it returns a **compiled** ``fl.keras`` model
that takes float32 inputs ``[batch, n_features]`` and gives ``n_classes`` scores per example
(logits or probabilities: only the largest one counts). It must have at most 1,000 weights
(``model.count_params()``).

The check makes a seeded dataset whose classes no straight line separates (concentric rings, or
the four quadrants of XOR, sometimes among extra features that are pure noise), seeds flowlab
(``fl.random.set_seed``: the first weights and fit's shuffling), calls ``build_model``, trains it with
``model.fit(x, y, epochs=40, batch_size=32, verbose=0)`` on 400 examples and reads four plain
properties:

- whether the model is compiled (an optimizer and a loss);
- the shape of ``model.predict`` on the 200 held-out examples: ``[200, n_classes]``;
- the number of weights: "at most 1000" when it holds, the real count when not;
- the held-out accuracy (the share of examples whose largest score is the right class, computed
  here with numpy): "at least 0.9" when it holds, the real value when not.

A model without a hidden layer (or with one but no nonlinear activation) is linear and stays near
chance on these data (0.3-0.55); the reference (one ``Dense(32, relu)`` hidden layer, ``Adam(0.01)``)
gets 0.99-1.0. Training one case takes about 0.15 s on a quiet machine (``TIME_LIMIT`` is 30 s)."""
from dataclasses import dataclass

import numpy as np

from flowlab.grading import Case

POINTS = 2
HINTS = [
    "A straight line cannot separate rings or XOR quadrants: the model needs a hidden layer with a "
    "nonlinear activation, e.g. layers.Dense(32, activation='relu'), before the output layer.",
    "The last layer gives one score per class: layers.Dense(n_classes). With no softmax in the model, "
    "compile with fl.keras.losses.SparseCategoricalCrossentropy(from_logits=True); with activation='softmax' "
    "on the last layer, use from_logits=False.",
    "Return the model compiled: model.compile(optimizer=fl.optimizers.Adam(learning_rate=0.01), loss=...). "
    "Adam's default rate (0.001) is too slow for 40 epochs; keep count_params() at most 1000.",
]
TOLERANCE = {"rtol": 0.0, "atol": 0.0}
TIME_LIMIT = 30.0

N_TRAIN, N_TEST = 400, 200
EPOCHS, BATCH_SIZE = 40, 32
MAX_PARAMS = 1000
BAR = 0.9


def rings(n, classes, features, seed):
    """``n`` points on ``classes`` concentric rings (class k at radius k+0.3 to k+1), in the first two
    features; any further features are noise."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, n)
    radius = y + 0.3 + rng.uniform(0.0, 0.7, n)
    angle = rng.uniform(0.0, 2 * np.pi, n)
    x = rng.normal(0.0, 1.0, (n, features))
    x[:, 0], x[:, 1] = radius * np.cos(angle), radius * np.sin(angle)
    return x.astype(np.float32), y.astype(np.int32)


def xor(n, classes, features, seed):
    """XOR: class 1 where the first two features have the same sign (a gap of 0.15 around the axes);
    any further features are noise."""
    assert classes == 2
    rng = np.random.default_rng(seed)
    corner = rng.uniform(0.15, 1.0, (n, 2)) * rng.choice([-1.0, 1.0], (n, 2))
    x = rng.normal(0.0, 1.0, (n, features))
    x[:, :2] = corner
    return x.astype(np.float32), (corner[:, 0] * corner[:, 1] > 0).astype(np.int32)


@dataclass(frozen=True)
class FitCase(Case):
    """A case: ``args`` are what ``build_model`` gets; ``data`` and ``seed`` say what it trains on."""
    data: str = "rings"
    seed: int = 0


def _expected(args):
    n_features, n_classes = args
    return {"compiled": True,
            "output shape": [N_TEST, n_classes],
            "parameters": f"at most {MAX_PARAMS}",
            "held-out accuracy": f"at least {BAR}"}


def _case(name, data, n_features, n_classes, seed):
    return FitCase(name, args=(n_features, n_classes), expected=_expected, data=data, seed=seed)


def cases():
    yield _case("two rings", "rings", 2, 2, 0)
    yield _case("XOR: four quadrants, two classes", "xor", 2, 2, 1)
    yield _case("three rings", "rings", 2, 3, 2)


### BEGIN HIDDEN TESTS
def hidden_cases():
    yield _case("three rings among 3 noise features", "rings", 5, 3, 3)
    yield _case("XOR among 2 noise features", "xor", 4, 2, 4)
    yield _case("four rings and a noise feature", "rings", 3, 4, 5)
### END HIDDEN TESTS


def run(answer, case):
    import flowlab as fl

    n_features, n_classes = case.args
    make = {"rings": rings, "xor": xor}[case.data]
    x, y = make(N_TRAIN + N_TEST, n_classes, n_features, case.seed)
    fl.random.set_seed(case.seed)                  # the first weights and fit's shuffling
    model = answer(n_features, n_classes)
    if not isinstance(model, fl.keras.Model):
        raise TypeError(f"build_model({n_features}, {n_classes}) returned {type(model).__name__}, "
                        "not an fl.keras model")
    compiled = getattr(model, "optimizer", None) is not None and getattr(model, "loss", None) is not None
    shape = [int(d) for d in np.shape(model.predict(x[N_TRAIN:], verbose=0))]   # before training: any model
    params = int(model.count_params())                                     # built by now, also without an Input
    out = {"compiled": compiled,
           "output shape": shape,
           "parameters": f"at most {MAX_PARAMS}" if params <= MAX_PARAMS else str(params),
           "held-out accuracy": None}
    if not compiled:
        out["held-out accuracy"] = "not trained: the model is not compiled"
    elif shape != [N_TEST, n_classes]:
        out["held-out accuracy"] = f"not trained: the model gives scores of shape {shape}, not [{N_TEST}, {n_classes}]"
    elif params > MAX_PARAMS:
        out["held-out accuracy"] = f"not trained: {params} weights, more than {MAX_PARAMS}"
    else:
        model.fit(x[:N_TRAIN], y[:N_TRAIN], epochs=EPOCHS, batch_size=BATCH_SIZE, verbose=0)
        scores = np.asarray(model.predict(x[N_TRAIN:], verbose=0))
        accuracy = float(np.mean(scores.argmax(axis=1) == y[N_TRAIN:]))
        out["held-out accuracy"] = f"at least {BAR}" if accuracy >= BAR else f"{accuracy:.3f}"
    return out
