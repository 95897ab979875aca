"""AUTOTUNE: the decision rules on made-up measurements, the tuner that applies and logs them, the
options that bound them, and real pipelines in which a slow map gains workers."""
import threading
import time

import pytest

import flowlab as fl
from flowlab.cluster.events import EventLog
from flowlab.data.autotune import (INTERVAL, WAIT_THRESHOLD, Budget, StageTuner, Window, decide_buffer,
                                   decide_parallelism)
from flowlab.data.options import resolve_buffer_size, resolve_parallelism, usable_cores
from flowlab.data.stats import PipelineStats

Dataset = fl.data.Dataset
pytestmark = pytest.mark.timeout(60)
MB = 1 << 20


# -- the rules, fed measured numbers ------------------------------------------------------------------
def test_a_map_grows_while_its_consumer_waits_and_a_core_is_free():
    window = Window(seconds=0.1, requests=10, wait_s=0.04, cpu_s=0.1)       # waited 40%, used 1 of 4 cores
    change = decide_parallelism(window, current=2, limit=4, cores=4)
    assert change.new == 3
    assert change.reason == "its consumer waited 40% of the last 100 ms and the process used 1.0 of 4 cores"


@pytest.mark.parametrize("why, window, current, limit, cores, worker_bytes, ram_left", [
    ("consumer barely waited", Window(0.1, 10, 0.1 * WAIT_THRESHOLD * 0.9, 0.0), 1, 4, 4, 0, float("inf")),
    ("at the limit", Window(0.1, 10, 0.09, 0.0), 4, 4, 8, 0, float("inf")),
    ("no core free", Window(0.1, 10, 0.09, 0.36), 2, 8, 4, 0, float("inf")),
    ("too few requests to judge", Window(0.1, 1, 0.09, 0.0), 1, 4, 4, 0, float("inf")),
    ("an empty window", Window(0.0, 5, 0.0, 0.0), 1, 4, 4, 0, float("inf")),
    ("one more worker's elements exceed the RAM left", Window(0.1, 10, 0.09, 0.0), 1, 4, 4, 20 * MB, 15 * MB),
])
def test_a_map_does_not_grow(why, window, current, limit, cores, worker_bytes, ram_left):
    assert decide_parallelism(window, current, limit, cores, worker_bytes, ram_left) is None, why


def test_the_free_core_rule_is_half_a_core():
    just_free = Window(1.0, 10, 0.5, 1.49)
    assert decide_parallelism(just_free, 1, 4, 2).new == 2
    assert decide_parallelism(just_free._replace(cpu_s=1.51), 1, 4, 2) is None


def test_a_prefetch_buffer_doubles_when_both_sides_sat_idle():
    window = Window(seconds=0.1, requests=10, wait_s=0.02, cpu_s=0.0, stall_s=0.03)
    change = decide_buffer(window, current=2, limit=64)
    assert change.new == 4
    assert change.reason == ("its consumer waited 20% and its producer was held up by the full buffer 30% "
                             "of the last 100 ms")
    assert decide_buffer(window, current=1, limit=64).new == 2
    assert decide_buffer(window, current=48, limit=64).new == 64                  # capped by the limit
    assert decide_buffer(window, current=4, limit=64, element_bytes=MB, ram_left=2.5 * MB).new == 6   # by RAM


@pytest.mark.parametrize("why, window, current, element_bytes, ram_left", [
    ("the producer never waited for room: it is simply slower", Window(0.1, 10, 0.09, 0.0, 0.0), 2, 0,
     float("inf")),
    ("the consumer never waited", Window(0.1, 10, 0.0, 0.0, 0.05), 2, 0, float("inf")),
    ("at the limit", Window(0.1, 10, 0.05, 0.0, 0.05), 64, 0, float("inf")),
    ("no RAM left for one more element", Window(0.1, 10, 0.05, 0.0, 0.05), 2, MB, 0.5 * MB),
])
def test_a_prefetch_buffer_does_not_grow(why, window, current, element_bytes, ram_left):
    assert decide_buffer(window, current, 64, element_bytes, ram_left) is None, why


# -- the tuner: windows, application, and the record it leaves -----------------------------------------
def tuner_for(parameter, value, limit, cores=4, ram=1 << 40, stalls=None):
    log = EventLog()
    stats = PipelineStats([("map#1", "map")], log=log)
    recorder = stats.stage("map#1")
    applied = []
    tuner = StageTuner(recorder, Budget(cores, ram), parameter, value, limit, applied.append, stalls)
    return tuner, applied, stats, log


def test_the_tuner_judges_each_window_applies_and_logs_the_decision():
    tuner, applied, stats, log = tuner_for("parallelism", 1, 3)
    t0 = tuner._start
    tuner.observe(t0 + 0.01, 0.01, 1.0)
    tuner.observe(t0 + 0.02, 0.01, 1.0)
    assert applied == []                                   # the window is not over yet
    tuner.observe(t0 + INTERVAL + 0.001, INTERVAL - 0.02, 1.0)
    assert applied == [2] and tuner.value == 2
    (decision,) = stats.decisions
    assert (decision.stage, decision.parameter, decision.old, decision.new) == ("map#1", "parallelism", 1, 2)
    assert decision.reason.startswith("its consumer waited") and stats.stage("map#1").parallelism == 2
    (event,) = log.events(kind="autotune")
    assert event.name == "map#1" and event.attrs["new"] == 2 and event.attrs["pipeline"] == stats.id
    assert "autotune (1 decisions)" in repr(stats)


