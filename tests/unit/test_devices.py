"""Device strings, fl.device scopes, logical devices, eager placement and the placement log."""
from __future__ import annotations

import dataclasses
import logging
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import flowlab as fl
from flowlab.core import execute as execute_module
from flowlab.core._context import ACTIVE
from flowlab.core.backends import gpu_count
from flowlab.core.device import (DEFAULT_DEVICE, RemoteDeviceError, current_device_spec, is_local, merge_scopes,
                                 resolve)

DeviceSpec = fl.DeviceSpec
LOCAL = "/job:localhost/replica:0/task:0"
CPU0, CPU1 = f"{LOCAL}/device:CPU:0", f"{LOCAL}/device:CPU:1"
GPU0, GPU1, GPU3 = f"{LOCAL}/device:GPU:0", f"{LOCAL}/device:GPU:1", f"{LOCAL}/device:GPU:3"


@pytest.fixture(autouse=True)
def default_devices():
    """Every test starts and ends with the default devices and no placement log."""
    fl.config.set_logical_devices("CPU", None)
    fl.config.set_logical_devices("GPU", None)
    yield
    fl.debugging.set_log_device_placement(False)
    fl.config.set_logical_devices("CPU", None)
    fl.config.set_logical_devices("GPU", None)


@pytest.fixture
def two_gpus():
    fl.config.set_logical_devices("GPU", 2)


# -- DeviceSpec: parsing, printing, merging -----------------------------------------------------
@pytest.mark.parametrize("text,fields,canonical", [
    ("/job:worker/replica:0/task:1/device:GPU:0", ("worker", 0, 1, "GPU", 0), "/job:worker/replica:0/task:1/device:GPU:0"),
    ("/job:worker/task:1", ("worker", None, 1, None, None), "/job:worker/task:1"),
    ("/task:1/gpu:0", (None, None, 1, "GPU", 0), "/task:1/device:GPU:0"),
    ("/cpu:0", (None, None, None, "CPU", 0), "/device:CPU:0"),
    ("/device:CPU:1", (None, None, None, "CPU", 1), "/device:CPU:1"),
    ("/GPU:1", (None, None, None, "GPU", 1), "/device:GPU:1"),
    ("gpu:0", (None, None, None, "GPU", 0), "/device:GPU:0"),
    ("/device:gpu:2", (None, None, None, "GPU", 2), "/device:GPU:2"),
    ("/Cpu:3", (None, None, None, "CPU", 3), "/device:CPU:3"),
    ("/gpu:*", (None, None, None, "GPU", None), "/device:GPU:*"),
    ("/device:GPU", (None, None, None, "GPU", None), "/device:GPU:*"),
    ("/job:ps/replica:2", ("ps", 2, None, None, None), "/job:ps/replica:2"),
    ("", (None, None, None, None, None), ""),
])
def test_parse_and_print(text, fields, canonical):
    spec = DeviceSpec.from_string(text)
    assert (spec.job, spec.replica, spec.task, spec.device_type, spec.device_index) == fields
    assert spec.to_string() == str(spec) == canonical
    assert DeviceSpec.from_string(canonical) == spec          # the round trip
    assert DeviceSpec(*fields) == spec
    assert eval(repr(spec), {"DeviceSpec": DeviceSpec}) == spec
    assert bool(spec) == (text != "")


@pytest.mark.parametrize("text,names", [
    ("/job:", ["'job:'", "job:NAME"]),
    ("/task:x", ["'task:x'", "task", "whole number"]),
    ("/replica:", ["replica:N"]),
    ("/device:TPU:0", ["'TPU'", "CPU and GPU"]),
    ("/tpu:0", ["'TPU'", "CPU and GPU"]),
    ("/gpu:-1", ["'gpu:-1'", "device index"]),
    ("/device:GPU:one", ["device index"]),
    ("/cpu:0/gpu:0", ["'gpu:0'", "second time"]),
    ("/job:a/job:b", ["'job:b'", "second time"]),
    ("/foo:1:2", ["'foo:1:2'", "not a part"]),
])
def test_malformed_strings_name_the_bad_part(text, names):
    with pytest.raises(ValueError) as info:
        DeviceSpec.from_string(text)
    message = str(info.value)
    assert repr(text) in message and "/device:GPU:N" in message   # the string and what is supported
    for name in names:
        assert name in message


def test_constructor_checks_and_normalises_fields():
    assert DeviceSpec(device_type="gpu", device_index=np.int64(1)).to_string() == "/device:GPU:1"
    for bad in (dict(task=-1), dict(replica="x"), dict(device_index=1.5), dict(device_type="tpu"), dict(task=True)):
        with pytest.raises(ValueError, match="DeviceSpec"):
            DeviceSpec(**bad)
    with pytest.raises(TypeError):
        DeviceSpec.from_string(3)


