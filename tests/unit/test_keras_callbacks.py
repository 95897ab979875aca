"""Callbacks: hook order, History, EarlyStopping, ModelCheckpoint, LearningRateScheduler, and a fit
interrupted mid-epoch that BackupAndRestore resumes to the very same weights."""
from __future__ import annotations

import os

import numpy as np
import pytest

import flowlab as fl

L, C = fl.keras.layers, fl.keras.callbacks
(X, Y), (X_TEST, Y_TEST) = fl.datasets.digits()
X, Y = X[:320], Y[:320]


def model(optimizer=None, seed=0, metrics=("accuracy",)):
    fl.random.set_seed(seed)
    m = fl.keras.Sequential([fl.keras.Input(shape=(64,)), L.Dense(32, activation="relu"), L.Dense(10)])
    m.compile(optimizer or fl.optimizers.Adam(0.01), fl.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
              metrics=list(metrics))
    return m


class Recorder(C.Callback):
    def __init__(self):
        super().__init__()
        self.events = []

    def on_train_begin(self, logs=None):
        self.events.append(("train_begin", self.params["epochs"], self.params["steps"]))

    def on_epoch_begin(self, epoch, logs=None):
        self.events.append(("epoch_begin", epoch))

    def on_train_batch_end(self, batch, logs=None):
        self.events.append(("batch_end", batch, round(logs["loss"], 6)))

    def on_epoch_end(self, epoch, logs=None):
        self.events.append(("epoch_end", epoch, sorted(logs)))

    def on_train_end(self, logs=None):
        self.events.append(("train_end",))


def test_hooks_run_in_order_with_batch_logs_read_on_demand():
    rec = Recorder()
    m = model()
    m.fit(X[:96], Y[:96], batch_size=32, epochs=2, verbose=0, callbacks=[rec],
          validation_data=(X_TEST[:50], Y_TEST[:50]))
    kinds = [e[0] for e in rec.events]
    assert kinds == ["train_begin"] + (["epoch_begin"] + ["batch_end"] * 3 + ["epoch_end"]) * 2 + ["train_end"]
    assert rec.events[0] == ("train_begin", 2, 3)
    assert [e[1] for e in rec.events if e[0] == "batch_end"] == [0, 1, 2, 0, 1, 2]
    assert rec.events[5][2] == ["accuracy", "loss", "val_accuracy", "val_loss"]
    batch_losses = [e[2] for e in rec.events if e[0] == "batch_end"]
    assert all(np.isfinite(batch_losses))


def test_lambda_callback_and_stop_training_mid_epoch():
    seen = []

    def stop(batch, logs):
        seen.append(batch)
        if batch == 1:
            m.stop_training = True

    m = model()
    history = m.fit(X, Y, batch_size=32, epochs=5, verbose=0, callbacks=[C.LambdaCallback(on_train_batch_end=stop)])
    assert seen == [0, 1] and history.epoch == [0]


def test_callbacks_must_be_callback_objects():
    with pytest.raises(TypeError, match="Callback"):
        model().fit(X, Y, verbose=0, callbacks=[print])


# -- EarlyStopping --------------------------------------------------------------------------------
class Scripted(C.Callback):
    """Replaces the logged val_loss with a scripted sequence (to test EarlyStopping's counting)."""

    def __init__(self, values):
        super().__init__()
        self.values = list(values)

    def on_epoch_end(self, epoch, logs=None):
        logs["val_loss"] = self.values[epoch]


def test_early_stopping_waits_patience_epochs_then_restores_the_best_weights():
    snapshots = []
    keep = C.LambdaCallback(on_epoch_end=lambda epoch, logs: snapshots.append(m.get_weights()))
    stopper = C.EarlyStopping(monitor="val_loss", patience=2, restore_best_weights=True)
    m = model()
    history = m.fit(X, Y, epochs=10, verbose=0, callbacks=[Scripted([5, 3, 4, 3.5, 1, 0]), keep, stopper])
    assert history.epoch == [0, 1, 2, 3] and stopper.stopped_epoch == 3 and stopper.best_epoch == 1
    for a, b in zip(m.get_weights(), snapshots[1]):
        np.testing.assert_array_equal(a, b)


def test_early_stopping_warns_about_a_missing_monitor():
    with pytest.warns(UserWarning, match="'val_loss' is not in the logs"):
        model().fit(X, Y, epochs=1, verbose=0, callbacks=[C.EarlyStopping()])


# -- ModelCheckpoint ----------------------------------------------------------------------------------
def test_model_checkpoint_writes_one_file_per_epoch_named_from_the_logs(tmp_path):
    m = model()
    cb = C.ModelCheckpoint(str(tmp_path / "model-{epoch:02d}-{loss:.2f}"), save_weights_only=True)
    history = m.fit(X, Y, epochs=2, verbose=0, callbacks=[cb])
    names = sorted(os.listdir(tmp_path))
    assert names == [f"model-{e + 1:02d}-{history.history['loss'][e]:.2f}.npz" for e in range(2)]
    fresh = model(seed=9)
    fresh.load_weights(cb.last_saved)
    np.testing.assert_array_equal(fresh.predict(X_TEST[:4]), m.predict(X_TEST[:4]))


