"""The copy rule without a GPU: an op runs on one device and its inputs are copied there first
(flowlab/core/backends/__init__.py), for eager ops, graph plans, variable assigns and optimizer
updates; reading a value into numpy copies it back.

A GPU is simulated by a second device whose arrays (``DeviceArray``, tests/unit/_simgpu.py) behave
as CuPy's do where it matters here: they refuse to be mixed with numpy arrays in one operation
(``Unsupported type <class 'numpy.ndarray'>``) and to become numpy arrays implicitly. It stands in
for CuPy, not for any part of flowlab: the ``gpus`` fixture (conftest.py) puts it in the GPU
backend's place, and flowlab's own dispatch, placement and plans run unchanged. Every case here failed with CuPy on a real H100 before the rule existed;
tests/gpu/test_gpu_devices.py runs the same cases there.
"""
import numpy as np
import pytest
from _simgpu import DeviceArray

import flowlab as fl
from flowlab import distribute as ds
from flowlab.core import backends


def _on_gpu(t, index=0):
    assert t.device.endswith(f"GPU:{index}"), t.device
    assert isinstance(t._value, DeviceArray), type(t._value)


def test_the_simulated_device_refuses_mixing_as_cupy_does(gpus):
    a = gpus.put(np.ones(2, np.float32), 0)
    with pytest.raises(TypeError, match="Unsupported type"):
        a * np.float32(2) + np.ones(2, np.float32)
    with pytest.raises(TypeError, match="Implicit conversion"):
        np.asarray(a)


def test_an_eager_op_copies_a_python_float_and_a_host_tensor_to_the_gpu(gpus):
    with fl.device("/gpu:0"):
        w = fl.Variable([1.0, 2.0])
    _on_gpu(w)
    y = w * 2.0 + fl.constant([1.0, 1.0])      # a Python float and a host tensor next to a GPU one
    _on_gpu(y)
    assert y.numpy().tolist() == [3.0, 5.0]     # .numpy() copies back to the host
    assert np.asarray(y).tolist() == [3.0, 5.0]
    assert float(fl.reduce_sum(y)) == 8.0


def test_a_cpu_scope_copies_gpu_inputs_to_the_host(gpus):
    with fl.device("/gpu:0"):
        w = fl.Variable([1.0, 2.0])
    with fl.device("/cpu:0"):
        y = w * np.ones(2, np.float32)
    assert y.device.endswith("CPU:0") and type(y._value) is np.ndarray
    assert y.numpy().tolist() == [1.0, 2.0]


def test_variable_assigns_copy_host_values_to_the_variables_device(gpus):
    with fl.device("/gpu:0"):
        v = fl.Variable([1.0, 2.0])
    v.assign(np.array([3.0, 4.0], np.float32))
    _on_gpu(v)
    v.assign_add([1.0, 1.0])
    v.assign_sub(fl.constant([0.5, 0.5]))
    _on_gpu(v)
    assert v.numpy().tolist() == [3.5, 4.5]
    host = fl.Variable([0.0, 0.0])              # a host variable given a GPU value stays on the host
    host.assign_add(v)
    assert type(host._value) is np.ndarray and host.numpy().tolist() == [3.5, 4.5]


@pytest.mark.parametrize("opt", ["sgd", "adam"])
def test_an_eager_optimizer_step_copies_a_host_gradient(gpus, opt):
    with fl.device("/gpu:0"):
        w = fl.Variable([1.0, 2.0])
    o = fl.optimizers.SGD(0.1, momentum=0.9) if opt == "sgd" else fl.optimizers.Adam(0.1)
    o.apply_gradients([(np.array([1.0, 1.0], np.float32), w)])
    _on_gpu(w)
    ref = fl.Variable([1.0, 2.0])
    (fl.optimizers.SGD(0.1, momentum=0.9) if opt == "sgd" else fl.optimizers.Adam(0.1)).apply_gradients(
        [(np.array([1.0, 1.0], np.float32), ref)])
    np.testing.assert_allclose(w.numpy(), ref.numpy())


