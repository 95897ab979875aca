"""survive-a-kill (exercises/13_survive_a_kill.ipynb): the reference custom loop, which checkpoints
after every step on the chief and restores the newest checkpoint on every worker, passes every
case on a real 2-worker LocalCluster with a worker killed (SIGKILL) mid-training; the usual mistakes
fail with a reason that says what went wrong. Every case closes its cluster, also when the answer
raises, and the fixture checks that no process started here is left behind."""
import re

import numpy as np
import pytest

import flowlab as fl
from flowlab.grading.check import reset_attempts
from _grade import outcomes

pytestmark = [pytest.mark.process, pytest.mark.usefixtures("nothing_left_behind")]

GLOBAL_BATCH = 8


def _train(directory, batch_for, steps, *, save=True, restore=True, with_optimizer=True, stale=False):
    """The reference, and the mistakes, as switches: ``save``/``restore`` the checkpoint,
    ``with_optimizer`` in it, ``stale``: the model saved only every 3 steps but the step every step."""
    import os
    import flowlab as fl
    from flowlab import distribute as ds
    strategy = ds.MultiWorkerMirroredStrategy()
    with strategy.scope():
        w = fl.Variable(np.zeros((3, 1), np.float32))
        b = fl.Variable(np.zeros((1,), np.float32))
        opt = fl.optimizers.SGD(0.1, momentum=0.9)
    step = fl.Variable(0, dtype=fl.int64)
    parts = dict(w=w, b=b, step=step, **({"optimizer": opt} if with_optimizer else {}))
    if stale:
        parts.pop("step")
    ckpt = fl.train.Checkpoint(**parts)
    latest = fl.train.latest_checkpoint(directory)
    if restore and latest:
        ckpt.restore(latest)
        if stale:
            with open(os.path.join(directory, "step.txt")) as f:
                step.assign(int(f.read()))
    chief = strategy.worker_index == 0
    manager = fl.train.CheckpointManager(ckpt, directory, max_to_keep=2) if chief and save else None

    def replica_step(x, y):
        with fl.GradientTape() as tape:
            per = fl.reduce_sum((fl.matmul(x, w) + b - y) ** 2, axis=1)
            loss = ds.compute_average_loss(per, global_batch_size=GLOBAL_BATCH)
        opt.apply_gradients(zip(tape.gradient(loss, [w, b]), [w, b]))

    while int(step.numpy()) < steps:
        x, y = batch_for(int(step.numpy()))
        strategy.run(replica_step, args=(x, y))
        step.assign_add(1)
        if manager is not None:
            k = int(step.numpy())
            if not stale or k % 3 == 0:
                manager.save(checkpoint_number=k)
            if stale:
                with open(os.path.join(directory, "step.txt"), "w") as f:
                    f.write(str(k))
    return [w.numpy(), b.numpy()]


def train_with_recovery(directory, batch_for, steps):
    return _train(directory, batch_for, steps)


def no_checkpoint(directory, batch_for, steps):
    return _train(directory, batch_for, steps, save=False, restore=False)


def never_restores(directory, batch_for, steps):
    return _train(directory, batch_for, steps, restore=False)


def forgets_the_optimizer(directory, batch_for, steps):
    return _train(directory, batch_for, steps, with_optimizer=False)


def stale_weights(directory, batch_for, steps):
    return _train(directory, batch_for, steps, stale=True)


def test_the_reference_passes_every_case():
    got = outcomes("survive-a-kill", train_with_recovery)
    assert len(got) == 3 and all(ok for _, ok, _ in got), got


def _visible_failure(wrong):
    [(name, ok, why)] = outcomes("survive-a-kill", wrong, hidden=False)
    assert not ok
    return why


@pytest.mark.parametrize("wrong", [no_checkpoint, never_restores])
def test_starting_again_from_step_0_fails_on_the_steps_done_twice(wrong):
    why = _visible_failure(wrong)
    # worker 1 asked for steps 0-5, died, then 0-9 again: 6 twice; worker 0 asked for step 5 or was stopped before
    assert re.search(r"steps each worker did twice.*expected 'at most 2', got 'worker 0: [56], worker 1: 6'", why), why


def test_a_checkpoint_without_the_optimizer_ends_on_other_weights():
    why = _visible_failure(forgets_the_optimizer)     # the momentum starts from zero again after the kill
    assert "every worker's [w, b]" in why and "expected 0.4158" in why, why


def test_a_stale_checkpoint_ends_on_other_weights():
    why = _visible_failure(stale_weights)             # weights of step 3 resumed as if they were step 5's
    assert "every worker's [w, b]" in why, why


def test_the_check_in_place_fails_and_shows_the_first_hint():
    reset_attempts("survive-a-kill")
    result = fl.grading.check("survive-a-kill", no_checkpoint)
    assert not result.passed
    text = repr(result)
    assert "steps each worker did twice" in text and "A retry calls your function again" in text, text
    assert "2 hidden" in text, text
