"""run_with_recovery(..., wait=False) on real LocalCluster workers: training runs on a thread of
the notebook's process while the caller is free; the caller kills a worker as the cluster panel's
Kill button does, the run restarts it and ends with the weights of a run without the fault.
Cancelling it or closing the cluster under it leaves nothing running."""
import threading
import time
from concurrent.futures import CancelledError

import numpy as np
import pytest

import flowlab as fl
from _processes import wait_gone

pytestmark = pytest.mark.process

EPOCHS = 5


def train(backup, started=None, pause_s=0.0):
    """Five shuffled epochs on every worker with BackupAndRestore; with ``started`` worker 1 creates
    that file when epoch 2 begins, and each epoch ends with a ``pause_s`` wait (time to kill it)."""
    import time

    import flowlab as fl
    from _distribute_helpers import keras_regressor, regression_data
    strategy = fl.distribute.MultiWorkerMirroredStrategy()
    fl.random.set_seed(100 + strategy.worker_index)
    with strategy.scope():
        model = keras_regressor()
    x, y = regression_data(48)

    def epoch_begins(epoch, logs):
        if started and epoch == 2 and strategy.worker_index == 1:
            open(started, "a").close()

    callbacks = [fl.keras.callbacks.BackupAndRestore(backup),
                 fl.keras.callbacks.LambdaCallback(on_epoch_begin=epoch_begins,
                                                   on_epoch_end=lambda epoch, logs: time.sleep(pause_s))]
    model.fit(x, y, batch_size=12, epochs=EPOCHS, verbose=0, shuffle=True, callbacks=callbacks)
    return [v.numpy() for v in model.trainable_variables]


def sleepy(seconds):
    import time
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(0.02)
    return "slept"


def _wait_for(check, limit, what):
    end = time.monotonic() + limit
    while not check():
        assert time.monotonic() < end, f"waited {limit} s for {what}"
        time.sleep(0.02)


def test_a_worker_killed_during_a_background_run_is_restarted_and_weights_match(make_cluster, tmp_path):
    cluster = make_cluster(workers=2)
    clean = fl.distribute.run_with_recovery(cluster, train, str(tmp_path / "clean"), timeout=120)

    started = tmp_path / "epoch2"
    run = fl.distribute.run_with_recovery(cluster, train, str(tmp_path / "backup"), str(started), 0.3,
                                          timeout=120, wait=False)
    assert not run.done() and run.restarts == [] and run.state in ("running", "done")
    _wait_for(started.exists, 60, "worker 1 to begin epoch 2")
    old_pid = cluster.pid(1)
    cluster.kill(1)                                        # what the panel's Kill button calls
    _wait_for(lambda: len(run.restarts) == 1, 30, "the restart to show on the run")   # live, before the end
    results = run.result(timeout=120)
    assert run.done() and run.state == "done" and run.exception() is None
    [restart] = results.restarts
    assert restart.task == "/job:worker/task:1" and restart.pid == old_pid and "SIGKILL" in restart.reason
    assert cluster.pid(1) != old_pid
    for weights in results:
        for a, b in zip(clean[0], weights):
            np.testing.assert_array_equal(b, a)            # bit for bit the fault-free weights
    assert "1 restart(s)" in run._repr_html_() and "done" in repr(run)


def test_the_background_run_raises_what_the_blocking_one_would(make_cluster):
    cluster = make_cluster(workers=2)

    def broken():
        raise ValueError("a bug in train_fn")

    with pytest.raises(ValueError, match="a bug in train_fn") as blocking:
        fl.distribute.run_with_recovery(cluster, broken)
    run = fl.distribute.run_with_recovery(cluster, broken, wait=False)
    with pytest.raises(ValueError, match="a bug in train_fn") as background:
        run.result(timeout=30)
    assert isinstance(background.value, fl.cluster.RemoteError)            # the same kind of error, built
    assert type(background.value).__name__ == type(blocking.value).__name__   # for each raise
    assert run.state == "failed" and run.restarts == []
    with pytest.raises(TimeoutError, match="still running"):
        fl.distribute.run_with_recovery(cluster, sleepy, 2, wait=False).result(timeout=0.1)


def test_cancel_stops_the_work_on_every_worker(make_cluster):
    cluster = make_cluster(workers=2)
    run = fl.distribute.run_with_recovery(cluster, sleepy, 60, wait=False)
    time.sleep(0.5)
    t0 = time.monotonic()
    assert run.cancel() is True
    assert time.monotonic() - t0 < 10                      # not the 60 s the work would have taken
    assert run.cancelled() and run.done() and not run._thread.is_alive()
    with pytest.raises(CancelledError, match="cancelled"):
        run.result()
    t0 = time.monotonic()
    assert cluster.run(sleepy, 0) == ["slept", "slept"]    # nothing left running on the workers
    assert time.monotonic() - t0 < 5
    assert run.cancel() is False                           # already over


def test_closing_the_cluster_ends_a_background_run(make_cluster):
    cluster = make_cluster(workers=2)
    pids = [cluster.pid(t) for t in cluster.tasks]
    run = fl.distribute.run_with_recovery(cluster, sleepy, 60, max_restarts=5, wait=False)
    time.sleep(0.5)
    cluster.close()
    assert run.wait(15), "the run went on after its cluster closed"
    assert run.state == "failed" and run.restarts == []   # no restart tried on a closed cluster
    with pytest.raises(fl.cluster.ClusterError, match="cluster was closed"):
        run.result()
    assert not run._thread.is_alive()
    assert wait_gone(pids, 10) == []
    assert not [t for t in threading.enumerate() if t.name.startswith("flowlab-recovery")]


def test_a_worker_paused_during_a_background_run_is_replaced_and_the_reason_says_paused(make_cluster):
    cluster = make_cluster(workers=2)
    run = fl.distribute.run_with_recovery(cluster, sleepy, 2, wait=False)
    time.sleep(0.5)
    paused_pid = cluster.pid(1)
    cluster.pause(1)                                       # the panel's Pause button
    assert run.result(timeout=60) == ["slept", "slept"]
    [restart] = run.restarts
    assert restart.pid == paused_pid and "was paused (SIGSTOP)" in restart.reason, restart.reason
    assert cluster.status(1) == "alive" and cluster.pid(1) != paused_pid
