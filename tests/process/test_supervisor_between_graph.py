"""The classic between-graph ps/worker script written with ``tf.train.Supervisor``, as the TF1
distributed tutorials have it: one script started as a ``ps`` task (``server.join()``) and as two
``worker`` tasks (real processes), variables on the ps through ``replica_device_setter``, the
chief (task 0) initializing them or restoring them from ``logdir``, the other worker waiting for
it, and ``while not sv.should_stop()`` loops whose steps add up on the ps. The processes and their
cleanup are test_between_graph.py's ``Tasks``."""
import os

import pytest

from test_between_graph import Tasks, _initial_loss

pytestmark = pytest.mark.process

SCRIPT = """\
import sys

import numpy as np
import flowlab.compat.v1 as tf

job_name, task_index, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
steps = int(sys.argv[4]) if len(sys.argv) > 4 else 0
logdir = sys.argv[5] if len(sys.argv) > 5 and sys.argv[5] != "-" else None

cluster = tf.train.ClusterSpec({"ps": ["localhost:PS"], "worker": ["localhost:W0", "localhost:W1"]})
if mode != "read":
    server = tf.train.Server(cluster, job_name=job_name, task_index=task_index)

if job_name == "ps":
    print("ps listening", flush=True)
    server.join()
    sys.exit(0)

with tf.device(tf.train.replica_device_setter(worker_device="/job:worker/task:%d" % task_index, cluster=cluster)):
    global_step = tf.Variable(0, name="global_step", trainable=False)
    x = tf.placeholder(tf.float32, [None, 1])
    y = tf.placeholder(tf.float32, [None, 1])
    w = tf.Variable(tf.zeros([1, 1]), name="w")
    b = tf.Variable(tf.zeros([1]), name="b")
    steps_by_worker = tf.Variable(tf.zeros([2]), name="steps_by_worker")
    loss = tf.reduce_mean(tf.square(tf.matmul(x, w) + b - y))
    mine = np.eye(2, dtype=np.float32)[task_index % 2]
    train_op = tf.group(tf.train.GradientDescentOptimizer(0.05).minimize(loss, global_step=global_step),
                        steps_by_worker.assign_add(mine))
    init_op = tf.global_variables_initializer()

xs = np.linspace(-1, 1, 16, dtype=np.float32).reshape(-1, 1)
feed = {x: xs, y: 3.0 * xs + 1.0}

if mode == "read":            # a third client: what the workers left on the ps
    with tf.Session("grpc://localhost:PS") as sess:
        gs, per, wv, bv = sess.run([global_step, steps_by_worker, w, b])
    print("read", int(gs), " ".join(str(float(v)) for v in per), float(wv[0, 0]), float(bv[0]), flush=True)
    sys.exit(0)

saver = tf.train.Saver() if logdir else None
sv = tf.train.Supervisor(is_chief=(task_index == 0), logdir=logdir, init_op=init_op, summary_op=None, saver=saver,
                         global_step=global_step, save_model_secs=600, recovery_wait_secs=1)
done = 0
if mode == "managed":
    with sv.managed_session(server.target) as sess:
        first = step = sess.run(global_step)
        while not sv.should_stop() and step < steps:
            _, step = sess.run([train_op, global_step], feed_dict=feed)
            done += 1
else:                         # "prepare": the older spelling, with an explicit sv.stop()
    sess = sv.prepare_or_wait_for_session(server.target)
    first = step = sess.run(global_step)
    while not sv.should_stop() and step < steps:
        _, step = sess.run([train_op, global_step], feed_dict=feed)
        done += 1
    sv.stop()
    sess.close()
print("steps", done, "first", int(first), flush=True)
"""


class SupervisorTasks(Tasks):
    def __init__(self, tmp_path):
        super().__init__(tmp_path)
        ps, w0, w1 = self.ports
        self.script.write_text(SCRIPT.replace("PS", str(ps)).replace("W0", str(w0)).replace("W1", str(w1)))

    def run(self, p):
        """(steps done, global step when the session was ready) that a worker printed."""
        words = self.finish(p).split()
        assert words[0] == "steps" and words[2] == "first", words
        return int(words[1]), int(words[3])


@pytest.fixture
def tasks(tmp_path):
    t = SupervisorTasks(tmp_path)
    try:
        ps = t.start("ps", 0, "serve")
        assert ps.stdout.readline().strip() == "ps listening"
        yield t
    finally:
        t.close()


def test_managed_sessions_of_two_workers_add_up_on_the_ps_and_the_non_chief_waits_for_the_chief(tasks):
    w1 = tasks.start("worker", 1, "managed", 40)      # the non-chief first: it waits for the chief
    lines = []
    while not lines or ("waiting for the chief" not in lines[-1] and lines[-1]):
        lines.append(w1.stderr.readline())          # "" at the end of the stream: it exited instead
    assert "waiting for the chief to initialize" in lines[-1] and "global_step" in lines[-1], lines
    w0 = tasks.start("worker", 0, "managed", 40)
    done0, first0 = tasks.run(w0)
    done1, first1 = tasks.run(w1)
    assert first0 == 0                              # the chief initialized the step
    step, by_worker, w, b, loss = tasks.read()
    assert by_worker == [float(done0), float(done1)]
    assert step == done0 + done1
    assert 40 <= step <= 42     # each stops when it sees the shared step at 40; each may be one step on
    assert loss < _initial_loss() / 2


def test_the_chief_restarted_on_its_address_restores_its_checkpoint_from_logdir(tasks, tmp_path):
    logdir = tmp_path / "train"
    done_a, first = tasks.run(tasks.start("worker", 0, "prepare", 12, logdir))
    assert first == 0 and done_a >= 12          # the step fetched with train_op may be read before its update
    names = sorted((f for f in os.listdir(logdir) if f.endswith(".npz")), key=len)
    assert names == ["model.ckpt-0.npz", f"model.ckpt-{done_a}.npz"]       # when ready, and at sv.stop()
    # the same worker started again on the same address, without a logdir: it initializes afresh
    # (the ps holds on to its connection to the old process: that must not hang the new one)
    assert tasks.run(tasks.start("worker", 0, "managed", 5, "-"))[1] == 0
    # and once more with the logdir: the chief restores the checkpoint's step and weights, and goes on
    done_c, first = tasks.run(tasks.start("worker", 0, "managed", 16, logdir))
    assert first == done_a and done_c > 0
    step, by_worker, w, b, loss = tasks.read()
    assert step == done_a + done_c and by_worker == [float(step), 0.0]
    assert loss < _initial_loss() / 2
    assert f"model.ckpt-{step}.npz" in os.listdir(logdir)
