"""tf.train.MonitoredTrainingSession, its hooks and tf.report_uninitialized_variables in one process
(the between-graph runs with real ps/worker processes are in tests/process/test_between_graph.py),
and tf.compat.v1.enable_eager_execution."""
import warnings

import numpy as np
import pytest

import flowlab.compat.v1 as tf


def linear_graph():
    g = tf.Graph()
    with g.as_default():
        step = tf.train.get_or_create_global_step()
        x = tf.placeholder(tf.float32, [None, 1])
        w = tf.Variable(tf.zeros([1, 1]), name="w")
        loss = tf.reduce_mean(tf.square(tf.matmul(x, w) - 2.0 * x))
        train = tf.train.GradientDescentOptimizer(0.1).minimize(loss, global_step=step)
    return g, step, x, w, loss, train


def test_a_monitored_session_stops_at_last_step_and_runs_hooks_in_the_same_run():
    g, step, x, w, loss, train = linear_graph()
    seen = []

    class Losses(tf.train.SessionRunHook):
        def before_run(self, run_context):
            return tf.train.SessionRunArgs(loss)

        def after_run(self, run_context, run_values):
            seen.append(float(run_values.results))

    with g.as_default():
        with tf.train.MonitoredTrainingSession(hooks=[tf.train.StopAtStepHook(last_step=7), Losses()]) as sess:
            runs = 0
            while not sess.should_stop():
                sess.run(train, feed_dict={x: np.ones((4, 1), np.float32)})
                runs += 1
            assert sess.should_stop()
    assert runs == 7 and len(seen) == 7 and seen[-1] < seen[0]
    assert g.finalized                # as in TensorFlow: the loop cannot grow the graph


def test_num_steps_counts_from_where_the_step_was_and_a_hook_needs_a_global_step():
    g, step, x, w, loss, train = linear_graph()
    with g.as_default():
        with tf.train.MonitoredTrainingSession(hooks=[tf.train.StopAtStepHook(num_steps=3)]) as sess:
            while not sess.should_stop():
                sess.run(train, feed_dict={x: np.ones((2, 1), np.float32)})
            assert sess.run(step) == 3
    with pytest.raises(ValueError, match="exactly one"):
        tf.train.StopAtStepHook(num_steps=1, last_step=2)
    with tf.Graph().as_default():
        tf.Variable(1.0)
        with pytest.raises(RuntimeError, match="get_or_create_global_step"):
            tf.train.MonitoredTrainingSession(hooks=[tf.train.StopAtStepHook(last_step=1)])


def test_report_uninitialized_variables_names_what_has_no_value_in_this_session():
    g, step, x, w, loss, train = linear_graph()
    with g.as_default():
        report = tf.report_uninitialized_variables()
        with tf.Session() as sess:
            assert sorted(sess.run(report).tolist()) == [b"global_step", b"w"]
            sess.run(w.initializer)
            assert sess.run(report).tolist() == [b"global_step"]
            sess.run(tf.global_variables_initializer())
            assert len(sess.run(report)) == 0
    assert w.shared_name is None              # a variable of this process, placed on no task
    with tf.Graph().as_default(), tf.device("/job:ps/task:0"):
        assert tf.Variable(0.0, name="v").shared_name == "v"


def test_a_non_chief_with_no_chief_gets_a_deadline_error_naming_the_variables():
    g, *_ = linear_graph()
    with g.as_default():
        with pytest.raises(tf.errors.DeadlineExceededError, match=r"global_step, w"):
            tf.train.MonitoredTrainingSession(is_chief=False, max_wait_secs=0.2)


def test_compat_enable_eager_execution_changes_nothing_and_says_so_once():
    import flowlab.compat.v1 as v1
    v1._said_eager = False
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tf.enable_eager_execution()
        tf.enable_eager_execution()
    assert len(caught) == 1 and "flowlab is eager by default" in str(caught[0].message)
    assert tf.executing_eagerly() is False and tf.disable_eager_execution() is None
    with tf.Graph().as_default():
        y = tf.constant(2) + 3
        with tf.Session() as sess:
            assert sess.run(y) == 5
