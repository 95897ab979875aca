"""The Keras-level and module-level names a TensorFlow tutorial types: ``import flowlab.keras``,
``fl.keras.backend``, ``losses.Reduction``, ``fl.nn.compute_average_loss`` (under a strategy too),
``fl.train.latest_checkpoint`` after ``Checkpoint.save``, and the errors for names flowlab leaves out."""
import os
import subprocess
import sys

import numpy as np
import pytest

import flowlab as fl


# -- import flowlab.keras ---------------------------------------------------------------------
def test_every_spelling_of_keras_gives_the_same_objects():
    import flowlab.keras
    from flowlab import keras
    from flowlab.keras import callbacks, layers, losses, metrics, models, optimizers
    from flowlab.keras.layers import Dense
    from flowlab.keras.models import Sequential
    assert flowlab.keras is keras is fl.keras
    assert layers is fl.keras.layers and Dense is fl.keras.layers.Dense
    assert (models.Sequential, models.Model) == (fl.keras.Sequential, fl.keras.Model) and Sequential is fl.keras.Sequential
    assert optimizers is fl.keras.optimizers is fl.optimizers
    assert (losses, metrics, callbacks) == (fl.keras.losses, fl.keras.metrics, fl.keras.callbacks)


def test_import_flowlab_keras_first_in_a_fresh_process_makes_one_copy_of_each_class():
    code = ("from flowlab.keras.layers import Dense; import flowlab.keras.optimizers as o; import flowlab as fl; "
            "import flowlab.nn.keras.layers as real; "
            "print(Dense is real.Dense, o is fl.optimizers, fl.keras is __import__('flowlab.nn.keras').nn.keras)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "True", "True"]


def test_a_tutorial_model_built_from_flowlab_keras_imports_trains():
    from flowlab.keras import layers, losses, models, optimizers
    fl.random.set_seed(0)
    model = models.Sequential([layers.Dense(8, activation="relu", input_shape=(4,)), layers.Dense(3)])
    model.compile(optimizer=optimizers.SGD(0.1), loss=losses.SparseCategoricalCrossentropy(from_logits=True))
    x = np.random.default_rng(0).standard_normal((32, 4)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int32)
    history = model.fit(x, y, epochs=5, batch_size=8, verbose=0)
    assert history.history["loss"][-1] < history.history["loss"][0]


# -- fl.keras.backend ---------------------------------------------------------------------------
def test_backend_basics():
    K = fl.keras.backend
    assert (K.floatx(), K.epsilon(), K.image_data_format()) == ("float32", 1e-7, "channels_last")
    v = fl.Variable([[1.0, 2.0]])
    K.set_value(v, [[3.0, 4.0]])
    assert K.get_value(v).tolist() == [[3.0, 4.0]] and K.eval(v * 2.0).tolist() == [[6.0, 8.0]]
    assert K.int_shape(v) == (1, 2) and K.ndim(v) == 2 and K.dtype(v) == "float32"
    with pytest.raises(TypeError, match="not a variable"):
        K.set_value(fl.constant(1.0), 2.0)
    with pytest.raises(ValueError, match="dtype='float64'"):
        K.set_floatx("float64")
    with pytest.raises(ValueError, match="channels_last"):
        K.set_image_data_format("channels_first")
    with pytest.warns(UserWarning, match="no session"):
        K.set_session(object())


def test_clear_session_restarts_layer_names():
    fl.keras.backend.clear_session()
    assert fl.keras.layers.Dense(2).name == "dense"
    assert fl.keras.layers.Dense(2).name == "dense_1"
    fl.keras.backend.clear_session()
    assert fl.keras.layers.Dense(2).name == "dense"


def test_set_epsilon_is_what_the_losses_clip_with():
    K, loss = fl.keras.backend, fl.keras.losses.binary_crossentropy
    try:
        K.set_epsilon(1e-3)
        assert float(loss([[1.0]], [[0.0]])[0]) == pytest.approx(-np.log(1e-3), rel=1e-5)
    finally:
        K.set_epsilon(1e-7)
    assert float(loss([[1.0]], [[0.0]])[0]) == pytest.approx(-np.log(1e-7), rel=1e-3)


# -- losses.Reduction --------------------------------------------------------------------------
def test_loss_reductions():
    R = fl.keras.losses.Reduction
    y, logits = [0, 1, 1], fl.constant([[2.0, 0.0], [0.0, 2.0], [1.0, 0.0]])
    per = fl.keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True).numpy()
    make = lambda r: fl.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=r)  # noqa: E731
    np.testing.assert_allclose(make(R.NONE)(y, logits).numpy(), per, rtol=1e-6)
    np.testing.assert_allclose(float(make(R.SUM)(y, logits)), per.sum(), rtol=1e-6)
    for r in (R.AUTO, R.SUM_OVER_BATCH_SIZE):
        np.testing.assert_allclose(float(make(r)(y, logits)), per.mean(), rtol=1e-6)
    mse = fl.keras.losses.MeanSquaredError(reduction=R.NONE)
    assert mse([[1.0], [2.0]], [[0.0], [0.0]], sample_weight=[1.0, 0.5]).numpy().tolist() == [1.0, 2.0]
    with pytest.raises(ValueError, match="Reduction.*got 'mean'"):
        fl.keras.losses.BinaryCrossentropy(reduction="mean")


