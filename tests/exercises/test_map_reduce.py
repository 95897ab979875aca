"""map-reduce (exercises/08_map_reduce.ipynb): the reference ``word_count``, whose map runs on every
worker of a real LocalCluster (worker r counts the files paths[r::n] and sends back a Counter) and
whose reduce adds the counts up in the notebook, passes every case, visible and hidden; the usual
mistakes (counting in the notebook, sending the words back, sending the text out, one file per
worker, ``split(" ")``) fail with a reason that says what went wrong. Every case closes its cluster
and removes its files, also when the answer raises or hangs, and the fixture checks that no process
started here is left behind."""
import collections
import glob
import os
import tempfile
import time

import pytest

import flowlab as fl
from flowlab.grading import compare, to_plain
from flowlab.grading.check import reset_attempts
from flowlab.grading.manifest import load_checks
from _grade import EXERCISES, outcomes

pytestmark = pytest.mark.process

ID = "map-reduce"


def _folders():
    return set(glob.glob(os.path.join(tempfile.gettempdir(), "flowlab-word-count-*")))


@pytest.fixture(autouse=True)
def no_folder_left_behind(nothing_left_behind):
    """The checks removed the shard folders they wrote (and, by the fixture it uses, every process
    a test started has ended)."""
    folders = _folders()
    yield
    assert not _folders() - folders, "shard folders left behind"


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


def count_mine(paths):
    import collections
    import flowlab as fl
    r, n = fl.cluster.rank(), fl.cluster.world_size()
    counts = collections.Counter()
    for path in paths[r::n]:
        with open(path) as f:
            counts.update(f.read().split())
    return counts


def reduce_with(mapper, what=None):
    """A word_count whose map is ``mapper`` run by cluster.run on ``what(paths)`` (default: the paths)."""
    def word_count(cluster, paths):
        total = collections.Counter()
        for counts in cluster.run(mapper, what(paths) if what else paths):
            total.update(counts)
        return dict(total)
    return word_count


word_count = reduce_with(count_mine)


def in_the_notebook(cluster, paths):
    total = collections.Counter()
    for p in paths:
        with open(p) as f:
            total.update(f.read().split())
    return dict(total)


def words_back(paths):
    import flowlab as fl
    r, n = fl.cluster.rank(), fl.cluster.world_size()
    words = []
    for path in paths[r::n]:
        with open(path) as f:
            words += f.read().split()
    return words                       # the words travel, to be counted in the notebook


def count_texts(texts):
    import collections
    import flowlab as fl
    r, n = fl.cluster.rank(), fl.cluster.world_size()
    return collections.Counter(w for t in texts[r::n] for w in t.split())


def one_file_each(paths):
    import collections
    import flowlab as fl
    with open(paths[fl.cluster.rank()]) as f:
        return collections.Counter(f.read().split())


def split_on_spaces(paths):
    import collections
    import flowlab as fl
    r, n = fl.cluster.rank(), fl.cluster.world_size()
    counts = collections.Counter()
    for path in paths[r::n]:
        with open(path) as f:
            counts.update(f.read().split(" "))
    return counts


def _read_all(paths):
    out = []
    for p in paths:
        with open(p) as f:
            out.append(f.read())
    return out


def test_the_reference_passes_every_case():
    results = outcomes(ID, word_count)
    assert len(results) == 6
    assert all(ok for _, ok, _ in results), results


def test_counting_in_the_notebook_says_the_map_did_not_run():
    ok, why = one_case(in_the_notebook, "2 workers, 2 shards")
    assert not ok and "the map did not run there" in why and "/job:worker/task:0" in why, why


def test_sending_the_words_back_goes_over_the_bytes_back():
    ok, why = one_case(reduce_with(words_back), "2 workers, 2 shards")
    assert not ok and "bytes each worker sent back" in why and "expected 'at most 4096'" in why, why


def test_sending_the_text_out_goes_over_the_bytes_sent():
    ok, why = one_case(reduce_with(count_texts, what=_read_all), "3 workers, 3 shards of different sizes")
    assert not ok and "bytes sent to each worker" in why and "expected 'at most 16384'" in why, why


def test_one_file_per_worker_misses_files_or_raises():
    ok, why = one_case(reduce_with(one_file_each), "2 workers, 5 shards (3 on worker 0, 2 on worker 1)")
    assert not ok and why.startswith("at ['counts']"), why
    ok, why = one_case(reduce_with(one_file_each), "3 workers, 2 shards (worker 2 has none)")
    assert not ok and "IndexError" in why and "/job:worker/task:2" in why, why


def test_split_on_spaces_keeps_newlines_inside_words():
    ok, why = one_case(reduce_with(split_on_spaces), "2 workers, 2 shards")
    assert not ok and why.startswith("at ['counts']"), why


def test_an_answer_that_hangs_has_its_cluster_closed():
    checks = load_checks(EXERCISES, ID)
    checks.run.__globals__["WATCHDOG_S"] = 2.0          # this loaded copy only
    t0 = time.monotonic()
    ok, why = one_case(lambda c, paths: c.run(time.sleep, 60), "2 workers, 2 shards", checks)
    assert not ok and "ran longer than 2 s" in why, why
    assert time.monotonic() - t0 < 30


def test_the_check_in_place_fails_and_shows_the_first_hint():
    reset_attempts(ID)
    result = fl.grading.check(ID, in_the_notebook)
    reset_attempts(ID)
    assert not result.passed
    text = repr(result)
    assert "the map did not run there" in text and "cluster.run(fn, paths)" in text, text
    assert "3 hidden" in text, text
