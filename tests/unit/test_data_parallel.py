"""flowlab.data's threads: parallel map really overlaps, keeps order (or not, when asked), bounds
what is in flight, reports errors with the element's index and original traceback, and never leaves
a thread behind (exhausted, broken out of, dropped, or failed)."""
import gc
import threading
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import flowlab as fl
from flowlab.data._parallel import MAX_CHUNK

Dataset = fl.data.Dataset
pytestmark = pytest.mark.timeout(60)


def data_threads():
    return [t for t in threading.enumerate() if t.name.startswith("flowlab-data-")]


def assert_no_threads_left(timeout=5.0):
    deadline = time.monotonic() + timeout
    while data_threads() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not data_threads(), f"threads left behind: {[t.name for t in data_threads()]}"


@pytest.fixture(autouse=True)
def no_threads_before_or_after():
    assert_no_threads_left()
    yield
    assert_no_threads_left()


def recorder():
    """A map function that sleeps (releasing the GIL, as numpy kernels do) and records when and where it ran."""
    intervals, lock = [], threading.Lock()

    def work(x, seconds=0.03):
        start = time.perf_counter()
        time.sleep(seconds)
        with lock:
            intervals.append((start, time.perf_counter(), threading.current_thread().name))
        return x
    return work, intervals


# -- parallelism and order ------------------------------------------------------------------------------
def test_parallel_map_calls_overlap_in_time_in_worker_threads():
    work, intervals = recorder()
    out = [int(x) for x in Dataset.range(8).map(work, num_parallel_calls=2)]
    assert out == list(range(8))
    assert len(intervals) == 8
    overlapping = [(a, b) for i, a in enumerate(intervals) for b in intervals[i + 1:] if a[0] < b[1] and b[0] < a[1]]
    assert overlapping, "no two calls of the map function ran at the same time"
    names = {name for _, _, name in intervals}
    assert len(names) == 2 and all(n.startswith("flowlab-data-map-") and "-worker-" in n for n in names)


def test_sequential_map_runs_in_the_callers_thread():
    work, intervals = recorder()
    assert [int(x) for x in Dataset.range(3).map(lambda x: work(x, 0))] == [0, 1, 2]
    assert {name for _, _, name in intervals} == {threading.current_thread().name}


def test_parallel_map_keeps_input_order_when_later_elements_finish_first():
    ds = Dataset.range(12).map(lambda x: time.sleep(0.002 * (12 - int(x))) or x * 2, num_parallel_calls=4)
    assert [int(x) for x in ds] == [2 * i for i in range(12)]
    ds = Dataset.range(12).map(lambda x: x * 2, num_parallel_calls=fl.data.AUTOTUNE, deterministic=True)
    assert [int(x) for x in ds] == [2 * i for i in range(12)]


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(-50, 50), max_size=60), st.integers(1, 4), st.booleans(), st.integers(0, 3))
def test_parallel_map_matches_python_for_any_length_workers_and_order(xs, workers, deterministic, slow_every):
    # a few slow calls make later elements finish first; chunks and token groups must not reorder or lose any
    def f(x):
        if slow_every and int(x) % (slow_every + 2) == 0:
            time.sleep(0.001)
        return x * 3 - 1
    ds = Dataset.from_tensor_slices(np.array(xs, np.int64).reshape(-1))
    got = [int(v) for v in ds.map(f, num_parallel_calls=workers, deterministic=deterministic)]
    expected = [x * 3 - 1 for x in xs]
    assert got == expected if deterministic else sorted(got) == sorted(expected)


def test_seeded_shuffle_through_parallel_and_autotuned_stages_is_repeatable():
    def make():
        return (Dataset.range(200).shuffle(50, seed=4).map(lambda x: x * 2, num_parallel_calls=fl.data.AUTOTUNE)
                .batch(7).prefetch(fl.data.AUTOTUNE))
    first = [b.numpy().tolist() for b in make()]
    assert first == [b.numpy().tolist() for b in make()]
    flat = [x for b in first for x in b]
    assert sorted(flat) == [2 * i for i in range(200)] and flat != sorted(flat)


def test_nondeterministic_map_returns_every_element_once():
    for source in (Dataset.range(30), Dataset.range(0), Dataset.range(1)):
        ds = source.map(lambda x: time.sleep(0.001 * (int(x) % 3)) or x, num_parallel_calls=3, deterministic=False)
        n = len(list(source))
        assert sorted(int(x) for x in ds) == list(range(n))
    options = fl.data.Options(deterministic=False)      # the option applies where the argument is None
    ds = Dataset.range(20).map(lambda x: x, num_parallel_calls=2).with_options(options)
    assert sorted(int(x) for x in ds) == list(range(20))


def test_threadpool_limit_from_options_reaches_the_map_stage():
    seen = set()

    def record(x):
        seen.update(t.name for t in threading.enumerate() if "-worker-" in t.name)
        return x
    options = fl.data.Options()
    options.threading.private_threadpool_size = 2
    ds = Dataset.range(10).map(record, num_parallel_calls=8).batch(5).with_options(options)
    assert len(list(ds)) == 2
    assert 1 <= len(seen) <= 2


@pytest.mark.parametrize("seconds, chunk", [(0.02, 1), (0.0, MAX_CHUNK)])
def test_parallel_map_bounds_what_is_in_flight(seconds, chunk):
    # a slow function keeps chunks of 1 element (at most 2 per worker in flight); a fast one lets a
    # worker take up to MAX_CHUNK at once (at most 2 chunks per worker in flight)
    pulled = []

    def source():
        for i in range(1000):
            pulled.append(i)
            yield i
    with iter(Dataset.from_generator(source).map(lambda x: time.sleep(seconds) or x, num_parallel_calls=2)) as it:
        assert int(next(it)) == 0
        time.sleep(0.3)          # let the workers fill every free slot; the bound holds whatever the timing
        assert len(pulled) <= 2 * 2 * chunk + 1