# -- compute_average_loss -----------------------------------------------------------------------
def test_compute_average_loss_outside_a_strategy():
    per = fl.constant([1.0, 2.0, 3.0, 6.0])
    assert float(fl.nn.compute_average_loss(per)) == 3.0
    assert float(fl.nn.compute_average_loss(per, global_batch_size=8)) == 1.5
    assert float(fl.nn.compute_average_loss(per, sample_weight=[1.0, 0.0, 0.0, 0.5], global_batch_size=4)) == 1.0
    assert float(fl.nn.compute_average_loss(per, regularization_loss=fl.constant(1.0))) == 4.0
    assert float(fl.nn.scale_regularization_loss([fl.constant(1.0), fl.constant(2.0)])) == 3.0
    with pytest.raises(ValueError, match="one loss per example.*Reduction.NONE"):
        fl.nn.compute_average_loss(fl.constant(1.0))
    with pytest.raises(ValueError, match="whole number"):
        fl.nn.compute_average_loss(per, global_batch_size=0)
    assert fl.distribute.compute_average_loss is fl.nn.compute_average_loss


def _custom_loop(strategy, traced):
    """A custom training loop as the tf.distribute tutorial writes it; returns the trained weights."""
    x = np.random.default_rng(1).standard_normal((8, 3)).astype(np.float32)
    y = np.random.default_rng(2).integers(0, 2, 8).astype(np.int32)
    with strategy.scope():
        fl.random.set_seed(3)
        model = fl.keras.Sequential([fl.keras.layers.Dense(2, input_shape=(3,))])
        loss_object = fl.keras.losses.SparseCategoricalCrossentropy(
            from_logits=True, reduction=fl.keras.losses.Reduction.NONE)
        optimizer = fl.optimizers.SGD(0.5)

    def train_step(inputs):
        features, labels = inputs
        with fl.GradientTape() as tape:
            per_example = loss_object(labels, model(features, training=True))
            loss = fl.nn.compute_average_loss(per_example)      # global batch size from the strategy
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    def distributed_step(inputs):
        losses = strategy.run(train_step, args=(inputs,))
        return strategy.reduce(fl.distribute.ReduceOp.SUM, losses, axis=None)

    step = fl.function(distributed_step) if traced else distributed_step
    dataset = strategy.experimental_distribute_dataset(fl.data.Dataset.from_tensor_slices((x, y)).batch(8))
    totals = [float(step(batch)) for _ in range(3) for batch in dataset]
    return [v.numpy() for v in model.trainable_variables], totals


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
def test_compute_average_loss_under_two_replicas_trains_as_one(cpus, traced):
    cpus(2)
    one, one_losses = _custom_loop(fl.distribute.MirroredStrategy(["/cpu:0"]), traced)
    two, two_losses = _custom_loop(fl.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]), traced)
    for a, b in zip(one, two):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(one_losses, two_losses, rtol=1e-5)


