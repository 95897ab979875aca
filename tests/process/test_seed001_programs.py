"""The programs of seeds/001 (distributed computation with TF1), run with ``import flowlab.compat.v1
as tf`` against real task processes: the seed's own ``create_worker.py`` (``tf.train.Server`` +
``join``) started twice, and ``tf.Session("grpc://localhost:PORT")`` in a third process; then the
same programs and the three exercises against a LocalCluster, compared with a local session."""
import contextlib
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from _processes import free_ports

import flowlab as fl
import flowlab.compat.v1 as tf
from flowlab.cluster.protocol import new_key
from flowlab.cluster.unix import remove_if_dead

pytestmark = pytest.mark.process

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CREATE_WORKER = """\
# Get task number from command line
import sys
task_number = int(sys.argv[1])

import flowlab.compat.v1 as tf

cluster = tf.train.ClusterSpec({"local": ["localhost:PORT0", "localhost:PORT1"]})
server = tf.train.Server(cluster, job_name="local", task_index=task_number)

print("Starting server #{}".format(task_number), flush=True)

server.start()
server.join()
"""

SUM = """\
import flowlab.compat.v1 as tf

cluster = tf.train.ClusterSpec({"local": ["localhost:PORT0", "localhost:PORT1"]})

x = tf.constant(2)

with tf.device("/job:local/task:1"):
    y2 = x - 66

with tf.device("/job:local/task:0"):
    y1 = x + 300
    y = y1 + y2

with tf.Session("grpc://localhost:PORT0") as sess:
    result = sess.run(y)
    print(result)
"""

MEAN = """\
import numpy as np
import flowlab.compat.v1 as tf

cluster = tf.train.ClusterSpec({"local": ["localhost:PORT0", "localhost:PORT1"]})

x = tf.placeholder(tf.float32, 100)

with tf.device("/job:local/task:1"):
    first_batch = tf.slice(x, [0], [50])
    mean1 = tf.reduce_mean(first_batch)

with tf.device("/job:local/task:0"):
    second_batch = tf.slice(x, [50], [-1])
    mean2 = tf.reduce_mean(second_batch)
    mean = (mean1 + mean2) / 2

data = np.random.RandomState(0).random_sample(100)
with tf.Session("grpc://localhost:PORT0") as sess:
    result = sess.run(mean, feed_dict={x: data})
    print(result, np.float32(data.astype(np.float32).mean()))
"""


def fill(text, ports):
    return text.replace("PORT0", str(ports[0])).replace("PORT1", str(ports[1]))


@pytest.fixture
def seed_servers(tmp_path):
    """The seed's two `python create_worker.py N` processes, sharing a cluster key (env)."""
    ports = free_ports(2)
    env = {**os.environ, "FLOWLAB_CLUSTER_KEY": new_key().hex(), "PYTHONPATH": ROOT}
    script = tmp_path / "create_worker.py"
    script.write_text(fill(CREATE_WORKER, ports))
    procs = []
    try:
        for i in range(2):
            procs.append(subprocess.Popen([sys.executable, str(script), str(i)], stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, env=env, cwd=tmp_path))
        for i, p in enumerate(procs):   # "Starting server #i" once it listens (start() binds first)
            line = p.stdout.readline().decode()
            assert f"Starting server #{i}" in line, line
        yield ports, env, tmp_path
    finally:
        for p in procs:                 # ours, by pid
            if p.poll() is None:
                p.kill()
            p.wait(10)
            p.stdout.close()
        for port in ports:              # a SIGKILLed server cannot remove its local-lane socket
            remove_if_dead(f"127.0.0.1:{port}")


def run_client(source, ports, env, tmp_path, timeout=90):
    script = tmp_path / "client.py"
    script.write_text(fill(source, ports))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, cwd=tmp_path,
                         timeout=timeout)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout.strip()


def test_seed_sum_prints_238_across_two_server_processes(seed_servers):
    ports, env, tmp = seed_servers
    assert run_client(SUM, ports, env, tmp) == "238"


def test_seed_mean_of_two_slices_matches_numpy(seed_servers):
    ports, env, tmp = seed_servers
    got, want = map(float, run_client(MEAN, ports, env, tmp).split())
    assert got == pytest.approx(want, rel=1e-6)


