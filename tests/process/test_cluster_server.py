"""fl.train.Server in this process over real sockets (no child processes): TensorFlow's shape."""
import numpy as np
import pytest

import flowlab as fl
from flowlab.cluster.client import Client

pytestmark = pytest.mark.process


def _port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_server_from_a_spec_starts_serves_and_stops():
    spec = fl.train.ClusterSpec({"worker": [f"localhost:{_port()}"]})
    server = fl.train.Server(spec, job_name="worker", task_index=0)
    try:
        assert server.target == f"flowlab://127.0.0.1:{spec.task_address('worker', 0).rsplit(':', 1)[1]}"
        client = Client.connect(spec, server.key)
        a = np.arange(1 << 20, dtype=np.float64)          # 8 MiB, zero-copy frames
        client.request(server.name, "put", {"key": "a"}, [a])
        np.testing.assert_array_equal(client.request(server.name, "get", {"key": "a"}).buffers[0], a)
        assert client.call(server.name, lambda: fl.cluster.rank()) == 0
        client.close()
    finally:
        server.stop()
    assert server.join(5)


def test_two_servers_of_one_spec_push_to_each_other():
    spec = fl.train.ClusterSpec({"worker": [f"localhost:{_port()}", f"localhost:{_port()}"]})
    key = bytes(range(32))
    servers = [fl.train.Server(spec, "worker", i, key=key) for i in range(2)]
    try:
        client = Client.connect(spec, key)
        client.request(servers[0].name, "put", {"key": "x"}, [np.ones(4)])
        client.request(servers[0].name, "push", {"key": "x", "to": "/job:worker/task:1"})
        assert client.request(servers[1].name, "get", {"key": "x"}).buffers[0].tolist() == [1.0] * 4
        client.close()
    finally:
        for s in servers:
            s.stop()
    assert all(s.join(5) for s in servers)
