"""The tf.distribute names a tutorial reader types: fl.distribute.experimental (strategy aliases,
CommunicationImplementation / CollectiveCommunication, CommunicationOptions), cluster resolvers and
strategy.cluster_resolver, MultiWorkerMirroredStrategy reading TF_CONFIG / FLOWLAB_CONFIG, the
cross-device-ops classes, and TPUStrategy's refusal. The two-process TF_CONFIG training run is in
tests/process/test_distribute_tf_config.py."""
import json
import socket
import threading
import warnings

import numpy as np
import pytest

import flowlab as fl
from flowlab import distribute as ds
from flowlab.cluster.collectives import CollectiveTimeoutError, LocalGroup
from flowlab.distribute import collective_options
from flowlab.distribute import experimental as E
from _distribute_helpers import make_optimizer, mlp_error, mlp_variables, regression_data


@pytest.fixture
def env(monkeypatch):
    """No TF_CONFIG / FLOWLAB_CONFIG / cluster key from outside; ``env(cluster, type, index)`` sets TF_CONFIG."""
    for name in ("TF_CONFIG", "FLOWLAB_CONFIG", "FLOWLAB_CLUSTER_KEY", "FLOWLAB_CLUSTER_KEY_FILE"):
        monkeypatch.delenv(name, raising=False)

    def set_config(cluster, task_type=None, index=None, name="TF_CONFIG"):
        cfg = {"cluster": cluster}
        if task_type is not None:
            cfg["task"] = {"type": task_type, "index": index}
        monkeypatch.setenv(name, json.dumps(cfg))
    return set_config


@pytest.fixture
def fresh_notes(monkeypatch):
    """Forget which once-per-process notes were given."""
    monkeypatch.setattr(collective_options, "_noted", set())


# -- fl.distribute.experimental ------------------------------------------------------------------------
def test_experimental_names_are_the_strategies_and_enums():
    assert E.ParameterServerStrategy is ds.ParameterServerStrategy
    assert E.CentralStorageStrategy is ds.CentralStorageStrategy
    assert issubclass(E.MultiWorkerMirroredStrategy, ds.MultiWorkerMirroredStrategy)
    assert E.CollectiveCommunication is E.CommunicationImplementation
    assert [m.name for m in E.CommunicationImplementation] == ["AUTO", "RING", "NCCL"]
    with pytest.raises(AttributeError, match="fl.distribute.experimental has no 'Estimator'"):
        E.Estimator


def test_communication_options_map_onto_flowlab_algorithms_and_deadline(env, fresh_notes, hidden_gpus):
    ring = ds.MultiWorkerMirroredStrategy(communication_options=E.CommunicationOptions(
        implementation=E.CommunicationImplementation.RING, timeout_seconds=7))
    assert (ring.extended._algorithm, ring.extended._timeout) == ("ring", 7.0)
    auto = ds.MultiWorkerMirroredStrategy()
    assert (auto.extended._algorithm, auto.extended._timeout) == ("ring", 120.0)   # flowlab's defaults
    assert auto.communication_options == E.CommunicationOptions()
    with pytest.warns(UserWarning, match="NCCL is NVIDIA's library for GPUs.*ring all-reduce"):
        nccl = ds.MultiWorkerMirroredStrategy(communication_options=E.CommunicationOptions(
            implementation=E.CommunicationImplementation.NCCL))
    assert nccl.extended._algorithm == "ring"
    with warnings.catch_warnings():
        warnings.simplefilter("error")           # said once per process, not at every strategy
        ds.MultiWorkerMirroredStrategy(communication=E.CollectiveCommunication.NCCL)
    # the older spellings: communication=..., and TF 2.0's positional (communication, cluster_resolver)
    old = ds.MultiWorkerMirroredStrategy(communication=E.CollectiveCommunication.RING)
    assert old.communication_options.implementation is E.CommunicationImplementation.RING
    first = E.MultiWorkerMirroredStrategy(E.CollectiveCommunication.RING)
    assert first.communication_options.implementation is E.CommunicationImplementation.RING
    both = ds.MultiWorkerMirroredStrategy(E.CommunicationOptions(timeout_seconds=3), communication="ring")
    assert both.extended._timeout == 3.0 and both.communication_options.implementation.name == "RING"
    assert ds.MultiWorkerMirroredStrategy(timeout=9, communication_options=E.CommunicationOptions(
        timeout_seconds=3)).extended._timeout == 9.0          # flowlab's own timeout= wins


