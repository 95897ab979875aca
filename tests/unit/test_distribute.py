"""Distribution strategies in one process: replicas on logical CPU devices, exactness against one
replica, PerReplica plumbing, reductions and distributed datasets."""
import numpy as np
import pytest

import flowlab as fl
from flowlab import distribute as ds
from _distribute_helpers import make_optimizer, mlp_error, mlp_variables, regression_data


def _train(strategy, steps=5, opt="sgd", global_batch=12):
    x, y = regression_data()
    with strategy.scope():
        variables = mlp_variables()
        optimizer = make_optimizer(opt)
    dataset = fl.data.Dataset.from_tensor_slices((x, y)).batch(global_batch)
    dist = strategy.experimental_distribute_dataset(dataset)

    def step_fn(inputs):
        xb, yb = inputs
        with fl.GradientTape() as tape:
            err = mlp_error(variables, xb, yb)
            loss = ds.compute_average_loss(fl.reduce_sum(err * err, axis=1), global_batch_size=global_batch)
        grads = tape.gradient(loss, variables)
        optimizer.apply_gradients(zip(grads, variables))
        return loss

    losses = []
    for _ in range(steps):
        for batch in dist:
            per = strategy.run(step_fn, args=(batch,))
            losses.append(float(strategy.reduce(ds.ReduceOp.SUM, per, axis=None).numpy()))
    return [v.numpy() for v in variables], losses


