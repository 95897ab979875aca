"""fl.keras.losses and fl.keras.metrics against numpy formulas, and their shape errors."""
from __future__ import annotations

import numpy as np
import pytest

import flowlab as fl

losses, metrics = fl.keras.losses, fl.keras.metrics
rng = np.random.default_rng(3)
LOGITS = rng.standard_normal((6, 4)).astype(np.float32)
LABELS = np.array([0, 3, 1, 1, 2, 0], np.int32)


def softmax(z):
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def reference_xent(labels, probs):
    return -np.log(probs[np.arange(len(labels)), labels])


def test_sparse_categorical_crossentropy_from_logits_and_from_probabilities():
    want = reference_xent(LABELS, softmax(LOGITS.astype(np.float64))).mean()
    got_logits = losses.SparseCategoricalCrossentropy(from_logits=True)(LABELS, LOGITS)
    got_probs = losses.SparseCategoricalCrossentropy()(LABELS, softmax(LOGITS))
    assert got_logits.shape == () and got_logits.dtype == fl.float32
    np.testing.assert_allclose(float(got_logits), want, rtol=1e-5)
    np.testing.assert_allclose(float(got_probs), want, rtol=1e-4)
    np.testing.assert_allclose(float(losses.get("sparse_categorical_crossentropy")(LABELS[:, None], softmax(LOGITS))),
                               want, rtol=1e-4)     # labels [batch, 1] are accepted, as in Keras


def test_categorical_crossentropy_with_one_hot_targets():
    onehot = np.eye(4, dtype=np.float32)[LABELS]
    want = reference_xent(LABELS, softmax(LOGITS.astype(np.float64))).mean()
    np.testing.assert_allclose(float(losses.CategoricalCrossentropy(from_logits=True)(onehot, LOGITS)), want, rtol=1e-5)
    np.testing.assert_allclose(float(losses.CategoricalCrossentropy()(onehot, softmax(LOGITS))), want, rtol=1e-4)


def test_mean_squared_error_fits_a_batch_vector_to_a_column():
    y = np.array([1.0, 2.0, 3.0], np.float32)
    pred = np.array([[1.5], [2.0], [2.0]], np.float32)
    np.testing.assert_allclose(float(losses.MeanSquaredError()(y, pred)), (0.25 + 0 + 1) / 3, rtol=1e-6)
    np.testing.assert_allclose(losses.mean_squared_error(y[:, None], pred).numpy(), [0.25, 0, 1], rtol=1e-6)


def test_binary_crossentropy_from_logits_equals_from_probabilities():
    z = rng.standard_normal((5, 1)).astype(np.float32)
    y = np.array([[0], [1], [1], [0], [1]], np.float32)
    p = 1 / (1 + np.exp(-z))
    want = -(y * np.log(p) + (1 - y) * np.log(1 - p)).mean()
    np.testing.assert_allclose(float(losses.BinaryCrossentropy(from_logits=True)(y, z)), want, rtol=1e-5)
    np.testing.assert_allclose(float(losses.BinaryCrossentropy()(y, p)), want, rtol=1e-4)


def test_sample_weight_and_reductions():
    w = np.array([1, 0, 2, 0, 0, 1], np.float32)
    per = reference_xent(LABELS, softmax(LOGITS.astype(np.float64)))
    loss = losses.SparseCategoricalCrossentropy(from_logits=True)
    np.testing.assert_allclose(float(loss(LABELS, LOGITS, sample_weight=w)), (per * w).mean(), rtol=1e-5)
    summed = losses.SparseCategoricalCrossentropy(from_logits=True, reduction="sum")
    np.testing.assert_allclose(float(summed(LABELS, LOGITS)), per.sum(), rtol=1e-5)
    each = losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")(LABELS, LOGITS)
    np.testing.assert_allclose(each.numpy(), per, rtol=1e-5)


def test_a_plain_function_is_a_loss():
    def l1(y_true, y_pred):
        return fl.reduce_mean(fl.abs(y_true - y_pred), axis=-1)

    loss = losses.get(l1)
    assert float(loss(np.zeros((2, 2), np.float32), np.ones((2, 2), np.float32))) == 1.0


def test_mismatched_shapes_name_the_loss_both_shapes_and_the_line():
    with pytest.raises(fl.errors.InvalidArgumentError) as info:
        losses.CategoricalCrossentropy()(np.zeros((4, 3), np.float32), np.zeros((4, 5), np.float32))
    message = str(info.value)
    assert message.startswith("categorical_crossentropy:")
    assert "y_true float32[4,3]" in message and "y_pred float32[4,5]" in message
    assert "test_keras_losses.py" in message


def test_integer_labels_given_to_categorical_crossentropy_point_to_the_sparse_loss():
    with pytest.raises(fl.errors.InvalidArgumentError, match="need sparse_categorical_crossentropy"):
        losses.CategoricalCrossentropy()(LABELS, softmax(LOGITS))
    with pytest.raises(fl.errors.InvalidArgumentError, match="need categorical_crossentropy"):
        losses.SparseCategoricalCrossentropy()(np.eye(4, dtype=np.float32)[LABELS], softmax(LOGITS))


def test_unknown_names_are_refused():
    with pytest.raises(ValueError, match="unknown loss 'hinge'"):
        losses.get("hinge")
    with pytest.raises(ValueError, match="unknown metric 'f1'"):
        metrics.get("f1")


# -- metrics --------------------------------------------------------------------------------------
def test_mean_accumulates_until_reset():
    m = metrics.Mean()
    m.update_state([1.0, 2.0, 3.0])
    m.update_state(10.0, sample_weight=3.0)
    assert float(m.result()) == pytest.approx((6 + 30) / 6)
    m.reset_state()
    assert float(m.result()) == 0.0


def test_sparse_categorical_accuracy_over_several_batches():
    m = metrics.SparseCategoricalAccuracy()
    guesses = LOGITS.argmax(axis=-1)
    m.update_state(LABELS[:3], LOGITS[:3])
    m.update_state(LABELS[3:], LOGITS[3:])
    assert float(m.result()) == pytest.approx(np.mean(guesses == LABELS))
    assert m.name == "sparse_categorical_accuracy"


def test_accuracy_picks_the_kind_that_fits_the_loss():
    assert isinstance(metrics.get("accuracy", losses.get("sparse_categorical_crossentropy")),
                      metrics.SparseCategoricalAccuracy)
    assert isinstance(metrics.get("acc", losses.CategoricalCrossentropy()), metrics.CategoricalAccuracy)
    assert isinstance(metrics.get("accuracy", losses.BinaryCrossentropy()), metrics.BinaryAccuracy)
    assert metrics.get("acc", losses.get("mse")).name == "acc"


def test_categorical_and_binary_accuracy():
    onehot = np.eye(4, dtype=np.float32)[LABELS]
    assert float(metrics.CategoricalAccuracy()(onehot, LOGITS)) == pytest.approx(np.mean(LOGITS.argmax(-1) == LABELS))
    b = metrics.BinaryAccuracy()
    assert float(b(np.array([[1], [0], [1]], np.float32), np.array([[0.9], [0.6], [0.2]], np.float32))) == pytest.approx(1 / 3)


def test_metric_updates_inside_a_traced_function_run_on_every_call():
    m = metrics.Mean()
    step = fl.function(lambda x: m.update_state(x))
    for value in (1.0, 2.0, 6.0):
        step(fl.constant([value]))
    assert float(m.result()) == 3.0
    assert step.experimental_get_tracing_count() == 1