def test_frozen_and_hashable():
    spec = DeviceSpec.from_string("/job:worker/gpu:0")
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.job = "ps"
    same = DeviceSpec(job="worker", device_type="GPU", device_index=0)
    assert spec == same and hash(spec) == hash(same) and len({spec, same}) == 1
    assert spec != DeviceSpec.from_string("/job:worker/gpu:1")
    assert spec.replace(task=2).to_string() == "/job:worker/task:2/device:GPU:0"


def test_make_merged_spec_takes_the_fields_other_sets():
    base = DeviceSpec.from_string("/job:worker/replica:0/task:1/device:GPU:0")
    assert base.make_merged_spec(DeviceSpec.from_string("/task:3")).to_string() == "/job:worker/replica:0/task:3/device:GPU:0"
    assert base.make_merged_spec(DeviceSpec()) == base
    assert DeviceSpec().make_merged_spec(base) == base
    assert DeviceSpec.from_string("/job:ps").make_merged_spec(DeviceSpec.from_string("/gpu:1")).to_string() == "/job:ps/device:GPU:1"
    # field by field, as TensorFlow: an index-less type keeps the other index (scopes refine this)
    assert DeviceSpec.from_string("/gpu:1").make_merged_spec(DeviceSpec.from_string("/cpu")).to_string() == "/device:CPU:1"


def test_merge_scopes_does_not_carry_an_index_across_device_types():
    gpu1, cpu, gpu = (DeviceSpec.from_string(s) for s in ("/gpu:1", "/cpu", "/device:GPU"))
    assert merge_scopes(gpu1, cpu).to_string() == "/device:CPU:*"
    assert merge_scopes(gpu1, gpu).to_string() == "/device:GPU:1"    # same type: the index stays


# -- fl.device scopes ---------------------------------------------------------------------------
def test_nested_scopes_merge_inner_over_outer():
    assert current_device_spec() == DeviceSpec()
    with fl.device("/job:worker") as outer:
        assert outer.to_string() == "/job:worker"
        with fl.device("/gpu:0") as inner:
            assert inner.to_string() == "/job:worker/device:GPU:0"
            assert current_device_spec() == inner
            with fl.device("/task:1/cpu:0") as innermost:
                assert innermost.to_string() == "/job:worker/task:1/device:CPU:0"
            with fl.device("") as same:                 # "" constrains nothing: the outer scope stays
                assert same == inner
            with fl.device(None) as cleared:            # None clears the scope inside it
                assert cleared == DeviceSpec() and current_device_spec() == DeviceSpec()
            assert current_device_spec() == inner
        with fl.device(DeviceSpec(job="ps", task=0)) as replaced:
            assert replaced.to_string() == "/job:ps/task:0"
    assert current_device_spec() == DeviceSpec()


def test_scopes_accept_logical_devices_and_reject_other_things(two_gpus):
    gpu1 = fl.config.list_logical_devices("GPU")[1]
    with fl.device(gpu1):
        assert (fl.constant([1.0]) + 1.0).device == GPU1
    with pytest.raises(TypeError, match="device string"):
        fl.device(1)
    with pytest.raises(ValueError, match="'TPU'"):
        fl.device("/tpu:0")                                # a bad string fails at once, not at an op


def test_scopes_belong_to_their_thread(two_gpus):
    seen = []
    with fl.device("/gpu:1"):
        worker = threading.Thread(target=lambda: seen.append((current_device_spec(), (fl.constant(1.0) + 1.0).device)))
        worker.start()
        worker.join()
    assert seen == [(DeviceSpec(), CPU0)]


# -- logical devices ----------------------------------------------------------------------------
def test_default_devices():
    names = [d.name for d in fl.config.list_logical_devices()]
    assert names[0] == CPU0 == DEFAULT_DEVICE
    assert len(fl.config.list_logical_devices("CPU")) == 1
    assert len(fl.config.list_logical_devices("GPU")) == gpu_count()   # 0 unless a real GPU is here
    physical = fl.config.list_physical_devices()
    assert physical[0].name == "/physical_device:CPU:0" and physical[0].device_type == "CPU"
    assert len(fl.config.list_physical_devices("gpu")) == gpu_count()


