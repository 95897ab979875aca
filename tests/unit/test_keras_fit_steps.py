"""Model.fit(steps_per_epoch=...), validation_steps, evaluate(steps=...) and predict(steps=...):
how many batches each loop reads, that an epoch goes on where the last one stopped in a repeating
dataset (as Keras reads it), that data which runs out ends the loop with a warning, and the errors
bad step counts get. Plain SGD on a linear model: the weights after a fit depend only on the
sequence of batches it trained on, so comparing weights compares the batches read."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import flowlab as fl

RNG = np.random.default_rng(3)
X = RNG.normal(size=(10, 3)).astype(np.float32)
Y = (X @ np.array([[1.0], [-2.0], [0.5]], np.float32) + 0.3).astype(np.float32)


def linear(seed=0):
    fl.random.set_seed(seed)
    model = fl.keras.Sequential([fl.keras.Input(shape=(3,)), fl.keras.layers.Dense(1)])
    model.compile(optimizer=fl.optimizers.SGD(0.05), loss="mse")
    return model


def batches(n_rows=10, batch=2):
    """A dataset of n_rows / batch batches of (x, y), in order."""
    return fl.data.Dataset.from_tensor_slices((X[:n_rows], Y[:n_rows])).batch(batch)


def weights(model):
    return [w.numpy() for w in model.weights]


def trained_on(order, batch=2):
    """A linear model after one epoch over the rows ``order`` (in that order, unshuffled)."""
    model = linear()
    model.fit(X[order], Y[order], batch_size=batch, epochs=1, shuffle=False, verbose=0)
    return weights(model)


class Seen(fl.keras.callbacks.Callback):
    """Records params["steps"] and how many train batches each epoch ran."""

    def __init__(self):
        super().__init__()
        self.per_epoch, self.steps = [], []

    def on_epoch_begin(self, epoch, logs=None):
        self.per_epoch.append(0)
        self.steps.append(self.params.get("steps"))

    def on_train_batch_end(self, batch, logs=None):
        self.per_epoch[-1] += 1


def no_warnings():
    ctx = warnings.catch_warnings()
    ctx.__enter__()
    warnings.simplefilter("error")
    return ctx


# -- fit(steps_per_epoch=) ---------------------------------------------------------------------------
def test_steps_per_epoch_goes_on_through_a_repeating_dataset_across_epochs():
    # 5 batches repeated; 2 epochs of 3: batches 0 1 2 | 3 4 0 (a fresh iterator each epoch would
    # train on 0 1 2 | 0 1 2 instead)
    model, seen = linear(), Seen()
    ctx = no_warnings()
    try:
        history = model.fit(batches().repeat(), steps_per_epoch=3, epochs=2, verbose=0, callbacks=[seen])
    finally:
        ctx.__exit__(None, None, None)
    assert seen.per_epoch == [3, 3] and seen.steps == [3, 3]
    assert len(history.history["loss"]) == 2
    continued = trained_on(list(range(10)) + [0, 1])
    restarted = trained_on(list(range(6)) * 2)
    for a, b, c in zip(weights(model), continued, restarted):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    assert not all(np.allclose(a, c) for a, c in zip(weights(model), restarted))


def test_steps_per_epoch_with_arrays_continues_into_the_next_pass():
    model, seen = linear(), Seen()
    model.fit(X, Y, batch_size=2, steps_per_epoch=3, epochs=2, shuffle=False, verbose=0, callbacks=[seen])
    assert seen.per_epoch == [3, 3]
    for a, b in zip(weights(model), trained_on(list(range(10)) + [0, 1])):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_data_of_exactly_steps_per_epoch_batches_is_read_anew_each_epoch():
    model, seen = linear(), Seen()
    ctx = no_warnings()
    try:
        model.fit(batches(6), steps_per_epoch=3, epochs=3, verbose=0, callbacks=[seen])
    finally:
        ctx.__exit__(None, None, None)
    assert seen.per_epoch == [3, 3, 3]
    for a, b in zip(weights(model), trained_on(list(range(6)) * 3)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_a_finite_dataset_that_runs_out_stops_fit_with_a_warning():
    model, seen = linear(), Seen()
    with pytest.warns(UserWarning, match=r"ran out after 5 batches \(in epoch 3 of 4, at step 1 of "
                                         r"steps_per_epoch=2; 8 batches wanted\).*repeat\(\)"):
        history = model.fit(batches(), steps_per_epoch=2, epochs=4, verbose=0, callbacks=[seen])
    assert seen.per_epoch == [2, 2, 1]
    assert len(history.history["loss"]) == 3          # the short epoch still ends (its logs, its callbacks)
    for a, b in zip(weights(model), trained_on(list(range(10)))):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_running_out_at_an_epoch_boundary_ends_fit_without_an_empty_epoch():
    model, seen = linear(), Seen()
    with pytest.warns(UserWarning, match="ran out after 4 batches"):
        history = model.fit(batches(8), steps_per_epoch=2, epochs=3, verbose=0, callbacks=[seen])
    assert seen.per_epoch == [2, 2, 0]
    assert len(history.history["loss"]) == 2


def test_a_dataset_that_repeats_forever_needs_steps_per_epoch():
    model = linear()
    with pytest.raises(fl.errors.InvalidArgumentError, match=r"fit: the dataset repeats forever.*steps_per_epoch="):
        model.fit(batches().repeat(), epochs=1, verbose=0)
    with pytest.raises(fl.errors.InvalidArgumentError, match=r"evaluate: the dataset repeats forever.*steps="):
        model.evaluate(batches().repeat(), verbose=0)
    with pytest.raises(fl.errors.InvalidArgumentError, match=r"predict: the dataset repeats forever.*steps="):
        model.predict(batches().map(lambda x, y: x).repeat())


@pytest.mark.parametrize("bad", [0, -1, 2.5, "3", True])
def test_bad_step_counts_are_refused(bad):
    model = linear()
    with pytest.raises(fl.errors.InvalidArgumentError, match="steps_per_epoch must be a whole number"):
        model.fit(X, Y, steps_per_epoch=bad, verbose=0)
    with pytest.raises(fl.errors.InvalidArgumentError, match="evaluate: steps must be a whole number"):
        model.evaluate(X, Y, steps=bad, verbose=0)


# -- evaluate / predict (steps=), validation_steps -----------------------------------------------------
def test_evaluate_steps_reads_that_many_batches():
    model = linear()
    first_two = model.evaluate(batches().take(2), verbose=0)
    assert model.evaluate(batches(), steps=2, verbose=0) == pytest.approx(first_two, rel=1e-6)
    assert model.evaluate(batches().repeat(), steps=2, verbose=0) == pytest.approx(first_two, rel=1e-6)
    assert model.evaluate(X, Y, batch_size=2, steps=2, verbose=0) == pytest.approx(first_two, rel=1e-6)
    assert model.evaluate(X, Y, batch_size=2, verbose=0) != pytest.approx(first_two, rel=1e-3)


def test_evaluate_with_more_steps_than_batches_warns_and_uses_them_all():
    model = linear()
    whole = model.evaluate(batches(), verbose=0)
    with pytest.warns(UserWarning, match=r"evaluate: the data ran out after 5 batches \(steps=7\)"):
        assert model.evaluate(batches(), steps=7, verbose=0) == pytest.approx(whole, rel=1e-6)


def test_predict_steps():
    model = linear()
    out = model.predict(batches().map(lambda x, y: x).repeat(), steps=3)
    assert out.shape == (6, 1)
    np.testing.assert_allclose(out, model.predict(X[:6]), rtol=1e-6)
    assert model.predict(X, batch_size=4, steps=2).shape == (8, 1)


def test_validation_steps_evaluates_that_many_validation_batches():
    model = linear()
    history = model.fit(X, Y, batch_size=5, epochs=1, shuffle=False, verbose=0,
                        validation_data=batches().repeat(), validation_steps=2)
    assert history.history["val_loss"][0] == pytest.approx(model.evaluate(batches().take(2), verbose=0), rel=1e-6)


def test_steps_per_epoch_under_a_mirrored_strategy_matches_one_replica(cpus):
    # the TF distributed-training tutorials' shape: fit(dataset.repeat(), epochs=..., steps_per_epoch=...)
    cpus(2)
    strategy = fl.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        model = linear()
    seen = Seen()
    model.fit(batches(batch=4).repeat(), steps_per_epoch=2, epochs=2, verbose=0, callbacks=[seen])
    assert seen.per_epoch == [2, 2]
    # batches of 4 rows: 0-3, 4-7, 8-9, then 0-3 again (the stream goes on)
    one = linear()
    one.fit(batches(batch=4).repeat().take(4), epochs=1, verbose=0)
    for a, b in zip(weights(model), weights(one)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