@pytest.mark.parametrize("kwargs, match", [
    ({"bytes_per_pack": -1}, "bytes_per_pack must be a whole number >= 0"),
    ({"timeout_seconds": 0}, "timeout_seconds must be a number of seconds > 0"),
    ({"implementation": "grpc"}, "unknown communication implementation 'grpc'"),
])
def test_communication_options_reject_bad_values(kwargs, match):
    with pytest.raises(ValueError, match=match):
        E.CommunicationOptions(**kwargs)


def test_strategy_arguments_of_the_wrong_kind_say_what_to_pass(env):
    with pytest.raises(TypeError, match="communication_options must be a fl.distribute.experimental"):
        ds.MultiWorkerMirroredStrategy(communication_options={"implementation": "RING"})
    with pytest.raises(TypeError, match="cluster_resolver must be a fl.distribute.cluster_resolver resolver"):
        ds.MultiWorkerMirroredStrategy(cluster_resolver="localhost:2222")


def test_timeout_seconds_is_the_collective_deadline():
    """Only rank 0 of two reduces: the call gives up after the options' deadline, naming rank 1."""
    group = LocalGroup(2)
    errors = []

    def rank0():
        s = ds.MultiWorkerMirroredStrategy(comm=group[0], communication_options=E.CommunicationOptions(
            timeout_seconds=0.5))
        try:
            s.reduce("sum", fl.constant([1.0, 2.0]))
        except CollectiveTimeoutError as e:
            errors.append(e)

    t = threading.Thread(target=rank0)
    t.start()
    t.join(30)
    group.close()
    assert errors and errors[0].waited == 0.5 and errors[0].missing == [1]


# -- cluster resolvers -----------------------------------------------------------------------------------
def test_tf_config_cluster_resolver_reads_the_variable_each_time(env):
    r = ds.cluster_resolver.TFConfigClusterResolver()
    assert (r.task_type, r.task_id, r.cluster_spec().as_dict(), r.master()) == (None, None, {}, "")
    env({"chief": ["localhost:2000"], "worker": ["localhost:2001", "localhost:2002"]}, "worker", 1)
    assert (r.task_type, r.task_id) == ("worker", 1)
    assert r.cluster_spec() == fl.cluster.ClusterSpec({"chief": ["localhost:2000"],
                                                       "worker": ["localhost:2001", "localhost:2002"]})
    assert r.master() == "localhost:2002" and r.master("chief", 0, rpc_layer="grpc") == "grpc://localhost:2000"
    assert r.variable() == "TF_CONFIG"
    r.task_type, r.task_id = "chief", 0                  # settable, as in TensorFlow
    assert r.master() == "localhost:2000"
    given = ds.cluster_resolver.TFConfigClusterResolver(environment={"FLOWLAB_CONFIG": json.dumps(
        {"cluster": {"worker": ["localhost:9"]}, "task": {"type": "worker", "index": 0}, "rpc_layer": "grpc"})})
    assert (given.task_type, given.task_id, given.master(), given.variable()) == \
        ("worker", 0, "grpc://localhost:9", "FLOWLAB_CONFIG")


def test_tf_config_and_flowlab_config_disagreeing_is_an_error(env):
    env({"worker": ["localhost:2001"]}, "worker", 0)
    env({"worker": ["localhost:3001"]}, "worker", 0, name="FLOWLAB_CONFIG")
    with pytest.raises(ValueError, match="TF_CONFIG and FLOWLAB_CONFIG are both set"):
        ds.cluster_resolver.TFConfigClusterResolver().cluster_spec()


