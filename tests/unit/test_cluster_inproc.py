"""Servers and clients running the real protocol over the in-process transport (threads, no sockets)."""
import threading
import time

import numpy as np
import pytest

import flowlab.cluster as fc
from flowlab.cluster import protocol as P
from flowlab.cluster.client import Client
from flowlab.cluster.errors import ClusterError, ClusterTimeoutError, RemoteError
from flowlab.cluster.events import EventLog
from flowlab.cluster.inproc import InprocTransport
from flowlab.cluster.server import Reply, Server

KEY = bytes(range(100, 132))


@pytest.fixture
def cluster(inproc_cluster):
    """Two inproc servers (worker 0 and 1) that know their spec, and a client to both."""
    servers, client, _ = inproc_cluster
    return servers, client


def test_hello_ping_and_stats(cluster):
    (s0, _), client = cluster
    assert client.request(s0.name, "ping", {"x": 1}).body["x"] == 1
    stats = client.request(s0.name, "stats").body
    assert stats["task"] == "/job:worker/task:0" and stats["messages"] >= 3 and stats["dropped"] == 0
    assert s0.target == f"flowlab://{s0.address}" and s0.address.startswith("inproc:")


def test_run_gives_rank_and_world_size_and_returns_results(cluster):
    servers, client = cluster
    pend = [client.submit_call(s.name, lambda a, b=0: (fc.rank(), fc.world_size(), a + b), (1,), {"b": 2})
            for s in servers]
    assert client.gather(pend) == [(0, 2, 3), (1, 2, 3)]
    assert fc.rank() == 0 and fc.world_size() == 1          # outside a task


def test_remote_exception_carries_task_traceback_and_class(cluster):
    (s0, _), client = cluster

    def bad():
        return {}["missing"]

    with pytest.raises(RemoteError) as info:
        client.call(s0.name, bad)
    e = info.value
    assert isinstance(e, KeyError)                      # `except KeyError` works around remote calls
    assert e.task == "/job:worker/task:0" and e.remote_type == "KeyError"
    assert "in bad" in e.remote_traceback and "return {}[\"missing\"]" in e.remote_traceback
    assert "/job:worker/task:0" in str(e) and "remote traceback" in str(e)


def test_unknown_message_type_is_a_remote_error_and_server_goes_on(cluster):
    (s0, _), client = cluster
    with pytest.raises(RemoteError, match="no handler for messages of type 'nope'"):
        client.request(s0.name, "nope")
    assert client.request(s0.name, "ping").body["ok"]


def test_garbage_unsigned_forged_and_replayed_frames_are_dropped_and_counted(cluster):
    (s0, _), client = cluster
    conn = InprocTransport().connect(s0.address)
    signer = P.Signer(KEY, "client-evil")
    replay = signer.pack("ping", s0.id)
    for frames in ([b"garbage"], [b"\x00" * 40], P.Signer(b"k" * 32, "x").pack("ping", s0.id), replay, replay):
        conn.send(frames)
    assert conn.recv(2) is not None          # the first copy of `replay` was answered
    assert client.request(s0.name, "ping").body["ok"]   # still serving
    assert conn.recv(0.2) is None            # nothing else was answered
    assert client.request(s0.name, "stats").body["dropped"] == 4
    drops = s0.log.events(kind="drop")
    assert [e.name for e in drops] == ["ProtocolError"] * 4
    assert "replayed" in drops[-1].attrs["reason"]
    conn.close()


def test_put_get_push_move_arrays_and_leave_events(cluster):
    (s0, s1), client = cluster
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    client.request(s0.name, "put", {"key": "a"}, [a])
    np.testing.assert_array_equal(client.request(s0.name, "get", {"key": "a"}).buffers[0], a)
    reply = client.request(s0.name, "push", {"key": "a", "to": s1.name, "as": "b"})
    assert reply.body["bytes"] == a.nbytes
    np.testing.assert_array_equal(client.request(s1.name, "get", {"key": "b"}).buffers[0], a)
    sent = client.request(s0.name, "events").body["events"]
    got = client.request(s1.name, "events").body["events"]
    assert any(e["kind"] == "send" and e["bytes"] == a.nbytes and e["attrs"]["peer"] == s1.name for e in sent)
    assert any(e["kind"] == "recv" and e["name"] == "b" and e["task"] == s1.name for e in got)
    with pytest.raises(RemoteError, match="no value named 'zz'"):
        client.request(s0.name, "get", {"key": "zz"})


def test_custom_handlers_inline_and_on_the_execution_thread(cluster):
    (s0, _), client = cluster
    s0.register("double", lambda server, msg: Reply({"n": len(msg.buffers)}, [msg.buffers[0] * 2]))
    gate = threading.Event()
    s0.register("wait", lambda server, msg: {"waited": gate.wait(5)}, inline=False)
    r = client.request(s0.name, "double", None, [np.ones(3)])
    assert r.body["n"] == 1 and r.buffers[0].tolist() == [2.0, 2.0, 2.0]
    p = client.submit(s0.name, "wait")
    assert client.request(s0.name, "ping").body["ok"]      # the loop still answers while a handler waits
    gate.set()
    assert client.result(p).body["waited"] is True


