"""Horovod's TensorFlow programs on two real ranks: the TF2 custom loop (DistributedGradientTape,
broadcast_variables inside the traced step under a Python flag) as a script under
``flowlab run -np 2``, and the TF1 graph program (DistributedOptimizer around a
``tf.train`` optimizer, BroadcastGlobalVariablesHook in a MonitoredTrainingSession) on the
workers of a LocalCluster.

Both are written as Horovod's own examples are, on small data, and checked against a closed form:
one process that takes the same steps on the combined batches."""
import os
import textwrap

import numpy as np
import pytest
from _processes import run_script_ranks

import flowlab as fl

pytestmark = pytest.mark.process
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ROWS, BATCH, STEPS = 512, 16, 16

# -- TF2: Horovod's tensorflow2_mnist example, as a reader types it ---------------------------------
SCRIPT = """\
    import sys
    import numpy as np
    import flowlab as fl
    import flowlab.horovod as hvd

    hvd.init()
    out = sys.argv[1]

    (images, labels), _ = fl.datasets.digits()
    dataset = fl.data.Dataset.from_tensor_slices((images[:{rows}].reshape(-1, 8, 8, 1).astype(np.float32),
                                                  labels[:{rows}].astype(np.int64)))
    dataset = dataset.shard(hvd.size(), hvd.rank()).batch({batch})

    mnist_model = fl.keras.Sequential([
        fl.keras.Input(shape=(8, 8, 1)),
        fl.keras.layers.Conv2D(8, [3, 3], activation="relu"),
        fl.keras.layers.Flatten(),
        fl.keras.layers.Dense(32, activation="relu"),
        fl.keras.layers.Dense(10, activation="softmax"),
    ])
    loss = fl.losses.SparseCategoricalCrossentropy()
    opt = fl.optimizers.Adam(0.001 * hvd.size())          # the learning rate scaled by the ranks
    checkpoint = fl.train.Checkpoint(model=mnist_model, optimizer=opt)
    initial = [w.numpy().copy() for w in mnist_model.variables]   # (the test's eyes)

    @fl.function
    def training_step(images, labels, first_batch):
        with fl.GradientTape() as tape:
            probs = mnist_model(images, training=True)
            loss_value = loss(labels, probs)
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss_value, mnist_model.trainable_variables)
        opt.apply_gradients(zip(grads, mnist_model.trainable_variables))
        # after the first step (as Horovod's example does it): every rank takes rank 0's state
        if first_batch:
            hvd.broadcast_variables(mnist_model.variables, root_rank=0)
            hvd.broadcast_variables(opt.variables(), root_rank=0)
        return loss_value

    for batch, (images, labels) in enumerate(dataset.take({steps} // hvd.size())):
        loss_value = training_step(images, labels, batch == 0)
        if batch % 4 == 0 and hvd.local_rank() == 0:
            print("Step #%d\\tLoss: %.6f" % (batch, loss_value))

    if hvd.rank() == 0:
        checkpoint.save(out + "/ckpt/ckpt")
    np.savez(out + f"/rank{{hvd.rank()}}.npz", traces=training_step.experimental_get_tracing_count(),
             iterations=opt.iterations.numpy(), **{{f"initial{{i}}": w for i, w in enumerate(initial)}},
             **{{f"final{{i}}": w.numpy() for i, w in enumerate(mnist_model.variables)}})
""".format(rows=ROWS, batch=BATCH, steps=STEPS)


def _model(weights):
    model = fl.keras.Sequential([
        fl.keras.Input(shape=(8, 8, 1)),
        fl.keras.layers.Conv2D(8, [3, 3], activation="relu"),
        fl.keras.layers.Flatten(),
        fl.keras.layers.Dense(32, activation="relu"),
        fl.keras.layers.Dense(10, activation="softmax"),
    ])
    for v, w in zip(model.variables, weights):
        v.assign(w)
    return model


def _grads(model, x, y):
    loss = fl.losses.SparseCategoricalCrossentropy()
    with fl.GradientTape() as tape:
        value = loss(y, model(x, training=True))
    return tape.gradient(value, model.trainable_variables)


