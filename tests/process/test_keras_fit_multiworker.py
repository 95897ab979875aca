"""Model.fit under MultiWorkerMirroredStrategy on real LocalCluster worker processes: every worker
ends with the same weights, the ones one process gets with the same global batch."""
import numpy as np
import pytest

import flowlab as fl
from _distribute_helpers import keras_fitted_alone, keras_regressor, regression_data

pytestmark = pytest.mark.process


def _data():
    return regression_data(48)


def _model():
    return keras_regressor()


def train_fit(shuffle):
    """fit under MultiWorkerMirroredStrategy; each worker starts from its own random weights (the
    build in the strategy's scope broadcasts worker 0's) and its own fit seed (broadcast too)."""
    import flowlab as fl
    from flowlab import distribute as ds
    strategy = ds.MultiWorkerMirroredStrategy()
    fl.random.set_seed(100 + strategy.worker_index)
    with strategy.scope():
        model = _model()
    initial = [v.numpy() for v in model.trainable_variables]
    x, y = _data()
    history = model.fit(x, y, batch_size=12, epochs=3, verbose=0, shuffle=shuffle)
    result = model.evaluate(x, y, batch_size=16, verbose=0, return_dict=True)
    return (strategy.num_replicas_in_sync, initial, [v.numpy() for v in model.trainable_variables],
            history.history, result)


def _reference(initial):
    return keras_fitted_alone(initial, *_data())[:2]


@pytest.mark.parametrize("shuffle", [False, True])
def test_fit_multi_worker_mirrored_two_workers(shuffle):
    with fl.cluster.LocalCluster(workers=2) as cluster:
        results = cluster.run(train_fit, shuffle, timeout=180)
    (n0, init0, w0, h0, r0), (n1, init1, w1, h1, r1) = results
    assert n0 == n1 == 2
    for a, b in zip(init0, init1):
        np.testing.assert_array_equal(a, b)          # worker 0's initial weights everywhere
    for a, b in zip(w0, w1):
        np.testing.assert_array_equal(a, b)          # identical weights on both workers
    assert h0 == h1 and r0 == r1                     # the same reduced logs
    assert h0["loss"][-1] < h0["loss"][0]
    if not shuffle:
        ref_w, ref_h = _reference(init0)
        for a, b in zip(ref_w, w0):
            np.testing.assert_allclose(b, a, rtol=2e-5, atol=2e-6)
        np.testing.assert_allclose(h0["loss"], ref_h["loss"], rtol=2e-5, atol=1e-6)
