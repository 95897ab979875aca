"""Auto-sharding (``fl.data.AutoShardPolicy``, ``flowlab/data/_autoshard.py``): the rewrite of a
pipeline of global batches into each worker's share: which files and elements each worker index
gets, its batch size, that the workers together see every element exactly once, and the errors."""
import os

import numpy as np
import pytest

import flowlab as fl
from flowlab.data._autoshard import auto_shard

P = fl.data.AutoShardPolicy


def _batches(ds):
    return [np.asarray(b).ravel().tolist() for b in ds.as_numpy_iterator()]


def _write_files(folder, files=6, per_file=5):
    """``files`` record files; record ``j`` of file ``f`` holds the number ``100 * f + j``."""
    paths = []
    for f in range(files):
        path = os.path.join(folder, f"part-{f:02d}.flrec")
        with fl.data.RecordWriter(path) as w:
            for j in range(per_file):
                w.write({"x": np.array([100 * f + j], np.int64)})
        paths.append(path)
    return paths


def _numbers(e):
    return e["x"][0]


# -- the option ----------------------------------------------------------------------------------
def test_option_defaults_to_auto_and_merges_through_with_options():
    ds = fl.data.Dataset.range(8).batch(4)
    assert ds.options().experimental_distribute._get("auto_shard_policy") is P.AUTO
    options = fl.data.Options()
    options.experimental_distribute.auto_shard_policy = fl.data.experimental.AutoShardPolicy.DATA
    later = fl.data.Options()
    later.deterministic = False           # a later with_options that leaves the policy unset keeps it
    piped = ds.with_options(options).prefetch(1).with_options(later)
    assert piped.options().experimental_distribute.auto_shard_policy is P.DATA
    assert piped.options().deterministic is False
    options.experimental_distribute.auto_shard_policy = "file"
    assert options.experimental_distribute.auto_shard_policy is P.FILE
    with pytest.raises(ValueError, match="auto_shard_policy must be one of .*OFF.*AUTO.*FILE.*DATA.*got 'sideways'"):
        options.experimental_distribute.auto_shard_policy = "sideways"
    with pytest.raises(AttributeError, match="no option 'policy'"):
        options.experimental_distribute.policy = P.OFF


@pytest.mark.parametrize("policy", [P.AUTO, P.OFF, P.FILE, P.DATA])
def test_one_worker_and_auto_off_leave_the_pipeline_as_it_is(policy):
    ds = fl.data.Dataset.range(10).batch(4)
    assert auto_shard(ds, 1, 0, policy) is ds
    if policy in (P.AUTO, P.OFF):
        assert auto_shard(ds, 3, 2, policy) is ds


def test_policy_is_read_off_the_pipeline_when_not_given():
    options = fl.data.Options()
    options.experimental_distribute.auto_shard_policy = P.DATA
    ds = fl.data.Dataset.range(8).batch(4).with_options(options)
    assert _batches(auto_shard(ds, 2, 1)) == [[1, 3], [5, 7]]


