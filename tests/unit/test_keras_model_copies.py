"""What a parameter-server fit ships to its workers: a fitted model pickles (its traced steps stay
behind), op functions pickle by reference, and a metric's accumulators are never handed to a
strategy's variable creator (they stay in the process that updates them)."""
import pickle

import numpy as np

import flowlab as fl
from flowlab.cluster.protocol import dumps, loads
from flowlab.core.tensor import variable_creator_scope


def _fitted():
    model = fl.keras.Sequential([fl.keras.Input(shape=(5,)), fl.keras.layers.Dense(3, activation="relu"),
                                 fl.keras.layers.Dense(1, activation="sigmoid")])
    model.compile(optimizer=fl.optimizers.Adam(0.01), loss="mse", metrics=["mae"])
    x = np.linspace(-1, 1, 40, dtype=np.float32).reshape(8, 5)
    model.fit(x, x[:, :1], epochs=2, verbose=0)
    return model, x


def test_every_op_function_pickles_by_reference():
    ops = [getattr(fl.core.ops, n) for n in dir(fl.core.ops) if not n.startswith("_")]
    ops = [f for f in ops if callable(f) and getattr(f, "__module__", "").startswith("flowlab.core.ops")]
    assert len(ops) > 50
    for f in ops:
        assert pickle.loads(pickle.dumps(f)) is f, f.__name__


def test_a_fitted_model_travels_and_its_copy_predicts_and_trains():
    model, x = _fitted()
    assert model._functions                                  # traced steps made by fit ...
    copy = loads(dumps(model))
    assert copy._functions == {}                             # ... stay behind
    np.testing.assert_array_equal(copy.predict(x, verbose=0), model.predict(x, verbose=0))
    copy.fit(x, x[:, :1], epochs=1, verbose=0)
    assert not np.array_equal(copy.trainable_variables[0].numpy(), model.trainable_variables[0].numpy())


def test_metric_variables_are_not_shown_to_a_variable_creator():
    seen = []
    with variable_creator_scope(lambda v: seen.append(v.name)):
        model = fl.keras.Sequential([fl.keras.Input(shape=(2,)), fl.keras.layers.Dense(1)])
        model.compile(optimizer=fl.optimizers.SGD(0.1), loss="mse", metrics=["mae"])
        model.fit(np.ones((4, 2), np.float32), np.ones((4, 1), np.float32), verbose=0)
    names = [m.name for m in model.metrics]
    assert names and not any(n.startswith(tuple(names)) for n in seen), seen
    assert any("kernel" in n for n in seen)