def test_one_way_handlers_send_nothing_back_and_count_their_errors(cluster):
    (s0, _), client = cluster
    seen = []
    s0.register("note", lambda server, msg: seen.append(msg.body["n"]), reply=False)
    s0.register("bad", lambda server, msg: 1 / 0, reply=False)
    pending = [client.submit(s0.name, "note", {"n": n}) for n in range(3)] + [client.submit(s0.name, "bad")]
    assert client.request(s0.name, "ping").body["ok"]     # answered after the four one-way messages
    assert seen == [0, 1, 2] and s0.stats["oneway_errors"] == 1
    with pytest.raises(ClusterTimeoutError):
        client.result(pending[0], timeout=0.2)             # no reply ever comes for a one-way message


def test_a_call_to_a_stopped_server_times_out_with_the_task_named(cluster):
    (s0, _), client = cluster
    s0.stop()
    assert s0.join(5)
    with pytest.raises(ClusterTimeoutError, match="/job:worker/task:0 did not answer a 'ping' request within 0.3 s"):
        client.request(s0.name, "ping", timeout=0.3)


def test_health_errors_stop_a_waiting_call(cluster):
    (s0, _), client = cluster
    client.health = lambda task: ClusterError(f"{task} is gone (said the health check)")
    t = time.monotonic()
    with pytest.raises(ClusterError, match="is gone"):
        client.call(s0.name, time.sleep, 3)
    assert time.monotonic() - t < 2.5


def test_replies_for_several_requests_are_sorted_out_across_threads(cluster):
    (s0, s1), client = cluster
    out, errors = {}, []

    def worker(i):
        try:
            task = (s0, s1)[i % 2].name
            out[i] = client.request(task, "ping", {"i": i}).body["i"]
        except Exception as e:   # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert not errors and out == {i: i for i in range(16)}


def test_client_without_connection_names_what_it_knows(cluster):
    _, client = cluster
    with pytest.raises(ClusterError, match="not connected to /job:ps/task:0"):
        client.request("/job:ps/task:0", "ping")


def test_server_needs_a_port_or_a_spec_and_warns_on_public_bind():
    with pytest.raises(ValueError, match="needs a ClusterSpec"):
        Server(job_name="worker", task_index=0, key=KEY, transport="inproc", start=False)
    with pytest.warns(UserWarning, match="reachable from other machines"):
        s = Server(port=0, key=KEY, transport="inproc", bind="0.0.0.0", start=False)
    assert s.name == "/job:worker/task:0"


def test_server_key_comes_from_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("FLOWLAB_CLUSTER_KEY", "ab" * 16)
    assert Server(port=0, transport="inproc", start=False).key == b"\xab" * 16
    monkeypatch.delenv("FLOWLAB_CLUSTER_KEY")
    f = tmp_path / "k"
    f.write_text("cd" * 20 + "\n")
    monkeypatch.setenv("FLOWLAB_CLUSTER_KEY_FILE", str(f))
    assert Server(port=0, transport="inproc", start=False).key == b"\xcd" * 20
    monkeypatch.delenv("FLOWLAB_CLUSTER_KEY_FILE")
    assert len(Server(port=0, transport="inproc", start=False).key) == 32   # a fresh random key


def test_transports_are_chosen_by_the_address_scheme():
    from flowlab.cluster import schemes
    from flowlab.cluster.spec import split_address
    assert [schemes.scheme_of(a) for a in ("inproc:3", "localhost:2222", "tcp://h:1", "[::1]:5")] == \
        ["inproc", "tcp", "tcp", "tcp"]
    assert split_address("tcp://h:5") == ("h", 5)
    assert (schemes.get("zmq").scheme, schemes.get("tcp", KEY).key, schemes.get("inproc").scheme) == \
        ("tcp", KEY, "inproc")
    with pytest.raises(ValueError, match="'udp'; known: tcp, inproc, zmq"):
        schemes.get("udp")
    with pytest.raises(ValueError, match="'udp'"):
        Server(port=0, key=KEY, transport="udp", start=False)
    # no transport named: the server listens by its address in the spec, the client connects by it
    spec = fc.ClusterSpec({"worker": ["inproc:47001"]})
    s = Server(spec, job_name="worker", task_index=0, key=KEY, event_log=EventLog())
    client = Client(KEY, event_log=EventLog())
    try:
        assert (s.transport.scheme, s.address) == ("inproc", "inproc:47001")
        client.add(s.name, s.address)
        assert client.request(s.name, "ping", {"x": 2}).body["x"] == 2
    finally:
        client.close()
        s.stop()
        assert s.join(5)
