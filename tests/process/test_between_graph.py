"""TF1 between-graph replication, as the classic ps/worker script does it: one script started as a
``ps`` task and two ``worker`` tasks (real processes, ``job_name``/``task_index`` arguments, one
ClusterSpec on free localhost ports). The ps calls ``server.join()``; each worker builds the same
graph under ``tf.train.replica_device_setter``, so the variables live on the ps under their
names and both workers update the same storage. A third process reads what they left there."""
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from _processes import free_ports, kill_left, wait_gone
from flowlab.cluster.protocol import new_key
from flowlab.cluster.unix import remove_if_dead

pytestmark = pytest.mark.process

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# the script a reader of a TF1 tutorial would write, with flowlab's import
SCRIPT = """\
import sys
import time

import numpy as np
import flowlab.compat.v1 as tf

job_name, task_index, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
steps = int(sys.argv[4]) if len(sys.argv) > 4 else 0
max_wait = float(sys.argv[5]) if len(sys.argv) > 5 else 120.0

cluster = tf.train.ClusterSpec({"ps": ["localhost:PS"], "worker": ["localhost:W0", "localhost:W1"]})
if mode != "read":
    server = tf.train.Server(cluster, job_name=job_name, task_index=task_index)

if job_name == "ps":
    print("ps listening", flush=True)
    server.join()
    sys.exit(0)

# every process builds the same graph: its variables live on the ps task, by name
with tf.device(tf.train.replica_device_setter(worker_device="/job:worker/task:%d" % task_index, cluster=cluster)):
    global_step = tf.train.get_or_create_global_step()
    x = tf.placeholder(tf.float32, [None, 1])
    y = tf.placeholder(tf.float32, [None, 1])
    w = tf.Variable(tf.zeros([1, 1]), name="w")
    b = tf.Variable(tf.zeros([1]), name="b")
    steps_by_worker = tf.Variable(tf.zeros([2]), name="steps_by_worker")
    loss = tf.reduce_mean(tf.square(tf.matmul(x, w) + b - y))
    mine = np.eye(2, dtype=np.float32)[task_index % 2]
    train_op = tf.group(tf.train.GradientDescentOptimizer(0.05).minimize(loss, global_step=global_step),
                        steps_by_worker.assign_add(mine))
    init = tf.global_variables_initializer()

xs = np.linspace(-1, 1, 16, dtype=np.float32).reshape(-1, 1)
feed = {x: xs, y: 3.0 * xs + 1.0}

if mode == "session":          # plain tf.Session: the chief initializes, the other waits for it
    not_ready = tf.report_uninitialized_variables()
    with tf.Session(server.target) as sess:
        if task_index == 0:
            sess.run(init)
        else:
            while len(sess.run(not_ready)):
                time.sleep(0.05)
        for _ in range(steps):
            sess.run(train_op, feed_dict=feed)
    print("steps", steps, flush=True)
elif mode == "monitored":      # MonitoredTrainingSession with a StopAtStepHook on the shared step
    done = 0
    hooks = [tf.train.StopAtStepHook(last_step=steps)]
    with tf.train.MonitoredTrainingSession(master=server.target, is_chief=(task_index == 0), hooks=hooks,
                                           max_wait_secs=max_wait) as sess:
        while not sess.should_stop():
            sess.run(train_op, feed_dict=feed)
            done += 1
    print("steps", done, flush=True)
elif mode == "read":           # a third client, no task of its own: reads the ps, initializes nothing
    with tf.Session("grpc://localhost:PS") as sess:
        gs, per, wv, bv = sess.run([global_step, steps_by_worker, w, b])
    print("read", int(gs), " ".join(str(float(v)) for v in per), float(wv[0, 0]), float(bv[0]), flush=True)
"""