def test_compute_average_loss_in_cross_replica_context_says_where_to_call_it(cpus):
    cpus(2)
    strategy = fl.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        with pytest.raises(RuntimeError, match="cross-replica context.*strategy.run"):
            fl.nn.compute_average_loss(fl.constant([1.0, 2.0]))
        assert float(fl.nn.compute_average_loss(fl.constant([1.0, 2.0]), global_batch_size=4)) == 0.75


# -- checkpoints -------------------------------------------------------------------------------
def test_checkpoint_save_then_latest_checkpoint_then_restore(tmp_path):
    model = fl.keras.Sequential([fl.keras.layers.Dense(2, input_shape=(3,))])
    optimizer = fl.optimizers.Adam(0.1)
    ckpt = fl.train.Checkpoint(model=model, optimizer=optimizer)
    prefix = os.path.join(tmp_path, "ckpt")
    assert fl.train.latest_checkpoint(tmp_path) is None
    saved = [np.array(v) for v in model.weights]
    first = ckpt.save(prefix)
    second = ckpt.save(prefix)
    assert fl.train.latest_checkpoint(tmp_path) == second == prefix + "-2" and first == prefix + "-1"
    for v in model.weights:
        v.assign(np.zeros(v.shape, np.float32))
    ckpt.restore(fl.train.latest_checkpoint(tmp_path)).assert_existing_objects_matched()
    for v, want in zip(model.weights, saved):
        np.testing.assert_array_equal(np.array(v), want)
    ckpt.write(os.path.join(tmp_path, "other"))          # write() leaves the state file alone
    assert fl.train.latest_checkpoint(tmp_path) == second


def test_checkpoint_save_and_manager_share_the_state_file(tmp_path):
    step = fl.Variable(0)
    ckpt = fl.train.Checkpoint(step=step)
    ckpt.save(os.path.join(tmp_path, "ckpt"))
    manager = fl.train.CheckpointManager(ckpt, tmp_path, max_to_keep=2)
    assert manager.latest_checkpoint == fl.train.latest_checkpoint(tmp_path)
    step.assign(5)
    path = manager.save()
    assert fl.train.latest_checkpoint(tmp_path) == path == manager.latest_checkpoint
    step.assign(0)
    fl.train.Checkpoint(step=step).restore(fl.train.latest_checkpoint(tmp_path))
    assert int(step) == 5


# -- names flowlab leaves out, and misspellings ------------------------------------------------
@pytest.mark.parametrize("name,points_to", [("estimator", "model.fit"), ("contrib", "fl.distribute"),
                                            ("lite", "Checkpoint"), ("saved_model", "save_weights"),
                                            ("summary", "History"), ("tpu", "MirroredStrategy")])
def test_names_left_out_on_purpose_say_so_and_point_to_the_flowlab_way(name, points_to):
    with pytest.raises(AttributeError, match="does not exist on purpose") as info:
        getattr(fl, name)
    assert points_to in str(info.value)
    assert not hasattr(fl, name)


def test_the_estimator_tutorial_program_meets_the_pointer():
    with pytest.raises(AttributeError, match="strategy.scope"):
        fl.estimator.RunConfig(train_distribute=fl.distribute.MirroredStrategy())


def test_tf1_names_point_to_compat_v1():
    with pytest.raises(AttributeError, match=r"flowlab.compat.v1.Session"):
        fl.Session()
    with pytest.raises(AttributeError, match=r"flowlab.compat.v1.placeholder"):
        fl.placeholder(fl.float32)


def test_misspelled_names_get_did_you_mean():
    with pytest.raises(AttributeError, match=r"no attribute 'reduce_summ'; did you mean 'reduce_sum'"):
        fl.reduce_summ
    with pytest.raises(AttributeError, match=r"did you mean 'distribute'"):
        fl.distribut
    with pytest.raises(AttributeError) as info:
        fl.qqqqq
    assert "did you mean" not in str(info.value)
