"""Exercise 05 · train-a-classifier: the reference ``build_model`` passes every case (visible and
hidden), and typical learner mistakes fail with a reason that names what went wrong. Each case
really trains the model (about 0.15 s on a quiet machine)."""
import flowlab as fl
import flowlab.grading
from _grade import failures, outcomes
from flowlab.grading.check import reset_attempts

ID = "train-a-classifier"
layers = fl.keras.layers


def _model(n_features, hidden_layers, outputs, *, out_activation=None, from_logits=True, compile=True):
    model = fl.keras.Sequential([fl.keras.Input(shape=(n_features,)), *hidden_layers,
                                 layers.Dense(outputs, activation=out_activation)])
    if compile:
        model.compile(optimizer=fl.optimizers.Adam(learning_rate=0.01),
                      loss=fl.keras.losses.SparseCategoricalCrossentropy(from_logits=from_logits))
    return model


def reference(n_features, n_classes):
    return _model(n_features, [layers.Dense(32, activation="relu")], n_classes)


def test_reference_passes_every_case():
    assert failures(ID, reference) == []


def test_softmax_output_with_probability_loss_passes_too():
    def softmax(n_features, n_classes):
        return _model(n_features, [layers.Dense(24, activation="relu")], n_classes, out_activation="softmax",
                      from_logits=False)
    assert all(ok for _, ok, _ in outcomes(ID, softmax, hidden=False))


def test_a_linear_model_stays_below_the_bar():
    def linear(n_features, n_classes):                  # no hidden layer
        return _model(n_features, [], n_classes)

    def no_activation(n_features, n_classes):           # a hidden layer, but linear: still one linear map
        return _model(n_features, [layers.Dense(32)], n_classes)

    for wrong in (linear, no_activation):
        failed = [(name, why) for name, ok, why in outcomes(ID, wrong, hidden=False) if not ok]
        assert len(failed) == 3, (wrong.__name__, failed)
        for _, why in failed:
            assert "held-out accuracy" in why and "expected 'at least 0.9'" in why, why
            assert float(why.rsplit("got '", 1)[1].rstrip("'")) < 0.8, why


def test_logits_with_a_loss_that_expects_probabilities_fails():
    def logits_without_from_logits(n_features, n_classes):
        return _model(n_features, [layers.Dense(32, activation="relu")], n_classes, from_logits=False)
    failed = [(name, why) for name, ok, why in outcomes(ID, logits_without_from_logits, hidden=False) if not ok]
    assert len(failed) == 3, failed
    assert all("held-out accuracy" in why for _, why in failed), failed


def test_wrong_output_size_fails_on_the_shape_without_training():
    def one_output(n_features, n_classes):
        return _model(n_features, [layers.Dense(32, activation="relu")], 1)
    failed = failures(ID, one_output)
    assert len(failed) == 6
    for _, why in failed:
        assert "['output shape'][1]" in why and "got 1" in why, why


def test_uncompiled_too_big_and_not_a_model_fail_with_their_reason():
    def uncompiled(n_features, n_classes):
        return _model(n_features, [layers.Dense(32, activation="relu")], n_classes, compile=False)
    assert all("at ['compiled']: expected True, got False" in why for _, why in failures(ID, uncompiled))

    def too_big(n_features, n_classes):
        return _model(n_features, [layers.Dense(64, activation="relu"), layers.Dense(64, activation="relu")],
                      n_classes)
    failed = failures(ID, too_big)
    assert len(failed) == 6 and all("['parameters']: expected 'at most 1000', got '4" in why for _, why in failed)

    def returns_a_function(n_features, n_classes):
        return reference
    failed = failures(ID, returns_a_function)
    assert len(failed) == 6 and all("raised TypeError" in why and "not an fl.keras model" in why
                                    for _, why in failed), failed


def test_check_in_place_shows_a_hint_after_a_failed_try():
    reset_attempts(ID)
    result = fl.grading.check(ID, lambda n_features, n_classes: _model(n_features, [], n_classes))
    assert not result.passed and result.hint and "hidden layer" in result.hint
    assert "hidden layer" in repr(result)
    assert "3 hidden checks" in repr(result)
    reset_attempts(ID)
