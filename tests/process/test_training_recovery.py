"""Training that recovers by itself, on real LocalCluster workers: fit under
MultiWorkerMirroredStrategy with BackupAndRestore (only the chief writes; every worker restores the
chief's backup and its own metrics), driven by fl.distribute.run_with_recovery, which restarts a
worker that dies mid-fit and runs the training function again. The resumed fit ends with the
weights and the logs of a fit that was never interrupted."""
import logging
import os

import numpy as np
import pytest

import flowlab as fl
from _distribute_helpers import keras_regressor, regression_data

pytestmark = pytest.mark.process

EPOCHS, DIE_EPOCH, DIE_BATCH = 4, 2, 2     # 48 rows in global batches of 12: 4 batches an epoch, and
                                           # with save_freq=2 three backups an epoch (batch 2, 4, its end)


def train(backup, marker=None, save_freq=2):
    """Four shuffled epochs on two workers with BackupAndRestore. With ``marker``, worker 1 exits
    (os._exit) after batch DIE_BATCH of epoch DIE_EPOCH the first time (when ``marker`` does not
    exist yet), just after the backup at batch 2 of that epoch."""
    import flowlab as fl
    from flowlab import distribute as ds
    strategy = ds.MultiWorkerMirroredStrategy()
    fl.random.set_seed(100 + strategy.worker_index)
    with strategy.scope():
        model = keras_regressor()
    x, y = regression_data(48)
    callbacks = [fl.keras.callbacks.BackupAndRestore(backup, save_freq=save_freq)]
    if marker is not None and strategy.worker_index == 1:
        epoch_now = {}

        def die(batch, logs):
            if epoch_now.get("e") == DIE_EPOCH and batch == DIE_BATCH and not os.path.exists(marker):
                open(marker, "w").close()
                os._exit(3)
        callbacks.append(fl.keras.callbacks.LambdaCallback(
            on_epoch_begin=lambda epoch, logs: epoch_now.__setitem__("e", epoch), on_train_batch_end=die))
    history = model.fit(x, y, batch_size=12, epochs=EPOCHS, verbose=0, shuffle=True, callbacks=callbacks)
    restored = callbacks[0].restored_from
    return [v.numpy() for v in model.trainable_variables], history.history, history.epoch, restored, os.getpid()


def test_a_killed_worker_is_restarted_and_fit_ends_as_if_nothing_happened(make_cluster, tmp_path, caplog):
    cluster = make_cluster(workers=2)
    clean = fl.distribute.run_with_recovery(cluster, train, str(tmp_path / "clean"), timeout=180)
    assert clean.restarts == []
    assert not (tmp_path / "clean").exists()                 # the chief deleted its backup at the end

    old_pid = cluster.pid(1)
    with caplog.at_level(logging.WARNING, logger="flowlab.distribute"):
        results = fl.distribute.run_with_recovery(cluster, train, str(tmp_path / "backup"), str(tmp_path / "died"),
                                                  max_restarts=3, timeout=180)
    assert (tmp_path / "died").exists()
    [restart] = results.restarts
    assert restart.count == 1 and restart.task == "/job:worker/task:1" and restart.pid == old_pid
    assert "exit code 3" in restart.reason
    assert cluster.pid(1) != old_pid and results[1][4] == cluster.pid(1)
    logged = [r.getMessage() for r in caplog.records if r.name == "flowlab.distribute"]
    assert len(logged) == 1 and "restart 1: /job:worker/task:1" in logged[0] and "exit code 3" in logged[0]

    (w_clean, h_clean, _, _, _), _ = clean
    for w, h, epochs_run, restored, _ in results:
        assert restored is not None and restored.endswith("backup-" + str(DIE_EPOCH * 3 + 1)), restored
        assert epochs_run == list(range(DIE_EPOCH, EPOCHS))                # resumed inside epoch 2
        for a, b in zip(w_clean, w):
            np.testing.assert_array_equal(b, a)                            # bit-identical weights
        for name, values in h_clean.items():                               # and the same logs, the resumed
            np.testing.assert_allclose(h[name], values[DIE_EPOCH:], rtol=1e-6)   # epoch's metrics included


def fails_everywhere():
    raise ValueError("a bug in train_fn")


def test_a_bug_is_raised_at_once_and_too_many_deaths_give_up(make_cluster, tmp_path):
    cluster = make_cluster(workers=2)
    with pytest.raises(ValueError, match="a bug in train_fn"):
        fl.distribute.run_with_recovery(cluster, fails_everywhere, max_restarts=3, timeout=60)
    assert cluster.status(0) == cluster.status(1) == "alive"

    with pytest.raises(fl.distribute.RecoveryError) as info:
        fl.distribute.run_with_recovery(cluster, dies_on_rank_1, max_restarts=1, timeout=60)
    err = info.value
    assert len(err.restarts) == 1 and err.restarts[0].task == "/job:worker/task:1"
    text = str(err)
    assert "max_restarts=1" in text and "restart 1: /job:worker/task:1" in text and "exit code 5" in text
    assert isinstance(err.__cause__, fl.cluster.WorkerDiedError)


def dies_on_rank_1():
    import os
    import flowlab as fl
    from flowlab.cluster.collectives import barrier
    if fl.cluster.rank() == 1:
        os._exit(5)
    barrier(timeout=60)
