"""tf.train.Supervisor, tf.train.Saver and tf.train.Coordinator in one process (the ps/worker run
with real processes is tests/process/test_supervisor_between_graph.py). The programs are the
ones TF1 tutorials write: a linear model, a global step, a Supervisor loop until a step count."""
import os
import threading
import warnings

import numpy as np
import pytest

import flowlab as fl
import flowlab.compat.v1 as tf

XS = np.linspace(-1, 1, 8, dtype=np.float32).reshape(-1, 1)


def model():
    g = tf.Graph()
    with g.as_default():
        step = tf.train.get_or_create_global_step()
        x = tf.placeholder(tf.float32, [None, 1])
        y = tf.placeholder(tf.float32, [None, 1])
        with tf.variable_scope("layer"):
            w = tf.get_variable("w", [1, 1], initializer=tf.zeros_initializer())
        b = tf.Variable(tf.zeros([1]), name="b")
        loss = tf.reduce_mean(tf.square(tf.matmul(x, w) + b - y))
        train = tf.train.GradientDescentOptimizer(0.1).minimize(loss, global_step=step)
        init = tf.global_variables_initializer()
    feed = {x: XS, y: 2.0 * XS + 0.5}
    return g, step, w, b, train, init, feed


def train_until(sv, sess, step, train, feed, last):
    n = 0
    while not sv.should_stop():
        _, s = sess.run([train, step], feed_dict=feed)
        n += 1
        if s + 1 >= last:
            sv.request_stop()
    return n


def test_the_tutorial_loop_runs_until_request_stop_and_finalizes_the_graph():
    g, step, w, b, train, init, feed = model()
    with g.as_default():
        sv = tf.train.Supervisor(is_chief=True, init_op=init, summary_op=None, saver=None, global_step=step)
    assert g.finalized and sv.global_step is step and sv.is_chief and sv.saver is None
    assert isinstance(sv.coord, tf.train.Coordinator)
    with sv.managed_session("") as sess:
        assert train_until(sv, sess, step, train, feed, 6) == 6
        assert sess.run(step) == 6 and sess.run(w)[0, 0] > 0.0
    assert sv.should_stop() and sess._closed
    with pytest.raises(RuntimeError, match="finalized"):
        with g.as_default():
            tf.constant(1.0)


def test_prepare_or_wait_for_session_then_stop_leaves_the_session_to_the_caller():
    g, step, w, b, train, init, feed = model()
    with g.as_default():
        sv = tf.train.Supervisor(init_op=init, saver=None, global_step=step)
    sess = sv.prepare_or_wait_for_session("")
    with sess:
        sess.run(train, feed_dict=feed)
        sv.stop()
        assert sv.should_stop() and sess.run(step) == 1
    with sv.prepare_or_wait_for_session("") as again:     # a second session: the init op runs again
        assert not sv.should_stop() and again.run(step) == 0


def test_the_chief_checkpoints_to_logdir_and_a_new_supervisor_restores_instead_of_initializing(tmp_path):
    g, step, w, b, train, init, feed = model()
    with g.as_default():
        sv = tf.train.Supervisor(is_chief=True, logdir=str(tmp_path), init_op=init, summary_op=None,
                                 global_step=step, save_model_secs=600)
    with sv.managed_session() as sess:
        train_until(sv, sess, step, train, feed, 5)
        trained = sess.run([w, b])
    assert sorted(f for f in os.listdir(tmp_path) if f.endswith(".npz")) == ["model.ckpt-0.npz", "model.ckpt-5.npz"]
    latest = tf.train.latest_checkpoint(str(tmp_path))
    assert latest == os.path.join(str(tmp_path), "model.ckpt-5")
    assert dict(fl.train.list_variables(latest))["layer/w"] == (1, 1)

    g2, step2, w2, b2, train2, init2, feed2 = model()      # the program started again
    with g2.as_default():
        sv2 = tf.train.Supervisor(logdir=str(tmp_path), init_op=init2, global_step=step2)
    with sv2.managed_session() as sess:
        assert sess.run(step2) == 5                           # restored, not initialized to 0
        np.testing.assert_array_equal(sess.run(w2), trained[0])
        np.testing.assert_array_equal(sess.run(b2), trained[1])
        train_until(sv2, sess, step2, train2, feed2, 8)
    assert tf.train.latest_checkpoint(str(tmp_path)).endswith("model.ckpt-8")


def test_save_model_secs_saves_between_steps_and_the_saver_keeps_max_to_keep(tmp_path):
    g, step, w, b, train, init, feed = model()
    with g.as_default():
        saver = tf.train.Saver(max_to_keep=3)
        sv = tf.train.Supervisor(logdir=str(tmp_path), saver=saver, global_step=step, save_model_secs=1e-9)
    with sv.managed_session() as sess:
        train_until(sv, sess, step, train, feed, 6)          # every should_stop() is past the interval
    kept = sorted(int(f[len("model.ckpt-"):-4]) for f in os.listdir(tmp_path) if f.endswith(".npz"))
    assert kept == [4, 5, 6]
    assert [os.path.basename(p) for p in saver.last_checkpoints] == ["model.ckpt-4", "model.ckpt-5", "model.ckpt-6"]


