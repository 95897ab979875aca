"""Model.compile / fit / evaluate / predict / summary: real training on the digits data, the traced
step against eager execution, datasets, and the errors bad input gets."""
from __future__ import annotations

import numpy as np
import pytest

import flowlab as fl

L = fl.keras.layers
(X_TRAIN, Y_TRAIN), (X_TEST, Y_TEST) = fl.datasets.digits()


def mlp(hidden=64, seed=0):
    fl.random.set_seed(seed)
    return fl.keras.Sequential([fl.keras.Input(shape=(64,)), L.Dense(hidden, activation="relu"), L.Dense(10)])


def compiled(model, lr=0.01, metrics=("accuracy",), **kwargs):
    model.compile(optimizer=fl.optimizers.Adam(lr), loss=fl.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=list(metrics), **kwargs)
    return model


# -- learning for real -----------------------------------------------------------------------------
def test_an_mlp_reaches_90_percent_test_accuracy_on_digits_in_a_few_epochs():
    # (the 360 test digits come from other writers than the training ones: a plain MLP levels off
    # near 90%; batch normalization gets it to about 92% in 5 epochs, over several seeds)
    fl.random.set_seed(0)
    model = fl.keras.Sequential([fl.keras.Input(shape=(64,)), L.Dense(128), L.BatchNormalization(),
                                 L.Activation("relu"), L.Dense(10)])
    compiled(model, lr=0.003)
    history = model.fit(X_TRAIN, Y_TRAIN, epochs=5, batch_size=32, verbose=0)
    loss, accuracy = model.evaluate(X_TEST, Y_TEST, verbose=0)
    assert accuracy >= 0.90, (accuracy, history.history)
    assert history.history["loss"][-1] < history.history["loss"][0] / 3
    assert len(history.history["loss"]) == 5 and history.epoch == list(range(5))


def test_a_small_cnn_learns_digits():
    fl.random.set_seed(1)
    model = fl.keras.Sequential([L.Reshape((8, 8, 1), input_shape=(64,)), L.Conv2D(8, 3, padding="same", activation="relu"),
                                 L.MaxPool2D(2), L.BatchNormalization(), L.Flatten(), L.Dropout(0.1), L.Dense(10)])
    compiled(model)
    model.fit(X_TRAIN, Y_TRAIN, epochs=3, batch_size=32, verbose=0)
    assert model.evaluate(X_TEST, Y_TEST, verbose=0)[1] >= 0.85


def test_evaluate_reports_the_loss_and_accuracy_of_predict():
    model = compiled(mlp())
    model.fit(X_TRAIN, Y_TRAIN, epochs=1, verbose=0)
    logits = model.predict(X_TEST, batch_size=50)
    assert logits.shape == (360, 10) and logits.dtype == np.float32
    z = logits.astype(np.float64)
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    logs = model.evaluate(X_TEST, Y_TEST, batch_size=64, verbose=0, return_dict=True)
    assert list(logs) == ["loss", "accuracy"]
    assert logs["loss"] == pytest.approx(-np.log(p[np.arange(360), Y_TEST]).mean(), rel=1e-5)
    assert logs["accuracy"] == pytest.approx(np.mean(logits.argmax(1) == Y_TEST))


# -- the traced step -------------------------------------------------------------------------------
def test_the_traced_step_trains_exactly_as_the_eager_one():
    weights = []
    for eager in (False, True):
        model = compiled(mlp(32), metrics=["accuracy"], run_eagerly=eager)
        history = model.fit(X_TRAIN[:300], Y_TRAIN[:300], epochs=2, batch_size=64, verbose=0)
        weights.append((model.get_weights(), history.history))
    (graph_w, graph_h), (eager_w, eager_h) = weights
    for a, b in zip(graph_w, eager_w):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    for name in graph_h:
        np.testing.assert_allclose(graph_h[name], eager_h[name], rtol=1e-5)


class Counting(fl.keras.Model):
    """Counts how often its Python call runs: once per trace when fit runs a graph."""

    def __init__(self):
        super().__init__()
        self.calls = 0
        self.hidden = L.Dense(16, activation="relu")
        self.out = L.Dense(10)

    def call(self, x, training=False):
        self.calls += 1
        return self.out(self.hidden(x))


