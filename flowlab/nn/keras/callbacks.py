"""Callbacks: code that ``fit`` runs at fixed points of training (start and end of training, of
each epoch and of each batch), to save checkpoints, stop early, change the learning rate, or
resume an interrupted fit.

A callback sees ``self.model`` and ``self.params`` (epochs, steps, verbose) and gets ``logs``: a
mapping from names ("loss", "accuracy", "val_loss"...) to floats. Per-batch logs are read only
when a callback looks at them, and a callback that does not override a batch hook costs nothing
per batch, so callbacks keep a fast fit fast.
"""
from __future__ import annotations

import math
import os
import shutil
import sys
import warnings
from collections.abc import Mapping

import numpy as np

from ..._display import show
from ...core import dtypes
from ...core.tensor import Variable, variable_creator_scope
from ..checkpoint import Checkpoint, CheckpointManager
from ..checkpoint import _file as _checkpoint_file
from .progress import ProgressBar

__all__ = ["Callback", "CallbackList", "History", "ProgbarLogger", "ModelCheckpoint", "EarlyStopping",
           "LearningRateScheduler", "BackupAndRestore", "LambdaCallback"]

_BATCH_HOOKS = ("on_train_batch_begin", "on_train_batch_end", "on_test_batch_begin", "on_test_batch_end",
                "on_predict_batch_begin", "on_predict_batch_end")


class Callback:
    """Base class: override the hooks you need. ``epoch`` counts from 0, ``batch`` from 0 within
    the epoch; set ``self.model.stop_training = True`` to end ``fit`` after this epoch (or batch)."""

    def __init__(self):
        self.model = None
        self.params = {}

    def set_model(self, model):
        self.model = model

    def set_params(self, params):
        self.params = params

    def on_train_begin(self, logs=None): pass
    def on_train_end(self, logs=None): pass
    def _on_train_failed(self): pass      # flowlab's own: fit raised (no Keras callback hears of that)
    def on_epoch_begin(self, epoch, logs=None): pass
    def on_epoch_end(self, epoch, logs=None): pass
    def on_train_batch_begin(self, batch, logs=None): pass
    def on_train_batch_end(self, batch, logs=None): pass
    def on_test_begin(self, logs=None): pass
    def on_test_end(self, logs=None): pass
    def on_test_batch_begin(self, batch, logs=None): pass
    def on_test_batch_end(self, batch, logs=None): pass
    def on_predict_begin(self, logs=None): pass
    def on_predict_end(self, logs=None): pass
    def on_predict_batch_begin(self, batch, logs=None): pass
    def on_predict_batch_end(self, batch, logs=None): pass

    def _uses(self, hook) -> bool:
        return getattr(type(self), hook) is not getattr(Callback, hook)


class LambdaCallback(Callback):
    """A callback from functions: ``LambdaCallback(on_epoch_end=lambda epoch, logs: print(epoch))``."""

    def __init__(self, **hooks):
        super().__init__()
        for name, fn in hooks.items():
            if not hasattr(Callback, name) or not name.startswith("on_"):
                raise TypeError(f"LambdaCallback: {name!r} is not a callback hook")
            setattr(self, name, fn)
        self._hooks = set(hooks)

    def _uses(self, hook):
        return hook in self._hooks


class BatchLogs(Mapping):
    """The logs of one batch: each value is read (from the metric variables or the step's outputs)
    the first time something asks for it."""

    __slots__ = ("_sources", "_cache")

    def __init__(self, sources):
        self._sources = sources        # name -> zero-argument function giving the value
        self._cache = {}

    def __getitem__(self, name):
        value = self._cache.get(name)
        if value is None:
            value = self._cache[name] = float(self._sources[name]())
        return value

    def __iter__(self):
        return iter(self._sources)

    def __len__(self):
        return len(self._sources)


