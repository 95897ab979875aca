"""Where graph nodes and variables are placed: explicit scope, then colocation with the variable
an op reads or updates, then the first placed input (as eager ops do), then the default CPU."""
import numpy as np
import pytest

import flowlab as fl
from flowlab.core.device import RemoteDeviceError
from flowlab.core.interpreters import Interpreter

GPU1 = "/job:localhost/replica:0/task:0/device:GPU:1"


@pytest.fixture(autouse=True)
def two_logical_gpus():
    fl.config.set_logical_devices("GPU", 2)
    yield
    fl.config.set_logical_devices("GPU", None)


def _devices(concrete):
    return {n.name: (n.device.to_string() if n.device else "") for n in concrete.graph.nodes}


def test_a_variable_lives_on_the_device_of_its_scope():
    with fl.device("/gpu:1"):
        w = fl.Variable(fl.ones([2, 2]))
    plain = fl.Variable(fl.ones([2]))
    assert w.device.endswith("device:GPU:1")
    assert plain.device.endswith("device:CPU:0")
    assert (fl.ones([3, 2]) @ w).device.endswith("device:GPU:1")   # eager: first placed input


def test_graph_ops_colocate_with_their_variable_and_follow_placed_inputs():
    with fl.device("/gpu:1"):
        w = fl.Variable(fl.ones([2, 2]), name="w")
    opt = fl.optimizers.SGD(0.1)

    @fl.function
    def step(x):
        with fl.GradientTape() as tape:
            loss = fl.reduce_sum(x @ w)
        opt.apply_gradients([(tape.gradient(loss, w), w)])
        return loss

    x = fl.ones([3, 2])
    assert float(step(x)) == 12.0
    devices = _devices(step.get_concrete_function(x))
    assert devices["w"].endswith("GPU:1")                 # the read, colocated
    assert devices["matmul"].endswith("GPU:1")            # follows its placed input
    assert devices["optimizer_update"].endswith("GPU:1")  # the update, colocated
    assert devices["arg0"] == ""                          # the argument itself is not placed


def test_an_explicit_scope_wins_over_colocation():
    with fl.device("/gpu:1"):
        w = fl.Variable(fl.ones([2]), name="w")

    @fl.function
    def f():
        with fl.device("/cpu:0"):
            return w * 2.0

    devices = _devices(f.get_concrete_function())
    assert devices["w"].endswith("CPU:0") and devices["multiply"].endswith("CPU:0")
    assert f().numpy().tolist() == [2.0, 2.0]


def test_a_node_on_a_missing_device_fails_when_the_function_is_compiled():
    @fl.function
    def f(x):
        with fl.device("/gpu:5"):
            return x * 2.0

    with pytest.raises(fl.InvalidArgumentError, match="no device .*GPU:5"):
        f(fl.ones([2]))


def test_a_node_on_another_task_is_refused_not_run_locally():
    @fl.function
    def f(x):
        with fl.device("/job:worker/task:1"):
            return x * 2.0

    with pytest.raises(RemoteDeviceError, match="needs a cluster"):
        f(fl.ones([2]))


def test_tensors_made_in_a_scope_live_on_its_device():
    with fl.device("/gpu:1"):
        made = {"constant": fl.constant([1.0, 2.0]), "zeros": fl.zeros([2]), "ones": fl.ones([2]),
                "range": fl.range(3), "fill": fl.fill([2], 3.0), "random": fl.random.normal([2]),
                "uniform": fl.random.uniform([2])}
    assert {k: t.device for k, t in made.items()} == {k: GPU1 for k in made}
    outside = fl.constant([1.0])
    assert outside.device.endswith("CPU:0")
    with fl.device("/gpu:1"):
        assert fl.constant(outside) is outside          # no new tensor: the caller's stays put
    with fl.device("/gpu:7"), pytest.raises(fl.errors.InvalidArgumentError, match="no device"):
        fl.zeros([2])


# -- the remote interpreter (flowlab.cluster registers one while a cluster is open) ---------------
class _Recorder(Interpreter):
    """An interpreter that records what core handed it and answers with a plain local tensor."""

    def __init__(self):
        self.calls = []

    def process(self, op, inputs, attrs, device):
        self.calls.append((op.name, device, len(inputs)))
        return fl.Tensor(np.asarray(-1.0, np.float32))


@pytest.fixture
def recorder():
    from flowlab.core.device import set_remote_interpreter
    r = _Recorder()
    set_remote_interpreter(r)
    yield r
    set_remote_interpreter(None)


def test_an_op_placed_on_another_task_goes_to_the_registered_interpreter(recorder):
    x = fl.constant([1.0, 2.0])
    with fl.device("/job:worker/task:1"):
        out = x + 1.0
    assert out.numpy() == -1.0
    assert recorder.calls == [("add", "/job:worker/replica:0/task:1/device:CPU:0", 2)]


def test_local_ops_never_reach_the_remote_interpreter(recorder):
    x = fl.constant([1.0, 2.0])
    with fl.device("/gpu:1"):
        y = x * 2.0
    z = x + 1.0                      # the fast path
    with fl.device("/job:localhost/task:0"):
        w = z - 1.0
    assert recorder.calls == []
    assert y.numpy().tolist() == [2.0, 4.0] and w.numpy().tolist() == [1.0, 2.0]


def test_without_a_remote_interpreter_the_plain_error_remains():
    from flowlab.core.device import remote_interpreter
    assert remote_interpreter() is None
    x = fl.constant([1.0])
    with fl.device("/job:worker/task:1"), pytest.raises(RemoteDeviceError, match="needs a cluster") as info:
        x + 1.0
    assert "test_placement.py" in str(info.value)