def test_a_graph_with_a_host_constant_runs_on_the_gpu_and_says_so(gpus):
    with fl.device("/gpu:0"):
        w = fl.Variable(np.arange(4, dtype=np.float32))

    @fl.function
    def f(x):
        return fl.reduce_sum(w * 2.0 + x * np.float32(3.0)) + 1.0

    out = f(fl.constant(np.ones(4, np.float32)))
    assert float(out) == 25.0
    _on_gpu(out)                                # the label is true: its value lives on the GPU


def test_a_graph_with_an_explicit_cpu_scope_over_a_gpu_variable(gpus):
    fl.config.set_logical_devices("GPU", 2)
    with fl.device("/gpu:1"):
        w = fl.Variable(fl.ones([2]), name="w")

    @fl.function
    def f():
        with fl.device("/cpu:0"):
            return w * 2.0

    out = f()
    assert out.numpy().tolist() == [2.0, 2.0] and out.device.endswith("CPU:0")


@pytest.mark.parametrize("opt", ["sgd", "adam"])
def test_a_traced_training_step_updates_a_gpu_variable_with_a_host_batch(gpus, opt):
    x = np.arange(12, dtype=np.float32).reshape(4, 3) / 10
    y = np.ones((4, 1), np.float32)

    def train(device):
        with fl.device(device):
            w = fl.Variable(np.full((3, 1), 0.5, np.float32))
        o = fl.optimizers.SGD(0.1, momentum=0.9) if opt == "sgd" else fl.optimizers.Adam(0.05)

        @fl.function
        def step(xb, yb):
            with fl.GradientTape() as tape:
                loss = fl.reduce_mean((fl.matmul(xb, w) - yb) ** 2)
            o.apply_gradients(zip(tape.gradient(loss, [w]), [w]))
            return loss

        losses = [float(step(fl.constant(x), fl.constant(y))) for _ in range(3)]
        return w, losses

    w, losses = train("/gpu:0")
    _on_gpu(w)
    ref, ref_losses = train("/cpu:0")
    np.testing.assert_allclose(w.numpy(), ref.numpy(), rtol=1e-6)
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-6)


def test_mirrored_over_the_gpu_trains_like_the_cpu(gpus):
    assert ds.MirroredStrategy().extended.worker_devices[0].upper().endswith("GPU:0")   # TF's default: the GPUs
    x = np.arange(24, dtype=np.float32).reshape(8, 3) / 10
    y = np.ones((8, 1), np.float32)

    def fit(strategy):
        with strategy.scope():
            model = fl.keras.Sequential([fl.keras.layers.Dense(1, kernel_initializer="ones")])
            model.compile(optimizer=fl.optimizers.SGD(0.1), loss="mse")
        history = model.fit(x, y, batch_size=4, epochs=2, verbose=0, shuffle=False)
        return model.get_weights(), history.history["loss"]

    weights, losses = fit(ds.MirroredStrategy(["/gpu:0"]))
    ref, ref_losses = fit(ds.MirroredStrategy(["/cpu:0"]))
    for a, b in zip(weights, ref):
        np.testing.assert_allclose(a, b, rtol=1e-6)
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-6)


def test_hiding_the_gpus_the_tensorflow_way(gpus):
    assert len(fl.config.list_logical_devices("GPU")) == 1
    fl.config.set_visible_devices([], "GPU")
    assert fl.config.list_logical_devices("GPU") == [] and fl.config.get_visible_devices("GPU") == []
    assert len(fl.config.list_physical_devices("GPU")) == 1          # the machine still has it
    fl.config.set_logical_devices("CPU", 2)
    assert ds.MirroredStrategy().num_replicas_in_sync == 2
    with pytest.raises(fl.errors.InvalidArgumentError, match="no device .*GPU:0"):
        with fl.device("/gpu:0"):
            fl.constant(1.0) + 1.0
    fl.config.set_visible_devices(fl.config.list_physical_devices("GPU"), "GPU")
    assert len(fl.config.list_logical_devices("GPU")) == 1


def test_set_visible_devices_refuses_what_it_cannot_do():
    with pytest.raises(ValueError, match="the CPU cannot be hidden"):
        fl.config.set_visible_devices([], "CPU")
    with pytest.raises(ValueError, match=r"GPU:7.* are not among this machine's GPU devices"):
        fl.config.set_visible_devices(fl.config.PhysicalDevice("/physical_device:GPU:7", "GPU"))
    with pytest.raises(ValueError, match=r"pass devices from fl.config.list_physical_devices\('GPU'\)"):
        fl.config.set_visible_devices(["/gpu:0"], "GPU")
    with pytest.raises(ValueError, match="device_type must be"):
        fl.config.set_visible_devices([], "TPU")