def test_session_on_an_address_with_no_server_fails_clearly(tmp_path):
    port = free_ports(1)[0]
    env = {**os.environ, "FLOWLAB_CLUSTER_KEY": new_key().hex(), "PYTHONPATH": ROOT}
    src = textwrap.dedent(f"""\
        import flowlab.compat.v1 as tf
        from flowlab.cluster.partition import connect
        try:
            connect("grpc://localhost:{port}", timeout=1.0)
        except Exception as e:
            print(type(e).__name__, e)
        """)
    script = tmp_path / "c.py"
    script.write_text(src)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=60)
    assert "no flowlab server answered at 127.0.0.1:" in out.stdout, out.stdout + out.stderr


# -- the same programs and the exercises on a LocalCluster, against a local session ---------------
@pytest.fixture(scope="module")
def cluster():
    c = fl.cluster.LocalCluster(workers=2, ps=1)
    try:
        yield c
    finally:
        c.close()


def _on(device, placed=True):
    """tf.device(device), or no placement at all for the single-process reference."""
    return tf.device(device) if placed else contextlib.nullcontext()


def _sum_graph(job, placed=True):
    g = tf.Graph()
    with g.as_default():
        x = tf.constant(2)
        with _on(f"/job:{job}/task:1", placed):
            y2 = x - 66
        with _on(f"/job:{job}/task:0", placed):
            y1 = x + 300
            y = y1 + y2
    return g, y


def test_sum_with_grpc_alias_of_the_cluster_target(cluster):
    g, y = _sum_graph("worker")
    grpc = cluster.target.replace("flowlab://", "grpc://")
    with tf.Session(grpc, graph=g) as sess:
        assert sess.run(y) == 238
        parts = sess.partitions(y)
    assert set(parts) == {"/job:worker/task:0", "/job:worker/task:1"}
    assert "recv subtract from /job:worker/task:1" in parts["/job:worker/task:0"]
    g, y = _sum_graph("worker", placed=False)
    with tf.Session(graph=g) as local:
        assert local.run(y) == 238


def test_exercise_1_renamed_job_names_the_node_and_the_tasks(cluster):
    """Renaming the job in the ClusterSpec but not in tf.device: a clear error, not a silent run."""
    g, y = _sum_graph("local")
    with tf.Session(cluster.target, graph=g) as sess:
        with pytest.raises(fl.errors.InvalidArgumentError) as info:
            sess.run(y)
    msg = str(info.value)
    assert "/job:local/task:" in msg and "/job:worker/task:0" in msg and "test_seed001_programs.py" in msg


def _mean_graph(sizes, weighted, placed=True):
    g = tf.Graph()
    with g.as_default():
        x = tf.placeholder(tf.float32, sum(sizes))
        parts, start = [], 0
        for task, n in enumerate(sizes):
            with _on(f"/job:worker/task:{task % 2}", placed):
                piece = tf.slice(x, [start], [n])
                parts.append((tf.cast(tf.size(piece), tf.float32), tf.reduce_mean(piece)))
            start += n
        with _on("/job:worker/task:0", placed):
            if weighted:
                total = tf.add_n([s * m for s, m in parts])
                mean = total / tf.add_n([s for s, _ in parts])
            else:
                mean = tf.add_n([m for _, m in parts]) / len(parts)
    return g, x, mean


def test_mean_of_two_slices_equals_the_single_process_result(cluster):
    data = np.random.RandomState(1).random_sample(100).astype(np.float32)
    g, x, mean = _mean_graph([50, 50], weighted=False)
    with tf.Session(cluster.target, graph=g) as sess:
        remote = sess.run(mean, feed_dict={x: data})
    g, x, mean = _mean_graph([50, 50], weighted=False, placed=False)
    with tf.Session(graph=g) as sess:
        local = sess.run(mean, feed_dict={x: data})
    assert remote == local
    assert remote == pytest.approx(data.mean(), rel=1e-5)


def test_exercise_2_slices_of_different_sizes_need_the_weighted_mean(cluster):
    data = np.random.RandomState(2).random_sample(100).astype(np.float32) * np.arange(100, dtype=np.float32)
    g, x, naive = _mean_graph([20, 80], weighted=False)
    with tf.Session(cluster.target, graph=g) as sess:
        wrong = sess.run(naive, feed_dict={x: data})
    g, x, weighted = _mean_graph([20, 30, 50], weighted=True)
    with tf.Session(cluster.target, graph=g) as sess:
        right = sess.run(weighted, feed_dict={x: data})
    g, x, weighted = _mean_graph([20, 30, 50], weighted=True, placed=False)
    with tf.Session(graph=g) as sess:
        local = sess.run(weighted, feed_dict={x: data})
    assert right == local
    assert right == pytest.approx(data.mean(), rel=1e-5)
    assert abs(wrong - data.mean()) > 1.0     # the plain mean of unequal slices is off