def test_saver_none_writes_nothing_and_summary_op_warns_once(tmp_path):
    import flowlab.compat._supervisor as supervisor
    supervisor._warned_summaries = False
    g, step, w, b, train, init, feed = model()
    with g.as_default(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sv = tf.train.Supervisor(logdir=str(tmp_path), saver=None, summary_op=step, global_step=step)
    assert len(caught) == 1 and "writes no summaries" in str(caught[0].message)
    with sv.managed_session() as sess:
        sess.run(train, feed_dict=feed)
    assert os.listdir(tmp_path) == []


def test_an_error_in_the_loop_rises_from_managed_session_without_a_last_checkpoint(tmp_path):
    g, step, w, b, train, init, feed = model()
    with g.as_default():
        sv = tf.train.Supervisor(logdir=str(tmp_path), global_step=step)
    with pytest.raises(ZeroDivisionError):
        with sv.managed_session() as sess:
            sess.run(train, feed_dict=feed)
            1 / 0
    assert sv.should_stop() and sess._closed
    assert tf.train.latest_checkpoint(str(tmp_path)).endswith("model.ckpt-0")   # only the one at the start


@pytest.mark.parametrize("end", [StopIteration, tf.errors.OutOfRangeError])
def test_the_end_of_the_input_is_a_normal_end(end):
    g, step, w, b, train, init, feed = model()
    with g.as_default():
        sv = tf.train.Supervisor(saver=None, global_step=step)
    with sv.managed_session() as sess:
        sess.run(train, feed_dict=feed)
        raise end("no more data")
    assert sv.should_stop()


def test_a_non_chief_waits_for_the_chief_and_names_what_is_uninitialized_at_its_deadline():
    g, step, *_ = model()
    with g.as_default():
        sv = tf.train.Supervisor(is_chief=False, global_step=step, recovery_wait_secs=0.05)
    with pytest.raises(tf.errors.DeadlineExceededError, match=r"global_step.*layer/w.*b"):
        sv.prepare_or_wait_for_session("", max_wait_secs=0.2)


def test_saver_round_trip_names_max_to_keep_and_errors(tmp_path):
    g, step, w, b, train, init, feed = model()
    prefix = str(tmp_path / "m.ckpt")
    with g.as_default():
        saver = tf.train.Saver(max_to_keep=2)
        only_w = tf.train.Saver({"weights": w})
    with tf.Session(graph=g) as sess:
        sess.run(init)
        sess.run(train, feed_dict=feed)
        first = saver.save(sess, prefix)
        assert first == prefix and tf.train.latest_checkpoint(str(tmp_path)) == prefix
        for _ in range(3):
            sess.run(train, feed_dict=feed)
            saver.save(sess, prefix, global_step=step)
        want = sess.run([step, w, b])
        w_path = only_w.save(sess, str(tmp_path / "w_only"), write_state=False)
    assert sorted(os.listdir(tmp_path)) == ["checkpoint", "m.ckpt-3.npz", "m.ckpt-4.npz", "w_only.npz"]
    assert [name for name, _ in fl.train.list_variables(prefix + "-4")] == ["b", "global_step", "layer/w",
                                                                           "save_counter"]
    with tf.Session(graph=g) as sess:                     # a new session has no values until restored
        saver.restore(sess, tf.train.latest_checkpoint(str(tmp_path)))
        got = sess.run([step, w, b])
        assert got[0] == want[0] and np.array_equal(got[1], want[1]) and np.array_equal(got[2], want[2])
    with tf.Session(graph=g) as sess:
        only_w.restore(sess, w_path)
        assert np.array_equal(sess.run(w), want[1])
        assert sorted(sess.run(tf.report_uninitialized_variables()).tolist()) == [b"b", b"global_step"]
        with pytest.raises(ValueError, match=r"no value for .*global_step.*restore only what it has|has no value for"):
            saver.restore(sess, w_path)
        with pytest.raises(ValueError, match="latest_checkpoint returned None"):
            saver.restore(sess, None)
        with pytest.raises(ValueError, match="no checkpoint at"):
            saver.restore(sess, str(tmp_path / "nothing"))
    with tf.Graph().as_default(), pytest.raises(ValueError, match="no variables to save"):
        tf.train.Saver()


def test_coordinator_join_raises_a_threads_error_and_a_clean_end_is_none():
    coord = tf.train.Coordinator()

    def worker():
        with coord.stop_on_exception():
            raise KeyError("bad record")

    threads = [threading.Thread(target=worker)]
    threads[0].start()
    with pytest.raises(KeyError, match="bad record"):
        coord.join(threads)
    assert coord.should_stop()
    coord.clear_stop()
    assert not coord.should_stop()
    coord.request_stop(tf.errors.OutOfRangeError("end of data"))
    coord.join([])                                    # a clean end: nothing to raise


def test_a_second_supervisor_on_the_finalized_graph_reuses_the_first_ones_defaults(tmp_path):
    g, step, w, b, train, init, feed = model()
    with g.as_default():
        first = tf.train.Supervisor(logdir=str(tmp_path), global_step=step)
        again = tf.train.Supervisor(logdir=str(tmp_path), global_step=step)    # a notebook cell run twice
    assert again.saver is first.saver and again.init_op is first.init_op
    with again.managed_session() as sess:
        assert sess.run(step) == 0
