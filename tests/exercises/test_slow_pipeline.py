"""The slow-pipeline exercise (exercises/06_slow_pipeline.ipynb, checks/slow_pipeline.py): the
reference passes every case, visible and hidden, and typical wrong answers fail with a reason that
says what went wrong. Each case times real pipelines whose loads sleep (about 1-2 s a case), so the
wrong answers are tried on the one case that shows their mistake."""
import flowlab as fl
from _grade import EXERCISES, outcomes
from flowlab.grading import compare, to_plain
from flowlab.grading.check import reset_attempts
from flowlab.grading.manifest import load_checks

ID = "slow-pipeline"


def reference(source, load, augment, batch_size):
    return source.map(load, num_parallel_calls=8).map(augment).batch(batch_size).prefetch(2)


def serial(source, load, augment, batch_size):                  # the slow pipeline, as given
    return source.map(load).map(augment).batch(batch_size)


def prefetch_only(source, load, augment, batch_size):           # overlaps, but loads one at a time
    return source.map(load).map(augment).batch(batch_size).prefetch(8)


def autotuned(source, load, augment, batch_size):               # at most one worker per core
    return (source.map(load, num_parallel_calls=fl.data.AUTOTUNE).map(augment)
            .batch(batch_size).prefetch(fl.data.AUTOTUNE))


def unordered(source, load, augment, batch_size):                # fast, but the ids come out of order
    return (source.map(load, num_parallel_calls=8, deterministic=False).map(augment)
            .batch(batch_size).prefetch(2))


def drops_last_batch(source, load, augment, batch_size):         # loses the shorter last batch
    return (source.map(load, num_parallel_calls=8).map(augment)
            .batch(batch_size, drop_remainder=True).prefetch(2))


def loads_twice(source, load, augment, batch_size):              # 8 readers over 4 shards: each id twice
    readers = fl.data.Dataset.range(8)
    return (readers.interleave(lambda r: source.shard(4, int(r) % 4).map(load), cycle_length=8,
                               num_parallel_calls=8).map(augment).batch(batch_size))


def one_case(answer, name_part):
    """(ok, why) of ``answer`` on the one case whose name holds ``name_part``, as _grade runs it."""
    checks = load_checks(EXERCISES, ID)
    [case] = [c for c in checks.cases() + checks.hidden_cases() if name_part in c.name]
    try:
        received = to_plain(checks.run(answer, case))
    except Exception as e:   # noqa: BLE001
        return False, f"raised {type(e).__name__}: {e}"
    return compare(to_plain(case.expected_value()), received, **case.tolerance(checks.TOLERANCE))


def test_reference_passes_every_case():
    results = outcomes(ID, reference)
    assert len(results) == 6
    assert all(ok for _, ok, _ in results), [(n, why) for n, ok, why in results if not ok]


def test_the_slow_pipeline_is_not_fast_enough():
    ok, why = one_case(serial, "16 elements")
    assert not ok
    assert "speed-up over the slow pipeline" in why and "expected 'at least 3x'" in why
    assert "got '0." in why or "got '1." in why, why


def test_prefetch_alone_is_not_fast_enough():
    ok, why = one_case(prefetch_only, "16 elements")
    assert not ok and "speed-up" in why and ("got '0." in why or "got '1." in why), why


def test_autotune_stops_at_two_workers_on_any_machine():
    ok, why = one_case(autotuned, "16 elements")
    assert not ok and "speed-up" in why, why
    assert "got '1." in why or "got '2." in why, why


def test_a_map_that_loses_order_fails_on_the_order():
    ok, why = one_case(unordered, "24 elements")
    assert not ok
    assert "ids in each batch, in order" in why, why      # every id is there: only the order is wrong


def test_dropping_the_last_batch_fails_on_a_hidden_case():
    assert one_case(drops_last_batch, "24 elements") == (True, "")    # no visible case has a short batch
    ok, why = one_case(drops_last_batch, "a last batch of 2), loads of 12")
    assert not ok
    assert "every id once (sorted)" in why and "expected 26 items, got 24" in why, why


def test_elements_made_twice_fail():
    ok, why = one_case(loads_twice, "16 elements")
    assert not ok
    assert "every id once (sorted)" in why and "expected 16 items, got 32" in why, why


def test_check_in_place_shows_a_hint_after_a_failed_try():
    reset_attempts(ID)
    result = fl.grading.check(ID, unordered)
    assert not result.passed and result.hint
    assert result.hint_number == 1 and "num_parallel_calls" in result.hint
    reset_attempts(ID)