def _gpu_graph():
    g = tf.Graph()
    with g.as_default():
        x = tf.constant([1.0, 2.0, 3.0])
        with tf.device("/job:worker/task:1/gpu:0"):
            y = x * 2.0
        with tf.device("/job:worker/task:0"):
            z = tf.reduce_sum(y)
    return g, z


def test_exercise_3_remote_gpu_fails_clearly_without_one_then_runs_on_a_logical_gpu(cluster):
    g, z = _gpu_graph()
    with tf.Session(cluster.target, graph=g) as sess:
        with pytest.raises(fl.errors.InvalidArgumentError) as info:
            sess.run(z)
    msg = str(info.value)
    assert "failed on /job:worker/task:1/device:GPU:0" in msg and "/job:worker/task:1 has no device:GPU:0" in msg
    assert "y = x * 2.0" in msg and "allow_soft_placement" in msg, msg
    assert "test_seed001_programs.py" in msg       # the line that made the node
    # with allow_soft_placement the node falls back to the task's CPU
    soft = tf.ConfigProto(allow_soft_placement=True)
    with tf.Session(cluster.target, graph=g, config=soft) as sess:
        assert sess.run(z) == 12.0
    # a logical GPU on that task: the same graph runs there
    cluster.call(1, _logical_gpus, 1)
    try:
        with tf.Session(cluster.target, graph=g) as sess:
            assert sess.run(z) == 12.0
        assert any(e.kind == "op" and (e.attrs or {}).get("device") == "/device:GPU:0" and e.task == "/job:worker/task:1"
                   for e in cluster.events())
    finally:
        cluster.call(1, _logical_gpus, None)


def _logical_gpus(n):
    import flowlab as fl
    fl.config.set_logical_devices("GPU", n)


def test_every_send_and_receive_is_in_the_event_log(cluster):
    cluster.events(clear=True)
    g, y = _sum_graph("worker")
    with tf.Session(cluster.target, graph=g) as sess:
        sess.run(y)
    evs = cluster.events()
    sends = [(e.task, e.name, e.attrs["peer"]) for e in evs if e.kind == "send"]
    recvs = [(e.attrs["peer"], e.name, e.task) for e in evs if e.kind == "recv"]
    assert sorted(sends) == sorted(recvs)
    assert ("/job:worker/task:1", "subtract", "/job:worker/task:0") in sends
    assert all(e.bytes == 4 for e in evs if e.kind in ("send", "recv"))
    ops = {(e.task, e.name) for e in evs if e.kind == "op"}
    assert ("/job:worker/task:1", "subtract") in ops and ("/job:worker/task:0", "add_1") in ops


def test_a_failing_partition_stops_the_others_waiting(cluster):
    """Task 1 fails; task 0 waits for its value: the run raises at once instead of waiting."""
    g = tf.Graph()
    with g.as_default():
        x = tf.placeholder(tf.float32, [None])
        with tf.device("/job:worker/task:1"):
            bad = tf.reshape(x, [3])         # fails when fed 4 values
        with tf.device("/job:worker/task:0"):
            out = tf.reduce_sum(bad) + tf.reduce_sum(x)
    with tf.Session(cluster.target, graph=g) as sess:
        with pytest.raises(fl.errors.InvalidArgumentError, match="reshape") as info:
            sess.run(out, feed_dict={x: [1.0, 2.0, 3.0, 4.0]})
        assert "/job:worker/task:1" in str(info.value)
        assert sess.run(out, feed_dict={x: [1.0, 2.0, 3.0]}) == 12.0   # both tasks serve the next run


def test_a_control_input_on_another_task_runs_first_and_is_pulled_in(cluster):
    """``with tf.control_dependencies([update])`` where ``update`` lives on the ps task and the
    node that waits for it on a worker: fetching only that node runs the update, every time."""
    g = tf.Graph()
    with g.as_default():
        with tf.device("/job:ps/task:0"):
            counter = tf.Variable(0, name="counter_cd")
            update = tf.assign_add(counter, 1)
        with tf.device("/job:worker/task:0"):
            with tf.control_dependencies([update]):
                out = tf.identity(tf.constant(7))
        init = tf.global_variables_initializer()
    with tf.Session(cluster.target, graph=g) as sess:
        sess.run(init)
        assert [int(sess.run(out)) for _ in range(3)] == [7, 7, 7]
        assert int(sess.run(counter)) == 3
        assert "recv" in " ".join(sess.partitions(out)["/job:worker/task:0"])