def _tf2_reference(start0, start1):
    """One process: step 1 applies, to rank 0's start, the mean of each rank's gradient at its own
    start (the broadcast comes after that step); then step k takes the gradient of rows
    2*BATCH*k .. 2*BATCH*(k+1) - 1, which the two ranks' shards of batch k make up together."""
    (images, labels), _ = fl.datasets.digits()
    x, y = images[:ROWS].reshape(-1, 8, 8, 1).astype(np.float32), labels[:ROWS].astype(np.int64)
    m0, m1 = _model(start0), _model(start1)
    opt = fl.optimizers.Adam(0.002)
    g0, g1 = _grads(m0, x[0:2 * BATCH:2], y[0:2 * BATCH:2]), _grads(m1, x[1:2 * BATCH:2], y[1:2 * BATCH:2])
    opt.apply_gradients(zip([(a + b) / 2 for a, b in zip(g0, g1)], m0.trainable_variables))
    for k in range(1, STEPS // 2):
        rows = slice(2 * BATCH * k, 2 * BATCH * (k + 1))
        opt.apply_gradients(zip(_grads(m0, x[rows], y[rows]), m0.trainable_variables))
    return [v.numpy() for v in m0.variables]


def test_tf2_custom_loop_program_under_flowlab_run(tmp_path):
    script = tmp_path / "tensorflow2_mnist.py"
    script.write_text(textwrap.dedent(SCRIPT))
    out = run_script_ranks(script, tmp_path, cwd=ROOT)
    assert [line.split("\t")[0] for line in out.splitlines() if "Step #" in line] == \
        ["[0] Step #0", "[0] Step #4"], out                              # rank 0 prints, rank 1 stays quiet

    r0, r1 = np.load(tmp_path / "rank0.npz"), np.load(tmp_path / "rank1.npz")
    n = len([k for k in r0.files if k.startswith("final")])
    assert n == 6
    assert int(r0["traces"]) == int(r1["traces"]) == 2                  # first_batch True, then False
    assert int(r0["iterations"]) == int(r1["iterations"]) == STEPS // 2
    start0, start1 = [r0[f"initial{i}"] for i in range(n)], [r1[f"initial{i}"] for i in range(n)]
    assert not all(np.array_equal(a, b) for a, b in zip(start0, start1))      # rank 1 started elsewhere
    for i in range(n):
        np.testing.assert_array_equal(r0[f"final{i}"], r1[f"final{i}"])      # and ends bit-identical
    for i, ref in enumerate(_tf2_reference(start0, start1)):
        np.testing.assert_allclose(r0[f"final{i}"], ref, rtol=2e-4, atol=2e-6)
    assert fl.train.latest_checkpoint(str(tmp_path / "ckpt")) is not None       # rank 0 saved


# -- TF1: Horovod's tensorflow_mnist example (graph, MonitoredTrainingSession) ---------------------
TF1_ROWS, TF1_BATCH, TF1_STEPS = 128, 8, 12


def _linear_data():
    rng = np.random.default_rng(5)
    x = rng.normal(size=(TF1_ROWS, 4)).astype(np.float32)
    return x, (x @ np.array([[1.0], [-2.0], [0.5], [3.0]], np.float32) + 0.25).astype(np.float32)


def tf1_program_on_rank(last_step):
    import flowlab.compat.v1 as tf
    import flowlab.horovod.tensorflow as hvd

    class Record(tf.train.SessionRunHook):          # the test's eyes: the variables before the broadcast
        def after_create_session(self, session, coord):
            self.initial = session.run(tf.global_variables())

    hvd.init()
    images, labels = _linear_data()
    x = tf.placeholder(tf.float32, [None, 4])
    y = tf.placeholder(tf.float32, [None, 1])
    w = tf.Variable(tf.random_normal([4, 1], seed=1 + hvd.rank()), name="w")    # each rank starts elsewhere
    b = tf.Variable(tf.zeros([1]), name="b")
    loss = tf.reduce_mean(tf.square(tf.matmul(x, w) + b - y))

    opt = tf.train.AdagradOptimizer(0.01 * hvd.size())
    opt = hvd.DistributedOptimizer(opt)
    global_step = tf.train.get_or_create_global_step()
    train_op = opt.minimize(loss, global_step=global_step)

    bcast = hvd.broadcast_global_variables(0)      # an op, for the plain session below (before the graph is final)
    record = Record()
    hooks = [record, hvd.BroadcastGlobalVariablesHook(0), tf.train.StopAtStepHook(last_step=last_step // hvd.size())]
    shard = slice(hvd.rank(), None, hvd.size())
    images, labels = images[shard], labels[shard]
    step = 0
    with tf.train.MonitoredTrainingSession(hooks=hooks) as mon_sess:
        after_broadcast = mon_sess.run([w, b, global_step])
        while not mon_sess.should_stop():
            rows = slice(step * TF1_BATCH, (step + 1) * TF1_BATCH)
            mon_sess.run(train_op, feed_dict={x: images[rows], y: labels[rows]})
            step += 1
        final = mon_sess.run([w, b, global_step])
    # broadcast_global_variables: an op run in a plain session, too
    with tf.Session() as sess:
        sess.run(tf.global_variables_initializer())
        sess.run(bcast)
        again = sess.run(w)
    return {"rank": hvd.rank(), "initial": record.initial, "after_broadcast": after_broadcast, "final": final,
            "steps": step, "again": again}


def _tf1_reference(w, b, steps):
    """TF1 Adagrad (accumulators from 0.1, no epsilon) on rows 2*TF1_BATCH*k .. : the two ranks'
    batches of step k together; the mean of their mean-square gradients is the whole batch's."""
    x, y = _linear_data()
    w, b = w.astype(np.float64), b.astype(np.float64)
    aw, ab = np.full_like(w, 0.1), np.full_like(b, 0.1)
    for k in range(steps):
        rows = np.r_[[2 * TF1_BATCH * k + 2 * j for j in range(TF1_BATCH)],
                     [2 * TF1_BATCH * k + 2 * j + 1 for j in range(TF1_BATCH)]]
        xk, yk = x[rows].astype(np.float64), y[rows].astype(np.float64)
        r = xk @ w + b - yk
        gw, gb = 2 * xk.T @ r / len(rows), 2 * r.sum(axis=0) / len(rows)
        aw, ab = aw + gw * gw, ab + gb * gb
        w, b = w - 0.02 * gw / np.sqrt(aw), b - 0.02 * gb / np.sqrt(ab)
    return w, b


def test_tf1_horovod_program_on_two_ranks(make_cluster):
    cluster = make_cluster(workers=2)
    r0, r1 = sorted(cluster.run(tf1_program_on_rank, TF1_STEPS, timeout=180), key=lambda r: r["rank"])
    # rank 1's own start (another seed) was overwritten by rank 0's when the session was made
    assert not np.array_equal(r0["initial"][0], r1["initial"][0])
    for got in (r0["after_broadcast"], r1["after_broadcast"]):
        np.testing.assert_array_equal(got[0], r0["initial"][0])
        assert got[2] == 0
    # both ranks stopped at last_step // size and agree on the step and every weight
    assert r0["steps"] == r1["steps"] == TF1_STEPS // 2
    assert r0["final"][2] == r1["final"][2] == TF1_STEPS // 2
    for a, b in zip(r0["final"], r1["final"]):
        np.testing.assert_array_equal(a, b)
    w, b = _tf1_reference(r0["initial"][0], r0["initial"][1], TF1_STEPS // 2)
    np.testing.assert_allclose(r0["final"][0], w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(r0["final"][1], b, rtol=1e-5, atol=1e-6)
    # hvd.broadcast_global_variables(0) run in a plain session: rank 0's freshly initialized w
    np.testing.assert_array_equal(r1["again"], r0["again"])
    np.testing.assert_array_equal(r0["again"], r0["initial"][0])
