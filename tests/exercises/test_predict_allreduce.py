"""predict-allreduce (exercises/09_predict_then_measure.ipynb): the reference α-β model passes every
case, the exact ones and the one measured on a real 2-worker LocalCluster; the usual mistakes
(2(n-1)/n forgotten, n steps instead of n-1, α left out, bits for bytes) fail the exact cases with
a reason that shows the expected and the received time. The measured case closes its cluster, also
when the answer raises, and the fixture checks that no process started here is left behind."""
import math

import pytest

import flowlab as fl
from flowlab.grading import compare, to_plain
from flowlab.grading.check import reset_attempts
from flowlab.grading.manifest import load_checks
from _grade import EXERCISES, outcomes

pytestmark = [pytest.mark.process, pytest.mark.usefixtures("nothing_left_behind")]

ID = "predict-allreduce"


def model(algorithm, n, nbytes, alpha, beta, *, factor=True, ring_steps=None, with_alpha=True, bits=False):
    """The reference, and the mistakes as switches."""
    if n == 1:
        return 0.0
    share = 2 * (n - 1) / n if factor else 1
    if algorithm == "naive":
        steps, busiest = 2, 2 * (n - 1) * nbytes
    elif algorithm == "ring":
        steps, busiest = (ring_steps or (lambda n: 2 * (n - 1)))(n), share * nbytes
    else:
        steps, busiest = 2 * int(math.log2(n)), share * nbytes
    return float(steps * alpha * with_alpha + busiest * (8 if bits else 1) * beta)


def reference(algorithm, n, nbytes, alpha, beta):
    return model(algorithm, n, nbytes, alpha, beta)


def exact_failures(answer):
    """``(name, why)`` of the exact cases (all but the measured one) that ``answer`` fails, run and
    compared as _grade.outcomes does, without starting a cluster."""
    checks = load_checks(EXERCISES, ID)
    out = []
    for case in checks.cases() + checks.hidden_cases():
        if case.args[0] == "measure":
            continue
        ok, why = compare(to_plain(case.expected_value()), to_plain(checks.run(answer, case)),
                          **case.tolerance(checks.TOLERANCE))
        if not ok:
            out.append((case.name, why))
    return out


def test_the_reference_passes_every_case_also_the_measured_one():
    results = outcomes(ID, reference)
    assert len(results) == 7
    assert all(ok for _, ok, _ in results), results


def test_the_measured_case_reads_a_real_cluster():
    checks = load_checks(EXERCISES, ID)
    measured = next(c for c in checks.cases() if c.args[0] == "measure")
    seen = []

    def spy(algorithm, n, nbytes, alpha, beta):
        seen.append((algorithm, n, nbytes, alpha, beta))
        return reference(algorithm, n, nbytes, alpha, beta)

    got = checks.run(spy, measured)
    assert got == measured.expected_value()
    assert [s[:3] for s in seen] == [("ring", 2, 4096), ("ring", 2, 1 << 20)]
    alpha, beta = seen[0][3:]
    assert 1e-7 < alpha < 0.05 and 0 <= beta < 1e-6          # measured here, seconds and seconds per byte


def test_a_prediction_far_off_the_stopwatch_fails_the_measured_case():
    checks = load_checks(EXERCISES, ID)
    measured = next(c for c in checks.cases() if c.args[0] == "measure")
    got = checks.run(lambda *args: reference(*args) * 1000, measured)     # milliseconds for seconds
    for why in got.values():
        assert "measured" in why and "too high" in why, got


@pytest.mark.parametrize("mistake, kwargs, failing", [
    ("2(n-1)/n forgotten", dict(factor=False), "ring, 4 ranks, 1 MiB"),
    ("n steps instead of n-1", dict(ring_steps=lambda n: 2 * n), "ring, 4 ranks, 1 MiB"),
    ("alpha left out", dict(with_alpha=False), "tree, 2 ranks, 4 bytes (latency only)"),
    ("bits for bytes", dict(bits=True), "naive, ring and tree, 8 ranks, 64 KiB"),
])
def test_typical_mistakes_fail_with_a_reason(mistake, kwargs, failing):
    fails = dict(exact_failures(lambda *args: model(*args, **kwargs)))
    assert failing in fails, (mistake, fails)
    assert "expected" in fails[failing] and "got" in fails[failing], fails[failing]


def test_wrong_types_are_a_fail_not_a_pass():
    fails = dict(exact_failures(lambda *args: str(reference(*args))))
    assert "ring, 4 ranks, 1 MiB" in fails


def test_the_check_in_place_shows_a_hint_after_a_failed_try():
    reset_attempts(ID)
    result = fl.grading.check(ID, lambda *args: model(*args, factor=False))
    assert not result.passed
    assert result.hint and "steps * alpha" in result.hint
    assert result.hidden == 4
    assert not [c for c in result.cases if c["name"].startswith("measured") and not c["passed"]]
    reset_attempts(ID)