def test_set_logical_devices():
    fl.config.set_logical_devices("CPU", 3)
    fl.config.set_logical_devices("gpu", 2)
    devices = fl.config.list_logical_devices()
    assert [(d.name, d.device_type) for d in devices] == [
        (CPU0, "CPU"), (CPU1, "CPU"), (f"{LOCAL}/device:CPU:2", "CPU"), (GPU0, "GPU"), (GPU1, "GPU")]
    assert [d.name for d in fl.config.list_logical_devices("GPU")] == [GPU0, GPU1]
    assert len(fl.config.list_physical_devices("CPU")) == 1        # logical devices are not physical
    for bad in [("CPU", 0), ("GPU", -1), ("GPU", 1.5), ("TPU", 1)]:
        with pytest.raises(ValueError):
            fl.config.set_logical_devices(*bad)
    fl.config.set_logical_devices("GPU", None)
    assert len(fl.config.list_logical_devices("GPU")) == gpu_count()


# -- eager placement ----------------------------------------------------------------------------
def test_results_carry_the_scope_device_and_values_are_right(two_gpus):
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    x = fl.constant(a)
    with fl.device("/gpu:1"):
        y = fl.matmul(x, fl.transpose(x))
        z = fl.nn.relu(y - 20.0)
    assert y.device == z.device == GPU1 and y.device.endswith("device:GPU:1")
    np.testing.assert_allclose(z.numpy(), np.maximum(a @ a.T - 20.0, 0))
    with fl.device("/device:CPU:0"):
        back = z * 1.0
    assert back.device == CPU0 and back._device is None             # the default CPU stays None
    with fl.device("/job:localhost"):                               # unset fields: this process's defaults
        assert (z + 1.0).device == CPU0
    with fl.device("/gpu"):                                          # any GPU: GPU:0
        assert (x + 1.0).device == GPU0


def test_without_a_scope_ops_follow_their_first_placed_input(two_gpus):
    x, w = fl.constant([[1.0, 2.0]]), fl.constant([[3.0], [4.0]])
    with fl.device("/gpu:0"):
        on0 = x + 0.0
    with fl.device("/gpu:1"):
        on1 = w + 0.0
    assert fl.matmul(x, on1).device == GPU1                        # first input on the default CPU
    assert fl.matmul(on0, on1).device == GPU0                      # two devices: the first input's
    assert fl.matmul(on1, on0).device == GPU1
    assert fl.reduce_sum(on1).device == GPU1 and fl.reshape(on1, [2]).device == GPU1
    with fl.device("/cpu:0"):
        assert fl.matmul(on0, on1).device == CPU0                  # a scope wins over the inputs
    with fl.device("/gpu:1"):
        with fl.device(None):
            assert (on0 * 2.0).device == GPU0 and (x * 2.0).device == CPU0
    np.testing.assert_allclose(fl.matmul(on0, on1).numpy(), [[11.0]])


def test_gradients_follow_the_placement(two_gpus):
    x = fl.constant([1.0, 2.0, 3.0])
    with fl.device("/gpu:1"):
        with fl.GradientTape() as tape:
            tape.watch(x)
            y = fl.reduce_sum(x * x)
        grad = tape.gradient(y, x)
    assert y.device == grad.device == GPU1
    np.testing.assert_allclose(grad.numpy(), [2.0, 4.0, 6.0])


def test_logical_cpus(two_gpus):
    fl.config.set_logical_devices("CPU", 2)
    with fl.device("/cpu:1"):
        t = fl.constant([1, 2]) + 1
    assert t.device == CPU1 and t.numpy().tolist() == [2, 3]


def test_changing_the_devices_after_placing_tensors_is_allowed(two_gpus):
    with fl.device("/gpu:1"):
        t = fl.constant([1.0, 2.0]) * 2.0
    fl.config.set_logical_devices("GPU", 0)                       # e.g. a notebook cell run again
    assert (t + 1.0).device == GPU1 and (t + 1.0).numpy().tolist() == [3.0, 5.0]
    with pytest.raises(fl.errors.InvalidArgumentError, match="no device"):
        with fl.device("/gpu:1"):
            t + 1.0
    fl.config.set_logical_devices("GPU", 2)
    with fl.device("/gpu:1"):
        assert (t + 1.0).device == GPU1


class _FakeGpuArray(np.ndarray):
    """A numpy array that says it lives in GPU memory (as a CuPy array does)."""
    __cuda_array_interface__ = {}