def test_model_checkpoint_best_only_saves_when_the_monitor_improves(tmp_path):
    cb = C.ModelCheckpoint(str(tmp_path / "best-{epoch}"), monitor="val_loss", save_best_only=True)
    model().fit(X, Y, epochs=4, verbose=0, callbacks=[Scripted([3, 2, 2.5, 1]), cb])
    assert sorted(os.listdir(tmp_path)) == ["best-1.npz", "best-2.npz", "best-4.npz"]


def test_model_checkpoint_names_a_missing_log_value(tmp_path):
    cb = C.ModelCheckpoint(str(tmp_path / "m-{val_accuracy:.2f}"))
    with pytest.raises(KeyError, match="val_accuracy"):
        model().fit(X, Y, epochs=1, verbose=0, callbacks=[cb])


# -- LearningRateScheduler --------------------------------------------------------------------------
class Counting(fl.keras.Model):
    def __init__(self):
        super().__init__()
        self.traces = 0
        self.dense = L.Dense(10)

    def call(self, x, training=False):
        self.traces += 1
        return self.dense(x)


def test_learning_rate_scheduler_changes_the_rate_without_retracing():
    rates = []
    m = Counting()
    m.compile(fl.optimizers.SGD(0.1), fl.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    watch = C.LambdaCallback(on_train_batch_begin=lambda b, logs: rates.append(float(m.optimizer.learning_rate)))
    history = m.fit(X[:64], Y[:64], batch_size=32, epochs=3, verbose=0,
                    callbacks=[C.LearningRateScheduler(lambda epoch: 0.1 / (epoch + 1)), watch])
    traces = m.traces
    assert rates == pytest.approx([0.1, 0.1, 0.05, 0.05, 0.1 / 3, 0.1 / 3])
    assert history.history["learning_rate"] == pytest.approx([0.1, 0.05, 0.1 / 3])
    assert traces <= 2      # a build call and one trace: the rate is a variable the graph reads


def test_learning_rate_changes_the_step_the_graph_takes():
    # the same first batch, learning rate 0 then 1: the first leaves the weights as they were
    m = model(fl.optimizers.SGD(0.0))
    before = m.get_weights()
    m.fit(X[:32], Y[:32], epochs=1, verbose=0, shuffle=False)
    for a, b in zip(before, m.get_weights()):
        np.testing.assert_array_equal(a, b)
    m.optimizer.learning_rate = 1.0
    m.fit(X[:32], Y[:32], epochs=1, verbose=0, shuffle=False)
    assert not np.array_equal(before[0], m.get_weights()[0])


# -- BackupAndRestore ---------------------------------------------------------------------------------
class Crash(C.Callback):
    """Raises at global batch ``at``: what a killed worker looks like to the code that called fit."""

    def __init__(self, at):
        super().__init__()
        self.at, self.count = at, 0

    def on_train_batch_end(self, batch, logs=None):
        self.count += 1
        if self.count == self.at:
            raise KeyboardInterrupt("interrupted on purpose")


def _fit(callbacks, epochs=3):
    m = model(fl.optimizers.Adam(0.01))
    history = m.fit(X, Y, batch_size=32, epochs=epochs, verbose=0, callbacks=callbacks)
    return m, history


@pytest.mark.parametrize("save_freq,crash_at", [(4, 17), ("epoch", 13), (3, 3)])
def test_an_interrupted_fit_resumed_by_backup_and_restore_ends_with_the_same_weights(tmp_path, save_freq, crash_at):
    reference, ref_history = _fit([])
    backup = str(tmp_path / "backup")
    with pytest.raises(KeyboardInterrupt):
        _fit([C.BackupAndRestore(backup, save_freq=save_freq), Crash(crash_at)])   # 10 batches per epoch
    assert os.listdir(backup), "a backup was written before the crash"
    restorer = C.BackupAndRestore(backup, save_freq=save_freq)
    resumed, history = _fit([restorer])
    assert restorer.restored_from is not None
    for a, b in zip(reference.get_weights(), resumed.get_weights()):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(reference.optimizer.get_slot(reference.weights[0], "m"),
                                  resumed.optimizer.get_slot(resumed.weights[0], "m"))
    assert int(resumed.optimizer.iterations) == 30
    # the epoch it resumed in logs the same loss as the uninterrupted run (the metric totals came back too)
    assert history.history["loss"] == pytest.approx(ref_history.history["loss"][len(ref_history.epoch) -
                                                                               len(history.epoch):], rel=1e-6)
    assert not os.path.exists(backup), "a completed fit deletes its backup"


def test_backup_and_restore_without_a_backup_starts_from_scratch(tmp_path):
    cb = C.BackupAndRestore(str(tmp_path / "none"))
    m, history = _fit([cb], epochs=1)
    assert cb.restored_from is None and history.epoch == [0]


def test_lambda_callbacks_get_logs_at_every_hook_as_in_keras():
    seen = []
    hooks = {name: (lambda *args, name=name: seen.append((name, len(args))))
             for name in ("on_train_begin", "on_epoch_begin", "on_train_batch_begin", "on_train_batch_end",
                          "on_epoch_end", "on_train_end")}
    model().fit(X[:32], Y[:32], epochs=1, verbose=0, callbacks=[C.LambdaCallback(**hooks)])
    assert seen == [("on_train_begin", 1), ("on_epoch_begin", 2), ("on_train_batch_begin", 2),
                    ("on_train_batch_end", 2), ("on_epoch_end", 2), ("on_train_end", 1)]