def test_simple_cluster_resolver_and_left_out_resolvers():
    r = ds.cluster_resolver.SimpleClusterResolver(fl.cluster.ClusterSpec({"worker": ["localhost:1", "localhost:2"]}),
                                                  task_type="worker", task_id=1, rpc_layer="grpc")
    assert (r.task_type, r.task_id, r.master(), r.cluster_spec().num_tasks("worker")) == \
        ("worker", 1, "grpc://localhost:2", 2)
    assert ds.cluster_resolver.SimpleClusterResolver({}, master="grpc://h:1").master() == "grpc://h:1"
    with pytest.raises(AttributeError, match="deliberately leaves TPUs out.*TFConfigClusterResolver"):
        ds.cluster_resolver.TPUClusterResolver


def test_cluster_resolver_of_strategies(env):
    assert ds.MirroredStrategy(["/cpu:0"]).cluster_resolver is None
    alone = ds.MultiWorkerMirroredStrategy().cluster_resolver      # nothing set: TensorFlow's Nones
    assert isinstance(alone, ds.cluster_resolver.TFConfigClusterResolver) and alone.task_type is None
    env({"worker": ["localhost:2001"]}, "worker", 0)
    s = ds.MultiWorkerMirroredStrategy()
    assert s.num_replicas_in_sync == 1 and (s.cluster_resolver.task_type, s.cluster_resolver.task_id) == ("worker", 0)


# -- MultiWorkerMirroredStrategy from TF_CONFIG: what it refuses, and a peer that never comes --------------
@pytest.mark.parametrize("cluster, task, match", [
    ({"worker": ["localhost:2001"], "ps": ["localhost:2002"]}, ("worker", 0),
     "lists ps tasks.*ParameterServerStrategy"),
    ({"worker": ["localhost:2001", "localhost:2002"]}, (None, None), "does not say which one this process is"),
    ({"worker": ["localhost:2001", "localhost:2002"]}, ("chief", 0), "not a valid cluster configuration"),
])
def test_tf_config_the_strategy_cannot_run_is_explained(env, cluster, task, match):
    env(cluster, *task)
    with pytest.raises(ValueError, match=match):
        ds.MultiWorkerMirroredStrategy()


def test_an_evaluator_runs_alone(env):
    env({"worker": ["localhost:2001", "localhost:2002"]}, "evaluator", 0)
    assert ds.MultiWorkerMirroredStrategy().num_replicas_in_sync == 1


def test_group_order_puts_the_chief_first():
    from flowlab.distribute._worker_group import place
    spec = fl.cluster.ClusterSpec({"worker": ["localhost:2", "localhost:3"], "chief": ["localhost:1"]})
    members, rank = place(spec, "worker", 0, "TF_CONFIG")
    assert members == [("chief", 0), ("worker", 0), ("worker", 1)] and rank == 1


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_missing_peer_is_named_and_the_address_is_freed(env):
    mine, theirs = _free_port(), _free_port()
    env({"worker": [f"localhost:{mine}", f"localhost:{theirs}"]}, "worker", 0)
    with pytest.raises(TimeoutError, match=rf"/job:worker/task:0 waited 1 s for /job:worker/task:1 at "
                                           rf"localhost:{theirs}.*Start that task too"):
        ds.MultiWorkerMirroredStrategy(connect_timeout=1)
    with socket.socket() as s:           # this process stopped serving its address again
        # SO_REUSEADDR: a closed connection in TIME_WAIT may hold the port; a listener still would not
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", mine))
        s.listen()


def test_a_cluster_across_machines_needs_a_key(env):
    env({"worker": ["localhost:2001", "10.1.2.3:2001"]}, "worker", 0)
    with pytest.raises(ValueError, match="spans machines \\(10.1.2.3:2001\\).*FLOWLAB_CLUSTER_KEY"):
        ds.MultiWorkerMirroredStrategy(connect_timeout=1)


