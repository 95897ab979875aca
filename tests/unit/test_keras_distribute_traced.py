"""Model.fit and evaluate under a strategy of one process with run_eagerly=False: each step is one
@fl.function around strategy.run (no replica threads), and it trains to the weights one replica
gets, and to the weights of the eager path (run_eagerly=True), with the same global batch."""
import numpy as np
import pytest

import flowlab as fl
from flowlab import distribute as ds
from _distribute_helpers import keras_regressor, keras_regressor_for, regression_data
from flowlab.distribute.keras_fit import TracedStep


def _data(n=48):
    return regression_data(n)


def _build(weights, metrics=("mae",)):
    return keras_regressor(weights, metrics)


def _initial():
    fl.random.set_seed(3)
    return [v.numpy() for v in _build([]).trainable_variables]


def _steps(model):
    """The distributed step objects fit/evaluate made, by kind."""
    return {k[1]: v for k, v in model._functions.items() if k[0] == "distributed"}


def _fit(strategy, weights, run_eagerly=False, batch_size=12, n=48, epochs=3, eval_batch=16, seed=None, **kw):
    x, y = _data(n)
    model = keras_regressor_for(strategy, weights)
    model.run_eagerly = run_eagerly
    if seed is not None:
        fl.random.set_seed(seed)
    history = model.fit(x, y, batch_size=batch_size, epochs=epochs, verbose=0, **kw)
    result = model.evaluate(x, y, batch_size=eval_batch, verbose=0, return_dict=True)
    return model, ([v.numpy() for v in model.trainable_variables], history.history, result)


def _close(got, ref, rtol=2e-5):
    weights, history, result = got
    for a, b in zip(ref[0], weights):
        np.testing.assert_allclose(b, a, rtol=rtol, atol=2e-6)
    assert history.keys() == ref[1].keys()
    for k in history:
        np.testing.assert_allclose(history[k], ref[1][k], rtol=rtol, atol=1e-6)
    assert result.keys() == ref[2].keys()
    for k in result:
        np.testing.assert_allclose(result[k], ref[2][k], rtol=rtol, atol=1e-6)


def _assert_traced(model, strategy, train_traces, test_traces):
    steps = _steps(model)
    assert isinstance(steps["train"], TracedStep)
    assert isinstance(steps["test"], TracedStep)
    assert steps["train"].trace_count == train_traces
    assert steps["test"].trace_count == test_traces
    assert getattr(strategy, "_pool", None) is None      # no replica thread ever ran: strategy.run was traced


@pytest.mark.parametrize("n", [2, 3, 4])
def test_traced_fit_matches_one_replica(cpus, n):
    """Batches of 10 over 48 rows (the last one 8), shuffled with the same seed: the same weights,
    history and evaluation as one replica; one trace per global batch shape, reused every epoch."""
    w = _initial()
    _, ref = _fit(None, w, batch_size=10, seed=7)
    cpus(n)
    strategy = ds.MirroredStrategy()
    assert strategy.num_replicas_in_sync == n
    model, got = _fit(strategy, w, batch_size=10, seed=7)
    _close(got, ref)
    _assert_traced(model, strategy, train_traces=2, test_traces=1)
    assert got[1]["loss"][-1] < got[1]["loss"][0]


@pytest.mark.parametrize("n", [2, 3, 4])
def test_traced_fit_matches_the_eager_path(cpus, n):
    """run_eagerly=True keeps the eager step (replica threads, eager apply_gradients) and ends
    with the same weights and logs as the traced step."""
    w = _initial()
    cpus(n)
    eager_strategy = ds.MirroredStrategy()
    eager_model, eager = _fit(eager_strategy, w, run_eagerly=True, shuffle=False)
    assert not any(isinstance(s, TracedStep) for s in _steps(eager_model).values())
    assert eager_strategy._pool is not None                 # the eager path runs the replicas on threads
    strategy = ds.MirroredStrategy()
    model, traced = _fit(strategy, w, shuffle=False)
    _close(traced, eager)
    _assert_traced(model, strategy, train_traces=1, test_traces=1)


def test_traced_fit_central_storage(cpus):
    w = _initial()
    _, ref = _fit(None, w, shuffle=False)
    cpus(3)
    strategy = ds.CentralStorageStrategy()
    model, got = _fit(strategy, w, shuffle=False)
    _close(got, ref)
    _assert_traced(model, strategy, train_traces=1, test_traces=1)


