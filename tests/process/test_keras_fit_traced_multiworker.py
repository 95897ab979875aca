"""Model.fit and evaluate under MultiWorkerMirroredStrategy on 2 real LocalCluster workers with
run_eagerly=False: each step is one traced graph (the gradient all-reduce a node in it), every
worker ends with the same weights, the ones one process gets with the same global batch and the
ones the eager step (run_eagerly=True) gets; a last batch of one row leaves worker 0 without any
(it adds zero gradients to the all-reduce)."""
import numpy as np
import pytest

import flowlab as fl
from _distribute_helpers import keras_fitted_alone, keras_regressor, regression_data

pytestmark = pytest.mark.process
ROWS = 49          # batches of 12: 12, 12, 12, 12 and a last one of 1 row (worker 0's piece: 0 rows)


def _data():
    return regression_data(ROWS)


def _model():
    return keras_regressor()


def train_fit(run_eagerly):
    """fit then evaluate under MultiWorkerMirroredStrategy, from worker 0's random weights."""
    import flowlab as fl
    from flowlab import distribute as ds
    from flowlab.distribute.keras_fit import TracedStep
    strategy = ds.MultiWorkerMirroredStrategy()
    fl.random.set_seed(100 + strategy.worker_index)
    with strategy.scope():
        model = _model()
    model.run_eagerly = run_eagerly
    initial = [v.numpy() for v in model.trainable_variables]
    x, y = _data()
    history = model.fit(x, y, batch_size=12, epochs=3, verbose=0, shuffle=False)
    result = model.evaluate(x, y, batch_size=16, verbose=0, return_dict=True)
    steps = {k[1]: v for k, v in model._functions.items() if k[0] == "distributed"}
    traces = {kind: s.trace_count for kind, s in steps.items() if isinstance(s, TracedStep)}
    return (strategy.num_replicas_in_sync, initial, [v.numpy() for v in model.trainable_variables],
            history.history, result, traces)


def _reference(initial):
    return keras_fitted_alone(initial, *_data())


def test_traced_fit_two_workers_matches_one_process_and_the_eager_step():
    with fl.cluster.LocalCluster(workers=2) as cluster:
        traced = cluster.run(train_fit, False, timeout=180)
        eager = cluster.run(train_fit, True, timeout=180)
    (n0, init0, w0, h0, r0, t0), (n1, init1, w1, h1, r1, t1) = traced
    assert n0 == n1 == 2
    # the traced path ran on both workers: a train trace for batches of 12 and one for the last
    # row; a test trace for 16 and one for the last row
    assert t0 == t1 == {"train": 2, "test": 2}
    for a, b in zip(init0, init1):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(w0, w1):
        np.testing.assert_array_equal(a, b)          # identical weights on both workers
    assert h0 == h1 and r0 == r1                     # the same reduced logs
    assert h0["loss"][-1] < h0["loss"][0]
    ref_w, ref_h, _ = _reference(init0)
    for a, b in zip(ref_w, w0):
        np.testing.assert_allclose(b, a, rtol=2e-5, atol=2e-6)
    # (the logs are each worker's mean, averaged over the workers: with 24 and 25 rows they are not
    # quite one process's mean over 49, so the logs are compared with the eager step's instead)
    (_, e_init, e_w, e_h, e_r, e_t), (_, _, e_w1, _, _, _) = eager
    assert e_t == {}                                   # run_eagerly=True: the eager step, no trace
    for a, b in zip(init0, e_init):
        np.testing.assert_array_equal(a, b)            # the same seeds: the same start
    for a, b, c in zip(w0, e_w, e_w1):
        np.testing.assert_allclose(b, a, rtol=2e-5, atol=2e-6)
        np.testing.assert_array_equal(b, c)
    assert h0.keys() == e_h.keys() and r0.keys() == e_r.keys()
    for k in h0:
        np.testing.assert_allclose(h0[k], e_h[k], rtol=2e-5, atol=1e-6)
    for k in r0:
        np.testing.assert_allclose(r0[k], e_r[k], rtol=2e-5, atol=1e-6)
