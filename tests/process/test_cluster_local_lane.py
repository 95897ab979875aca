"""The local lane (flowlab.cluster.unix) between real processes: a client and the workers of a
LocalCluster on this machine talk over Unix sockets, with the same signed frames and checks as TCP.

Every test ends every process it started, even when it fails (the fixture closes each cluster and
checks its pids are gone).
"""
import os
import signal
import socket
import stat
import struct
import time

import numpy as np
import pytest

import flowlab as fl
import flowlab.cluster as fc
from flowlab.cluster import protocol as P
from flowlab.cluster import unix

pytestmark = [pytest.mark.process,
              pytest.mark.skipif(not unix.AVAILABLE, reason="no AF_UNIX on this platform")]
SLACK = 3.0     # seconds added to each deadline of the issue on this shared machine


@pytest.fixture(autouse=True)
def _default_lane(monkeypatch):
    monkeypatch.delenv("FLOWLAB_LOCAL_LANE", raising=False)     # these tests are about the lane itself


def lane_of(c, task):
    host, _, port = c.spec.address_of(task).rpartition(":")
    return unix.lane_path(host, int(port))


def wait_for(cond, limit):
    end = time.monotonic() + limit
    while not cond() and time.monotonic() < end:
        time.sleep(0.02)
    return cond()


def frame(frames):
    """``frames`` as the lane puts them on the stream."""
    bufs, _ = unix.encode(frames)
    return b"".join(bytes(b) for b in bufs)


# -- which lane --------------------------------------------------------------------------------------
def test_client_and_workers_talk_over_the_local_lane(make_cluster):
    c = make_cluster(workers=2)
    assert c.client.stats["lanes"] == {t: "unix" for t in c.tasks}
    assert "unix" in repr(c.client._peers[c.workers[0]].conn)
    for task in c.tasks:
        path = lane_of(c, task)
        assert stat.S_ISSOCK(os.stat(path).st_mode)
        d = os.stat(os.path.dirname(path))
        assert d.st_uid == os.getuid() and not d.st_mode & 0o077       # a private directory
    # worker to worker: a push goes over the lane too, and arrives whole
    a = np.arange(1 << 20, dtype=np.float32).reshape(1024, 1024)   # 4 MiB: the large-frame path
    c.client.request(c.workers[0], "put", {"key": "a"}, [a])
    assert c.client.request(c.workers[0], "push", {"key": "a", "to": c.workers[1]}).body["bytes"] == a.nbytes
    np.testing.assert_array_equal(c.client.request(c.workers[1], "get", {"key": "a"}).buffers[0], a)
    lanes = c.call(0, lambda: fc.current_server().peers().stats["lanes"])
    assert lanes == {c.workers[1]: "unix"}


def test_lane_turned_off_uses_tcp(make_cluster, monkeypatch):
    monkeypatch.setenv("FLOWLAB_LOCAL_LANE", "0")
    c = make_cluster(workers=1)
    assert c.client.stats["lanes"] == {c.workers[0]: "tcp"}
    assert c.run(lambda: 7) == [7]


# -- results ------------------------------------------------------------------------------------------
def test_remote_eager_results_equal_local_ones(make_cluster):
    c = make_cluster(workers=2)
    rng = np.random.default_rng(0)
    x = fl.constant(rng.standard_normal((300, 200)).astype(np.float32))   # 240 KB: a large frame
    w = fl.constant(rng.standard_normal((200, 7)).astype(np.float32))
    s = fl.constant(np.float64(2.5))                                       # 0-d
    i = fl.constant(np.arange(12, dtype=np.int32).reshape(3, 4))
    local = [(x @ w).numpy(), fl.reduce_sum(x, axis=0).numpy(), (s * s).numpy(), (i + i).numpy()]
    with fl.device("/job:worker/task:0"):
        y = x @ w
        r0 = fl.reduce_sum(x, axis=0)
        ss = s * s
    with fl.device("/job:worker/task:1"):
        ii = i + i
        y2 = y + 0.0            # pulled from task 0 by task 1
    remote = [y.numpy(), r0.numpy(), ss.numpy(), ii.numpy()]
    for got, want in zip(remote, local):
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(y2.numpy(), local[0])
    assert c.run(lambda: fc.rank() * 10) == [0, 10]


