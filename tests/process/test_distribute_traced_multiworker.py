"""``strategy.run`` inside ``@fl.function`` across real LocalCluster worker processes: under
MultiWorkerMirroredStrategy the gradient all-reduce is a node of the traced graph (a collective
that runs each time the graph runs), and the traced loop ends with the eager loop's weights and
with one process's; ParameterServerStrategy refuses a traced step with a clear error."""
import numpy as np
import pytest

import flowlab as fl
from flowlab import distribute as ds
from _distribute_helpers import GLOBAL_BATCH, mlp_loss, mlp_variables, reference_weights, regression_data

pytestmark = pytest.mark.process


def _train(traced, seed=1, epochs=3):
    import flowlab as fl
    from flowlab import distribute as ds
    strategy = ds.MultiWorkerMirroredStrategy()
    x, y = regression_data()
    with strategy.scope():
        variables = mlp_variables(seed + strategy.worker_index)   # different on each worker: scope() syncs them
        opt = fl.optimizers.Adam(0.01)
    dist = strategy.experimental_distribute_dataset(fl.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH))

    def step_fn(inputs):
        with fl.GradientTape() as tape:
            loss = mlp_loss(variables, inputs[0], inputs[1])
        opt.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return loss

    def train_step(batch):
        return strategy.reduce(ds.ReduceOp.SUM, strategy.run(step_fn, args=(batch,)), axis=None)

    if traced:
        train_step = fl.function(train_step)
    losses = [float(train_step(batch)) for _ in range(epochs) for batch in dist]
    info = None
    if traced:
        (concrete,) = train_step._cache.values()
        info = (train_step.experimental_get_tracing_count(),
                [n.op.name for n in concrete.graph.nodes if n.op.name == "allreduce"])
    return strategy.num_replicas_in_sync, [v.numpy() for v in variables], losses, info


def train_both():
    """The traced loop, then the eager one, on fresh variables, in this worker."""
    return _train(traced=True), _train(traced=False)


@pytest.mark.parametrize("n", [2, 3])
def test_traced_multi_worker_loop_matches_eager_and_one_process(n):
    ref = reference_weights()
    with fl.cluster.LocalCluster(workers=n) as cluster:
        results = cluster.run(train_both, timeout=240)
    for (replicas, traced, traced_losses, info), (_, eager, eager_losses, _) in results:
        assert replicas == n
        traces, collectives = info
        assert traces == 1                              # six steps, one trace
        assert collectives == ["allreduce"] * 2   # the gradients' and the loss's
        for t, e, r in zip(traced, eager, ref):
            np.testing.assert_array_equal(t, e)         # the same collective on the same arrays: same bits
            np.testing.assert_allclose(t, r, rtol=2e-5, atol=2e-6)
        assert traced_losses == eager_losses
    assert all(r[0][2] == results[0][0][2] for r in results)    # every worker reports the same global loss


def test_parameter_server_refuses_a_traced_step_clearly():
    x, y = regression_data()
    with fl.cluster.LocalCluster(workers=1, ps=1) as cluster:
        strategy = ds.ParameterServerStrategy(cluster)
        with strategy.scope():
            w = fl.Variable(np.zeros((5, 1), np.float32), name="w")
            opt = fl.optimizers.SGD(0.1)

        def step_fn(xb, yb):
            with fl.GradientTape() as tape:
                loss = fl.reduce_mean((fl.matmul(xb, w) - yb) ** 2)
            opt.apply_gradients([(tape.gradient(loss, w), w)])
            return loss

        @fl.function
        def traced_step(xb, yb):
            return strategy.run(step_fn, args=(xb, yb))

        coordinator = ds.ClusterCoordinator(strategy)
        result = coordinator.schedule(traced_step, args=(x[:8], y[:8]))
        with pytest.raises(Exception, match="ClusterCoordinator.schedule") as info:
            result.fetch(timeout=120)
        assert "ParameterServerStrategy" in str(info.value)
        ok = ds.ClusterCoordinator(strategy).schedule(step_fn, args=(x[:8], y[:8]))   # an eager step still works
        assert np.isfinite(float(ok.fetch(timeout=120)))


def traced_step_without_peer():
    """Worker 1 never steps: worker 0's traced step fails in its all-reduce, within the deadline."""
    import flowlab as fl
    from flowlab import distribute as ds
    from flowlab.cluster.collectives import CollectiveError
    strategy = ds.MultiWorkerMirroredStrategy(timeout=4)
    with strategy.scope():
        variables = mlp_variables(1)
        opt = fl.optimizers.SGD(0.1)
    if strategy.worker_index == 1:
        return None

    def step_fn(xb, yb):
        with fl.GradientTape() as tape:
            loss = mlp_loss(variables, xb, yb)
        opt.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return loss

    train_step = fl.function(lambda xb, yb: strategy.run(step_fn, args=(xb, yb)))
    x, y = regression_data()
    try:
        train_step(x[:6], y[:6])
    except CollectiveError as e:
        return type(e).__name__, e.op, list(e.missing), str(e), "\n".join(getattr(e, "__notes__", []))
    return "no error"


def test_a_missing_peer_fails_the_traced_step_with_a_collective_error():
    with fl.cluster.LocalCluster(workers=2) as cluster:
        got, none = cluster.run(traced_step_without_peer, timeout=120)
    assert none is None
    name, op, missing, message, notes = got
    assert name in ("CollectiveTimeoutError", "PeerLostError"), got
    assert op == "allreduce" and missing == [1], got
    assert "worker 0 of 2" in notes


def reduce_both_ways():
    """strategy.reduce of a worker-dependent value, eager and traced, for each op and axis."""
    import flowlab as fl
    from flowlab import distribute as ds
    strategy = ds.MultiWorkerMirroredStrategy()
    value = fl.constant(np.arange(6, dtype=np.float32).reshape(3, 2) * (strategy.worker_index + 1) / 7)
    out = []
    for op in ("sum", "mean"):
        for axis in (None, 0):
            eager = strategy.reduce(op, value, axis=axis).numpy()
            traced = fl.function(lambda v, op=op, axis=axis: strategy.reduce(op, v, axis=axis))(value).numpy()
            out.append((op, axis, eager, traced))
    return out


def test_traced_reduce_across_workers_matches_eager():
    with fl.cluster.LocalCluster(workers=2) as cluster:
        results = cluster.run(reduce_both_ways, timeout=120)
    base = np.arange(6, dtype=np.float32).reshape(3, 2) / 7
    want = {("sum", None): base * 3, ("mean", None): base * 1.5, ("sum", 0): (base * 3).sum(0),
            ("mean", 0): (base * 3).sum(0) / 6}
    for worker in results:
        for op, axis, eager, traced in worker:
            np.testing.assert_array_equal(traced, eager)
            np.testing.assert_allclose(traced, want[op, axis], rtol=1e-6)
