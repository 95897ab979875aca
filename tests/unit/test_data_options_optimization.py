"""``fl.data.Options().experimental_optimization`` and TensorFlow's older option names: accepted as
tutorials set them; ``map_parallelization`` really makes a sequential map parallel."""
import threading

import pytest

import flowlab as fl


def threads_calling(ds_builder, options=None):
    """The set of threads that ran the map function, and the elements."""
    seen = set()

    def fn(x):
        seen.add(threading.get_ident())
        return x * 2

    ds = ds_builder(fn)
    if options is not None:
        ds = ds.with_options(options)
    return seen, [int(x) for x in ds]


def test_tutorial_options_map_parallelization_runs_a_sequential_map_in_worker_threads():
    # The tf.data talk's program: set map_parallelization on an Options and attach it with with_options.
    options = fl.data.Options()
    options.experimental_optimization.map_parallelization = True
    main = threading.get_ident()

    seen, values = threads_calling(lambda fn: fl.data.Dataset.range(20).map(fn), options)
    assert values == [2 * i for i in range(20)]          # the order is kept (deterministic by default)
    assert main not in seen                              # the calls ran in the stage's worker threads

    seen, values = threads_calling(lambda fn: fl.data.Dataset.range(20).map(fn))
    assert seen == {main} and values == [2 * i for i in range(20)]   # without the option: sequential


def test_map_parallelization_false_and_apply_default_optimizations_change_nothing():
    options = fl.data.Options()
    options.experimental_optimization.map_parallelization = False
    options.experimental_optimization.apply_default_optimizations = False
    seen, values = threads_calling(lambda fn: fl.data.Dataset.range(5).map(fn), options)
    assert seen == {threading.get_ident()} and values == [0, 2, 4, 6, 8]


def test_every_field_tutorials_set_is_accepted_and_merged():
    options = fl.data.Options()
    opt = options.experimental_optimization
    for name in ("map_parallelization", "parallel_batch", "noop_elimination", "apply_default_optimizations",
                 "map_and_batch_fusion", "map_fusion", "map_and_filter_fusion", "filter_fusion",
                 "shuffle_and_repeat_fusion", "inject_prefetch", "hoist_random_uniform"):
        setattr(opt, name, True)
        assert getattr(opt, name) is True
    other = fl.data.Options()
    other.experimental_optimization.map_fusion = False
    merged = options.merge(other)
    assert merged.experimental_optimization.map_fusion is False and merged.experimental_optimization.parallel_batch
    ds = fl.data.Dataset.range(6).map(lambda x: x + 1).batch(3).with_options(options)
    assert [b.numpy().tolist() for b in ds] == [[1, 2, 3], [4, 5, 6]]
    assert ds.options().experimental_optimization.noop_elimination is True


def test_wrong_names_and_values_say_where_to_look():
    opt = fl.data.Options().experimental_optimization
    with pytest.raises(AttributeError, match="Options\\(\\).autotune"):
        opt.autotune = True
    with pytest.raises(AttributeError, match="map_parallelization"):
        opt.map_paralelization = True                      # a typo lists the real names
    with pytest.raises(TypeError, match="True, False or None"):
        opt.parallel_batch = "yes"
    with pytest.raises(TypeError, match="group of settings"):
        fl.data.Options().experimental_optimization = True


def test_older_tensorflow_names_threading_and_deterministic():
    options = fl.data.Options()
    options.experimental_threading.private_threadpool_size = 1
    options.experimental_threading.max_intra_op_parallelism = 1
    options.experimental_deterministic = False
    options.experimental_slack = True
    assert options.threading.private_threadpool_size == 1 and options.deterministic is False
    assert options.experimental_threading is options.threading
    # private_threadpool_size bounds the threads a parallel map starts: one thread here, however asked.
    seen = set()

    def fn(x):
        seen.add(threading.get_ident())
        return x

    ds = fl.data.Dataset.range(30).map(fn, num_parallel_calls=4).with_options(options)
    assert sorted(int(x) for x in ds) == list(range(30))
    assert len(seen) == 1
