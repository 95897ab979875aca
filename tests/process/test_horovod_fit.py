"""flowlab.horovod with Model.fit on real ranks: LocalCluster workers (``cluster.run``) and
``flowlab run -np 2 script.py`` (as ``horovodrun`` runs a script).

The main program is Horovod's Keras MNIST example as a reader types it, on the digits data:
``import flowlab.horovod.keras as hvd``, a learning rate scaled by ``hvd.size()``,
``hvd.DistributedOptimizer``, ``compile(..., experimental_run_tf_function=False)``, the broadcast
and metric-average callbacks (and the warm-up), a checkpoint callback on rank 0 only,
``verbose=1`` on rank 0 only, and ``fit(dataset, steps_per_epoch=... // hvd.size())``. fit traces
its step (the default), so the gradient average is a node of the traced graph.

Closed form: rank r reads rows r, r+2, ... in batches of 16, so step k of the two ranks together
reads rows 32k .. 32k+31; the average of the two ranks' mean-loss gradients is the mean-loss
gradient of those 32 rows: one process with batches of 32 (and the same scaled learning rate)
takes the same steps."""
import os
import textwrap

import numpy as np
import pytest
from _processes import run_script_ranks

import flowlab as fl

pytestmark = pytest.mark.process
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ROWS, BATCH, STEPS, EPOCHS, WARMUP = 768, 16, 24, 3, 2


# -- the tutorial program (on each rank) ------------------------------------------------------------
def _digits():
    import flowlab as fl
    (images, labels), _ = fl.datasets.digits()
    return images[:ROWS].reshape(-1, 8, 8, 1), labels[:ROWS].astype(np.int64)


def _mnist_model(seed):
    import flowlab as fl
    fl.random.set_seed(seed)
    return fl.keras.Sequential([
        fl.keras.layers.Conv2D(8, [3, 3], activation="relu"),
        fl.keras.layers.Flatten(),
        fl.keras.layers.Dense(32, activation="relu"),
        fl.keras.layers.Dense(10, activation="softmax"),
    ])


def keras_mnist_on_rank(outdir, warmup):
    import flowlab as fl
    import flowlab.horovod.keras as hvd

    class Record(fl.keras.callbacks.Callback):      # the test's eyes: weights and logs at this point of the list
        def __init__(self):
            super().__init__()
            self.weights, self.logs = None, []

        def on_train_begin(self, logs=None):
            self.weights = [w.numpy().copy() for w in self.model.weights]

        def on_epoch_end(self, epoch, logs=None):
            self.logs.append(dict(logs))

    hvd.init()
    images, labels = _digits()
    dataset = fl.data.Dataset.from_tensor_slices((images, labels))
    dataset = dataset.shard(hvd.size(), hvd.rank()).repeat().batch(BATCH)

    model = _mnist_model(10 + hvd.rank())         # every rank starts elsewhere: the broadcast must fix that
    scaled_lr = 0.001 * hvd.size()
    opt = fl.optimizers.Adam(scaled_lr)
    opt = hvd.DistributedOptimizer(opt)
    model.compile(loss=fl.keras.losses.SparseCategoricalCrossentropy(), optimizer=opt, metrics=["accuracy"],
                  experimental_run_tf_function=False)

    before, after = Record(), Record()
    callbacks = [before,
                 hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                 after,
                 hvd.callbacks.MetricAverageCallback()]
    if warmup:
        callbacks.append(hvd.callbacks.LearningRateWarmupCallback(initial_lr=scaled_lr, warmup_epochs=WARMUP,
                                                                  verbose=1))
    if hvd.rank() == 0:
        callbacks.append(fl.keras.callbacks.ModelCheckpoint(os.path.join(outdir, "checkpoint-{epoch}.h5")))
    verbose = 1 if hvd.rank() == 0 else 0
    history = model.fit(dataset, steps_per_epoch=STEPS // hvd.size(), callbacks=callbacks, epochs=EPOCHS,
                        verbose=verbose)
    traced = any(k[0] == "train" for k in model._functions)      # fit's step ran as a traced graph
    return {"rank": hvd.rank(), "initial": before.weights, "broadcast": after.weights, "local_logs": before.logs,
            "history": history.history, "weights": [w.numpy() for w in model.weights], "traced": traced}


