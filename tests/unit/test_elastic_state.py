"""hvd.elastic without processes: commit and restore of each state kind in one process, what
``elastic.run`` keeps or forgets, and the retry itself on a LocalGroup (threads): a rank lost
mid-training, a second try on a fresh group in which the lost rank has no commit and the survivor
has one, and the same weights as a run without the loss, whichever rank was lost."""
import numpy as np
import pytest

import flowlab as fl
import flowlab.horovod as hvd
from flowlab.cluster.collectives import LocalGroup
from flowlab.cluster.collectives.errors import PeerLostError
from flowlab.horovod import _elastic

ROWS, PER, STEPS = 48, 6, 8          # two ranks of 6 rows: global batches of 12, 8 steps (2 epochs)


def _model(seed):
    rng = np.random.default_rng(seed)
    model = fl.keras.Sequential([fl.keras.Input(shape=(5,)), fl.keras.layers.Dense(4, activation="relu"),
                                 fl.keras.layers.Dense(1)])
    for v in model.variables:
        v.assign(rng.normal(size=v.shape).astype(np.float32) * 0.5)
    return model


def _data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(ROWS, 5)).astype(np.float32)
    return x, (x @ rng.normal(size=(5, 1)) + 0.3).astype(np.float32)


@pytest.fixture(autouse=True)
def _empty_store():
    _elastic._commits.clear()
    yield
    _elastic._commits.clear()
    hvd.shutdown()


def test_keras_state_commit_and_restore_in_one_process():
    model = _model(1)
    opt = fl.optimizers.SGD(0.1, momentum=0.9)
    state = hvd.elastic.TensorFlowKerasState(model, opt, epoch=0, seen=[1])
    assert state.commits == 0
    x, y = _data()

    def step():
        with fl.GradientTape() as tape:
            loss = fl.reduce_mean((model(x[:12]) - y[:12]) ** 2)
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))

    step()
    state.epoch = 1
    state.seen.append(2)
    state.commit()
    kept = [v.numpy().copy() for v in model.variables]
    kept_slot = opt.get_slot(model.trainable_variables[0], "momentum").numpy().copy()
    step()
    step()
    state.epoch, state.seen = 5, None
    opt.learning_rate = 0.5
    assert not np.array_equal(model.variables[0].numpy(), kept[0])

    state.restore()
    assert state.commits == 1 and state.epoch == 1 and state.seen == [1, 2]
    for v, k in zip(model.variables, kept):
        np.testing.assert_array_equal(v.numpy(), k)
    np.testing.assert_array_equal(opt.get_slot(model.trainable_variables[0], "momentum").numpy(), kept_slot)
    assert int(opt.iterations.numpy()) == 1 and float(opt.learning_rate.numpy()) == pytest.approx(0.1)
    state.seen.append(3)                                  # the commit is a copy, not the live list
    state.restore()
    assert state.seen == [1, 2]


def test_object_and_variable_states_and_their_errors():
    counter = fl.Variable(3.0)
    state = hvd.elastic.TensorFlowState([counter], step=0)
    counter.assign(7.0)
    state.step = 2
    state.save()
    counter.assign(9.0)
    state.restore()
    assert float(counter.numpy()) == 7.0 and state.step == 2 and state.commits == 1
    obj = hvd.elastic.ObjectState(batch=4)
    obj.batch = 9
    obj.restore()
    assert obj.batch == 4 and obj.check_host_updates() is None

    with pytest.raises(TypeError, match="pass variables="):
        hvd.elastic.TensorFlowState()
    with pytest.raises(ValueError, match="no variables yet; build it first"):
        hvd.elastic.TensorFlowKerasState(fl.keras.Sequential([fl.keras.layers.Dense(1)]))
    with pytest.raises(TypeError, match="first argument must be an hvd.elastic state"):
        hvd.elastic.run(lambda state: None)(object())
    with pytest.raises(TypeError, match="expected functions"):
        obj.register_reset_callbacks([3])
    for name in ("KerasState", "CommitStateCallback", "HostDiscoveryScript"):
        with pytest.raises(AttributeError, match="is not in flowlab.*run_with_recovery") as e:
            getattr(hvd.elastic, name)
        assert type(e.value).__name__ == "NotInFlowlabError"
    import flowlab.horovod.tensorflow as hvd_tf
    assert hvd_tf.elastic.run is hvd.elastic.run