class CallbackList:
    """Runs a list of callbacks; batch hooks only reach callbacks that override them."""

    def __init__(self, callbacks, model, params):
        self.callbacks = list(callbacks)
        for cb in self.callbacks:
            cb.set_model(model)
            cb.set_params(params)
        self._by_hook = {hook: [cb for cb in self.callbacks if cb._uses(hook)] for hook in _BATCH_HOOKS}

    def wants(self, hook) -> bool:
        return bool(self._by_hook[hook])

    def batch(self, hook, batch, logs=None):
        for cb in self._by_hook[hook]:
            getattr(cb, hook)(batch, logs)

    def _on_train_failed(self):
        for cb in self.callbacks:
            cb._on_train_failed()

    def __getattr__(self, hook):
        if not hook.startswith("on_"):
            raise AttributeError(hook)

        def call(*args):
            for cb in self.callbacks:
                getattr(cb, hook)(*args)
        return call


class History(Callback):
    """Records the logs of every epoch: ``history.history["loss"]`` is the loss after each epoch.
    ``fit`` returns it."""

    def __init__(self):
        super().__init__()
        self.epoch, self.history = [], {}

    def on_train_begin(self, logs=None):
        self.epoch, self.history = [], {}

    def on_epoch_end(self, epoch, logs=None):
        self.epoch.append(epoch)
        for name, value in (logs or {}).items():
            self.history.setdefault(name, []).append(value)

    def __repr__(self):
        return f"<History: {len(self.epoch)} epochs of {sorted(self.history)}>"


class ProgbarLogger(Callback):
    """Shows a ``ProgressBar``: a live widget in a notebook (``mode="auto"``), else one text line
    per epoch (``mode="text"``)."""

    def __init__(self, mode="auto", stream=None):
        super().__init__()
        self.mode, self.stream = mode, stream
        self.bar = None

    def on_train_begin(self, logs=None):
        p = self.params
        self.bar = ProgressBar(p.get("epochs", 1), p.get("steps"), samples=p.get("samples"),
                               batch_size=p.get("batch_size"), replicas=p.get("replicas", 1),
                               strategy=p.get("strategy"))
        view = show(self.bar) if self.mode == "auto" else None
        if view is None:
            self.bar.stream = self.stream or sys.stdout
        self.bar.view = view
        self.bar.start()

    def _uses(self, hook):
        return hook == "on_train_batch_end"     # counts steps; reads the logs only when a live view redraws

    def on_epoch_begin(self, epoch, logs=None):
        self.bar.start_epoch(epoch, self.params.get("steps"))

    def on_train_batch_end(self, batch, logs=None):
        self.bar.update(batch + 1, logs)

    def on_epoch_end(self, epoch, logs=None):
        if self.params.get("steps") is not None:          # known after the first pass over a dataset
            self.bar.steps = self.params["steps"]
        if self.bar.batch_size is None:                   # a dataset's: known after its first batch
            self.bar.batch_size = self.params.get("batch_size")
        self.bar.end_epoch(logs or {}, workers=self.params.pop("worker_logs", None))

    def on_train_end(self, logs=None):
        self.bar.finish("stopped" if getattr(self.model, "stop_training", False) else "done")

    def _on_train_failed(self):
        if self.bar is not None and self.bar.status in ("waiting", "running"):
            self.bar.finish("failed")       # the monitor says so instead of running on forever


def _monitor_mode(mode, monitor):
    if mode not in ("auto", "min", "max"):
        raise ValueError(f"mode must be 'auto', 'min' or 'max', got {mode!r}")
    if mode == "auto":
        mode = "max" if any(k in monitor for k in ("acc", "auc", "precision", "recall")) else "min"
    return mode


def _better(mode, delta):
    return (lambda a, b: a - delta > b) if mode == "max" else (lambda a, b: a + delta < b)


