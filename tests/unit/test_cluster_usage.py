"""In-process parts of what a cluster panel reads: :class:`flowlab.cluster._usage.Usage` (CPU and
memory from /proc, one sample per interval, a capped history) and ``Client.traffic()`` (messages,
bytes, the work in flight and what it runs), over a task served in this process."""
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

from flowlab.cluster import _usage
from flowlab.cluster._usage import Usage, read_process
from flowlab.cluster.protocol import dumps

linux = pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="reads /proc")


def _burn(seconds):
    import time
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


@linux
def test_read_process_of_this_one_and_of_one_that_is_gone():
    cpu, rss = read_process(os.getpid())
    _burn(0.05)
    assert read_process(os.getpid())[0] >= cpu + 0.04 and rss > 2 ** 20
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    assert read_process(p.pid) is None


@linux
def test_usage_samples_once_per_interval_and_keeps_the_last_ones():
    u = Usage(every=0.5, keep=3)
    me = os.getpid()
    first = u.sample({"a": me, "b": None}, {"a": 0, "b": 0}, now=100.0)
    assert first["a"]["cpu"] is None and first["a"]["rss"] > 0 and first["a"]["history"] == []
    assert first["b"] == {"cpu": None, "rss": None, "history": []}
    _burn(0.1)
    assert u.sample({"a": me, "b": None}, {"a": 5}, now=100.2)["a"]["cpu"] is None   # too soon: no new sample
    second = u.sample({"a": me, "b": None}, {"a": 5}, now=101.0)
    # 0.1 s of CPU or more over the 1 s between samples (time passed in fact does not matter)
    assert second["a"]["cpu"] >= 9.0 and second["a"]["history"] == [second["a"]["cpu"]]
    assert second["b"]["history"] == [0.0]
    for k in range(5):
        last = u.sample({"a": me, "b": None}, {}, now=102.0 + k)
    assert len(last["a"]["history"]) == 3 and u.unit == "cpu %"


def test_without_proc_or_psutil_the_history_is_messages_per_second(monkeypatch):
    monkeypatch.setattr(_usage, "_PROC", False)
    monkeypatch.setattr(_usage, "_psutil", lambda: None)
    u = Usage(every=0.5)
    assert u.unit == "msgs/s"
    u.sample({"a": os.getpid()}, {"a": 10}, now=10.0)
    got = u.sample({"a": os.getpid()}, {"a": 30}, now=12.0)
    assert got["a"] == {"cpu": None, "rss": None, "history": [10.0]}


def test_traffic_counts_messages_and_bytes_and_the_work_in_flight(inproc_task):
    server, client = inproc_task
    task = server.name
    t0 = client.traffic()[task]
    assert t0["busy"] is False and t0["running"] is None
    client.request(task, "hello")
    t1 = client.traffic()[task]
    assert (t1["msgs_out"], t1["msgs_in"]) == (t0["msgs_out"] + 1, t0["msgs_in"] + 1)
    assert t1["bytes_out"] > t0["bytes_out"] and t1["bytes_in"] > t0["bytes_in"]
    # a tensor's bytes count as bytes, not as its rows
    big = np.zeros((4, 1000), np.float32)
    client.request(task, "hello", None, [big])
    assert client.traffic()[task]["bytes_out"] >= t1["bytes_out"] + big.nbytes

    p = client.submit(task, "run", None, [dumps(_nap), dumps(((0.3,), {}))], what="_nap")
    t = client.traffic(drain=False)[task]
    assert t["busy"] is True and t["running"] == "_nap" and t["msgs_out"] == t1["msgs_out"] + 2
    assert client.gather([p]) == ["napped"]
    assert client.traffic()[task]["busy"] is False and client.traffic()[task]["running"] is None
    # counts go on when a task is removed and added again (a restart)
    before = client.traffic()[task]
    client.remove(task)
    client.add(task, server.address)
    again = client.traffic()[task]
    assert again["busy"] is False and again["msgs_out"] == before["msgs_out"] + 1   # add's hello


def _nap(seconds):
    import time
    time.sleep(seconds)
    return "napped"


def test_a_reply_nobody_collects_is_read_by_traffic_and_the_task_shows_idle(inproc_task):
    server, client = inproc_task
    task = server.name
    p = client.submit(task, "run", None, [dumps(_nap), dumps(((0.05,), {}))], what="_nap")
    assert client.traffic(drain=False)[task]["busy"] is True
    for _ in range(300):
        if not client.traffic()[task]["busy"]:
            break
        threading.Event().wait(0.01)
    else:
        raise AssertionError("the reply was never read, the task still shows busy")
    assert client.gather([p]) == ["napped"]      # kept for its caller
    # what an eager op request runs: its op type; a graph step: "step"
    q = client.submit(task, "op", {"op": "MatMul"})
    assert client.traffic(drain=False)[task]["running"] == "MatMul"
    with pytest.raises(Exception):      # a malformed op: the task says so, and is idle again
        client.result(q, timeout=10)
    assert client.traffic()[task]["busy"] is False
