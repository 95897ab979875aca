"""``strategy.run`` and ``strategy.reduce`` inside ``@fl.function`` for the strategies of one process
(MirroredStrategy and CentralStorageStrategy on logical CPU devices): the traced custom loop ends
with the weights of the eager loop and of one replica, traces once, puts each replica on its
device, and names the replica in its errors."""
import numpy as np
import pytest

import flowlab as fl
from flowlab import distribute as ds
from _distribute_helpers import GLOBAL_BATCH, make_optimizer, mlp_loss, mlp_variables, regression_data


def _train(strategy, traced, opt="sgd", epochs=3, rows=24):
    """The custom loop of the lessons, traced or eager: (final weights, per-step losses, the step)."""
    x, y = regression_data(rows)
    with strategy.scope():
        variables = mlp_variables()
        optimizer = make_optimizer(opt)
    dist = strategy.experimental_distribute_dataset(fl.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH))

    def step_fn(inputs):
        xb, yb = inputs
        with fl.GradientTape() as tape:
            loss = mlp_loss(variables, xb, yb)
        grads = tape.gradient(loss, variables)
        optimizer.apply_gradients(zip(grads, variables))
        return loss

    def train_step(batch):
        per_replica = strategy.run(step_fn, args=(batch,))
        return strategy.reduce(ds.ReduceOp.SUM, per_replica, axis=None)

    if traced:
        train_step = fl.function(train_step)
    losses = [float(train_step(batch)) for _ in range(epochs) for batch in dist]
    return [v.numpy() for v in variables], losses, train_step


def _strategy(kind, n):
    if n == 1:
        return ds.MirroredStrategy(["/cpu:0"])
    return ds.MirroredStrategy() if kind == "mirrored" else ds.CentralStorageStrategy()