def test_fit_traces_its_step_once_for_every_batch_size_and_every_fit():
    model = compiled(Counting())
    model.fit(X_TRAIN[:100], Y_TRAIN[:100], batch_size=32, epochs=3, verbose=0)   # last batch has 4 examples
    after_first = model.calls
    model.fit(X_TRAIN[:100], Y_TRAIN[:100], batch_size=32, epochs=2, verbose=0)
    assert model.calls == after_first <= 2      # a build call at most, and one trace


def test_run_eagerly_runs_python_on_every_step():
    model = compiled(Counting(), run_eagerly=True)
    model.fit(X_TRAIN[:96], Y_TRAIN[:96], batch_size=32, epochs=2, verbose=0)
    assert model.calls >= 6


def test_a_custom_train_step_is_used_and_may_log_extra_values():
    class Halved(fl.keras.Sequential):
        def train_step(self, data):
            x, y = data
            with fl.GradientTape() as tape:
                pred = self(x, training=True)
                loss = self.compute_loss(x, y, pred)
            grads = tape.gradient(loss, self.trainable_variables)
            self.optimizer.apply_gradients(zip([g * 0.5 for g in grads], self.trainable_variables))
            return {"grad_norm": fl.sqrt(fl.add_n([fl.reduce_sum(g * g) for g in grads]))}

    fl.random.set_seed(0)
    model = Halved([fl.keras.Input(shape=(64,)), L.Dense(10)])
    compiled(model, metrics=[])
    history = model.fit(X_TRAIN[:64], Y_TRAIN[:64], batch_size=32, epochs=2, verbose=0)
    assert set(history.history) == {"loss", "grad_norm"} and history.history["grad_norm"][0] > 0


# -- data ------------------------------------------------------------------------------------------
def test_fit_takes_a_dataset_and_iterates_it_once_per_epoch():
    seen = []

    def count(x, y):
        seen.append(1)
        return x, y

    ds = fl.data.Dataset.from_tensor_slices((X_TRAIN[:200], Y_TRAIN[:200])).map(count).batch(50)
    model = compiled(mlp())
    history = model.fit(ds, epochs=3, verbose=0, validation_data=fl.data.Dataset.from_tensor_slices(
        (X_TEST, Y_TEST)).batch(100))
    assert len(seen) == 600
    assert set(history.history) == {"loss", "accuracy", "val_loss", "val_accuracy"}


def test_validation_split_holds_out_the_last_examples():
    model = compiled(mlp())
    history = model.fit(X_TRAIN[:500], Y_TRAIN[:500], epochs=1, validation_split=0.2, verbose=0)
    model2 = model
    assert history.history["val_loss"][0] == pytest.approx(
        model2.evaluate(X_TRAIN[400:500], Y_TRAIN[400:500], verbose=0)[0], rel=1e-6)


def test_sample_weight_zero_examples_do_not_train():
    model = compiled(mlp(8))
    before = model.get_weights()
    model.fit(X_TRAIN[:64], Y_TRAIN[:64], sample_weight=np.zeros(64), epochs=1, verbose=0, shuffle=False)
    for a, b in zip(before, model.get_weights()):
        np.testing.assert_allclose(a, b, atol=1e-7)      # zero loss, zero gradient (Adam moves by 0)


def test_mean_squared_error_regression():
    x, y = fl.datasets.regression(256, noise=0.0, seed=1, features=3)
    fl.random.set_seed(0)
    model = fl.keras.Sequential([L.Dense(1, input_shape=(3,))])
    model.compile(fl.optimizers.SGD(0.1), "mse", metrics=["mae"])
    history = model.fit(x, y, epochs=30, batch_size=32, verbose=0)
    assert history.history["loss"][-1] < 1e-3 and "mae" in history.history


# -- errors ----------------------------------------------------------------------------------------
def test_fit_given_x_and_y_of_different_lengths():
    model = compiled(mlp())
    with pytest.raises(fl.errors.InvalidArgumentError) as info:
        model.fit(X_TRAIN, Y_TRAIN[:100], verbose=0)
    message = str(info.value)
    assert "x has 1437, y has 100" in message and "model.fit(X_TRAIN, Y_TRAIN[:100], verbose=0)" in message


def test_fit_before_compile_says_so():
    with pytest.raises(RuntimeError, match="must be compiled first"):
        mlp().fit(X_TRAIN, Y_TRAIN, verbose=0)