# -- bad frames on the Unix socket ----------------------------------------------------------------------------
def test_forged_unsigned_replayed_and_garbage_frames_on_the_unix_socket_are_dropped(make_cluster):
    c = make_cluster(workers=1)
    task = c.workers[0]
    server_id = c.client._peers[task].server_id
    path = lane_of(c, task)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(5)
    try:
        s.connect(path)
        good = P.Signer(c.key, "client-test").pack("ping", server_id, {"n": 1})
        bad = [[b"garbage"], [os.urandom(64)], [good[0][32:]],                      # garbage, unsigned
               P.Signer(os.urandom(32), "client-x").pack("ping", server_id),        # forged
               [good[0], b"extra"]]                                                 # a frame too many
        for frames in bad + [good, good]:                                           # the second: replayed
            s.sendall(frame(frames))
        reply = s.recv(65536)
        count = struct.unpack_from("<I", reply)[0]
        header = reply[4 + 8 * count:]
        msg = P.Verifier(c.key, "client-test").unpack([header])
        assert msg.body == {"n": 1, "re": 1, "ok": True}
        s.settimeout(0.3)
        with pytest.raises(socket.timeout):
            s.recv(65536)                       # nothing answered the dropped ones
        assert c.client.request(task, "stats").body["dropped"] == 6
        # a stream that breaks the framing is dropped, counted, and that connection closed
        s.settimeout(5)
        s.sendall(struct.pack("<I", 0) + b"not a message")
        assert s.recv(65536) == b""
        s2 = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s2.settimeout(5)
        s2.connect(path)
        s2.sendall(struct.pack("<IQ", 1, 1 << 62))          # an absurd frame length
        assert s2.recv(65536) == b""
        s2.close()
        assert c.client.request(task, "stats").body["dropped"] == 8
        assert c.run(lambda: "serving") == ["serving"]
        log = c.logs(0)
        assert "bad signature" in log and "replayed" in log and "bad frame count" in log
    finally:
        s.close()


# -- the socket files ----------------------------------------------------------------------------------------
def test_socket_files_are_removed_after_close_and_after_sigkill(make_cluster):
    c = make_cluster(workers=2)
    paths = [lane_of(c, t) for t in c.tasks]
    assert all(os.path.exists(p) for p in paths)
    c.kill(1)
    t = time.monotonic()
    with pytest.raises(fc.WorkerDiedError):
        c.call(1, time.sleep, 30)                   # liveness over the lane: named within a second
    assert time.monotonic() - t < 1.0 + SLACK
    assert wait_for(lambda: not os.path.exists(paths[1]), 1.0 + SLACK), "a killed task's socket file stayed"
    assert os.path.exists(paths[0])
    c.restart(1)                                   # back on its port, with its lane
    assert lane_of(c, c.workers[1]) == paths[1] and os.path.exists(paths[1])
    assert c.client.stats["lanes"][c.workers[1]] == "unix"
    assert c.run(lambda: fc.rank()) == [0, 1]
    c.close()
    assert not any(os.path.exists(p) for p in paths)


def test_an_in_process_server_removes_its_socket_on_stop(monkeypatch):
    monkeypatch.delenv("FLOWLAB_LOCAL_LANE", raising=False)
    srv = fc.Server.create_local_server()
    try:
        path = srv._listener.lane_path
        assert path and os.path.exists(path)
        client = fc.Client(srv.key)
        client.add("/job:localhost/task:0", srv.address)
        assert client.lane("/job:localhost/task:0") == "unix"
        assert client.request("/job:localhost/task:0", "ping", {"x": 3}).body["x"] == 3
        client.close()
    finally:
        srv.stop()
        assert srv.join(5)
    assert not os.path.exists(path)


def test_a_stale_socket_file_falls_back_to_tcp(make_cluster):
    c = make_cluster(workers=1)
    task = c.workers[0]
    path = lane_of(c, task)
    os.unlink(path)                                 # as if a killed task left a file that was removed
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(path)                                  # a file nobody listens on
    dead.close()
    client = fc.Client(c.key)
    try:
        client.add(task, c.spec.address_of(task))
        assert client.lane(task) == "tcp"
        assert client.request(task, "ping", {"ok2": 1}).body["ok2"] == 1
        assert not os.path.exists(path)              # the stale file was removed
    finally:
        client.close()


# -- liveness over the lane ----------------------------------------------------------------------------------
def test_a_large_send_to_a_stopped_worker_raises_its_error_within_three_seconds(make_cluster):
    c = make_cluster(workers=1)
    assert c.client.lane(c.workers[0]) == "unix"
    pid = c.pid(0)
    big = np.ones(16 << 20, np.float32)             # 64 MiB: far more than the socket buffers hold
    os.kill(pid, signal.SIGSTOP)
    try:
        t = time.monotonic()
        with pytest.raises(fc.WorkerUnresponsiveError) as info:
            c.client.request(c.workers[0], "put", {"key": "big"}, [big])
        assert time.monotonic() - t < 3.0 + SLACK
        assert info.value.pid == pid
    finally:
        os.kill(pid, signal.SIGCONT)
    assert wait_for(lambda: c.status(0) == "alive", 10)
    assert c.call(0, lambda: "awake") == "awake"    # the next send connects again