def test_parameter_server_strategy_says_what_it_takes(env):
    with pytest.raises(TypeError, match="takes the cluster itself in flowlab: a fl.cluster.LocalCluster"):
        ds.ParameterServerStrategy(ds.cluster_resolver.TFConfigClusterResolver())


# -- cross-device ops ----------------------------------------------------------------------------------------
def _train(strategy, steps=3):
    x, y = regression_data()
    with strategy.scope():
        variables = mlp_variables()
        optimizer = make_optimizer("adam")
    dist = strategy.experimental_distribute_dataset(fl.data.Dataset.from_tensor_slices((x, y)).batch(12))

    def step_fn(inputs):
        xb, yb = inputs
        with fl.GradientTape() as tape:
            err = mlp_error(variables, xb, yb)
            loss = ds.compute_average_loss(fl.reduce_sum(err * err, axis=1), global_batch_size=12)
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return loss

    for _ in range(steps):
        for batch in dist:
            strategy.run(step_fn, args=(batch,))
    return [v.numpy() for v in variables]


@pytest.mark.parametrize("make, algorithm", [
    (ds.NcclAllReduce, "ring"), (ds.HierarchicalCopyAllReduce, "tree"), (ds.ReductionToOneDevice, "naive")])
def test_cross_device_ops_train_like_one_replica(cpus, fresh_notes, make, algorithm):
    ref = _train(ds.MirroredStrategy(["/cpu:0"]))
    cpus(3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")          # NcclAllReduce's note (tested below)
        strategy = ds.MirroredStrategy(cross_device_ops=make())
    assert strategy.num_replicas_in_sync == 3 and strategy.extended._algorithm == algorithm
    for a, b in zip(ref, _train(strategy)):
        np.testing.assert_allclose(b, a, rtol=2e-5, atol=2e-6)


def test_cross_device_ops_reduce_per_replica_values():
    per = ds.PerReplica([fl.constant([1.0, 2.0]), fl.constant([3.0, 4.0]), fl.constant([5.0, 9.0])])
    for ops in (ds.HierarchicalCopyAllReduce(), ds.ReductionToOneDevice()):
        assert ops.reduce(ds.ReduceOp.SUM, per).numpy().tolist() == [9.0, 15.0]
        assert ops.reduce("mean", per).numpy().tolist() == [3.0, 5.0]
        assert [t.numpy().tolist() for t in ops.batch_reduce("sum", [(per, None), (per, None)])] == [[9.0, 15.0]] * 2


def test_nccl_all_reduce_says_once_what_runs_instead(fresh_notes, hidden_gpus):
    with pytest.warns(UserWarning, match="NcclAllReduce: NCCL is NVIDIA's library for GPUs.*ring all-reduce"):
        ds.NcclAllReduce()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ds.NcclAllReduce(num_packs=2)


def test_cross_device_ops_mistakes_are_explained():
    with pytest.raises(TypeError, match=r"write NcclAllReduce\(\) with parentheses"):
        ds.MirroredStrategy(["/cpu:0"], cross_device_ops=ds.NcclAllReduce)
    with pytest.raises(TypeError, match="cross_device_ops must be one of"):
        ds.MirroredStrategy(["/cpu:0"], cross_device_ops="nccl")
    with pytest.raises(ValueError, match="num_packs must be a whole number >= 0"):
        ds.HierarchicalCopyAllReduce(num_packs=-1)
    with pytest.raises(ValueError, match="leave accumulation_fn unset"):
        ds.ReductionToOneDevice(accumulation_fn=lambda xs: xs[0])


# -- TPUs -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("cls", [ds.TPUStrategy, E.TPUStrategy])
def test_tpu_strategy_says_flowlab_leaves_tpus_out(cls):
    with pytest.raises(NotImplementedError, match="deliberately leaves TPUs out.*MirroredStrategy.*"
                                                  "MultiWorkerMirroredStrategy"):
        cls()