class ModelCheckpoint(Callback):
    """Saves the model (and its optimizer, unless ``save_weights_only``) as a checkpoint after each
    epoch, or every ``save_freq`` batches. ``filepath`` may name the epoch and any logged value:
    ``"ckpt/model-{epoch:02d}-{val_loss:.2f}"``. With ``save_best_only`` it saves only when
    ``monitor`` improves. Load one back with ``model.load_weights(path)``."""

    def __init__(self, filepath, monitor="val_loss", verbose=0, save_best_only=False, save_weights_only=False,
                 mode="auto", save_freq="epoch", initial_value_threshold=None):
        super().__init__()
        self.filepath, self.monitor, self.verbose = os.fspath(filepath), monitor, verbose
        self.save_best_only, self.save_weights_only = save_best_only, save_weights_only
        self.mode = _monitor_mode(mode, monitor)
        self._better = _better(self.mode, 0.0)
        if save_freq != "epoch" and (isinstance(save_freq, bool) or not isinstance(save_freq, int) or save_freq < 1):
            raise ValueError(f"ModelCheckpoint: save_freq must be 'epoch' or a number of batches >= 1, got {save_freq!r}")
        self.save_freq = save_freq
        self.best = initial_value_threshold
        self.last_saved = None
        self._batches = 0
        self._epoch = 0

    def _uses(self, hook):
        return hook == "on_train_batch_end" and self.save_freq != "epoch"

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        self._batches += 1
        if self._batches % self.save_freq == 0:
            self._save(self._epoch, {k: logs[k] for k in logs} if logs else {}, batch=batch)

    def on_epoch_end(self, epoch, logs=None):
        if self.save_freq == "epoch":
            self._save(epoch, dict(logs or {}))

    def _save(self, epoch, logs, batch=None):
        if self.save_best_only:
            current = logs.get(self.monitor)
            if current is None:
                warnings.warn(f"ModelCheckpoint: cannot save the best model, {self.monitor!r} is not in the logs "
                              f"(available: {sorted(logs)})", stacklevel=2)
                return
            if self.best is not None and not self._better(current, self.best):
                return
            self.best = current
        try:
            path = self.filepath.format(epoch=epoch + 1, batch=(batch or 0) + 1, **logs)
        except KeyError as e:
            raise KeyError(f"ModelCheckpoint: filepath {self.filepath!r} names {e}, which is not in the logs "
                           f"(available: epoch, batch, {', '.join(sorted(logs))})") from None
        if self.save_weights_only:
            Checkpoint(model=self.model).write(path)
        else:
            Checkpoint(model=self.model, optimizer=self.model.optimizer).write(path)
        self.last_saved = path
        if self.verbose:
            print(f"Epoch {epoch + 1}: saved the model to {path}")


class EarlyStopping(Callback):
    """Stops training once ``monitor`` has gone ``patience`` epochs without improving by more than
    ``min_delta`` (as Keras counts: 0 and 1 both stop at the first epoch without improvement); with
    ``restore_best_weights`` the model ends with the weights of its best epoch."""

    def __init__(self, monitor="val_loss", min_delta=0.0, patience=0, verbose=0, mode="auto", baseline=None,
                 restore_best_weights=False, start_from_epoch=0):
        super().__init__()
        self.monitor, self.patience, self.verbose = monitor, int(patience), verbose
        self.min_delta = abs(float(min_delta))
        self.mode = _monitor_mode(mode, monitor)
        self._better = _better(self.mode, self.min_delta)
        self.baseline, self.restore_best_weights = baseline, restore_best_weights
        self.start_from_epoch = int(start_from_epoch)

    def on_train_begin(self, logs=None):
        self.wait, self.stopped_epoch, self.best_epoch = 0, 0, 0
        self.best = self.baseline
        self.best_weights = None

    def on_epoch_end(self, epoch, logs=None):
        logs = logs or {}
        current = logs.get(self.monitor)
        if current is None:
            warnings.warn(f"EarlyStopping: {self.monitor!r} is not in the logs (available: {sorted(logs)}); "
                          "pass validation_data to fit to get val_ values", stacklevel=2)
            return
        if epoch < self.start_from_epoch:
            return
        if self.best is None or self._better(current, self.best):
            self.best, self.best_epoch, self.wait = current, epoch, 0
            if self.restore_best_weights:
                self.best_weights = self.model.get_weights()
            return
        self.wait += 1
        if self.wait >= self.patience:
            self.stopped_epoch = epoch
            self.model.stop_training = True
            if self.restore_best_weights and self.best_weights is not None:
                self.model.set_weights(self.best_weights)
            if self.verbose:
                print(f"Epoch {epoch + 1}: early stopping (best {self.monitor} {self.best:.4f} at epoch "
                      f"{self.best_epoch + 1})")