# -- DATA ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("workers", [2, 3, 4])
def test_data_workers_together_hold_each_global_batch_exactly_once(workers):
    global_batch = 12
    ds = fl.data.Dataset.range(60).map(lambda x: x * 10).batch(global_batch).prefetch(2)
    reference = _batches(ds)
    shares = [_batches(auto_shard(ds, workers, i, P.DATA)) for i in range(workers)]
    for i, share in enumerate(shares):
        assert len(share) == len(reference)
        assert all(len(b) == global_batch // workers for b in share)
        assert share[0] == [10 * (i + workers * j) for j in range(global_batch // workers)]
    for k, batch in enumerate(reference):      # batch k of the workers together is global batch k
        assert sorted(x for share in shares for x in share[k]) == sorted(batch)
    assert _batches(ds) == reference           # the original pipeline is untouched


def test_data_keeps_drop_remainder_and_padded_batch():
    ds = fl.data.Dataset.range(10).batch(4, drop_remainder=True)
    shares = [auto_shard(ds, 2, i, P.DATA) for i in range(2)]
    assert [_batches(s) for s in shares] == [[[0, 2], [4, 6]], [[1, 3], [5, 7]]]
    assert shares[0].element_spec.shape.as_list() == [2]
    padded = fl.data.Dataset.range(1, 5).map(lambda n: fl.fill([n], n)).padded_batch(4, padded_shapes=[5])
    rows = [[r.tolist() for r in b] for b in auto_shard(padded, 2, 1, P.DATA).as_numpy_iterator()]
    assert rows == [[[2, 2, 0, 0, 0], [4, 4, 4, 4, 0]]]


def test_stages_above_the_batch_and_their_options_survive():
    options = fl.data.Options()
    options.experimental_distribute.auto_shard_policy = P.DATA
    options.deterministic = False
    ds = (fl.data.Dataset.range(16).batch(8).map(lambda b: b + 1000, num_parallel_calls=2)
          .with_options(options).take(1))
    share = auto_shard(ds, 4, 3)
    assert _batches(share) == [[1003, 1007]]
    assert share.options().deterministic is False
    assert share.options().experimental_distribute.auto_shard_policy is P.DATA


def test_in_memory_cache_above_the_shard_is_not_replayed_whole():
    ds = fl.data.Dataset.range(8).batch(4).cache()
    assert _batches(ds) == [[0, 1, 2, 3], [4, 5, 6, 7]]          # fills the original's cache
    assert _batches(auto_shard(ds, 2, 0, P.DATA)) == [[0, 2], [4, 6]]


# -- FILE ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("workers", [2, 3])
def test_file_list_files_each_worker_reads_only_its_files(tmp_path, workers):
    _write_files(tmp_path, files=6, per_file=4)
    ds = (fl.data.Dataset.list_files(str(tmp_path / "*.flrec"), shuffle=True, seed=3)
          .interleave(lambda f: fl.data.RecordDataset(f, decode=True), cycle_length=2)
          .map(_numbers).batch(6))
    every = sorted(x for b in _batches(ds) for x in b)
    assert every == sorted(100 * f + j for f in range(6) for j in range(4))
    seen = []
    for i in range(workers):
        share = _batches(auto_shard(ds, workers, i, P.FILE))
        assert all(len(b) == 6 // workers for b in share)
        files = {x // 100 for b in share for x in b}
        assert files == set(range(i, 6, workers))      # sorted files i, i+N, ... before any shuffle
        seen += [x for b in share for x in b]
    assert sorted(seen) == every                       # every record exactly once over the workers


def test_file_record_dataset_of_a_list_or_of_names(tmp_path):
    paths = _write_files(tmp_path, files=4, per_file=2)
    listed = fl.data.RecordDataset(paths, decode=True).map(_numbers).batch(4)
    assert [_batches(auto_shard(listed, 2, i, P.FILE)) for i in range(2)] == [
        [[0, 1], [200, 201]], [[100, 101], [300, 301]]]
    named = fl.data.RecordDataset(fl.data.Dataset.list_files(str(tmp_path / "*.flrec"), shuffle=False),
                                  decode=True).map(_numbers).batch(4)
    assert _batches(auto_shard(named, 2, 1, P.FILE)) == [[100, 101], [300, 301]]
    assert _batches(listed) == [[0, 1, 100, 101], [200, 201, 300, 301]]     # the original: all files


def test_file_errors_name_the_policy_and_what_to_use_instead(tmp_path):
    with pytest.raises(ValueError, match=r"AutoShardPolicy.FILE: the pipeline has no file source .*from_generator.*"
                                         r"use AutoShardPolicy.DATA"):
        auto_shard(fl.data.Dataset.from_generator(lambda: iter(range(8))).batch(4), 2, 0, P.FILE)
    with pytest.raises(ValueError, match=r"AutoShardPolicy.FILE: .*no file source .*range"):
        auto_shard(fl.data.Dataset.range(8).batch(4), 2, 0, P.FILE)
    paths = _write_files(tmp_path, files=2, per_file=2)
    with pytest.raises(ValueError, match=r"FILE: the pipeline reads 2 file\(s\), fewer than the 3 workers.*DATA"):
        auto_shard(fl.data.RecordDataset(paths).batch(3), 3, 0, P.FILE)
    with pytest.raises(ValueError, match=r"FILE: the pipeline reads 2 file\(s\), fewer than the 3 workers"):
        auto_shard(fl.data.Dataset.list_files(str(tmp_path / "*")).interleave(fl.data.RecordDataset).batch(3),
                   3, 0, P.FILE)
    cached = fl.data.RecordDataset(paths).batch(2).cache(str(tmp_path / "cache"))
    with pytest.raises(ValueError, match="cache.*every worker would share that one file"):
        auto_shard(cached, 2, 0, P.FILE)


@pytest.mark.parametrize("policy", [P.FILE, P.DATA])
def test_batch_errors(tmp_path, policy):
    paths = _write_files(tmp_path, files=2, per_file=2)
    with pytest.raises(ValueError, match=rf"AutoShardPolicy.{policy.name}: the batch size 5 of the pipeline's "
                                         r"batch stage cannot be split evenly over 2 workers"):
        auto_shard(fl.data.RecordDataset(paths).batch(5), 2, 0, policy)
    with pytest.raises(ValueError, match=rf"AutoShardPolicy.{policy.name}: found no batch stage .*RecordDataset"):
        auto_shard(fl.data.RecordDataset(paths).map(lambda p: p), 2, 0, policy)
    with pytest.raises(ValueError, match="worker_index must be in"):
        auto_shard(fl.data.RecordDataset(paths).batch(2), 2, 2, policy)


# -- through a strategy with one worker process --------------------------------------------------
@pytest.fixture
def two_cpus(hidden_gpus):
    fl.config.set_logical_devices("CPU", 2)
    yield
    fl.config.set_logical_devices("CPU", None)


@pytest.mark.parametrize("policy", [P.AUTO, P.OFF, P.FILE, P.DATA])
def test_one_worker_strategy_reads_the_same_under_every_policy(two_cpus, tmp_path, policy):
    paths = _write_files(tmp_path, files=2, per_file=4)
    options = fl.data.Options()
    options.experimental_distribute.auto_shard_policy = policy
    ds = fl.data.RecordDataset(paths, decode=True).map(_numbers).batch(4).with_options(options)
    strategy = fl.distribute.MirroredStrategy()
    got = [[v.numpy().tolist() for v in strategy.experimental_local_results(b)]
           for b in strategy.experimental_distribute_dataset(ds)]
    assert got == [[[0, 1], [2, 3]], [[100, 101], [102, 103]]]
