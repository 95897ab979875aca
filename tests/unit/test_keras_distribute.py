"""Model.fit and evaluate under the strategies of one process: the same weights and logs as one
replica with the same global batch."""
import numpy as np
import pytest

import flowlab as fl
from flowlab import distribute as ds
from _distribute_helpers import keras_regressor, keras_regressor_for, regression_data


def _data(n=48):
    return regression_data(n)


def _build(weights=None):
    return keras_regressor(weights)


def _fit(strategy, weights, run_eagerly=False, batch_size=12, **kw):
    x, y = _data()
    model = keras_regressor_for(strategy, weights)
    model.run_eagerly = run_eagerly
    history = model.fit(x, y, batch_size=batch_size, epochs=3, verbose=0, **kw)
    result = model.evaluate(x, y, batch_size=16, verbose=0, return_dict=True)
    distributed = any(k[0] == "distributed" for k in model._functions)
    assert distributed == (strategy is not None)       # the strategy's path ran, not the one-replica plan
    return [v.numpy() for v in model.trainable_variables], history.history, result


def _initial():
    return [v.numpy() for v in _build().trainable_variables]


def _close(got, ref):
    weights, history, result = got
    for a, b in zip(ref[0], weights):
        np.testing.assert_allclose(b, a, rtol=2e-5, atol=2e-6)
    assert history.keys() == ref[1].keys()
    for k in history:
        np.testing.assert_allclose(history[k], ref[1][k], rtol=2e-5, atol=1e-6)
    for k in result:
        np.testing.assert_allclose(result[k], ref[2][k], rtol=2e-5, atol=1e-6)


@pytest.mark.parametrize("n", [2, 4])
def test_fit_mirrored_matches_one_replica(cpus, n):
    w = _initial()
    ref = _fit(None, w, shuffle=False)
    cpus(n)
    strategy = ds.MirroredStrategy()
    assert strategy.num_replicas_in_sync == n
    got = _fit(strategy, w, shuffle=False)
    _close(got, ref)
    assert got[1]["loss"][-1] < got[1]["loss"][0]


@pytest.mark.parametrize("n", [2, 4])
def test_fit_central_storage_matches_one_replica(cpus, n):
    w = _initial()
    ref = _fit(None, w, shuffle=False)
    cpus(n)
    _close(_fit(ds.CentralStorageStrategy(), w, shuffle=False), ref)


def test_fit_mirrored_shuffled_eager_and_validation(cpus):
    """Shuffling draws the same order as one replica (fit's seed is fixed by the global seed);
    run_eagerly and validation_data work too."""
    w = _initial()
    x, y = _data()
    fl.random.set_seed(7)
    ref = _fit(None, w, validation_data=(x[:20], y[:20]))
    cpus(3)
    fl.random.set_seed(7)
    _close(_fit(ds.MirroredStrategy(), w, run_eagerly=True, validation_data=(x[:20], y[:20])), ref)


def test_fit_without_a_strategy_records_none(cpus):
    model = _build()
    assert model.distribute_strategy is None
    cpus(2)
    s = ds.MirroredStrategy()
    with s.scope():
        model = _build()
    assert model.distribute_strategy is s


def test_fit_uneven_split_matches_one_replica(cpus):
    """Batches of 10 (the last one 8) over 3 replicas: parts of unequal size still give the
    gradient of the global batch's mean loss."""
    w = _initial()
    ref = _fit(None, w, shuffle=False, batch_size=10)
    cpus(3)
    _close(_fit(ds.MirroredStrategy(), w, shuffle=False, batch_size=10), ref)


def test_fit_with_a_custom_train_step_says_what_to_do(cpus):
    class Custom(fl.keras.Sequential):
        def train_step(self, data):
            return super().train_step(data)

    cpus(2)
    with ds.MirroredStrategy().scope():
        model = Custom([fl.keras.Input(shape=(5,)), fl.keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
    x, y = _data()
    with pytest.raises(NotImplementedError, match="custom loop"):
        model.fit(x, y, batch_size=12, epochs=1, verbose=0)
