"""Remote eager execution on real worker processes: ops under fl.device("/job:worker/task:N") run on
that task, return handles, equal the local results, and move data task to task directly."""
import gc

import numpy as np
import pytest

import flowlab as fl
from flowlab.cluster.remote import RemoteTensor
from flowlab.core.device import RemoteDeviceError

pytestmark = pytest.mark.process


def stored(cluster, task):
    return cluster.client.request(task, "stats").body["stored"]


def test_an_op_placed_on_a_task_runs_there_and_returns_a_handle(cluster):
    x = fl.constant([[1.0, 2.0], [3.0, 4.0]])
    cluster.events(clear=True)
    with fl.device("/job:worker/task:1"):
        y = fl.matmul(x, x)
    assert isinstance(y, RemoteTensor) and y.task == "/job:worker/task:1"
    assert y.device == "/job:worker/replica:0/task:1/device:CPU:0"
    assert y.shape == (2, 2) and y.dtype == fl.float32
    np.testing.assert_array_equal(y.numpy(), fl.matmul(x, x).numpy())
    ops = [(e.task, e.name) for e in cluster.events() if e.kind == "op"]
    assert ops == [("/job:worker/task:1", "matmul")]


def test_remote_results_equal_local_ones_for_a_chain_of_ops(cluster):
    rng = np.random.RandomState(0)
    a = fl.constant(rng.standard_normal((4, 3)).astype(np.float32))
    b = fl.constant(rng.standard_normal((3, 5)).astype(np.float32))

    def program():
        h = fl.nn.relu(fl.matmul(a, b) + 0.5)
        return fl.reduce_sum(h * h, axis=1), fl.reduce_max(h)

    local = [t.numpy() for t in program()]
    with fl.device("/job:worker/task:0"):
        remote = program()
    assert all(isinstance(t, RemoteTensor) for t in remote)
    for r, want in zip(remote, local):
        np.testing.assert_array_equal(r.numpy(), want)


def test_ops_follow_a_handle_and_pull_inputs_from_the_task_that_holds_them(cluster):
    x = fl.constant(np.arange(6, dtype=np.float32))
    with fl.device("/job:worker/task:1"):
        y = x * 10.0
    z = y + 1.0                              # no scope: runs where y is
    assert isinstance(z, RemoteTensor) and z.task == "/job:worker/task:1"
    cluster.events(clear=True)
    with fl.device("/job:worker/task:0"):
        w = z * y                            # both inputs on task 1: task 0 pulls them from task 1
    assert w.task == "/job:worker/task:0"
    np.testing.assert_array_equal(w.numpy(), (x * 10.0 + 1.0).numpy() * (x * 10.0).numpy())
    evs = cluster.events()
    sends = {(e.task, e.attrs["peer"], e.bytes) for e in evs if e.kind == "send"}
    recvs = {(e.task, e.attrs["peer"], e.bytes) for e in evs if e.kind == "recv"}
    assert ("/job:worker/task:1", "/job:worker/task:0", 24) in sends         # worker to worker
    assert ("/job:worker/task:0", "/job:worker/task:1", 24) in recvs
    assert all(peer != "client" for _, peer, _ in recvs)


def test_an_op_placed_here_fetches_its_remote_inputs(cluster):
    x = fl.constant([1.0, 2.0])
    with fl.device("/job:worker/task:1"):
        y = x + 1.0
    with fl.device("/job:localhost"):
        z = y * 2.0
    assert type(z) is fl.Tensor
    np.testing.assert_array_equal(z.numpy(), [4.0, 6.0])
    assert float(fl.reduce_sum(y).numpy()) == 5.0 and float(y[1]) == 3.0


def test_a_tape_differentiates_ops_on_tasks_and_ops_here_on_their_results(cluster):
    w = fl.Variable([[1.0, 2.0], [3.0, -4.0]])
    x = fl.constant([[0.5, -1.0], [2.0, 1.0]])
    b = fl.constant([0.25, -0.5])

    def program(task0, task1):
        with fl.device(task0):
            h = fl.tanh(fl.matmul(x, w))
        with fl.device(task1):                # pulled from task 0 by task 1
            y = h * 2.0 + b
        with fl.device(None):
            return fl.reduce_sum(y * y)       # here: follows y to task 1

    with fl.GradientTape(persistent=True) as tape:
        tape.watch(b)
        want = program(None, None)
    local = tape.gradient(want, [w, b])
    with fl.GradientTape(persistent=True) as tape:
        tape.watch(b)
        got = program("/job:worker/task:0", "/job:worker/task:1")
        with fl.device("/job:localhost"):
            here = got * 3.0                  # an op here on a remote input
    assert isinstance(got, RemoteTensor)
    for g, want_g in zip(tape.gradient(got, [w, b]), local):
        np.testing.assert_allclose(g.numpy(), want_g.numpy(), rtol=1e-6)
    np.testing.assert_allclose(tape.gradient(here, w).numpy(), 3.0 * local[0].numpy(), rtol=1e-6)
    with fl.device("/job:worker/task:1"):
        other = x + 1.0
    zero = tape.gradient(got, other, unconnected_gradients="zero")
    assert zero.device == other.device and zero.numpy().tolist() == [[0.0, 0.0], [0.0, 0.0]]


def test_handles_free_remote_memory_when_collected(cluster):
    task = "/job:worker/task:1"
    x = fl.constant(np.ones(1000, np.float32))
    with fl.device(task):
        keep = x + 0.0
        before = stored(cluster, task)
        handles = [x * float(i) for i in range(20)]
    assert stored(cluster, task) == before + 20
    del handles
    gc.collect()
    with fl.device(task):
        keep = keep + 1.0                    # the forgotten keys travel with the next op
    assert stored(cluster, task) <= before + 1
    assert keep.numpy()[0] == 2.0


def test_bad_input_names_the_op_the_shapes_the_task_and_the_line(cluster):
    a, b = fl.ones([2, 3]), fl.ones([2, 3])
    with fl.device("/job:worker/task:1"):
        with pytest.raises(fl.errors.InvalidArgumentError) as info:
            fl.matmul(a, b)
    msg = str(info.value)
    assert "matmul" in msg and "float32[2,3]" in msg and "/job:worker/task:1" in msg
    assert "test_remote_eager.py" in msg and "fl.matmul(a, b)" in msg


def test_a_kernel_failure_on_the_task_names_the_task_and_the_line(cluster):
    x = fl.constant([1.0, 2.0, 3.0, 4.0])
    with fl.device("/job:worker/task:0"):
        y = x + 0.0
    with pytest.raises(fl.errors.InvalidArgumentError) as info:
        fl.reshape(y, [3])
    msg = str(info.value)
    assert "reshape" in msg and "/job:worker/task:0" in msg and "fl.reshape(y, [3])" in msg


def test_a_remote_gpu_without_one_fails_clearly(cluster):
    x = fl.constant([1.0])
    with fl.device("/job:worker/task:1/gpu:0"):
        with pytest.raises(fl.errors.InvalidArgumentError) as info:
            x + 1.0
    assert "/job:worker/task:1 has no device:GPU:0" in str(info.value)


def test_an_unknown_task_is_a_clear_error(cluster):
    x = fl.constant([1.0])
    with fl.device("/job:worker/task:7"):
        with pytest.raises(RemoteDeviceError, match=r"no open cluster has the task /job:worker/task:7"):
            x + 1.0
