"""What a ParameterServerStrategy worker sends with its pushes: the pickled optimizer once per
ps task (per worker process), then only gradients; a ps task that no longer holds the optimizer
asks for it again and training goes on."""
import numpy as np
import pytest

import flowlab as fl
from flowlab import distribute as ds

pytestmark = pytest.mark.process


def _data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(32, 3)).astype(np.float32)
    return x, (x @ np.array([[1.0], [-2.0], [0.5]], np.float32)).astype(np.float32)


def _setup(strategy, momentum):
    with strategy.scope():
        w = fl.Variable(np.zeros((3, 1), np.float32), name="w")
        b = fl.Variable(np.zeros(1, np.float32), name="b")
        opt = fl.optimizers.SGD(0.1, momentum=momentum)

    def step(xb, yb):
        with fl.GradientTape() as tape:
            loss = fl.reduce_mean((fl.matmul(xb, w) + b - yb) ** 2)
        opt.apply_gradients(zip(tape.gradient(loss, [w, b]), [w, b]))
        return loss
    return w, b, step


def _stats(cluster, strategy):
    return [cluster.client.request(t, "ps_stats", timeout=60).body for t in strategy.parameter_devices]


def _forget_optimizers():
    from flowlab.cluster.server import current_server
    current_server().state("flowlab.distribute.parameter_server").optimizers.clear()


@pytest.mark.parametrize("workers", [1, 2])
def test_the_optimizer_travels_once_per_worker_and_ps_task(workers):
    x, y = _data()
    with fl.cluster.LocalCluster(workers=workers, ps=2) as cluster:
        strategy = ds.ParameterServerStrategy(cluster)
        w, b, step = _setup(strategy, momentum=0.5)
        coordinator = ds.ClusterCoordinator(strategy)
        for _ in range(2):
            for i in range(0, 32, 8):
                coordinator.schedule(step, args=(x[i:i + 8], y[i:i + 8]))
        coordinator.join(timeout=120)
        stats = _stats(cluster, strategy)
    for s in stats:      # each ps task holds one of the two variables: every step pushed to both
        assert s["pushes"] == 8
        assert 1 <= s["with_optimizer"] <= workers
        assert s["optimizer_loads"] == 1


def test_a_ps_task_that_forgot_the_optimizer_gets_it_again():
    x, y = _data()
    with fl.cluster.LocalCluster(workers=1, ps=1) as cluster:
        strategy = ds.ParameterServerStrategy(cluster)
        w, b, step = _setup(strategy, momentum=0.0)     # no slots: forgetting loses no state
        coordinator = ds.ClusterCoordinator(strategy)
        for i in range(0, 16, 8):
            coordinator.schedule(step, args=(x[i:i + 8], y[i:i + 8]))
        coordinator.join(timeout=120)
        cluster.call(strategy.parameter_devices[0], _forget_optimizers, timeout=60)
        for i in range(16, 32, 8):
            coordinator.schedule(step, args=(x[i:i + 8], y[i:i + 8]))
        coordinator.join(timeout=120)
        (stats,) = _stats(cluster, strategy)
    assert stats["pushes"] == 4 and stats["optimizer_loads"] == 2 and stats["with_optimizer"] == 2
    rw, rb = fl.Variable(np.zeros((3, 1), np.float32)), fl.Variable(np.zeros(1, np.float32))
    ref = fl.optimizers.SGD(0.1)
    for i in range(0, 32, 8):
        with fl.GradientTape() as tape:
            loss = fl.reduce_mean((fl.matmul(x[i:i + 8], rw) + rb - y[i:i + 8]) ** 2)
        ref.apply_gradients(zip(tape.gradient(loss, [rw, rb]), [rw, rb]))
    np.testing.assert_allclose(w.numpy(), rw.numpy(), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(b.numpy(), rb.numpy(), rtol=1e-5, atol=1e-7)
