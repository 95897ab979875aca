import pytest

import flowlab as fl


@pytest.fixture
def hidden_gpus():
    """This machine's GPUs hidden, as a TensorFlow user hides them (``set_visible_devices([], "GPU")``),
    for tests about CPU devices that a visible GPU would change (MirroredStrategy() picks the GPUs);
    shown again after the test."""
    visible = fl.config.get_visible_devices("GPU")
    fl.config.set_visible_devices([], "GPU")
    yield
    fl.config.set_visible_devices(visible, "GPU")


@pytest.fixture
def cpus(hidden_gpus):
    """``cpus(n)`` splits this process into n logical CPU devices (and hides any GPU), undone after the test."""
    def make(n):
        fl.config.set_logical_devices("CPU", n)
    yield make
    fl.config.set_logical_devices("CPU", None)


@pytest.fixture
def inproc_task():
    """``(server, client)``: one task, /job:worker/task:0, served in this process over the in-process
    transport, and a client connected to it; both closed after the test."""
    from flowlab.cluster.client import Client
    from flowlab.cluster.events import EventLog
    from flowlab.cluster.server import Server
    key = bytes(range(40, 72))
    server = Server(port=0, job_name="worker", task_index=0, key=key, transport="inproc", event_log=EventLog())
    client = Client(key, transport="inproc", event_log=EventLog())
    client.add(server.name, server.address)
    yield server, client
    client.close()
    server.stop()
    assert server.join(5)



@pytest.fixture
def widget_comm(monkeypatch):
    """Widgets made in the test talk to ``_widgets.RecordingComm``s; returns the list of comms made."""
    import comm
    from _widgets import RecordingComm
    made = []

    def create(**kwargs):
        c = RecordingComm(**kwargs)
        made.append(c)
        return c
    monkeypatch.setattr(comm, "create_comm", create)
    return made


@pytest.fixture
def inproc_cluster(request):
    """Two in-process servers (worker 0 and 1) that know their spec, and a client to both, keyed
    with the test module's ``KEY``: ``(servers, client, spec)``. Stopped and joined afterwards,
    even when the test fails."""
    from flowlab.cluster import ClusterSpec
    from flowlab.cluster.client import Client
    from flowlab.cluster.events import EventLog
    from flowlab.cluster.server import Server
    key = request.module.KEY
    servers = [Server(port=0, job_name="worker", task_index=i, key=key, transport="inproc", event_log=EventLog())
               for i in range(2)]
    spec = ClusterSpec({"worker": [s.address for s in servers]})
    client = Client(key, transport="inproc", event_log=EventLog())
    try:
        for s in servers:
            client.add(s.name, s.address)
        client.request_all([s.name for s in servers], "spec", {"cluster": spec.as_dict()})
        yield servers, client, spec
    finally:
        client.close()
        for s in servers:
            s.stop()
        for s in servers:
            assert s.join(5), f"{s.name} did not stop"


@pytest.fixture
def gpus():
    """One simulated GPU (tests/unit/_simgpu.py, a stand-in for CuPy) in the GPU backend's place;
    ``fl.config.set_logical_devices("GPU", n)`` makes n of it. Undone after the test."""
    from _simgpu import SimulatedGPUs
    from flowlab.core import backends
    sim = SimulatedGPUs(1)
    backends._use_gpu_backend(sim)
    try:
        yield sim
    finally:
        backends._use_gpu_backend(None)
        fl.config.set_logical_devices("GPU", None)
        fl.config.set_logical_devices("CPU", None)