class LearningRateScheduler(Callback):
    """Sets the optimizer's learning rate at the start of each epoch to ``schedule(epoch, lr)`` (or
    ``schedule(epoch)``). The rate is a variable the training step reads when it runs, so nothing
    is retraced; each epoch's rate appears in the logs as "learning_rate"."""

    def __init__(self, schedule, verbose=0):
        super().__init__()
        self.schedule, self.verbose = schedule, verbose

    def on_epoch_begin(self, epoch, logs=None):
        opt = self.model.optimizer
        current = opt.learning_rate
        if not isinstance(current, Variable):
            raise TypeError("LearningRateScheduler: the optimizer's learning rate is a schedule function already; "
                            "give the optimizer a number")
        try:
            lr = self.schedule(epoch, float(current))
        except TypeError:
            lr = self.schedule(epoch)
        lr = float(lr)
        if not math.isfinite(lr):
            raise ValueError(f"LearningRateScheduler: the schedule gave {lr} for epoch {epoch}")
        opt.learning_rate = lr
        if self.verbose:
            print(f"Epoch {epoch + 1}: learning rate {lr:.6g}")

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs["learning_rate"] = float(self.model.optimizer.learning_rate)


class BackupAndRestore(Callback):
    """Makes a fit survive interruption: it backs up the model, the optimizer, the metrics and where
    training is (epoch, batch, the shuffling seed) to ``backup_dir`` at the end of each epoch (and
    every ``save_freq`` batches, if a number), and a later ``fit`` with the same callback starts
    from the last backup instead of from scratch. With arrays (or a dataset that repeats its order)
    the resumed fit ends with the same weights as one that was never interrupted. The backup is
    deleted when a fit completes (``delete_checkpoint=True``).

    Under a strategy with several workers (MultiWorkerMirroredStrategy) every worker must use the
    callback with the same ``backup_dir`` (a folder they all see). Only the chief (worker 0) writes
    it; the weights, optimizer and fit position are the same on every worker, and what differs
    per worker, each one's metric accumulators, is gathered to the chief at each backup and saved
    as one row per worker. At the start of ``fit`` the chief says which backup to restore, so every
    worker restores the same one and takes its own metrics row back. Saving is a collective: all
    workers back up at the same batch."""

    def __init__(self, backup_dir, save_freq="epoch", delete_checkpoint=True):
        super().__init__()
        if save_freq != "epoch" and (isinstance(save_freq, bool) or not isinstance(save_freq, int) or save_freq < 1):
            raise ValueError(f"BackupAndRestore: save_freq must be 'epoch' or a number of batches >= 1, got {save_freq!r}")
        self.backup_dir, self.save_freq, self.delete_checkpoint = os.fspath(backup_dir), save_freq, delete_checkpoint
        self._manager = None
        self._strategy = None
        self._rows = None
        self.restored_from = None

    def _uses(self, hook):
        return hook == "on_train_batch_end" and self.save_freq != "epoch"

    def on_train_begin(self, logs=None):
        from .distribution import is_chief, strategy_of
        model = self.model
        state = model._fit_state
        strategy = strategy_of(model)
        self._strategy = strategy if strategy is not None and strategy.num_workers > 1 else None
        self._chief = is_chief(strategy)
        parts = {"model": model, "optimizer": model.optimizer, "fit": state}
        self._rows = None
        if self._strategy is None:
            parts["metrics"] = list(model.metrics)
        elif model.metrics:
            self._metric_vars = [v for m in model.metrics for v in m.variables]
            width = sum(np.asarray(v.numpy()).size for v in self._metric_vars)
            with variable_creator_scope(None):      # a plain variable of this process, never mirrored
                self._rows = Variable(np.zeros((self._strategy.num_workers, width)), dtype=dtypes.float64,
                                      trainable=False, name="backup/worker_metrics")
            parts["worker_metrics"] = self._rows
        ckpt = Checkpoint(**parts)
        latest = None
        if self._chief:
            self._manager = CheckpointManager(ckpt, self.backup_dir, max_to_keep=1, checkpoint_name="backup")
            latest = self._manager.latest_checkpoint
        else:
            self._manager = None               # a worker that is not the chief never writes the backup
        if self._strategy is not None:         # the chief's choice, so every worker restores the same backup
            number = self._strategy.chief_int(_backup_number(latest))
            latest = os.path.join(self.backup_dir, f"backup-{number}") if number >= 0 else None
        self.restored_from = latest
        if latest is not None and not self._chief and not os.path.exists(_checkpoint_file(latest)):
            raise FileNotFoundError(
                f"BackupAndRestore on worker {self._strategy.worker_index}: the chief restores {latest!r} but this "
                f"worker cannot see it; backup_dir must be one folder every worker can read (a shared file system)")
        if latest is not None:
            ckpt.restore(latest).assert_existing_objects_matched()
            if self._rows is not None:
                self._put_metrics(self._rows.numpy()[self._strategy.worker_index])
            state.resumed = True
        self._epoch = 0

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if (batch + 1) % self.save_freq == 0:
            self._back_up(self._epoch, batch + 1)

    def on_epoch_end(self, epoch, logs=None):
        self._back_up(epoch + 1, 0)

    def _back_up(self, epoch, step):
        state = self.model._fit_state
        state.epoch.assign(np.int64(epoch))
        state.step.assign(np.int64(step))
        if self._rows is not None:            # every worker's metrics, to the chief (a collective)
            mine = [np.asarray(v.numpy(), np.float64).reshape(-1) for v in self._metric_vars]
            rows = self._strategy.gather_rows(np.concatenate(mine) if mine else np.zeros(0))
            if self._chief:
                self._rows.assign(rows)
        if self._manager is not None:
            self._manager.save()

    def _put_metrics(self, row):
        at = 0
        for v in self._metric_vars:
            shape = np.shape(v.numpy())
            n = int(np.prod(shape))
            v.assign(row[at:at + n].reshape(shape).astype(v.dtype.as_numpy_dtype))
            at += n

    def on_train_end(self, logs=None):
        if self.delete_checkpoint and self._manager is not None:
            self._manager.delete_all()
            if os.path.isdir(self.backup_dir) and not os.listdir(self.backup_dir):
                shutil.rmtree(self.backup_dir, ignore_errors=True)


def _backup_number(path) -> int:
    """``backup-7`` -> 7; no backup -> -1."""
    return -1 if path is None else int(os.path.basename(path).rpartition("-")[2])


class FitState:
    """Where a fit is: the next epoch and batch to run and the seed that shuffles every epoch, as
    variables, so that a checkpoint (BackupAndRestore) can save and restore them."""

    def __init__(self):
        self.epoch = Variable(np.int64(0), dtype=dtypes.int64, trainable=False, name="fit/epoch")
        self.step = Variable(np.int64(0), dtype=dtypes.int64, trainable=False, name="fit/step")
        self.seed = Variable(np.int64(0), dtype=dtypes.int64, trainable=False, name="fit/seed")
        self.resumed = False

    def _checkpoint_children(self):
        return {"epoch": self.epoch, "step": self.step, "seed": self.seed}