def test_a_loss_that_does_not_fit_the_model_output_names_both_shapes_and_the_fit_line():
    model = mlp()
    model.compile("sgd", fl.keras.losses.CategoricalCrossentropy(from_logits=True))
    with pytest.raises(fl.errors.InvalidArgumentError) as info:
        model.fit(X_TRAIN[:10], np.eye(5, dtype=np.float32)[Y_TRAIN[:10] % 5], verbose=0)
    message = str(info.value)
    assert "categorical_crossentropy" in message and "float32[?,5]" in message and "float32[?,10]" in message
    assert "model.fit(X_TRAIN[:10]" in message


def test_input_features_that_do_not_fit_the_first_layer():
    model = compiled(mlp())
    with pytest.raises(fl.errors.InvalidArgumentError, match="built for inputs of 64 features"):
        model.fit(X_TRAIN[:, :32], Y_TRAIN, verbose=0)


def test_batch_size_and_missing_targets_are_checked():
    model = compiled(mlp())
    with pytest.raises(fl.errors.InvalidArgumentError, match="batch_size must be a whole number"):
        model.fit(X_TRAIN, Y_TRAIN, batch_size=0, verbose=0)
    with pytest.raises(fl.errors.InvalidArgumentError, match="no targets"):
        model.fit(X_TRAIN, verbose=0)
    with pytest.raises(fl.errors.InvalidArgumentError, match="y must not be given"):
        model.fit(fl.data.Dataset.from_tensor_slices((X_TRAIN, Y_TRAIN)).batch(8), Y_TRAIN, verbose=0)


def test_the_functional_api_is_refused_with_a_clear_message():
    with pytest.raises(NotImplementedError, match="functional API"):
        fl.keras.Model(inputs=None, outputs=None)


# -- summary, weights ------------------------------------------------------------------------------
def test_summary_lists_layers_shapes_and_parameter_counts():
    fl.random.set_seed(0)
    model = fl.keras.Sequential([L.Dense(32, activation="relu", input_shape=(64,), name="hidden"),
                                 L.Dense(10, name="logits")], name="digits_mlp")
    lines = []
    model.summary(print_fn=lines.append)
    text = "\n".join(lines)
    assert 'Model: "digits_mlp"' in text
    assert any(line.split() == ["hidden", "(Dense)", "(None,", "32)", "2,080"] for line in lines), text
    assert any(line.split() == ["logits", "(Dense)", "(None,", "10)", "330"] for line in lines), text
    assert "Total params: 2,410" in text and "Trainable params: 2,410" in text


def test_summary_of_a_model_without_an_input_shape_explains_how_to_build_it():
    with pytest.raises(ValueError, match="not built yet.*input_shape"):
        fl.keras.Sequential([L.Dense(3)]).summary()


def test_save_weights_and_load_weights(tmp_path):
    model = compiled(mlp())
    model.fit(X_TRAIN[:64], Y_TRAIN[:64], epochs=1, verbose=0)
    path = model.save_weights(tmp_path / "weights")
    other = mlp(seed=5)
    other.load_weights(path)
    np.testing.assert_array_equal(other.predict(X_TEST[:5]), model.predict(X_TEST[:5]))


def test_integer_inputs_are_cast_by_the_first_layer():
    counts = (X_TRAIN[:200] * 16).astype(np.int32)          # the digits' raw pixel counts 0..16
    fl.random.set_seed(0)
    model = fl.keras.Sequential([L.Dense(32, activation="relu"), L.Dense(10)])   # built from the data
    compiled(model)
    history = model.fit(counts, Y_TRAIN[:200], epochs=2, verbose=0)
    assert model.layers[0].kernel.dtype == fl.float32 and np.isfinite(history.history["loss"]).all()
    assert model.predict(counts[:3]).dtype == np.float32


def test_a_subclassed_model_with_its_own_build_and_weights():
    class Affine(fl.keras.Model):
        def build(self, input_shape):
            self.scale = self.add_weight("scale", (input_shape[-1],), initializer="ones")
            self.head = L.Dense(10)

        def call(self, x, training=False):
            return self.head(x * self.scale)

    model = compiled(Affine())
    model.fit(X_TRAIN[:64], Y_TRAIN[:64], epochs=2, verbose=0)
    assert [w.name for w in model.weights][0].endswith("/scale:0") and len(model.weights) == 3
    assert not np.array_equal(model.scale.numpy(), np.ones(64))      # trained too