def test_the_tuner_stops_at_its_limit_and_waits_for_enough_requests():
    tuner, applied, _, _ = tuner_for("parallelism", 1, 2)
    t = tuner._start + INTERVAL + 0.001
    tuner.observe(t, INTERVAL, 1.0)                        # one request: too few to judge, window goes on
    assert applied == []
    tuner.observe(t + 0.001, 0.001, 1.0)
    assert applied == [2]
    for i in range(20):                                    # at the limit: nothing more to decide
        tuner.observe(t + 1 + i, 1.0, 1.0)
    assert applied == [2]


def test_the_tuner_reads_producer_stalls_and_respects_the_ram_budget():
    stalled = [0.0]
    tuner, applied, _, _ = tuner_for("buffer_size", 1, 64, stalls=lambda: stalled[0])
    t = tuner._start
    stalled[0] = 0.02
    tuner.observe(t + 0.03, 0.02, 1.0)
    tuner.observe(t + INTERVAL + 0.01, 0.02, 1.0)
    assert applied == [2]
    element = fl.zeros([MB // 4])                          # 1 MB per element, 2.5 MB budget
    tuner, applied, _, _ = tuner_for("buffer_size", 2, 64, ram=int(2.5 * MB), stalls=lambda: stalled[0])
    t = tuner._start
    stalled[0] = 10.0
    tuner.observe(t + 0.03, 0.02, element)
    tuner.observe(t + INTERVAL + 0.01, 0.02, element)
    assert applied == []                                   # 3 elements would not fit


# -- options ------------------------------------------------------------------------------------------
def test_autotune_options_bound_and_switch_the_tuning():
    options = fl.data.Options()
    assert resolve_parallelism(fl.data.AUTOTUNE, options) == (1, usable_cores(), True)
    options.autotune.cpu_budget = 6
    assert resolve_parallelism(fl.data.AUTOTUNE, options) == (1, 6, True)
    options.threading.private_threadpool_size = 3
    assert resolve_parallelism(fl.data.AUTOTUNE, options) == (1, 3, True)
    assert resolve_parallelism(8, options) == (3, 3, False)
    options.autotune.enabled = False
    assert resolve_parallelism(fl.data.AUTOTUNE, options) == (3, 3, False)
    assert resolve_buffer_size(fl.data.AUTOTUNE, options) == (2, 2, False)
    options.autotune.enabled = True
    options.autotune.max_buffer_size = 5
    assert resolve_buffer_size(fl.data.AUTOTUNE, options) == (1, 5, True)
    assert resolve_buffer_size(7, options) == (7, 7, False)
    with pytest.raises(ValueError, match="buffer_size must be >= 0"):
        Dataset.range(3).prefetch(-5)
    with pytest.raises(ValueError, match="num_parallel_calls must be a positive count"):
        Dataset.range(3).map(lambda x: x, num_parallel_calls=0)


def test_autotune_off_means_the_fixed_default():
    options = fl.data.Options()
    options.autotune.enabled = False
    options.autotune.cpu_budget = 3
    ds = Dataset.range(20).map(lambda x: x, num_parallel_calls=fl.data.AUTOTUNE).prefetch(fl.data.AUTOTUNE)
    ds = ds.with_options(options)
    assert [int(x) for x in ds] == list(range(20))
    stats = ds.stats()
    assert stats.stage("map#1").parallelism == 3 and stats.stage("prefetch#2").buffer_size == 2
    assert stats.decisions == []


# -- real pipelines ------------------------------------------------------------------------------------
def worker_threads():
    return {t.name for t in threading.enumerate() if "-worker-" in t.name}


def test_a_slow_map_gains_workers_while_its_consumer_waits():
    options = fl.data.Options()
    options.autotune.cpu_budget = 4          # sleeping calls use no CPU, so cores are free however many
    seen = set()

    def slow(x):
        seen.update(worker_threads())
        time.sleep(0.01)
        return x
    ds = Dataset.range(60).map(slow, num_parallel_calls=fl.data.AUTOTUNE).with_options(options)
    assert [int(x) for x in ds] == list(range(60))          # order kept while workers are added
    stats = ds.stats()
    stage = stats.stage("map#1")
    assert stage.parallelism > 1 and len(seen) == stage.parallelism <= 4
    assert [d.new for d in stage.decisions] == list(range(2, stage.parallelism + 1))
    assert all(d.parameter == "parallelism" and "consumer waited" in d.reason for d in stage.decisions)
    assert [e.attrs["new"] for e in stats.events("autotune")] == [d.new for d in stage.decisions]


def test_a_bursty_producer_gets_a_bigger_prefetch_buffer():
    def bursts():
        for i in range(120):
            if i % 12 == 0:
                time.sleep(0.06)             # a slow read now and then (a new file, say)
            yield i
    ds = Dataset.from_generator(bursts).prefetch(fl.data.AUTOTUNE)
    got = []
    for x in ds:
        got.append(int(x))
        time.sleep(0.003)                    # a consumer that is busy between elements
    assert got == list(range(120))
    stage = ds.stats().stage("prefetch#1")
    assert stage.buffer_size > 1 and all(d.parameter == "buffer_size" for d in stage.decisions)
    assert stage.buffer_size <= 64