class _FakeCupy:
    """Stands in for ``cupy_backend`` so the routing of a machine with one real GPU runs anywhere."""
    name = "cupy"

    def __init__(self):
        self.devices_used = []
        fake = self

        class Device:
            def __init__(self, index):
                fake.devices_used.append(index)

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                return False

        self.xp = type("xp", (), {"cuda": type("cuda", (), {"Device": Device}),
                                  "asarray": staticmethod(lambda a: np.asarray(a).view(_FakeGpuArray))})

    def kernel(self, op):
        return op.kernels.get(self.name, op.kernel)

    def device_count(self):
        return 1

    def owns(self, array):
        return isinstance(array, _FakeGpuArray)

    def device_of(self, array):
        return 0

    def put(self, array, gpu):
        if isinstance(array, _FakeGpuArray):
            return array
        with self.xp.cuda.Device(gpu):
            return self.xp.asarray(array)

    def to_numpy(self, array):
        return np.asarray(array).view(np.ndarray)


def test_with_a_real_gpu_logical_gpus_run_on_it_and_data_moves(monkeypatch):
    from flowlab.core import backends
    fake = _FakeCupy()
    monkeypatch.setattr(backends, "_gpu", fake)        # the GPU backend, with one device, all visible
    monkeypatch.setattr(backends, "_count", 1)
    monkeypatch.setattr(backends, "_visible", None)
    monkeypatch.setattr(backends, "_every", None)          # the visible GPUs, worked out again
    monkeypatch.setattr(backends, "_placed", {})           # kernels placed on devices: none yet
    fl.config.set_logical_devices("GPU", None)
    assert [d.name for d in fl.config.list_logical_devices("GPU")] == [GPU0]     # one per real GPU
    assert backends.backend_for_device(GPU0) is fake and backends.backend_for_device(CPU0) is backends.numpy_backend
    fl.config.set_logical_devices("GPU", 2)                      # GPU:1 is virtual, on real GPU 0
    x = fl.constant([[1.0, 2.0], [3.0, 4.0]])
    with fl.device("/gpu:1"):
        y = x @ x
    assert isinstance(y._value, _FakeGpuArray) and y.device == GPU1 and set(fake.devices_used) == {0}
    np.testing.assert_allclose(y.numpy(), [[7.0, 10.0], [15.0, 22.0]])
    assert type(y.numpy()) is np.ndarray
    assert isinstance((y + x)._value, _FakeGpuArray)              # no scope: the GPU input's device
    with fl.device("/cpu:0"):
        back = y * 1.0
    assert type(back._value) is np.ndarray and back._device is None   # copied back to host memory


# -- errors -------------------------------------------------------------------------------------
def test_a_missing_device_lists_the_devices_there_are(two_gpus):
    x = fl.constant([1.0])
    scope = fl.device("/gpu:3")
    with scope:                                                    # entering is fine: the op fails
        with pytest.raises(fl.errors.InvalidArgumentError) as info:
            fl.matmul(fl.reshape(x, [1, 1]), fl.reshape(x, [1, 1]))
    message = str(info.value)
    assert message.startswith(f"reshape: no device {GPU3}; this process has: {CPU0}, {GPU0}, {GPU1}")
    assert 'fl.config.set_logical_devices("GPU", 4) to make more' in message
    assert "test_devices.py" in message                            # the user's line
    with pytest.raises(fl.errors.InvalidArgumentError, match=r'set_logical_devices\("CPU", 2\)'):
        with fl.device("/cpu:1"):
            x + 1.0


def test_a_gpu_on_a_laptop_says_how_to_get_one():
    if gpu_count():
        pytest.skip("this machine has a real GPU")
    with pytest.raises(fl.errors.InvalidArgumentError, match=r'no device .*GPU:0; this process has: '
                                                              r'[^;]*CPU:0; use fl.config.set_logical_devices\("GPU", 1\)'):
        with fl.device("/gpu:0"):
            fl.constant([1.0]) + 1.0


@pytest.mark.parametrize("where", ["/job:worker/task:1", "/job:worker", "/task:1", "/replica:1/cpu:0"])
def test_remote_devices_need_a_cluster(where):
    x = fl.constant([1.0])
    with fl.device(where):
        with pytest.raises(NotImplementedError) as info:
            x + 1.0
    assert isinstance(info.value, RemoteDeviceError)
    assert "cluster" in str(info.value) and "LocalCluster" in str(info.value) and CPU0 in str(info.value)


def test_resolve_gives_canonical_strings(two_gpus):
    assert resolve("") == resolve(DeviceSpec()) == resolve("/cpu:0") == CPU0
    assert resolve("/gpu:1") == resolve(DeviceSpec(device_type="GPU", device_index=1)) == GPU1
    assert resolve("/job:worker/task:1", allow_remote=True) == "/job:worker/replica:0/task:1/device:CPU:0"
    with pytest.raises(RemoteDeviceError):
        resolve("/job:worker/task:1")
    with pytest.raises(fl.errors.InvalidArgumentError):
        resolve("/gpu:2")
    assert is_local(None) and is_local(CPU0) and is_local(GPU1)
    assert not is_local(resolve("/job:worker/task:1", allow_remote=True)) and not is_local(resolve("/task:1", allow_remote=True))


