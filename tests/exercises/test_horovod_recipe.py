"""Exercise horovod-recipe (exercises/checks/horovod_recipe.py): the reference recipe passes every
case, visible and hidden, on the ranks of a LocalGroup (threads of this process: no process is
started); typical mistakes fail with a reason that says what went wrong."""
import threading

import flowlab as fl
import flowlab.horovod as hvd
from _grade import EXERCISES, all_pass, failures
from flowlab.grading.check import reset_attempts
from flowlab.grading.manifest import load_checks

ID = "horovod-recipe"


def recipe(broadcast=True, scale=True, op=hvd.Average, distributed=True, only_rank_0=False):
    def train_rank(w0, x, y, base_lr, steps):
        hvd.init()
        kernel, bias = fl.Variable(w0[0]), fl.Variable(w0[1])
        opt = fl.optimizers.SGD(base_lr * (hvd.size() if scale else 1))
        if distributed:
            opt = hvd.DistributedOptimizer(opt, op=op)
        if broadcast:
            hvd.broadcast_variables([kernel, bias], root_rank=0)
        for _ in range(steps):
            with fl.GradientTape() as tape:
                loss = fl.reduce_mean((fl.matmul(x, kernel) + bias - y) ** 2)
            if not only_rank_0 or hvd.rank() == 0:
                opt.apply_gradients(zip(tape.gradient(loss, [kernel, bias]), [kernel, bias]))
        return [kernel.numpy(), bias.numpy()]
    return train_rank


def per_variable_allreduce(w0, x, y, base_lr, steps):
    """Averages each gradient with its own hvd.allreduce: right weights, twice the all-reduces."""
    hvd.init()
    kernel, bias = fl.Variable(w0[0]), fl.Variable(w0[1])
    opt = fl.optimizers.SGD(base_lr * hvd.size())
    hvd.broadcast_variables([kernel, bias], root_rank=0)
    for _ in range(steps):
        with fl.GradientTape() as tape:
            loss = fl.reduce_mean((fl.matmul(x, kernel) + bias - y) ** 2)
        grads = [hvd.allreduce(g) for g in tape.gradient(loss, [kernel, bias])]
        opt.apply_gradients(zip(grads, [kernel, bias]))
    return [kernel.numpy(), bias.numpy()]


def test_the_recipe_passes_every_case():
    assert all_pass(ID, recipe())


def test_forgetting_the_broadcast_fails_on_agreement():
    fails = failures(ID, recipe(broadcast=False))
    assert len(fails) == 5          # all but the group of one
    assert all("the ranks hold the same weights" in why and "differs from rank 0" in why for _, why in fails)


def test_no_distributed_optimizer_fails():
    fails = failures(ID, recipe(distributed=False))
    assert len(fails) == 5 and all("differs from rank 0" in why for _, why in fails)


def test_summing_or_unscaled_lr_fail_against_one_worker():
    for wrong in (recipe(op=hvd.Sum), recipe(scale=False)):
        fails = failures(ID, wrong)
        assert len(fails) == 5
        assert all("one worker's weights" in why and "do not hold the right result" in why for _, why in fails)


def test_one_allreduce_per_variable_fails_on_the_event_log():
    fails = failures(ID, per_variable_allreduce)
    assert len(fails) == 5
    assert all("all-reduces" in why and "(2 per step)" in why for _, why in fails)


def test_only_rank_0_applying_fails_without_hanging():
    checks = load_checks(EXERCISES, ID)
    module = checks.namespace["run"].__globals__
    saved, module["JOIN_S"] = module["JOIN_S"], 2.0   # fail fast here: rank 0 waits for partners that never come
    before = threading.active_count()
    try:
        checks.namespace["run"](recipe(only_rank_0=True), checks.cases()[0])
    except RuntimeError as e:
        assert "still running" in str(e) and "every rank calls apply_gradients" in str(e)
    else:
        raise AssertionError("only rank 0 applying gradients should fail")
    finally:
        module["JOIN_S"] = saved
    assert threading.active_count() <= before   # the group's threads ended


def test_check_in_place_shows_a_hint():
    reset_attempts(ID)
    result = fl.grading.check(ID, recipe(broadcast=False))
    assert not result.passed and result.hint and "rank 0" in result.hint
    reset_attempts(ID)
