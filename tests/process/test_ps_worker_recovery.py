"""Parameter-server training goes on when a worker dies: the ClusterCoordinator runs the dead
worker's steps again on the survivors, gives the dead worker nothing more, and gives it work again
once cluster.restart brings it back. Real LocalCluster processes; the worker kills itself mid-step
(before its push), so every scheduled step pushes exactly once."""
import logging

import numpy as np
import pytest

import flowlab as fl
from flowlab import distribute as ds

pytestmark = pytest.mark.process


def test_a_dead_workers_step_runs_elsewhere_and_the_restarted_worker_gets_work(make_cluster, tmp_path, caplog):
    cluster = make_cluster(workers=2, ps=1)
    strategy = ds.ParameterServerStrategy(cluster)
    with strategy.scope():
        v = fl.Variable(np.zeros(1, np.float32), name="count")
        opt = fl.optimizers.SGD(1.0)
    doomed, marker = cluster.pid(1), str(tmp_path / "died")

    def step():
        import os
        import time
        if os.getpid() == doomed and not os.path.exists(marker):     # the first step on worker 1
            open(marker, "w").close()
            os._exit(7)
        with fl.GradientTape() as tape:
            loss = -fl.reduce_sum(v)                                 # gradient -1: each push adds 1
        opt.apply_gradients(zip(tape.gradient(loss, [v]), [v]))
        time.sleep(0.05)
        return os.getpid()

    coordinator = ds.ClusterCoordinator(strategy)
    with caplog.at_level(logging.WARNING, logger="flowlab.distribute"):
        first = [coordinator.schedule(step) for _ in range(8)]
        coordinator.join(timeout=120)
    pids = [r.fetch() for r in first]
    assert coordinator.rescheduled >= 1 and coordinator.done()
    assert set(pids) == {cluster.pid(0)}             # every step ran, the dead worker's on worker 0
    assert float(v.numpy()[0]) == 8.0                # each step pushed once: nothing lost
    assert cluster.status(1) == "dead"
    logged = [r.getMessage() for r in caplog.records if r.name == "flowlab.distribute"]
    assert logged and "/job:worker/task:1" in logged[0] and "exit code 7" in logged[0]

    more = [coordinator.schedule(step) for _ in range(3)]       # still only worker 0 while 1 is dead
    coordinator.join(timeout=120)
    assert {r.fetch() for r in more} == {cluster.pid(0)}

    cluster.restart(1)
    again = [coordinator.schedule(step) for _ in range(8)]
    coordinator.join(timeout=120)
    assert {r.fetch() for r in again} == {cluster.pid(0), cluster.pid(1)}   # the restarted worker got work
    assert float(v.numpy()[0]) == 19.0


def test_no_live_worker_is_a_clear_error(make_cluster):
    cluster = make_cluster(workers=1, ps=1)
    strategy = ds.ParameterServerStrategy(cluster)
    coordinator = ds.ClusterCoordinator(strategy)
    cluster.kill(0)

    def step():
        return 1

    value = coordinator.schedule(step)
    with pytest.raises(RuntimeError, match=r"no worker is alive.*cluster\.restart"):
        value.fetch(60)


def test_fit_under_parameter_servers_goes_on_when_a_worker_is_killed(make_cluster):
    """Worker 1 is SIGKILLed from a callback in epoch 1; fit runs every epoch on worker 0."""
    from _distribute_helpers import regression_data
    cluster = make_cluster(workers=2, ps=1)
    strategy = ds.ParameterServerStrategy(cluster)
    with strategy.scope():
        model = fl.keras.Sequential([fl.keras.Input(shape=(5,)), fl.keras.layers.Dense(1)])
        model.compile(optimizer=fl.optimizers.SGD(0.05), loss="mse")
    x, y = regression_data(48)

    def kill_in_epoch_1(batch, logs):
        if kill_in_epoch_1.epoch == 1 and batch == 1:
            cluster.kill(1)
    kill_in_epoch_1.epoch = 0

    def note_epoch(epoch, logs):
        kill_in_epoch_1.epoch = epoch
    history = model.fit(x, y, batch_size=6, epochs=3, verbose=0, callbacks=[fl.keras.callbacks.LambdaCallback(
        on_epoch_begin=note_epoch, on_train_batch_end=kill_in_epoch_1)])
    assert history.epoch == [0, 1, 2]
    assert history.history["loss"][-1] < history.history["loss"][0]
    assert cluster.status(1) == "dead"