def test_without_a_gpu_kernels_are_returned_as_they_are(hidden_gpus):
    """The all-CPU path (no GPU, or all hidden): no wrapper around any kernel, so no copy check costs anything."""
    from flowlab.core.execute import get_op
    op = get_op("multiply")
    assert backends.visible_gpus() == ()
    assert backends.kernel_for_device(op, None) is op.kernel
    assert backends.kernel_for_device(op, "/job:localhost/replica:0/task:0/device:CPU:0") is op.kernel


def test_mirrored_over_two_logical_gpus_trains_like_the_cpu(gpus):
    fl.config.set_logical_devices("GPU", 2)
    x = np.arange(24, dtype=np.float32).reshape(8, 3) / 10
    y = np.ones((8, 1), np.float32)

    def fit(strategy):
        with strategy.scope():
            model = fl.keras.Sequential([fl.keras.layers.Dense(1, kernel_initializer="ones")])
            model.compile(optimizer=fl.optimizers.Adam(0.05), loss="mse")
        return model, model.fit(x, y, batch_size=4, epochs=2, verbose=0, shuffle=False).history["loss"]

    model, losses = fit(ds.MirroredStrategy())
    assert model.trainable_variables[0]._value.__class__ is DeviceArray   # the weights stay on the GPU
    ref, ref_losses = fit(ds.MirroredStrategy(["/cpu:0"]))
    for a, b in zip(model.get_weights(), ref.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-6)
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-6)


def test_an_error_with_a_gpu_input_names_the_op_the_device_and_the_line(gpus):
    with fl.device("/gpu:0"):
        a = fl.ones([2, 3])
    with pytest.raises(fl.errors.InvalidArgumentError) as e:
        fl.matmul(a, fl.ones([2, 3]))
    msg = str(e.value)
    assert msg.startswith("matmul") and "float32[2,3] on GPU:0, float32[2,3]" in msg
    assert "test_device_copies.py" in msg


def test_memory_info_counts_what_the_gpu_holds_and_its_peak(gpus):
    fl.config.experimental.reset_memory_stats("GPU:0")
    base = fl.config.experimental.get_memory_info("GPU:0")
    with fl.device("/gpu:0"):
        big = fl.zeros([256, 256])                # 256 KiB of float32
        held = fl.config.experimental.get_memory_info("GPU:0")
        assert held["current"] - base["current"] >= 256 * 256 * 4
        del big
    after = fl.config.experimental.get_memory_info("GPU:0")
    assert after["current"] < held["current"] and after["peak"] >= held["current"]
    fl.config.experimental.reset_memory_stats("GPU:0")
    assert fl.config.experimental.get_memory_info("GPU:0")["peak"] == after["current"]
    with pytest.raises(ValueError, match="memory is counted for GPUs"):
        fl.config.experimental.get_memory_info("CPU:0")


def test_each_copy_between_memories_is_an_event_with_its_bytes(gpus):
    log = fl.core.events.default_log()
    since = fl.core.events.now()
    x = fl.constant(np.ones((4, 8), np.float32))
    with fl.device("/gpu:0"):
        y = x * 2.0                               # x (128 bytes) and 2.0 (4 bytes) go to the GPU
    y.numpy()                                     # and 128 bytes come back
    copies = [(e.name, e.bytes, e.attrs["src"], e.attrs["dst"]) for e in log.events("copy", since=since)]
    assert ("to GPU", 128, "CPU:0", "GPU:0") in copies and ("to host", 128, "GPU:0", "CPU:0") in copies
    assert len(copies) == gpus.copies


def test_without_a_gpu_a_gpu_scope_says_why_and_what_to_do(hidden_gpus):
    with pytest.raises(fl.errors.InvalidArgumentError) as e:
        with fl.device("/gpu:0"):
            fl.constant(1.0) + 1.0
    msg = str(e.value)
    assert "has no GPU: " in msg and "logical GPUs run on the CPU" in msg
    assert 'fl.config.set_logical_devices("GPU", 1)' in msg
    assert "test_device_copies.py" in msg
