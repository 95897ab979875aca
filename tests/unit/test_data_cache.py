"""Dataset.cache: in memory, and in a checksummed file that outlives the dataset object; a file
cache exists only after a complete pass, and damage to it is reported, never read as data."""
import collections
import os

import numpy as np
import pytest

import flowlab as fl
from flowlab.data.dataset import map_structure

Dataset = fl.data.Dataset
Point = collections.namedtuple("Point", "x y")


def values(ds):
    return [map_structure(lambda a: a.tolist() if hasattr(a, "tolist") else a, e) for e in ds.as_numpy_iterator()]


def counting(n, calls):
    return Dataset.range(n).map(lambda x: calls.append(int(x)) or x * 10)


def test_file_cache_replays_later_iterations_and_later_datasets(tmp_path):
    path, calls = str(tmp_path / "c.cache"), []
    ds = counting(5, calls).cache(path)
    assert not os.path.exists(path)
    assert values(ds) == [0, 10, 20, 30, 40]
    assert os.path.exists(path) and calls == [0, 1, 2, 3, 4]
    assert values(ds) == [0, 10, 20, 30, 40] and calls == [0, 1, 2, 3, 4]
    again = counting(5, calls).cache(path)         # a new pipeline (as in a new program) reads the file
    assert values(again) == [0, 10, 20, 30, 40] and calls == [0, 1, 2, 3, 4]
    assert next(iter(again)).dtype == fl.int64
    assert list(fl.data.read_records(path))[0].startswith(b'{"format": "flowlab.data.cache"')   # a record file


def test_file_cache_keeps_only_complete_passes_and_leaves_no_temporary_file(tmp_path):
    path, calls = str(tmp_path / "c.cache"), []
    ds = counting(6, calls).cache(path)
    assert values(ds.take(3)) == [0, 10, 20]                       # stopped early: nothing cached
    it = iter(ds)
    next(it)
    del it                                                         # dropped mid-way: nothing cached
    broken = Dataset.range(6).map(lambda x: 10 // (3 - int(x))).cache(path)
    with pytest.raises(fl.data.PipelineError):
        values(broken)                                             # failed mid-way: nothing cached
    assert os.listdir(tmp_path) == []
    assert values(ds) == [0, 10, 20, 30, 40, 50] and os.listdir(tmp_path) == ["c.cache"]


def test_file_cache_round_trips_structures_dtypes_and_bytes(tmp_path):
    def gen():
        for i in range(3):
            yield {"image": np.full((2, 3), i, np.float16), "label": np.int32(i), "ok": np.bool_(i % 2),
                   "name": f"item-{i}", "raw": bytes([i, 0, 255])}
    ds = Dataset.from_generator(gen).map(lambda d: (d, Point(d["label"], fl.zeros([0]))))
    expected = values(ds)
    cached = ds.cache(str(tmp_path / "s.cache"))
    assert values(cached) == expected                # first pass: written
    replay = list(cached)                            # second pass: read back
    assert values(cached) == expected
    first = replay[0]
    assert isinstance(first[1], tuple) and first[1]._fields == ("x", "y") and first[1].y.shape == (0,)
    assert first[0]["image"].dtype == fl.float16 and first[0]["ok"].dtype == fl.bool
    assert first[0]["raw"] == bytes([0, 0, 255]) and first[0]["name"] == "item-0"


def test_empty_dataset_caches_as_empty(tmp_path):
    path = str(tmp_path / "e.cache")
    assert values(Dataset.range(0).cache(path)) == []
    assert os.path.exists(path) and values(Dataset.range(5).cache(path)) == []


def test_a_damaged_cache_file_is_reported_with_its_offset(tmp_path):
    path = str(tmp_path / "c.cache")
    ds = Dataset.range(50).map(lambda x: fl.fill([8], x)).cache(path)
    values(ds)
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 0x10                      # one flipped bit in the middle of the file
    open(path, "wb").write(bytes(data))
    with pytest.raises(fl.data.DataLossError, match=r"c\.cache.*(offset|byte)"):
        values(ds)
    open(path, "wb").write(bytes(data[: len(data) // 3]))        # a truncated copy
    with pytest.raises(fl.data.DataLossError, match="truncated"):
        values(Dataset.range(50).cache(path))


def test_cache_refuses_a_file_that_is_not_a_cache_and_structures_that_change(tmp_path):
    path = tmp_path / "data.flrec"
    with fl.data.RecordWriter(path) as w:
        w.write(b"not a cache header")
    with pytest.raises(fl.errors.InvalidArgumentError, match="not a flowlab cache file; delete it"):
        values(Dataset.range(3).cache(str(path)))
    plain = tmp_path / "notes.txt"
    plain.write_text("hello")
    with pytest.raises(fl.data.DataLossError):
        values(Dataset.range(3).cache(str(plain)))
    shifting = Dataset.from_generator(lambda: iter([(1, 2), (1, 2, 3)])).cache(str(tmp_path / "x.cache"))
    with pytest.raises(fl.errors.InvalidArgumentError, match="element 1 has a different structure"):
        values(shifting)
    assert not (tmp_path / "x.cache").exists()


def test_cache_under_a_parallel_stage_and_across_repeat(tmp_path):
    calls = []
    ds = counting(8, calls).cache(str(tmp_path / "p.cache")).map(lambda x: x + 1, num_parallel_calls=2).prefetch(2)
    assert values(ds.repeat(3)) == [x * 10 + 1 for x in range(8)] * 3
    assert calls == list(range(8))
