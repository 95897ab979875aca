"""The installed ``flowlab`` command runs in a fresh process."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

import flowlab

pytestmark = pytest.mark.process
SCRIPT = Path(sys.executable).with_name("flowlab")


def _run(*args):
    cmd = [str(SCRIPT), *args] if SCRIPT.exists() else [sys.executable, "-m", "flowlab", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=dict(os.environ))


def test_info_reports_versions_blas_and_gpu():
    r = _run("info")
    assert r.returncode == 0, r.stderr
    assert f"flowlab      {flowlab.__version__}" in r.stdout
    assert "thread(s)" in r.stdout          # BLAS and its thread count
    assert "GPU (CuPy)" in r.stdout
    # the engine's ops (`flowlab info` does not load the cluster, whose collectives are table ops too)
    engine = [n for n in flowlab.core.list_ops() if not flowlab.core.get_op(n).peers]
    assert f"{len(engine)} in the op table" in r.stdout


def test_no_command_prints_help_and_fails():
    r = _run()
    assert r.returncode == 2
    assert "info" in r.stdout


def test_version():
    r = _run("--version")
    assert r.returncode == 0 and r.stdout.strip() == flowlab.__version__


# -- flowlab worker: one task of a cluster from a shell ---------------------------------------------
def _free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_worker(args, env_extra, tmp_path):
    import subprocess as sp
    cmd = [str(SCRIPT), *args] if SCRIPT.exists() else [sys.executable, "-m", "flowlab", *args]
    log = open(tmp_path / "worker.log", "w")
    return sp.Popen(cmd, stdout=log, stderr=sp.STDOUT, env={**os.environ, **env_extra}, start_new_session=True)


def _stop(proc):
    if proc.poll() is None:
        proc.kill()
    proc.wait(10)


@pytest.mark.parametrize("how", ["spec-file", "FLOWLAB_CONFIG"])
def test_worker_serves_one_task_from_a_shell(tmp_path, how):
    import json

    from flowlab.cluster import protocol
    from flowlab.cluster.client import Client

    key = protocol.new_key()
    ports = [_free_port(), _free_port()]
    cluster = {"worker": [f"localhost:{p}" for p in ports]}
    if how == "spec-file":
        (tmp_path / "spec.json").write_text(json.dumps(cluster))
        (tmp_path / "cluster.key").write_text(key.hex())
        args, env = ["worker", "--cluster", str(tmp_path / "spec.json"), "--job", "worker", "--task", "1",
                     "--key-file", str(tmp_path / "cluster.key")], {}
    else:
        args = ["worker"]
        env = {"FLOWLAB_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "worker", "index": 1}}),
               "FLOWLAB_CLUSTER_KEY": key.hex()}
    proc = _start_worker(args, env, tmp_path)
    try:
        client = Client(key)
        client.add("/job:worker/task:1", f"127.0.0.1:{ports[1]}", timeout=30)
        import flowlab.cluster as fc
        assert client.call("/job:worker/task:1", lambda: (fc.rank(), fc.world_size(), os.getpid())) == (1, 2, proc.pid)
        assert client.call("/job:worker/task:1", lambda: os.environ.get("FLOWLAB_CLUSTER_KEY")) is None
        client.request("/job:worker/task:1", "shutdown")
        assert proc.wait(10) == 0
        client.close()
    finally:
        _stop(proc)
    log = (tmp_path / "worker.log").read_text()
    assert f"/job:worker/task:1 (pid {proc.pid}) listening on 127.0.0.1:{ports[1]}" in log


def test_worker_refuses_to_start_without_a_key_or_a_spec(tmp_path):
    import json
    (tmp_path / "spec.json").write_text(json.dumps({"worker": ["localhost:1"]}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLOWLAB_")}
    cmd = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "flowlab"]
    r = subprocess.run([*cmd, "worker", "--cluster", str(tmp_path / "spec.json")], capture_output=True, text=True,
                       timeout=60, env=env)
    assert r.returncode == 2 and "no cluster key" in r.stderr and "FLOWLAB_CLUSTER_KEY" in r.stderr
    r = subprocess.run([*cmd, "worker"], capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 2 and "--cluster" in r.stderr and "FLOWLAB_CONFIG" in r.stderr
    r = subprocess.run([*cmd, "worker", "--cluster", str(tmp_path / "spec.json"), "--task", "5"],
                       capture_output=True, text=True, timeout=60, env={**env, "FLOWLAB_CLUSTER_KEY": "ab" * 16})
    assert r.returncode == 2 and "has no task 5" in r.stderr
