"""The liveness monitor over the in-process transport: ready messages, heartbeats, exits, silence."""
import signal
import time

import pytest

from flowlab.cluster.errors import ClusterTimeoutError, WorkerDiedError, WorkerUnresponsiveError, describe_exit
from flowlab.cluster.inproc import InprocTransport
from flowlab.cluster.liveness import Heartbeat, Monitor, log_tail

KEY = b"L" * 32
TASK = "/job:worker/task:0"


class FakeProcess:
    """Stands in for the child process (the monitor is what is tested): a pid and a poll()."""
    pid = 4242

    def __init__(self):
        self.code = None

    def poll(self):
        return self.code


@pytest.fixture
def monitor():
    m = Monitor(InprocTransport(), KEY, interval=0.05, timeout=0.5, poll=0.02)
    yield m
    m.close()


def _heartbeat(monitor, info=None):
    return Heartbeat(InprocTransport(), KEY, monitor.address, monitor.id, TASK,
                     info or {"address": "inproc:99", "pid": FakeProcess.pid, "id": "server-x"}, interval=0.05).start()


def _wait_for(cond, limit=5.0):
    end = time.monotonic() + limit
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.01)
    return False


def test_ready_then_alive_then_dead_with_exit_code_and_log(monitor, tmp_path):
    log = tmp_path / "w.log"
    log.write_text("".join(f"line {i}\n" for i in range(30)))
    proc = FakeProcess()
    monitor.watch(TASK, proc, str(log))
    hb = _heartbeat(monitor)
    try:
        monitor.wait_ready([TASK], 5)
        st = monitor.state(TASK)
        assert (st.status, st.address, st.server_id) == ("alive", "inproc:99", "server-x")
        assert monitor.problem(TASK) is None
        proc.code = -signal.SIGKILL
        assert _wait_for(lambda: monitor.problem(TASK) is not None)
        err = monitor.problem(TASK, "running f")
        assert isinstance(err, WorkerDiedError) and err.signal == signal.SIGKILL and err.pid == 4242
        assert "died while running f: killed by signal 9 (SIGKILL)" in str(err)
        assert "line 29" in str(err) and "line 10" not in str(err)      # the last lines only
    finally:
        hb.stop()


def test_silence_is_unresponsive_and_heartbeats_bring_it_back(monitor):
    monitor.watch(TASK, FakeProcess())
    hb = _heartbeat(monitor)
    monitor.wait_ready([TASK], 5)
    hb.stop()                                          # like SIGSTOP: the process is there, silent
    assert _wait_for(lambda: monitor.state(TASK).status == "unresponsive")
    err = monitor.problem(TASK)
    assert isinstance(err, WorkerUnresponsiveError) and err.silent_for >= 0.5
    assert "stopped answering: no heartbeat for" in str(err)
    hb2 = _heartbeat(monitor)                          # like SIGCONT
    try:
        assert _wait_for(lambda: monitor.state(TASK).status == "alive")
        assert monitor.problem(TASK) is None
    finally:
        hb2.stop()


def test_a_task_that_dies_while_starting_fails_wait_ready(monitor):
    proc = FakeProcess()
    proc.code = 3
    monitor.watch(TASK, proc)
    with pytest.raises(WorkerDiedError, match="died while starting: exit code 3"):
        monitor.wait_ready([TASK], 5)


def test_a_task_that_never_says_ready_times_out(monitor):
    monitor.watch(TASK, FakeProcess())
    with pytest.raises(ClusterTimeoutError, match="did not start within 0.2 s"):
        monitor.wait_ready([TASK], 0.2)


def test_ready_from_another_pid_is_ignored(monitor):
    monitor.watch(TASK, FakeProcess())
    hb = _heartbeat(monitor, {"address": "inproc:1", "pid": 1, "id": "old"})
    try:
        with pytest.raises(ClusterTimeoutError):
            monitor.wait_ready([TASK], 0.3)
    finally:
        hb.stop()


def test_describe_exit_and_log_tail(tmp_path):
    assert describe_exit(0) == "exit code 0"
    assert describe_exit(-15) == "killed by signal 15 (SIGTERM)"
    assert describe_exit(None, 9) == "killed by signal 9 (SIGKILL)"
    assert describe_exit(None) == "exit status unknown"
    assert log_tail(str(tmp_path / "missing")) is None