class Tasks:
    """The script's processes: started by ``start``, every one ended (by pid) at the end."""

    def __init__(self, tmp_path):
        self.ports = free_ports(3)
        ps, w0, w1 = self.ports
        self.script = tmp_path / "trainer.py"
        self.script.write_text(SCRIPT.replace("PS", str(ps)).replace("W0", str(w0)).replace("W1", str(w1)))
        self.env = {**os.environ, "FLOWLAB_CLUSTER_KEY": new_key().hex(), "PYTHONPATH": ROOT,
                    "PYTHONUNBUFFERED": "1"}
        self.tmp = tmp_path
        self.procs = []

    def start(self, *args):
        p = subprocess.Popen([sys.executable, str(self.script), *map(str, args)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=self.env, cwd=self.tmp)
        self.procs.append(p)
        return p

    def finish(self, p, timeout=120):
        out, err = p.communicate(timeout=timeout)
        assert p.returncode == 0, out + err
        return out

    def read(self):
        """(global step, steps by worker, w, b, loss) as a third process finds them on the ps."""
        words = self.finish(self.start("client", 0, "read")).split()
        assert words[0] == "read", words
        w, b = float(words[4]), float(words[5])
        return int(words[1]), [float(words[2]), float(words[3])], w, b, _loss(w, b)

    def close(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
        left = wait_gone([p.pid for p in self.procs], 10)
        kill_left(left)
        for p in self.procs:
            p.communicate()
        for port in self.ports:   # a killed server cannot remove its local-lane socket
            remove_if_dead(f"127.0.0.1:{port}")
        assert not left, f"processes left: {left}"


@pytest.fixture
def tasks(tmp_path):
    t = Tasks(tmp_path)
    try:
        ps = t.start("ps", 0, "serve")
        assert ps.stdout.readline().strip() == "ps listening"
        yield t
    finally:
        t.close()


def _loss(w, b):
    xs = np.linspace(-1, 1, 16, dtype=np.float32)
    return float(np.mean((w * xs + b - (3.0 * xs + 1.0)) ** 2))


def _initial_loss():
    return _loss(0.0, 0.0)


def test_two_workers_sessions_share_the_ps_variables_and_their_steps_add_up(tasks):
    w0 = tasks.start("worker", 0, "session", 25)
    w1 = tasks.start("worker", 1, "session", 15)
    assert tasks.finish(w0).split() == ["steps", "25"]
    assert tasks.finish(w1).split() == ["steps", "15"]
    step, by_worker, w, b, loss = tasks.read()
    assert step == 40                        # both workers' minimize(global_step=...) on one counter
    assert by_worker == [25.0, 15.0]          # each worker's own additions landed there
    assert w > 0.5 and b > 0.1 and loss < _initial_loss() / 2   # 40 steps of training, not 25 or 15


def test_monitored_sessions_stop_both_workers_at_the_shared_last_step_and_a_late_chief_is_waited_for(tasks):
    w1 = tasks.start("worker", 1, "monitored", 60)     # the non-chief first: it waits for the chief
    lines = []
    while not lines or ("waiting for the chief" not in lines[-1] and lines[-1]):
        lines.append(w1.stderr.readline())       # "" at the end of the stream: it exited instead
    assert "waiting for the chief to initialize" in lines[-1] and "global_step" in lines[-1], lines
    w0 = tasks.start("worker", 0, "monitored", 60)
    done0 = int(tasks.finish(w0).split()[1])
    done1 = int(tasks.finish(w1).split()[1])
    step, by_worker, w, b, loss = tasks.read()
    assert by_worker == [float(done0), float(done1)]
    assert step == done0 + done1
    assert 60 <= step <= 61     # each stops once the shared step is 60; both may be in their last step
    assert loss < _initial_loss() / 2


def test_a_non_chief_whose_chief_never_comes_fails_at_its_deadline_naming_the_variables(tasks):
    start = time.monotonic()
    p = tasks.start("worker", 1, "monitored", 10, 1.5)
    out, err = p.communicate(timeout=60)
    assert p.returncode != 0
    assert "DeadlineExceededError" in err and "chief" in err, err
    for name in ("global_step", "w", "b", "steps_by_worker"):
        assert name in err.splitlines()[-1]
    assert time.monotonic() - start < 50
