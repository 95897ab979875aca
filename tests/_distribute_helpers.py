"""What the distribution tests share: a small regression problem, the two-layer model that learns
it, its loss, and the weights one process reaches on it (the answer every strategy must match).

Used by tests/unit/test_distribute*.py and tests/process/test_distribute*multiworker.py. It imports
as a top-level module because pytest (import mode "prepend") puts tests/, the folder of the
package-less tests/conftest.py, on sys.path. Worker functions in the process tests travel by
reference (their test module is importable), and a LocalCluster worker starts with its parent's
sys.path (flowlab/cluster/local.py), so the workers import this module the same way.
"""
import numpy as np

import flowlab as fl

GLOBAL_BATCH = 12


def regression_data(n=24, seed=0):
    """``n`` rows of 5 features and a linear target: float32 (x, y)."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 5)).astype(np.float32)
    y = (x @ rng.normal(size=(5, 1)) + 0.3).astype(np.float32)
    return x, y


def mlp_variables(seed=1):
    """[w1, b1, w2] of a 5-8-1 relu network (under ``strategy.scope()`` they are the strategy's)."""
    rng = np.random.default_rng(seed)
    return [fl.Variable(rng.normal(size=(5, 8)).astype(np.float32) * 0.5), fl.Variable(np.zeros(8, np.float32)),
            fl.Variable(rng.normal(size=(8, 1)).astype(np.float32) * 0.5)]


def make_optimizer(kind):
    """The optimizers the tests run with: "sgd" (with momentum) or "adam"."""
    return fl.optimizers.SGD(0.1, momentum=0.9) if kind == "sgd" else fl.optimizers.Adam(0.01)


def mlp_error(variables, xb, yb):
    """The network's prediction minus the target, per row."""
    w1, b1, w2 = variables
    return fl.matmul(fl.nn.relu(fl.matmul(xb, w1) + b1), w2) - yb


def mlp_loss(variables, xb, yb, scale=GLOBAL_BATCH):
    """The summed squared error over ``scale``: a replica's share of the global batch's mean."""
    err = mlp_error(variables, xb, yb)
    return fl.reduce_sum(err * err) / scale


def reference_weights(seed=1, epochs=3):
    """The weights after ``epochs`` of Adam on global batches in this process, with no strategy."""
    variables = mlp_variables(seed)
    opt = fl.optimizers.Adam(0.01)
    x, y = regression_data()
    for _ in range(epochs):
        for s in range(0, len(x), GLOBAL_BATCH):
            with fl.GradientTape() as tape:
                loss = mlp_loss(variables, x[s:s + GLOBAL_BATCH], y[s:s + GLOBAL_BATCH])
            opt.apply_gradients(zip(tape.gradient(loss, variables), variables))
    return [v.numpy() for v in variables]


def keras_regressor(weights=None, metrics=("mae",)):
    """The same 5-8-1 relu network as a compiled keras model (SGD with momentum, mse), with
    ``weights`` assigned when given."""
    model = fl.keras.Sequential([fl.keras.Input(shape=(5,)), fl.keras.layers.Dense(8, activation="relu"),
                                 fl.keras.layers.Dense(1)])
    for v, w in zip(model.trainable_variables, weights or []):
        v.assign(w)
    model.compile(optimizer=fl.optimizers.SGD(0.05, momentum=0.5), loss="mse", metrics=list(metrics))
    return model


def keras_regressor_for(strategy, weights=None, metrics=("mae",)):
    """:func:`keras_regressor` built inside ``strategy.scope()`` (as is, for ``strategy=None``)."""
    if strategy is None:
        return keras_regressor(weights, metrics)
    with strategy.scope():
        return keras_regressor(weights, metrics)


def keras_fitted_alone(weights, x, y):
    """The keras regressor from ``weights`` after 3 unshuffled epochs of ``fit`` in batches of 12 in
    this process (no strategy): its weights, history and evaluation (batches of 16)."""
    model = keras_regressor(weights)
    history = model.fit(x, y, batch_size=12, epochs=3, verbose=0, shuffle=False)
    result = model.evaluate(x, y, batch_size=16, verbose=0, return_dict=True)
    return [v.numpy() for v in model.trainable_variables], history.history, result
