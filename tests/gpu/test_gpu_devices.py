"""The copy rule on a real GPU: an op runs on one device and its inputs are copied there first
(Python floats, numpy constants, host tensors and gradients included); ``.numpy()`` copies back.
Each case here failed on an H100 with CuPy before the rule (CuPy refuses numpy inputs:
``Unsupported type <class 'numpy.ndarray'>``, ``Implicit conversion to a NumPy array is not allowed``).
tests/unit/test_device_copies.py checks the same rule without a GPU. Skipped where no CUDA device is visible."""
import numpy as np
import pytest

import flowlab as fl
from flowlab import distribute as ds

pytestmark = pytest.mark.gpu



def _on_gpu(t, cp, index=0):
    assert t.device.endswith(f"GPU:{index}"), t.device
    assert isinstance(t._value, cp.ndarray), type(t._value)


def test_a_gpu_variable_times_a_python_float(cp):
    with fl.device("/gpu:0"):
        w = fl.Variable([1.0, 2.0])
    _on_gpu(w, cp)
    y = w * 2.0 + fl.constant([1.0, 1.0])
    _on_gpu(y, cp)
    assert y.numpy().tolist() == [3.0, 5.0]
    assert np.asarray(y).tolist() == [3.0, 5.0]
    with fl.device("/cpu:0"):
        z = w * np.float32(3.0)
    assert z.device.endswith("CPU:0") and type(z._value) is np.ndarray and z.numpy().tolist() == [3.0, 6.0]


def test_numpy_of_a_gpu_tensor_is_a_host_copy(cp):
    t = fl.convert_to_tensor(cp.arange(4, dtype=cp.float32))
    _on_gpu(t, cp)
    out = t.numpy()
    assert type(out) is np.ndarray and out.tolist() == [0.0, 1.0, 2.0, 3.0]
    assert float(fl.reduce_sum(t)) == 6.0


def test_assigns_copy_host_values_to_a_gpu_variable(cp):
    with fl.device("/gpu:0"):
        v = fl.Variable([1.0, 2.0])
    v.assign(np.array([3.0, 4.0], np.float32))
    v.assign_add([1.0, 1.0])
    v.assign_sub(fl.constant([0.5, 0.5]))
    _on_gpu(v, cp)
    assert v.numpy().tolist() == [3.5, 4.5]


@pytest.mark.parametrize("opt", ["sgd", "adam"])
def test_an_optimizer_step_with_a_gpu_variable_and_a_host_gradient(cp, opt):
    def make():
        return fl.optimizers.SGD(0.1, momentum=0.9) if opt == "sgd" else fl.optimizers.Adam(0.1)
    with fl.device("/gpu:0"):
        w = fl.Variable([1.0, 2.0])
    ref = fl.Variable([1.0, 2.0])
    for _ in range(2):
        make().apply_gradients([(np.array([1.0, 1.0], np.float32), w)])
        make().apply_gradients([(np.array([1.0, 1.0], np.float32), ref)])
    _on_gpu(w, cp)
    np.testing.assert_allclose(w.numpy(), ref.numpy(), rtol=1e-6)


def test_a_graph_with_a_host_constant_on_the_gpu(cp):
    with fl.device("/gpu:0"):
        w = fl.Variable(np.arange(4, dtype=np.float32))

    @fl.function
    def f(x):
        return fl.reduce_sum(w * 2.0 + x * np.float32(3.0)) + 1.0

    out = f(fl.constant(np.ones(4, np.float32)))
    assert float(out) == 25.0
    _on_gpu(out, cp)