def test_prefetch_keeps_order_and_runs_ahead_in_its_thread():
    names = []
    ds = Dataset.range(50).map(lambda x: names.append(threading.current_thread().name) or x).prefetch(4)
    assert [int(x) for x in ds] == list(range(50))
    assert set(names) == {n for n in names if n.startswith("flowlab-data-prefetch-")} and names
    assert [int(x) for x in Dataset.range(5).prefetch(fl.data.AUTOTUNE)] == list(range(5))
    assert [int(x) for x in Dataset.range(5).prefetch(0)] == list(range(5))


def test_parallel_map_really_speeds_up_numpy_work_pipeline_shape():
    # not a timing test: just the pipeline of the benchmark, parallel map + batch + prefetch, gives the
    # same batches as the sequential one
    def work(x):
        a = np.full((64, 64), float(x), np.float32)
        return (a @ a).sum()
    sequential = [b.tolist() for b in Dataset.range(40).map(work).batch(8).as_numpy_iterator()]
    parallel = Dataset.range(40).map(work, num_parallel_calls=2).batch(8).prefetch(2)
    assert [b.tolist() for b in parallel.as_numpy_iterator()] == sequential


# -- errors ---------------------------------------------------------------------------------------
def failing_at(bad):
    def fn(x):
        if int(x) == bad:
            raise ValueError(f"cannot handle {int(x)}")
        return x
    return fn


@pytest.mark.parametrize("parallel", [None, 1, 3])
def test_map_error_names_the_index_and_carries_the_original_traceback(parallel):
    ds = Dataset.range(10, 30).map(failing_at(17), num_parallel_calls=parallel)
    got = []
    with pytest.raises(fl.data.PipelineError) as info:
        for x in ds:
            got.append(int(x))
    assert got == list(range(10, 17))                 # in order, up to the failing element
    err = info.value
    assert err.index == 7 and err.stage == "map"      # its index in the map's input
    message = str(err)
    assert "element 7" in message and "ValueError: cannot handle 17" in message
    assert 'raise ValueError(f"cannot handle {int(x)}")' in message    # the original traceback's text
    assert isinstance(err.__cause__, ValueError) and err.__cause__.__traceback__ is not None


def test_errors_from_upstream_pass_through_parallel_stages_unchanged():
    def source():
        yield 1
        raise KeyError("source broke")
    ds = Dataset.from_generator(source).map(lambda x: x, num_parallel_calls=2).prefetch(2)
    it = iter(ds)
    assert int(next(it)) == 1
    with pytest.raises(KeyError, match="source broke"):
        next(it)
    with pytest.raises(StopIteration):   # a failed iterator is finished
        next(it)


def test_error_in_nondeterministic_map_and_in_interleave():
    with pytest.raises(fl.data.PipelineError, match="element 5"):
        list(Dataset.range(10).map(failing_at(5), num_parallel_calls=2, deterministic=False))
    with pytest.raises(fl.data.PipelineError, match="interleave.*element 2"):
        list(Dataset.range(4).interleave(lambda x: Dataset.range(int(x) // (int(x) - 2)), cycle_length=2,
                                          num_parallel_calls=2))


# -- cleanup: no thread left behind ------------------------------------------------------------------
def pipelines():
    return {
        "map": lambda: Dataset.range(1000).map(lambda x: x, num_parallel_calls=2),
        "prefetch": lambda: Dataset.range(1000).prefetch(3),
        "chain": lambda: Dataset.range(1000).map(lambda x: x, num_parallel_calls=2).prefetch(2).batch(4).prefetch(1),
        "interleave": lambda: Dataset.range(10).interleave(lambda x: Dataset.range(100).prefetch(2), cycle_length=3,
                                                           num_parallel_calls=3),
        "repeat": lambda: Dataset.range(1000).map(lambda x: x, num_parallel_calls=2).repeat(),
    }


@pytest.mark.parametrize("name", sorted(pipelines()))
def test_no_thread_left_after_exhaustion_break_drop_or_close(name):
    make = pipelines()[name]
    if name != "repeat":
        list(make())                                   # exhausted
        assert_no_threads_left()
    for x in make():                                   # broken out of early
        break
    assert_no_threads_left()
    it = iter(make())                                  # dropped mid-way
    next(it)
    assert data_threads()
    del it
    gc.collect()
    assert_no_threads_left()
    with iter(make()) as it:                           # closed explicitly
        next(it)
    assert_no_threads_left()
    numpy_iterator = make().as_numpy_iterator()
    next(numpy_iterator)
    numpy_iterator.close()
    assert_no_threads_left()


def test_no_thread_left_after_an_error():
    ds = Dataset.range(1000).map(failing_at(3), num_parallel_calls=2).prefetch(2).map(lambda x: x, num_parallel_calls=2)
    with pytest.raises(fl.data.PipelineError):
        list(ds)
    assert_no_threads_left()


def test_dropping_an_iterator_whose_queue_is_full_stops_its_thread():
    it = iter(Dataset.range(10**6).prefetch(2))
    next(it)
    time.sleep(0.1)                       # the producer is now blocked on a full queue
    del it
    assert_no_threads_left()


def test_importing_flowlab_data_starts_no_thread():
    import subprocess
    import sys
    code = "import threading, flowlab; print(len(threading.enumerate()))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "1"
