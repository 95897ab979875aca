"""The trace-once exercise (exercises/02_trace_once.ipynb, checks/trace_once.py): the reference
passes every case, visible and hidden, and typical learner mistakes fail with a reason that says
what went wrong. Each test makes its own functions: a trace count belongs to one fl.function."""
import sys
from pathlib import Path

import pytest

import flowlab as fl
from flowlab.grading.check import reset_attempts

sys.path.insert(0, str(Path(__file__).parent))
from _grade import EXERCISES, failures, outcomes   # noqa: E402

ID = "trace-once"
SIGNATURE = [fl.TensorSpec([None, None], fl.float32), fl.TensorSpec([], fl.float32)]


def standardise(x, eps):
    mean = fl.reduce_mean(x, axis=0, keepdims=True)
    var = fl.reduce_mean(fl.square(x - mean), axis=0, keepdims=True)
    return (x - mean) / fl.sqrt(var + eps)


def test_the_reference_passes_every_case():
    results = outcomes(ID, fl.function(standardise, input_signature=SIGNATURE))
    assert len(results) == 6
    assert all(ok for _, ok, _ in results), results


def test_the_reference_traces_once_over_all_the_cases():
    reference = fl.function(standardise, input_signature=SIGNATURE)
    outcomes(ID, reference)
    assert reference.experimental_get_tracing_count() == 1


@pytest.mark.filterwarnings("ignore:.*has been traced:UserWarning")   # flowlab's retrace warning, on purpose
def test_a_plain_fl_function_fails_on_the_retraces_not_the_values():
    failed = dict(failures(ID, fl.function(standardise)))
    assert "batches of 4, 9 and 30 rows" in failed and "eps = 0.1, 0.001, 1e-5 as Python numbers" in failed
    for why in failed.values():
        assert "new traces" in why and "values" not in why
    assert "expected 'at most 1', got '3'" in failed["batches of 4, 9 and 30 rows"]


def test_a_signature_that_leaves_out_eps_is_refused_on_the_call():
    # an input_signature must name every argument: one for x alone fails on normalize(x, eps)
    only_x = fl.function(lambda x, eps: standardise(x, eps), input_signature=SIGNATURE[:1])
    failed = dict(failures(ID, only_x))
    assert len(failed) == 6 and "raised TypeError" in failed["batches of 4, 9 and 30 rows"]
    assert "input_signature" in failed["batches of 4, 9 and 30 rows"]


def test_a_fixed_number_of_features_fails_when_the_features_change():
    three = fl.function(standardise, input_signature=[fl.TensorSpec([None, 3], fl.float32), SIGNATURE[1]])
    failed = dict(failures(ID, three))
    assert "eps = 0.1, 0.001, 1e-5 as Python numbers" in failed    # 2 features
    assert "batches of 4, 9 and 30 rows" not in failed               # 3 features fit
    assert "does not fit its input_signature" in failed["eps = 0.1, 0.001, 1e-5 as Python numbers"]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")   # 0 / 0 on purpose
def test_without_eps_a_batch_of_one_row_is_nan():
    def no_eps(x, eps):
        mean = fl.reduce_mean(x, axis=0, keepdims=True)
        return (x - mean) / fl.sqrt(fl.reduce_mean(fl.square(x - mean), axis=0, keepdims=True))

    failed = dict(failures(ID, fl.function(no_eps, input_signature=SIGNATURE)))
    # a batch of 1 row has variance 0: without eps, 0 / 0
    assert "a batch of 1 row, then 2 rows (eps keeps it finite)" in failed
    assert "values" in failed["a batch of 1 row, then 2 rows (eps keeps it finite)"]
    assert "nan" in failed["a batch of 1 row, then 2 rows (eps keeps it finite)"]


def test_a_plain_python_function_has_no_trace_count():
    failed = dict(failures(ID, standardise))
    assert len(failed) == 6
    assert all("not an @fl.function" in why for why in failed.values())


@pytest.mark.filterwarnings("ignore:.*has been traced:UserWarning")
def test_check_in_place_shows_a_hint_after_a_failed_try():
    reset_attempts(ID)
    try:
        result = fl.grading.check(ID, fl.function(standardise), exercises=EXERCISES)
        assert not result.passed and result.points == 0
        assert result.hint and "experimental_get_tracing_count" in result.hint
        assert "new traces" in repr(result)
        assert result.hidden == 3
        assert fl.grading.check(ID, fl.function(standardise, input_signature=SIGNATURE), exercises=EXERCISES).passed
    finally:
        reset_attempts(ID)