def test_run_keeps_the_commit_only_for_a_lost_peer():
    state = hvd.elastic.ObjectState(step=0)

    @hvd.elastic.run
    def train(state, fail):
        state.step = 1
        state.commit()
        state.step = 2                                     # not committed
        if fail is not None:
            raise fail
        return state.step

    with pytest.raises(PeerLostError) as info:
        train(state, PeerLostError("rank 1 exited", op="allreduce", rank=0, missing=[1]))
    assert state.step == 1 and state.commits == 1           # restored, and the commit kept
    assert any("restored ObjectState" in n for n in info.value.__notes__)
    again = hvd.elastic.ObjectState(step=0)                 # the next try makes its state anew:
    assert again.step == 0                                  # until the sync, its own values,
    with pytest.raises(ValueError, match="a bug"):
        train(again, ValueError("a bug"))                   # (the sync gave it step 1, then it failed)
    assert _elastic._commits == {}                          # a bug: the next run starts afresh
    assert train(hvd.elastic.ObjectState(step=0), None) == 2
    assert _elastic._commits == {}                          # done: nothing left to resume


def _train(comm, lose, commit_every, log):
    """Two ranks, STEPS steps of SGD with momentum through hvd.DistributedGradientTape; rank
    ``lose[0]`` is lost at the start of step ``lose[1]`` when ``lose`` is given."""
    hvd.init()
    r = hvd.rank()
    model = _model(10 + r)                                 # different on each rank: the sync equalizes
    opt = fl.optimizers.SGD(0.05, momentum=0.9)
    x, y = _data()
    state = hvd.elastic.TensorFlowKerasState(model, opt, step=0)
    state.register_reset_callbacks([lambda: log.append(("reset", r))])

    @hvd.elastic.run
    def loop(state):
        log.append(("start", r, state.step))
        while state.step < STEPS:
            k = state.step
            if lose is not None and (r, k) == lose:
                _GROUPS[-1].kill(r)                        # its peers see it gone
                raise _Lost()
            lo = (k * 2 * PER) % ROWS + r * PER
            with fl.GradientTape() as tape:
                loss = fl.reduce_mean((model(x[lo:lo + PER]) - y[lo:lo + PER]) ** 2)
            tape = hvd.DistributedGradientTape(tape)
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))
            state.step = k + 1
            if state.step % commit_every == 0:
                state.commit()
        return [v.numpy() for v in model.variables]

    return loop(state)


class _Lost(Exception):
    """The lost rank's own end (its process would be gone)."""


_GROUPS: list = []


def _group_run(lose, commit_every, log):
    group = LocalGroup(2)
    _GROUPS.append(group)
    with group:
        return group.run(_train, lose, commit_every, log, return_exceptions=True)


@pytest.mark.parametrize("lost_rank, at, commit_every", [(1, 5, 1), (0, 6, 3)])
def test_a_retry_resumes_from_the_survivors_commit(lost_rank, at, commit_every):
    clean_log: list = []
    clean = _group_run(None, commit_every, clean_log)
    assert not any(isinstance(c, BaseException) for c in clean), clean
    for a, b in zip(*clean):
        np.testing.assert_array_equal(a, b)
    assert _elastic._commits == {} and not any(e[0] == "reset" for e in clean_log)

    log: list = []
    first = _group_run((lost_rank, at), commit_every, log)
    survivor = 1 - lost_rank
    assert isinstance(first[lost_rank], _Lost)
    assert isinstance(first[survivor], PeerLostError), first[survivor]
    assert list(_elastic._commits) and all(key[1] == survivor for key in _elastic._commits)

    assert not any(e[0] == "reset" for e in log)
    log.clear()
    retry = _group_run(None, commit_every, log)            # the lost rank "restarted": no commit of its own
    assert not any(isinstance(c, BaseException) for c in retry), retry
    resumed_at = at // commit_every * commit_every
    assert sorted(log) == [("reset", 0), ("reset", 1), ("start", 0, resumed_at), ("start", 1, resumed_at)]
    assert _elastic._commits == {}
    for weights in retry:
        for a, b in zip(clean[0], weights):
            np.testing.assert_array_equal(b, a)            # bit for bit the weights of the clean run


def test_a_value_that_cannot_travel_is_named_on_every_rank():
    def make(comm):
        hvd.init()
        state = hvd.elastic.ObjectState(step=0, lock=__import__("threading").Lock())
        with pytest.raises(TypeError, match="could not send its commit.*must pickle"):
            state.sync()
        return True

    with LocalGroup(2) as group:
        assert group.run(make) == [True, True]