class _WarmupReference(fl.keras.callbacks.Callback):
    """The learning rate the warm-up gives two ranks, set for the one-process reference: from
    scaled_lr / 2 to scaled_lr over WARMUP epochs, before every batch."""

    def __init__(self, scaled_lr, steps):
        super().__init__()
        self.scaled_lr, self.steps, self.epoch = scaled_lr, steps, 0

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        if self.epoch < WARMUP:
            progress = self.epoch + batch / self.steps
            self.model.optimizer.learning_rate = self.scaled_lr / 2 * (progress / WARMUP + 1)
        else:
            self.model.optimizer.learning_rate = self.scaled_lr


def _reference(warmup):
    images, labels = _digits()
    dataset = fl.data.Dataset.from_tensor_slices((images, labels)).repeat().batch(2 * BATCH)
    model = _mnist_model(10)                       # rank 0's start
    model.compile(loss=fl.keras.losses.SparseCategoricalCrossentropy(), optimizer=fl.optimizers.Adam(0.002),
                  metrics=["accuracy"])
    callbacks = [_WarmupReference(0.002, STEPS // 2)] if warmup else []
    history = model.fit(dataset, steps_per_epoch=STEPS // 2, epochs=EPOCHS, verbose=0, callbacks=callbacks)
    return model, history.history


@pytest.mark.parametrize("warmup", [False, True], ids=["plain", "warmup"])
def test_horovod_keras_mnist_program_on_two_ranks(make_cluster, tmp_path, warmup):
    cluster = make_cluster(workers=2)
    r0, r1 = sorted(cluster.run(keras_mnist_on_rank, str(tmp_path), warmup, timeout=240), key=lambda r: r["rank"])
    assert r0["traced"] and r1["traced"]

    # the broadcast: rank 1 started elsewhere, and left on_train_begin with rank 0's weights
    assert not all(np.array_equal(a, b) for a, b in zip(r0["initial"], r1["initial"]))
    for a, b, c in zip(r0["initial"], r0["broadcast"], r1["broadcast"]):
        np.testing.assert_array_equal(b, a)
        np.testing.assert_array_equal(c, a)

    # the ranks end identical, and equal to one process on the whole batches (closed form)
    for a, b in zip(r0["weights"], r1["weights"]):
        np.testing.assert_array_equal(a, b)
    ref, ref_history = _reference(warmup)
    for a, b in zip(ref.weights, r0["weights"]):
        np.testing.assert_allclose(b, a.numpy(), rtol=2e-4, atol=2e-6)

    # MetricAverageCallback: each rank's own logs differ, the logged (averaged) ones are the same
    # on both ranks, are the mean of the two, and match the one-process run's
    assert r0["history"] == r1["history"]
    for e in range(EPOCHS):
        own0, own1 = r0["local_logs"][e], r1["local_logs"][e]
        assert own0["loss"] != own1["loss"]
        for k in ("loss", "accuracy"):
            assert r0["history"][k][e] == pytest.approx((own0[k] + own1[k]) / 2, rel=1e-12)
    np.testing.assert_allclose(r0["history"]["loss"], ref_history["loss"], rtol=1e-4)
    np.testing.assert_allclose(r0["history"]["accuracy"], ref_history["accuracy"], atol=1.5 / (STEPS * BATCH))

    if warmup:     # logged each epoch: the rate at its last batch, then the full scaled rate
        expected = [0.002 / 2 * ((e + (STEPS // 2 - 1) / (STEPS // 2)) / WARMUP + 1) for e in range(WARMUP - 1)]
        expected += [0.002] * (EPOCHS - WARMUP + 1)
        np.testing.assert_allclose(r0["history"]["lr"], expected, rtol=1e-12)

    # the checkpoint callback (rank 0 only) wrote every epoch, the last one holding the final weights
    assert sorted(os.listdir(tmp_path)) == [f"checkpoint-{e}.h5.npz" for e in range(1, EPOCHS + 1)]
    restored = _mnist_model(99)
    restored.build((None, 8, 8, 1))
    restored.load_weights(str(tmp_path / f"checkpoint-{EPOCHS}.h5"))
    for a, b in zip(restored.weights, r0["weights"]):
        np.testing.assert_array_equal(a.numpy(), b)


# -- the older, smaller check: eager and traced steps -------------------------------------------------
def _data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(48, 4)).astype(np.float32)
    return x, (x @ rng.normal(size=(4, 1))).astype(np.float32)


def _model(seed, optimizer, run_eagerly):
    import flowlab as fl
    fl.random.set_seed(seed)
    model = fl.keras.Sequential([fl.keras.Input(shape=(4,)), fl.keras.layers.Dense(6, activation="relu"),
                                 fl.keras.layers.Dense(1)])
    model.compile(optimizer=optimizer, loss="mse", run_eagerly=run_eagerly)
    return model


def fit_on_rank(run_eagerly):
    import flowlab as fl
    import flowlab.horovod as hvd
    hvd.init()
    x, y = _data()
    model = _model(100 + hvd.rank(), hvd.DistributedOptimizer(fl.optimizers.SGD(0.05)), run_eagerly)
    shard = slice(hvd.rank(), None, hvd.size())                                           # 24 rows each
    model.fit(x[shard], y[shard], batch_size=24 // hvd.size(), epochs=3, shuffle=False, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    return [w.numpy() for w in model.weights]


@pytest.mark.parametrize("run_eagerly", [True, False], ids=["eager", "traced"])
def test_fit_with_distributed_optimizer_matches_one_process(make_cluster, run_eagerly):
    x, y = _data()
    ref = _model(100, fl.optimizers.SGD(0.05), run_eagerly)
    # step k of rank r takes the rows 24k + r, 24k + r + 2, ...: together, rows 24k .. 24k + 23,
    # which is step k of one process with batches of 24; the mean of the two ranks' mean gradients
    # is the mean gradient over those 24 rows
    ref.fit(x, y, batch_size=24, epochs=3, shuffle=False, verbose=0)
    results = make_cluster(workers=2).run(fit_on_rank, run_eagerly, timeout=180)
    for weights in results:
        for a, b in zip(ref.weights, weights):
            np.testing.assert_allclose(b, a.numpy(), rtol=1e-4, atol=1e-6)


# -- the same program as a script under `flowlab run -np 2` -----------------------------------------
SCRIPT = """\
    import sys
    import numpy as np
    import flowlab as fl
    import flowlab.horovod.keras as hvd

    hvd.init()
    (images, labels), _ = fl.datasets.digits()
    dataset = fl.data.Dataset.from_tensor_slices((images.reshape(-1, 8, 8, 1), labels.astype(np.int64)))
    dataset = dataset.repeat().shuffle(1000, seed=hvd.rank()).batch(32)

    model = fl.keras.Sequential([
        fl.keras.layers.Conv2D(8, [3, 3], activation="relu"),
        fl.keras.layers.Flatten(),
        fl.keras.layers.Dense(10, activation="softmax"),
    ])
    opt = hvd.DistributedOptimizer(fl.optimizers.Adam(0.001 * hvd.size()))
    model.compile(loss=fl.keras.losses.SparseCategoricalCrossentropy(), optimizer=opt, metrics=["accuracy"],
                  experimental_run_tf_function=False)
    callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0), hvd.callbacks.MetricAverageCallback(),
                 hvd.callbacks.LearningRateWarmupCallback(initial_lr=0.001 * hvd.size(), warmup_epochs=1, verbose=1)]
    model.fit(dataset, steps_per_epoch=20 // hvd.size(), callbacks=callbacks, epochs=2,
              verbose=1 if hvd.rank() == 0 else 0)
    np.savez(sys.argv[1] + f"/rank{hvd.rank()}.npz", *[w.numpy() for w in model.weights])
"""


def test_the_program_runs_as_a_script_under_flowlab_run(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SCRIPT))
    out = run_script_ranks(script, tmp_path, cwd=ROOT)
    assert "[0] Epoch 1/2" in out and "[0] Epoch 2/2" in out, out           # rank 0 shows progress,
    assert "[1] Epoch" not in out, out                                      # rank 1 stays quiet
    assert "finished gradual learning rate warmup" in out, out
    w0, w1 = np.load(tmp_path / "rank0.npz"), np.load(tmp_path / "rank1.npz")
    assert len(w0.files) == 4
    for k in w0.files:
        np.testing.assert_array_equal(w0[k], w1[k])      # different data on each rank, the same model
