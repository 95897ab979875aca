"""ops-on-tasks (exercises/07_ops_on_tasks.ipynb): the reference ``spread``, which puts block i's
product on worker i % n of a real LocalCluster, adds the products up on worker 0 and fetches only
the sum, passes every case, visible and hidden; the usual mistakes (everything computed in the
notebook, everything on worker 0, every product fetched, task numbers past the last worker) fail
with a reason that says what went wrong. Every case closes its cluster, also when the answer raises
or hangs, and the fixture checks that no process started here is left behind."""
import time

import pytest

import flowlab as fl
from flowlab.grading import compare, to_plain
from flowlab.grading.check import reset_attempts
from flowlab.grading.manifest import load_checks
from _grade import EXERCISES, outcomes

pytestmark = [pytest.mark.process, pytest.mark.usefixtures("nothing_left_behind")]

ID = "ops-on-tasks"


def one_case(answer, name, checks=None):
    """``(ok, why)`` of ``answer`` on the case called ``name`` only, as the grader compares it."""
    checks = checks or load_checks(EXERCISES, ID)
    case = next(c for c in checks.cases() + checks.hidden_cases() if c.name == name)
    expected = to_plain(case.expected_value())
    try:
        received = to_plain(checks.run(answer, case))
    except Exception as e:   # noqa: BLE001 - the answer under test may raise: that is a fail
        return False, f"raised {type(e).__name__}: {e}"
    return compare(expected, received, **case.tolerance(checks.TOLERANCE))


def spread(cluster, blocks, place=lambda i, n: i % n, fetch_each=False):
    """The reference, and two mistakes as switches: ``place`` picks block i's task number,
    ``fetch_each`` adds the products up in numpy after fetching each one."""
    n = len(cluster.workers)
    products = []
    for i, block in enumerate(blocks):
        with fl.device(f"/job:worker/task:{place(i, n)}"):
            products.append(fl.matmul(block, block, transpose_a=True))
    if fetch_each:
        return sum(p.numpy() for p in products)
    with fl.device(cluster.workers[0]):
        return fl.add_n(products).numpy()


def in_the_notebook(cluster, blocks):
    return sum(b.T @ b for b in blocks)


def test_the_reference_passes_every_case():
    results = outcomes(ID, spread)
    assert len(results) == 6
    assert all(ok for _, ok, _ in results), results


def test_a_handle_returned_instead_of_an_array_passes_too():
    def handle(cluster, blocks):
        n = len(cluster.workers)
        products = []
        for i, block in enumerate(blocks):
            with fl.device(cluster.workers[i % n]):
                products.append(fl.matmul(block, block, transpose_a=True))
        return fl.add_n(products)          # no scope: it follows the first product, to worker 0
    assert one_case(handle, "3 workers, 4 blocks of different heights") == (True, "")


def test_computing_in_the_notebook_says_the_task_ran_no_ops():
    ok, why = one_case(in_the_notebook, "2 workers, 2 blocks")
    assert not ok
    assert "/job:worker/task:0" in why and "expected '1 matmul', got 'ran no ops'" in why, why


def test_every_product_on_worker_0_fails_on_the_counts():
    ok, why = one_case(lambda c, b: spread(c, b, place=lambda i, n: 0),
                       "2 workers, 5 blocks (3 on task 0, 2 on task 1)")
    assert not ok and "expected '3 matmuls', got '5 matmuls'" in why, why


def test_fetching_every_product_fails_on_the_fetches():
    ok, why = one_case(lambda c, b: spread(c, b, fetch_each=True), "3 workers, 4 blocks of different heights")
    assert not ok and "values fetched by the notebook" in why and "expected 1, got 4" in why, why


def test_task_numbers_past_the_last_worker_raise_a_clear_error():
    ok, why = one_case(lambda c, b: spread(c, b, place=lambda i, n: i),
                       "2 workers, 5 blocks (3 on task 0, 2 on task 1)")
    assert not ok and "RemoteDeviceError" in why and "/job:worker/task:2" in why, why


def test_an_answer_that_hangs_has_its_cluster_closed():
    checks = load_checks(EXERCISES, ID)
    checks.run.__globals__["WATCHDOG_S"] = 2.0          # this loaded copy only
    t0 = time.monotonic()
    ok, why = one_case(lambda c, b: c.run(time.sleep, 60), "2 workers, 2 blocks", checks)
    assert not ok and "ran longer than 2 s" in why, why
    assert time.monotonic() - t0 < 30


def test_the_check_in_place_fails_and_shows_the_first_hint():
    reset_attempts(ID)
    result = fl.grading.check(ID, in_the_notebook)
    reset_attempts(ID)
    assert not result.passed
    text = repr(result)
    assert "ran no ops" in text and "cluster.workers[i % len(cluster.workers)]" in text, text
    assert "3 hidden" in text, text