@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize("kind", ["mirrored", "central"])
@pytest.mark.parametrize("opt", ["sgd", "adam"])
def test_traced_loop_matches_eager_and_one_replica(cpus, n, kind, opt):
    cpus(n)
    traced, traced_losses, step = _train(_strategy(kind, n), traced=True, opt=opt)
    eager, eager_losses, _ = _train(_strategy(kind, n), traced=False, opt=opt)
    one, one_losses, _ = _train(_strategy(kind, 1), traced=True, opt=opt)
    assert step.experimental_get_tracing_count() == 1        # six steps, one trace
    for t, e, o in zip(traced, eager, one):
        if n == 2:   # a sum of two is the same in any order: the same bits as the eager all-reduce
            np.testing.assert_array_equal(t, e)
        np.testing.assert_allclose(t, e, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(t, o, rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(traced_losses, eager_losses, rtol=1e-6)
    np.testing.assert_allclose(traced_losses, one_losses, rtol=2e-5, atol=1e-6)
    assert traced_losses[-2] < traced_losses[0]    # it trained (the same batch, two epochs later)


def test_a_short_last_batch_traces_once_more_not_every_step(cpus):
    cpus(3)
    traced, _, step = _train(ds.MirroredStrategy(), traced=True, rows=30, epochs=4)   # batches 12, 12, 6
    eager, _, _ = _train(ds.MirroredStrategy(), traced=False, rows=30, epochs=4)
    assert step.experimental_get_tracing_count() == 2
    for t, e in zip(traced, eager):
        np.testing.assert_allclose(t, e, rtol=1e-6, atol=1e-7)


def test_the_graph_places_each_replica_and_updates_once(cpus):
    cpus(3)
    _, _, step = _train(ds.MirroredStrategy(), traced=True, epochs=1)
    (concrete,) = step._cache.values()
    nodes = concrete.graph.nodes
    matmuls = {n.device for n in nodes if n.op.name == "matmul" and n.name.startswith("replica_")}
    assert {str(d)[-5:] for d in matmuls} == {"CPU:0", "CPU:1", "CPU:2"}
    for i in range(3):      # each replica's forward matmuls are on its own device
        assert all(str(n.device).endswith(f"CPU:{i}") for n in nodes
                   if n.name.startswith(f"replica_{i}/") and n.op.name == "matmul")
    sums = [n for n in nodes if n.name.startswith("all_reduce/") and n.op.name == "add"]
    assert len(sums) == 3 * 2        # three variables, each a sum of three replicas' gradients
    assert len([n for n in nodes if n.op.name == "optimizer_update"]) == 3    # one update per variable
    assert len([n for n in nodes if n.op.name == "optimizer_advance"]) == 1


def test_central_storage_sums_and_updates_on_the_cpu(cpus):
    cpus(2)
    _, _, step = _train(ds.CentralStorageStrategy(["/cpu:1", "/cpu:0"]), traced=True, epochs=1)
    (concrete,) = step._cache.values()
    for n in concrete.graph.nodes:
        if n.name.startswith("all_reduce/"):
            assert str(n.device).endswith("CPU:0"), (n.name, n.device)


def _toy(strategy):
    with strategy.scope():
        w = fl.Variable(np.ones((3, 1), np.float32))
        opt = fl.optimizers.SGD(0.1)
    return w, opt


def test_per_replica_arguments_are_fed_and_results_come_out(cpus):
    cpus(2)
    s = ds.MirroredStrategy()

    @fl.function
    def double(batch):
        return s.run(lambda x: x * 2.0, args=(batch,))

    a = ds.PerReplica([fl.constant([1.0, 2.0]), fl.constant([3.0])])
    b = ds.PerReplica([fl.constant([5.0, 6.0]), fl.constant([7.0])])
    out_a, out_b = double(a), double(b)
    assert isinstance(out_a, ds.PerReplica)
    assert [v.numpy().tolist() for v in out_a.values] == [[2.0, 4.0], [6.0]]
    assert [v.numpy().tolist() for v in out_b.values] == [[10.0, 12.0], [14.0]]   # fed, not baked in
    assert double.experimental_get_tracing_count() == 1
    double(ds.PerReplica([fl.constant([1.0]), fl.constant([3.0, 4.0])]))        # other per-replica shapes
    assert double.experimental_get_tracing_count() == 2


@pytest.mark.parametrize("op,axis", [("sum", None), ("mean", None), ("sum", 0), ("mean", 0)])
def test_traced_reduce_matches_eager(cpus, op, axis):
    cpus(3)
    s = ds.MirroredStrategy()
    per = ds.PerReplica([fl.constant(np.arange(k, k + 4, dtype=np.float32).reshape(2, 2) / 3) for k in range(3)])
    eager = s.reduce(op, per, axis=axis)
    traced = fl.function(lambda v: s.reduce(op, v, axis=axis))(per)
    np.testing.assert_allclose(traced.numpy(), eager.numpy(), rtol=1e-6)
    assert traced.dtype == eager.dtype


def test_an_error_while_tracing_names_the_replica(cpus):
    cpus(3)
    s = ds.MirroredStrategy()

    def fn(x):
        if ds.get_replica_context().replica_id_in_sync_group == 2:
            return fl.matmul(x, fl.ones([4, 1]))        # wrong inner size in replica 2 only
        return x

    batch = ds.PerReplica([fl.ones([2, 3]), fl.ones([2, 3]), fl.ones([2, 3])])
    with pytest.raises(fl.errors.InvalidArgumentError) as info:
        fl.function(lambda b: s.run(fn, args=(b,)))(batch)
    assert "in replica 2 of 3" in "\n".join(getattr(info.value, "__notes__", []))


def test_an_error_while_running_names_the_replica(cpus):
    cpus(2)
    s = ds.MirroredStrategy()
    table = fl.constant(np.arange(10, dtype=np.float32))
    step = fl.function(lambda idx: s.run(lambda i: fl.gather(table, i), args=(idx,)))
    ok = ds.PerReplica([fl.constant([1, 2]), fl.constant([3, 4])])
    assert [v.numpy().tolist() for v in step(ok).values] == [[1.0, 2.0], [3.0, 4.0]]
    bad = ds.PerReplica([fl.constant([1, 2]), fl.constant([3, 40])])    # out of range in replica 1
    with pytest.raises(fl.errors.InvalidArgumentError, match="replica_1/gather"):
        step(bad)


def test_replica_all_reduce_inside_a_trace_is_refused_with_a_way_out(cpus):
    cpus(2)
    s = ds.MirroredStrategy()
    fn = fl.function(lambda b: s.run(lambda x: ds.get_replica_context().all_reduce("sum", x), args=(b,)))
    with pytest.raises(NotImplementedError, match="strategy.reduce"):
        fn(ds.PerReplica([fl.ones([2]), fl.ones([2])]))


def test_replicas_must_make_the_same_apply_gradients_calls(cpus):
    cpus(2)
    s = ds.MirroredStrategy()
    w, opt = _toy(s)

    def fn(x):
        if ds.get_replica_context().replica_id_in_sync_group == 0:
            with fl.GradientTape() as tape:
                loss = fl.reduce_sum(fl.matmul(x, w))
            opt.apply_gradients([(tape.gradient(loss, w), w)])
        return x

    with pytest.raises(ValueError, match="different numbers of apply_gradients"):
        fl.function(lambda b: s.run(fn, args=(b,)))(ds.PerReplica([fl.ones([2, 3]), fl.ones([2, 3])]))


def test_a_traced_apply_inside_an_eager_run_explains_what_to_do(cpus):
    cpus(2)
    s = ds.MirroredStrategy()
    w, opt = _toy(s)

    @fl.function
    def inner(x):
        with fl.GradientTape() as tape:
            loss = fl.reduce_sum(fl.matmul(x, w))
        return opt.apply_gradients([(tape.gradient(loss, w), w)])

    with pytest.raises(NotImplementedError, match="around the whole step"):
        s.run(inner, args=(ds.PerReplica([fl.ones([2, 3]), fl.ones([2, 3])]),))


def test_per_replica_holds_its_components_but_does_not_unpack_like_a_pair():
    p = ds.PerReplica([1, 2])
    assert p.values == (1, 2) and len(p) == 2
    assert "PerReplica" in repr(p)
    with pytest.raises(TypeError):
        x, y = p          # a distributed (x, y) batch must not silently give replica 0 and replica 1
    import pickle
    q = pickle.loads(pickle.dumps(p))
    assert type(q) is ds.PerReplica and q.values == (1, 2)


def test_reading_an_updated_variable_after_apply_is_refused_not_stale(cpus):
    cpus(2)
    s = ds.MirroredStrategy()
    w, opt = _toy(s)

    def fn(x):
        with fl.GradientTape() as tape:
            loss = fl.reduce_sum(fl.matmul(x, w))
        opt.apply_gradients([(tape.gradient(loss, w), w)])
        return fl.reduce_sum(w)          # eagerly: the updated w, in every replica

    with pytest.raises(NotImplementedError, match="replica 0 reads .* after apply_gradients"):
        fl.function(lambda b: s.run(fn, args=(b,)))(ds.PerReplica([fl.ones([2, 3]), fl.ones([2, 3])]))
