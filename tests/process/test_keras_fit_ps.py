"""Model.fit under ParameterServerStrategy on a real LocalCluster: every step runs on a worker
(pull, forward, gradients, push to the ps tasks), asynchronously; after each epoch this process's
model has the ps tasks' weights. One worker is plain sequential training; two train together."""
import numpy as np
import pytest

import flowlab as fl
from flowlab import distribute as ds
from _distribute_helpers import keras_regressor, regression_data

pytestmark = pytest.mark.process


def _data(n=48):
    return regression_data(n)


def _model():
    return keras_regressor()


def test_fit_with_one_worker_is_sequential_training_and_never_stale():
    x, y = _data()
    fl.random.set_seed(4)
    with fl.cluster.LocalCluster(workers=1, ps=2) as cluster:
        strategy = ds.ParameterServerStrategy(cluster)
        with strategy.scope():
            model = _model()
        start = [v.numpy() for v in model.trainable_variables]
        history = model.fit(x, y, batch_size=8, epochs=3, shuffle=False, verbose=0)
        on_ps = {strategy.placement(v) for v in model.trainable_variables}
        stale = strategy.staleness()
        steps = int(model.optimizer.iterations.numpy())       # pulled from its ps task after the last epoch
        trained = [v.numpy() for v in model.trainable_variables]
        strategy.pull()
        assert all(np.array_equal(a, v.numpy()) for a, v in zip(trained, model.trainable_variables))
        evaluated = model.evaluate(x, y, batch_size=16, verbose=0, return_dict=True)
    alone = _model()
    for v, w in zip(alone.trainable_variables, start):
        v.assign(w)
    reference = alone.fit(x, y, batch_size=8, epochs=3, shuffle=False, verbose=0)
    assert on_ps == {"/job:ps/task:0", "/job:ps/task:1"}
    assert steps == 3 * 6 and stale == [0] * (3 * 6 * 4)         # 18 steps, 4 variables each
    for a, b in zip(trained, alone.trainable_variables):
        np.testing.assert_allclose(a, b.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(history.history["loss"], reference.history["loss"], rtol=1e-5)
    np.testing.assert_allclose(history.history["mae"], reference.history["mae"], rtol=1e-5)
    np.testing.assert_allclose(evaluated["loss"], alone.evaluate(x, y, batch_size=16, verbose=0, return_dict=True)["loss"],
                               rtol=1e-5)


def test_fit_with_two_workers_trains_asynchronously():
    x, y = _data(96)
    fl.random.set_seed(5)
    with fl.cluster.LocalCluster(workers=2, ps=1) as cluster:
        strategy = ds.ParameterServerStrategy(cluster)
        with strategy.scope():
            model = _model()
        history = model.fit(x, y, batch_size=8, epochs=4, verbose=0, validation_data=(x[:16], y[:16]))
        steps = int(model.optimizer.iterations.numpy())
        stale = strategy.staleness()
        one = model.train_on_batch(x[:8], y[:8])
        after_one = int(model.optimizer.iterations.numpy())
    losses = history.history["loss"]
    assert steps == 4 * 12 and after_one == steps + 1
    assert losses[-1] < losses[0] / 3, losses                       # it trained
    assert set(history.history) == {"loss", "mae", "val_loss", "val_mae"}
    assert len(stale) == 4 * 12 * 4 and min(stale) >= 0             # every push recorded how stale it was
    assert np.all(np.isfinite(one)) and len(one) == 2             # loss and mae