def test_an_explicit_cpu_scope_over_a_gpu_variable_in_a_graph(cp):
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
def test_a_traced_training_step_on_the_gpu_matches_the_cpu(cp, opt):
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

        return w, [float(step(fl.constant(x), fl.constant(y))) for _ in range(3)]

    w, losses = train("/gpu:0")
    _on_gpu(w, cp)
    ref, ref_losses = train("/cpu:0")
    np.testing.assert_allclose(w.numpy(), ref.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("devices", [["/gpu:0"], ["/gpu:0", "/gpu:1"]])
def test_mirrored_fit_over_gpus_matches_the_cpu(cp, devices):
    fl.config.set_logical_devices("GPU", len(devices))
    assert ds.MirroredStrategy().extended.worker_devices[0].upper().endswith("GPU:0")   # TF's default
    x = np.arange(24, dtype=np.float32).reshape(8, 3) / 10
    y = np.ones((8, 1), np.float32)

    def fit(strategy):
        with strategy.scope():
            model = fl.keras.Sequential([fl.keras.layers.Dense(1, kernel_initializer="ones")])
            model.compile(optimizer=fl.optimizers.SGD(0.1), loss="mse")
        history = model.fit(x, y, batch_size=4, epochs=2, verbose=0, shuffle=False)
        return model, history.history["loss"]

    model, losses = fit(ds.MirroredStrategy(devices))
    ref, ref_losses = fit(ds.MirroredStrategy(["/cpu:0"]))
    for a, b in zip(model.get_weights(), ref.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5, atol=1e-6)


def test_hiding_the_gpu_puts_mirrored_on_the_cpus(cp):
    visible = fl.config.get_visible_devices("GPU")
    fl.config.set_visible_devices([], "GPU")
    try:
        fl.config.set_logical_devices("CPU", 2)
        s = ds.MirroredStrategy()
        assert s.num_replicas_in_sync == 2 and all("CPU" in d.upper() for d in s.extended.worker_devices)
    finally:
        fl.config.set_visible_devices(visible, "GPU")
    assert fl.config.list_logical_devices("GPU")


def test_an_error_with_a_gpu_input_names_the_op_the_device_and_the_line(cp):
    with fl.device("/gpu:0"):
        a = fl.ones([2, 3])
    with pytest.raises(fl.errors.InvalidArgumentError) as e:
        fl.matmul(a, fl.ones([2, 3]))
    msg = str(e.value)
    assert msg.startswith("matmul") and "on GPU:0" in msg and "test_gpu_devices.py" in msg


# -- the stand-in's cases (tests/unit/test_gpu_standin_ops.py) on the real GPU ---------------------
def _standin():
    import sys
    from pathlib import Path
    unit = str(Path(__file__).resolve().parents[1] / "unit")
    if unit not in sys.path:
        sys.path.insert(0, unit)
    import test_gpu_standin_ops
    return test_gpu_standin_ops


S = _standin()


def _same_on_gpu(cp, name, got, want):
    got, want = S._outputs(got), S._outputs(want)
    assert len(got) == len(want) > 0
    for g, w in zip(got, want):
        if name in S.ON_THE_HOST:
            assert type(g._value) is np.ndarray, name
        else:
            _on_gpu(g, cp)
        assert g.shape == w.shape and g.dtype == w.dtype, name
        if name not in S.RANDOM:
            np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("name", sorted(S.CASES))
def test_every_op_eager_and_traced_on_the_gpu(cp, name):
    fn, inputs = S.CASES[name]
    want = S._cpu(fn, inputs)
    with fl.device("/gpu:0"):
        traced = fl.function(fn)(*S._tensors(inputs, fn))
        eager = None if name in S.GRAPH_ONLY else fn(*S._tensors(inputs, fn))
    _same_on_gpu(cp, name, traced, want)
    if eager is not None:
        _same_on_gpu(cp, name, eager, want)


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
@pytest.mark.parametrize("name", S.DIFFERENTIABLE)
def test_every_gradient_on_the_gpu(cp, name, traced):
    fn, inputs = S.CASES[name]
    with fl.device("/gpu:0"):
        got = S._gradients(fn, inputs, traced)
    with fl.device("/cpu:0"):
        want = S._gradients(fn, inputs, traced)
    _same_on_gpu(cp, name, got, want)


def test_fit_a_custom_loop_and_a_session_on_the_gpu(cp):
    for run in (S._fit, S._custom_loop):
        model, losses = run("/gpu:0")
        assert all(isinstance(w._value, cp.ndarray) for w in model.trainable_variables)
        ref, ref_losses = run("/cpu:0")
        np.testing.assert_allclose(losses, ref_losses, rtol=1e-4)
    losses, w = S._session_run("/gpu:0")
    ref_losses, ref_w = S._session_run("/cpu:0")
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-4)


def test_memory_info_and_copy_events_on_the_gpu(cp):
    fl.config.experimental.reset_memory_stats("GPU:0")
    base = fl.config.experimental.get_memory_info("GPU:0")
    since = fl.core.events.now()
    with fl.device("/gpu:0"):
        big = fl.constant(np.ones((512, 512), np.float32)) * 2.0
        held = fl.config.experimental.get_memory_info("GPU:0")
    assert held["current"] - base["current"] >= 512 * 512 * 4 and held["peak"] >= held["current"]
    big.numpy()
    kinds = {(e.name, e.attrs["dst"]) for e in fl.core.events.default_log().events("copy", since=since)}
    assert ("to GPU", "GPU:0") in kinds and ("to host", "CPU:0") in kinds
