"""Errors for learners, in-process: device strings with a typo get a "did you mean", tracebacks
lose flowlab's own frames (the filter itself; a real kernel is in
tests/process/test_notebook_tracebacks.py), a client's interrupt cancels the work on a server,
and dead or busy workers say how to end or restart them."""
import _thread
import threading
import time

import pytest

import flowlab as fl
from flowlab import _traceback
from flowlab.cluster.errors import Interrupted, WorkerBusyError, WorkerDiedError, WorkerUnresponsiveError
from flowlab.cluster.local import restart_call
from flowlab.cluster.magic import run_cell

# -- device strings ------------------------------------------------------------------------------
@pytest.fixture
def two_cpus():
    fl.config.set_logical_devices("CPU", 2)
    yield
    fl.config.set_logical_devices("CPU", None)
    fl.config.set_logical_devices("GPU", None)


def placed_add(device):
    with fl.device(device):
        return fl.constant([1.0]) + 1.0


def test_a_gpu_that_is_not_there_suggests_the_device_that_is(two_cpus):
    fl.config.set_logical_devices("GPU", 0)
    with pytest.raises(fl.errors.InvalidArgumentError) as info:
        placed_add("/gpu:0")
    text = str(info.value)
    assert "no device /job:localhost/replica:0/task:0/device:GPU:0" in text          # what was asked
    assert "device:CPU:0" in text and "device:CPU:1" in text                          # what exists
    assert "did you mean '/cpu:0'?" in text                                           # the closest
    assert "test_learner_errors.py" in text                                           # the user's line


def test_a_cpu_index_past_the_last_suggests_the_nearest_cpu(two_cpus):
    with pytest.raises(fl.errors.InvalidArgumentError, match=r"device:CPU:3.*did you mean '/cpu:1'\?"):
        placed_add("/cpu:3")
    assert placed_add("/cpu:1").numpy().tolist() == [2.0]


@pytest.mark.parametrize("typed, meant", [
    ("/devcie:CPU:0", "/device:CPU:0"),
    ("/cpu0", "/cpu:0"),
    ("/jbo:worker/task:0", "/job:worker/task:0"),
    ("/job:worker/tsak:1", "/job:worker/task:1"),
    ("/tpu:0", "/gpu:0"),
])
def test_a_misspelt_part_of_a_device_string_gets_the_fixed_string(typed, meant):
    with pytest.raises(ValueError) as info:
        fl.device(typed)
    assert f"cannot parse device {typed!r}" in str(info.value)
    assert f"did you mean {meant!r}?" in str(info.value)


def test_a_device_type_flowlab_lacks_names_the_ones_it_has():
    with pytest.raises(ValueError, match=r"'TPU', which flowlab does not have \(it has CPU and GPU\)") as info:
        fl.device("/device:TPU:0")
    assert "did you mean" not in str(info.value)    # nothing close to suggest


# -- the traceback filter ------------------------------------------------------------------------
def users_function(a, b):
    return fl.matmul(a, b)


def test_the_filter_drops_flowlab_frames_and_keeps_the_users():
    with pytest.raises(fl.errors.InvalidArgumentError) as info:
        users_function(fl.ones([2, 3]), fl.ones([2, 3]))
    full = info.value.__traceback__
    kept, hidden = _traceback.filter_traceback(full)
    names = []
    while kept is not None:
        assert not _traceback.is_flowlab_frame(kept.tb_frame)
        names.append(kept.tb_frame.f_code.co_name)
        kept = kept.tb_next
    assert hidden >= 2 and names[-1] == "users_function" and "test_the_filter_drops_flowlab_frames_and_keeps_the_users" in names
    assert info.value.__traceback__ is full      # the exception keeps its whole traceback


def test_filtering_switches_have_tensorflows_names():
    assert fl.debugging.is_traceback_filtering_enabled()
    fl.debugging.disable_traceback_filtering()
    try:
        assert not fl.debugging.is_traceback_filtering_enabled()
    finally:
        fl.debugging.enable_traceback_filtering()
    assert fl.debugging.is_traceback_filtering_enabled()
    assert _traceback.install(object()) is False      # no IPython shell here: nothing to wrap


# -- cancel on a server (in-process: the exec thread is interrupted between bytecodes) -----------
def spin(seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(0.01)
    return "done"


def test_an_interrupted_wait_cancels_the_running_and_the_queued_request(inproc_task):
    server, client = inproc_task
    running = client.submit_call(server.name, spin, (60,))
    queued = client.submit_call(server.name, spin, (60,))
    timer = threading.Timer(0.5, _thread.interrupt_main)
    timer.start()
    with pytest.raises(Interrupted) as info:
        client.results([running, queued], timeout=None)
    assert info.value.cancelled == [server.name, server.name] and info.value.still_running == []
    assert client.call(server.name, lambda: 7, timeout=10) == 7


def test_a_queued_request_that_is_cancelled_never_runs(inproc_task):
    server, client = inproc_task
    ran = []
    first = client.submit_call(server.name, spin, (0.5,))
    second = client.submit_call(server.name, ran.append, (1,))
    assert client.request(server.name, "cancel", {"seq": second.seq}).body["state"] == "queued"
    assert client.gather([first], timeout=10) == ["done"]
    with pytest.raises(BaseException, match="cancelled by the client before it started"):
        client.gather([second], timeout=10)
    assert ran == []
    assert client.request(server.name, "cancel", {"seq": first.seq}).body["state"] == "done"


def test_a_busy_task_raises_naming_it_and_how_to_end_it(inproc_task):
    server, client = inproc_task
    client.stop_hint = restart_call
    stuck = client.submit_call(server.name, spin, (3,))
    client._busy[server.name] = (stuck, time.monotonic())   # as an interrupt that got no confirmation leaves it
    with pytest.raises(WorkerBusyError, match=r"/job:worker/task:0 .*still running .*cluster\.restart\(0\)"):
        client.call(server.name, lambda: 1, timeout=10)
    assert client.request(server.name, "ping", {"x": 1}).body["x"] == 1   # control messages still pass
    time.sleep(3)
    assert client.call(server.name, lambda: 1, timeout=10) == 1          # finished: free again


# -- dead and silent workers --------------------------------------------------------------------
def test_dead_and_silent_workers_name_the_call_that_restarts_them():
    died = WorkerDiedError("/job:worker/task:1", 123, signal=9, restart=restart_call("/job:worker/task:1"))
    assert str(died) == ("/job:worker/task:1 (pid 123) died: killed by signal 9 (SIGKILL); "
                         "start it again with cluster.restart(1)")
    silent = WorkerUnresponsiveError("/job:ps/task:0", 5, 2.0, restart=restart_call("/job:ps/task:0"))
    assert "cluster.restart('/job:ps/task:0')" in str(silent)


def test_px_namespace_starts_with_fl_np_and_the_rank():
    out = run_cell("print(rank, world_size, size, fl is __import__('flowlab'), np.__name__)")
    assert out["stdout"] == "0 1 1 True numpy\n" and "error" not in out