@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize("opt", ["sgd", "adam"])
def test_mirrored_matches_one_replica(cpus, n, opt):
    cpus(n)
    ref, ref_losses = _train(ds.MirroredStrategy(["/cpu:0"]), opt=opt)
    strategy = ds.MirroredStrategy()
    assert strategy.num_replicas_in_sync == n
    got, losses = _train(strategy, opt=opt)
    for a, b in zip(ref, got):
        np.testing.assert_allclose(b, a, rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(losses, ref_losses, rtol=2e-5, atol=1e-6)
    assert losses[-2] < losses[0]       # it trained (the same batch, four steps later)


@pytest.mark.parametrize("n", [2, 4])
def test_central_storage_matches_one_replica(cpus, n):
    cpus(n)
    ref, _ = _train(ds.MirroredStrategy(["/cpu:0"]))
    got, _ = _train(ds.CentralStorageStrategy())
    for a, b in zip(ref, got):
        np.testing.assert_allclose(b, a, rtol=2e-5, atol=2e-6)


def test_run_gives_each_replica_its_shard_and_context(cpus):
    cpus(3)
    s = ds.MirroredStrategy()
    batch = next(iter(s.experimental_distribute_dataset(fl.data.Dataset.range(7).batch(7))))
    assert isinstance(batch, ds.PerReplica) and len(batch.values) == 3

    def fn(x):
        ctx = ds.get_replica_context()
        return ctx.replica_id_in_sync_group, x.numpy().tolist(), ctx.all_reduce("sum", fl.constant(1.0)).numpy()

    out = s.run(fn, args=(batch,)).values
    assert [o[0] for o in out] == [0, 1, 2]
    assert sum((o[1] for o in out), []) == list(range(7))   # every example once, in order
    assert all(o[2] == 3.0 for o in out)


def test_reduce_sum_mean_and_axis(cpus):
    cpus(2)
    s = ds.MirroredStrategy()
    per = ds.PerReplica([fl.constant([1.0, 2.0, 3.0]), fl.constant([5.0])])
    assert s.reduce("sum", ds.PerReplica([fl.constant(2.0), fl.constant(3.0)]), axis=None).numpy() == 5.0
    assert s.reduce(ds.ReduceOp.MEAN, ds.PerReplica([fl.constant(2.0), fl.constant(3.0)]), axis=None).numpy() == 2.5
    assert s.reduce(ds.ReduceOp.SUM, per, axis=0).numpy() == 11.0
    assert s.reduce(ds.ReduceOp.MEAN, per, axis=0).numpy() == pytest.approx(11.0 / 4)
    with pytest.raises(ValueError, match="unknown reduction"):
        s.reduce("max", per, axis=None)


def test_datasets_from_function(cpus):
    cpus(2)
    s = ds.MirroredStrategy()
    seen = []

    def dataset_fn(ctx):
        seen.append(ctx)
        return fl.data.Dataset.range(8).batch(ctx.get_per_replica_batch_size(4))

    batches = [[v.numpy().tolist() for v in b.values] for b in s.distribute_datasets_from_function(dataset_fn)]
    assert batches == [[[0, 1], [2, 3]], [[4, 5], [6, 7]]]
    assert (seen[0].num_input_pipelines, seen[0].input_pipeline_id, seen[0].num_replicas_in_sync) == (1, 0, 2)
    with pytest.raises(ValueError, match="cannot be split evenly"):
        seen[0].get_per_replica_batch_size(5)


def test_a_failing_replica_raises_its_own_error_and_nothing_hangs(cpus):
    cpus(3)
    s = ds.MirroredStrategy()
    v = fl.Variable([1.0])
    opt = fl.optimizers.SGD(0.1)

    def fn():
        if ds.get_replica_context().replica_id_in_sync_group == 1:
            raise KeyError("replica one broke")
        opt.apply_gradients([(fl.constant([1.0]), v)])

    with pytest.raises(KeyError, match="replica one broke"):
        s.run(fn)


def test_scope_and_contexts(cpus):
    cpus(2)
    s = ds.CentralStorageStrategy()
    assert not ds.has_strategy()
    with s.scope():
        assert ds.get_strategy() is s and ds.in_cross_replica_context()
        v = fl.Variable([1.0])
    assert "CPU:0" in str(v.device)
    assert ds.get_strategy().num_replicas_in_sync == 1


def test_function_inside_the_replica_fn_matches_eager(cpus):
    """@fl.function on the forward pass and gradients, apply_gradients eagerly: same weights as one
    replica without any function."""
    x = np.arange(24, dtype=np.float32).reshape(6, 4) / 10
    y = np.ones((6, 1), np.float32)

    def train(strategy, traced):
        with strategy.scope():
            w = fl.Variable(np.ones((4, 1), np.float32))
            opt = fl.optimizers.SGD(0.1)

        def grads(xb, yb):
            with fl.GradientTape() as tape:
                loss = ds.compute_average_loss(fl.reduce_sum((fl.matmul(xb, w) - yb) ** 2, axis=1),
                                               global_batch_size=6)
            return loss, tape.gradient(loss, [w])
        grads = fl.function(grads) if traced else grads

        def step(batch):
            loss, g = grads(*batch)
            opt.apply_gradients(zip(g, [w]))
            return loss

        dist = strategy.experimental_distribute_dataset(fl.data.Dataset.from_tensor_slices((x, y)).batch(6))
        for _ in range(3):
            for b in dist:
                strategy.run(step, args=(b,))
        return w.numpy()

    ref = train(ds.MirroredStrategy(["/cpu:0"]), traced=False)
    cpus(3)
    np.testing.assert_allclose(train(ds.MirroredStrategy(), traced=True), ref, rtol=1e-5, atol=1e-6)


def test_apply_gradients_traced_under_run_says_what_to_do(cpus):
    cpus(2)
    s = ds.MirroredStrategy()
    w = fl.Variable([1.0])
    opt = fl.optimizers.SGD(0.1)

    @fl.function
    def step():
        opt.apply_gradients([(fl.constant([1.0]), w)])
        return w.read_value()

    with pytest.raises(NotImplementedError, match="apply_gradients outside it"):
        s.run(step)


def test_multi_worker_alone_is_one_replica():
    s = ds.MultiWorkerMirroredStrategy()
    assert s.num_replicas_in_sync == 1
    with s.scope():
        v = fl.Variable([2.0])
        opt = fl.optimizers.SGD(0.5)
    s.run(lambda: opt.apply_gradients([(fl.constant([2.0]), v)]))
    assert v.numpy().tolist() == [1.0]
    assert s.reduce("mean", fl.constant([1.0, 3.0]), axis=0).numpy() == 2.0
