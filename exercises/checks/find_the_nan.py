"""04 · Find the NaN: a stable softmax cross-entropy.

The answer is ``cross_entropy(logits, labels)``: ``logits`` a float32 [batch, classes] array,
``labels`` one-hot of the same shape; it returns the loss of each example, a [batch] tensor, equal
to ``-sum(labels * log(softmax(logits)), axis=1)`` and finite for logits of any size. The check
turns the result into a float64 numpy array and compares it with numpy's reference, computed in
float64 with the log-sum-exp trick."""
import numpy as np

from flowlab.grading import Case

POINTS = 2
HINTS = [
    "Turn on fl.debugging.enable_check_numerics() and call your function on the logits of the failing case: "
    "which op makes the first Inf?",
    "softmax does not change when you subtract the same number from every logit of a row: subtract the row's "
    "maximum (fl.reduce_max(logits, axis=1, keepdims=True)) before fl.exp.",
    "Better still, never take the log of a probability: log(softmax(z)) = z - max - log(sum(exp(z - max))).",
]
TOLERANCE = {"rtol": 1e-5, "atol": 1e-5}


def _one_hot(labels, classes):
    return np.eye(classes, dtype=np.float32)[labels]


def _reference(args):
    logits, labels = (np.asarray(a, dtype=np.float64) for a in args)
    z = logits - logits.max(axis=1, keepdims=True)
    log_softmax = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    return [float(v) for v in -(labels * log_softmax).sum(axis=1)]


def _case(name, logits, labels):
    logits = np.asarray(logits, dtype=np.float32)
    return Case(name, args=(logits, _one_hot(labels, logits.shape[1])), expected=_reference)


def cases():
    yield _case("small logits", [[1.0, 2.0, 3.0], [0.5, -0.5, 0.0]], [2, 0])
    yield _case("large logits (the ones that made the NaN)", [[1000.0, 0.0, -1000.0], [50.0, 120.0, 80.0]], [0, 1])
    yield _case("very negative logits", [[-1000.0, -1001.0, -1002.0]], [2])


### BEGIN HIDDEN TESTS
def hidden_cases():
    rng = np.random.default_rng(16)
    yield _case("random batch of 8, 5 classes", rng.normal(0.0, 3.0, (8, 5)), rng.integers(0, 5, 8))
    yield _case("huge spread", [[3e4, -3e4], [-3e4, 3e4]], [1, 1])
    yield _case("all logits equal", [[88.0, 88.0, 88.0, 88.0]], [3])
### END HIDDEN TESTS


def run(answer, case):
    return [float(v) for v in np.asarray(answer(*case.args, **case.kwargs), dtype=np.float64).reshape(-1)]