def test_pieces_of_size_zero(cpus):
    """A global batch of 2 over 4 replicas (two replicas get no rows) and a last batch of 3 (one
    gets none): those replicas add zero gradients, and nothing to the metrics."""
    w = _initial()
    _, ref = _fit(None, w, batch_size=2, n=20, epochs=2, eval_batch=3, shuffle=False)
    cpus(4)
    strategy = ds.MirroredStrategy()
    model, got = _fit(strategy, w, batch_size=2, n=20, epochs=2, eval_batch=3, shuffle=False)
    _close(got, ref)
    _, ref = _fit(None, w, batch_size=5, n=23, epochs=2, eval_batch=7, shuffle=False)
    strategy = ds.MirroredStrategy()
    model, got = _fit(strategy, w, batch_size=5, n=23, epochs=2, eval_batch=7, shuffle=False)
    _close(got, ref)
    _assert_traced(model, strategy, train_traces=2, test_traces=2)   # 5 and 3; 7 and 2


def test_traced_fit_with_sample_weights_and_validation(cpus):
    w = _initial()
    x, y = _data()
    sw = np.linspace(0.2, 2.0, len(x)).astype(np.float32)
    kw = dict(sample_weight=sw, validation_data=(x[:20], y[:20]), shuffle=False, batch_size=10)
    _, ref = _fit(None, w, **kw)
    cpus(3)
    strategy = ds.MirroredStrategy()
    model, got = _fit(strategy, w, **kw)
    _close(got, ref)
    assert "val_loss" in got[1] and "val_mae" in got[1]
    # the train step is traced for (x, y, sample_weight) batches of 10 and 8; the test step for the
    # validation batches (10) and evaluate's (16), one runner each
    assert _steps(model)["train"].trace_count == 2
    assert getattr(strategy, "_pool", None) is None


def test_each_replica_is_in_the_one_graph(cpus):
    """The trace holds every replica's forward pass (its own name scope and device), and fit's
    steps call that one graph: stepping the model again does not trace again."""
    w = _initial()
    cpus(2)
    strategy = ds.MirroredStrategy()
    model, _ = _fit(strategy, w, shuffle=False, epochs=1)
    step = _steps(model)["train"]
    (concrete, rows, call), = step._plans.values()
    assert call == concrete.unchecked_call          # the arrays fit the trace: no per-step checks
    assert rows == [slice(0, 6), slice(6, 12)]
    names = [node.name for node in concrete.graph.nodes]
    assert any(name.startswith("replica_0/") for name in names)
    assert any(name.startswith("replica_1/") for name in names)
    assert any(name.startswith("all_reduce/") for name in names)
    x, y = _data()
    model.fit(x, y, batch_size=12, epochs=2, verbose=0)
    assert step.trace_count == 1
    assert _steps(model)["train"] is step


def test_a_strategy_that_refuses_tracing_keeps_the_eager_step(cpus):
    """A strategy with _no_traced_run set (ParameterServerStrategy's kind) gets the eager step."""
    w = _initial()
    _, ref = _fit(None, w, shuffle=False)
    cpus(2)
    strategy = ds.MirroredStrategy()
    strategy._no_traced_run = "this strategy's steps are eager"
    model, got = _fit(strategy, w, shuffle=False)
    _close(got, ref)
    assert not any(isinstance(s, TracedStep) for s in _steps(model).values())
    assert strategy._pool is not None


def test_train_on_batch_is_traced(cpus):
    w = _initial()
    x, y = _data()
    ref_model = _build(w)
    ref = ref_model.train_on_batch(x[:12], y[:12])
    cpus(2)
    strategy = ds.MirroredStrategy()
    with strategy.scope():
        model = _build(w)
    got = model.train_on_batch(x[:12], y[:12])
    np.testing.assert_allclose(got, ref, rtol=2e-5)
    for a, b in zip(ref_model.trainable_variables, model.trainable_variables):
        np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=2e-5, atol=2e-6)
    assert isinstance(_steps(model)["train"], TracedStep)


def test_many_batch_shapes_warn_once_and_still_match(cpus):
    """train_on_batch with batches of 1..7 rows over 3 replicas: one trace per size, the same
    weights as one replica, and one warning naming what to do once there are more than 5 shapes."""
    w = _initial()
    x, y = _data()
    ref_model = _build(w)
    cpus(3)
    with ds.MirroredStrategy().scope():
        model = _build(w)
    sizes = [1, 2, 3, 4, 5, 6, 7, 3, 1]
    with pytest.warns(UserWarning, match="drop_remainder") as caught:
        at = 0
        for n in sizes:
            np.testing.assert_allclose(model.train_on_batch(x[at:at + n], y[at:at + n]),
                                       ref_model.train_on_batch(x[at:at + n], y[at:at + n]), rtol=2e-5, atol=1e-6)
            at += n
    assert sum("drop_remainder" in str(c.message) for c in caught) == 1
    assert _steps(model)["train"].trace_count == 7
    for a, b in zip(ref_model.trainable_variables, model.trainable_variables):
        np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=2e-5, atol=2e-6)
