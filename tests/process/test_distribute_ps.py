"""ParameterServerStrategy on a real LocalCluster with ps tasks: variables placed on the ps,
steps scheduled on workers, asynchronous updates, staleness observable."""
import numpy as np
import pytest

import flowlab as fl
from flowlab import distribute as ds

pytestmark = pytest.mark.process


def _data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(32, 3)).astype(np.float32)
    return x, (x @ np.array([[1.0], [-2.0], [0.5]], np.float32)).astype(np.float32)


def _setup(strategy):
    with strategy.scope():
        w = fl.Variable(np.zeros((3, 1), np.float32), name="w")
        b = fl.Variable(np.zeros(1, np.float32), name="b")
        opt = fl.optimizers.SGD(0.1, momentum=0.5)     # state kept on the ps tasks between steps

    def step(xb, yb):
        with fl.GradientTape() as tape:
            loss = fl.reduce_mean((fl.matmul(xb, w) + b - yb) ** 2)
        opt.apply_gradients(zip(tape.gradient(loss, [w, b]), [w, b]))
        return loss
    return w, b, step, opt


def test_one_worker_is_sequential_sgd_and_never_stale():
    x, y = _data()
    with fl.cluster.LocalCluster(workers=1, ps=2) as cluster:
        strategy = ds.ParameterServerStrategy(cluster)
        w, b, step, opt = _setup(strategy)
        assert {strategy.placement(w), strategy.placement(b)} == {"/job:ps/task:0", "/job:ps/task:1"}
        coordinator = ds.ClusterCoordinator(strategy)
        losses = [coordinator.schedule(step, args=(x[i:i + 8], y[i:i + 8])) for i in range(0, 32, 8)]
        coordinator.join(timeout=120)
        got = [float(r.fetch()) for r in losses]
        stale = strategy.staleness()
        strategy.pull()
        steps = int(opt.iterations.numpy())
    rw, rb = fl.Variable(np.zeros((3, 1), np.float32)), fl.Variable(np.zeros(1, np.float32))
    ref_opt = fl.optimizers.SGD(0.1, momentum=0.5)
    ref = []
    for i in range(0, 32, 8):
        with fl.GradientTape() as tape:
            loss = fl.reduce_mean((fl.matmul(x[i:i + 8], rw) + rb - y[i:i + 8]) ** 2)
        ref_opt.apply_gradients(zip(tape.gradient(loss, [rw, rb]), [rw, rb]))
        ref.append(float(loss))
    np.testing.assert_allclose(got, ref, rtol=1e-5)
    np.testing.assert_allclose(w.numpy(), rw.numpy(), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(b.numpy(), rb.numpy(), rtol=1e-5, atol=1e-7)
    assert stale == [0] * 8          # 4 steps x 2 variables, each read right before its own push
    assert steps == 4                # the step counter on the ps task counted every step


def test_two_workers_train_asynchronously():
    x, y = _data()
    with fl.cluster.LocalCluster(workers=2, ps=1) as cluster:
        strategy = ds.ParameterServerStrategy(cluster)
        w, b, step, opt = _setup(strategy)
        coordinator = ds.ClusterCoordinator(strategy)
        first = coordinator.schedule(step, args=(x, y)).fetch(120)
        results = [coordinator.schedule(step, args=(x[i:i + 8], y[i:i + 8])) for _ in range(5) for i in range(0, 32, 8)]
        coordinator.join(timeout=180)
        last = coordinator.schedule(step, args=(x, y)).fetch(120)
        stale = strategy.staleness()
    assert len(results) == 20 and coordinator.done()
    assert last < first / 4                         # it trained
    assert len(stale) == 2 * 22 and min(stale) >= 0 and max(stale) <= 21
