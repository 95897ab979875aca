"""flowlab.horovod with Model.fit across real LocalCluster workers: DistributedOptimizer plus
BroadcastGlobalVariablesCallback keep every rank's model identical and equal to one process
training on the whole batch."""
import numpy as np
import pytest

import flowlab as fl

pytestmark = pytest.mark.process


def _data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(48, 4)).astype(np.float32)
    return x, (x @ rng.normal(size=(4, 1))).astype(np.float32)


def _model(seed, optimizer):
    import flowlab as fl
    fl.random.set_seed(seed)
    model = fl.keras.Sequential([fl.keras.layers.Dense(6, activation="relu"), fl.keras.layers.Dense(1)])
    model.compile(optimizer=optimizer, loss="mse", run_eagerly=True)
    model.build((None, 4)) if hasattr(model, "build") else model(np.zeros((1, 4), np.float32))
    return model


def fit_on_rank():
    import flowlab as fl
    import flowlab.horovod as hvd
    hvd.init()
    x, y = _data()
    model = _model(100 + hvd.rank(), hvd.DistributedOptimizer(fl.optimizers.SGD(0.05)))   # different starts
    shard = slice(hvd.rank(), None, hvd.size())                                           # 24 rows each
    model.fit(x[shard], y[shard], batch_size=24 // hvd.size(), epochs=3, shuffle=False, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    return [w.numpy() for w in model.weights]


def test_fit_with_distributed_optimizer_matches_one_process():
    x, y = _data()
    ref = _model(100, fl.optimizers.SGD(0.05))
    # step k of rank r takes the rows 24k + r, 24k + r + 2, ...: together, rows 24k .. 24k + 23,
    # which is step k of one process with batches of 24; the mean of the two ranks' mean gradients
    # is the mean gradient over those 24 rows
    ref.fit(x, y, batch_size=24, epochs=3, shuffle=False, verbose=0)
    with fl.cluster.LocalCluster(workers=2) as cluster:
        results = cluster.run(fit_on_rank, timeout=180)
    for weights in results:
        for a, b in zip(ref.weights, weights):
            np.testing.assert_allclose(b, a.numpy(), rtol=1e-4, atol=1e-6)