# -- the placement log --------------------------------------------------------------------------
def test_placement_log_goes_to_the_current_stderr(capsys, two_gpus):
    assert not fl.debugging.get_log_device_placement()
    x = fl.constant([[1.0]])
    fl.debugging.set_log_device_placement(True)
    assert fl.debugging.get_log_device_placement()
    with fl.device("/gpu:1"):
        fl.matmul(x, x)
    x + x                                                          # logged too: no fast path while on
    fl.debugging.set_log_device_placement(False)
    x - x
    err = capsys.readouterr().err.splitlines()
    assert err == [f"Executing op matmul in device {GPU1}", f"Executing op add in device {CPU0}"]
    assert logging.getLogger("flowlab.placement").handlers          # the logger TF users would look for


def test_placement_log_in_a_fresh_process():
    code = textwrap.dedent("""
        import flowlab as fl
        fl.config.set_logical_devices("GPU", 2)
        fl.debugging.set_log_device_placement(True)
        with fl.device("/gpu:1"):
            y = fl.matmul(fl.constant([[1.0]]), fl.constant([[2.0]]))
        print(y.numpy()[0, 0])
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "2.0"
    assert f"Executing op matmul in device {GPU1}" in out.stderr


@pytest.mark.process
def test_placement_log_shows_in_a_notebook_cell(tmp_path):
    manager = pytest.importorskip("jupyter_client.manager")
    env = {**__import__("os").environ, "IPYTHONDIR": str(tmp_path / "ipython")}
    km, kc = manager.start_new_kernel(kernel_name="python3", env=env)
    try:
        code = ("import flowlab as fl\nfl.config.set_logical_devices('GPU', 2)\n"
                "fl.debugging.set_log_device_placement(True)\n"
                "with fl.device('/gpu:1'):\n    fl.matmul(fl.constant([[1.0]]), fl.constant([[2.0]]))\n")
        streams = []
        reply = kc.execute_interactive(code, timeout=60, output_hook=lambda msg: streams.append(msg))
        assert reply["content"]["status"] == "ok"
        cell_output = "".join(m["content"]["text"] for m in streams if m["msg_type"] == "stream")
        assert f"Executing op matmul in device {GPU1}" in cell_output
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


# -- the eager fast paths -----------------------------------------------------------------------
def test_scopes_and_the_log_leave_the_fast_paths_on(monkeypatch, two_gpus):
    baseline = ACTIVE.count
    with fl.device("/gpu:1"):
        assert ACTIVE.count == baseline + 1
        with fl.device("/gpu:0"):
            assert ACTIVE.count == baseline + 2
    assert ACTIVE.count == baseline
    with pytest.raises(ZeroDivisionError):
        with fl.device("/gpu:1"):
            1 / 0
    with pytest.raises(fl.errors.InvalidArgumentError):
        with fl.device("/gpu:7"):
            fl.constant(1.0) + 1.0
    with pytest.raises(RemoteDeviceError):
        with fl.device("/job:worker"):
            fl.constant(1.0) + 1.0
    assert ACTIVE.count == baseline
    for on in (True, True, False, False):                          # switching twice counts once
        fl.debugging.set_log_device_placement(on)
    assert ACTIVE.count == baseline


def test_default_device_tensors_skip_execute_and_placed_ones_do_not(monkeypatch, two_gpus):
    if ACTIVE.count:
        pytest.skip("something else in this process turned the fast paths off")
    with fl.device("/gpu:1"):
        placed = fl.constant([1.0, 2.0]) + 0.0
    plain = fl.constant([1.0, 2.0])
    calls = []
    real_execute = execute_module.execute
    monkeypatch.setattr(execute_module, "execute", lambda op, inputs, attrs=None: calls.append(op.name) or
                        real_execute(op, inputs, attrs or execute_module.NO_ATTRS))
    assert plain._device is None and (plain + plain)._device is None and fl.exp(plain)._device is None
    assert calls == []                                             # the fast paths, untouched
    assert (placed + 1.0).device == GPU1 and fl.exp(placed).device == GPU1 and (plain * placed).device == GPU1
    assert calls == ["add", "exp", "multiply"]                     # a placed tensor goes through execute
