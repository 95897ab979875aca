"""flowlab.data.Dataset: every source and transformation against a plain-Python reference."""
import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import flowlab as fl
from flowlab.data.dataset import map_structure

Dataset = fl.data.Dataset
SMALL = settings(max_examples=25, deadline=None)
lists = st.lists(st.integers(-100, 100), max_size=30)


def values(ds):
    """The elements as plain Python (lists and numbers), for comparing with a reference."""
    return [map_structure(lambda a: a.tolist() if hasattr(a, "tolist") else a, e) for e in ds.as_numpy_iterator()]


# -- sources ----------------------------------------------------------------------------------------
@SMALL
@given(lists)
def test_from_tensor_slices_and_range_match_python(xs):
    assert values(Dataset.from_tensor_slices(np.array(xs, np.int64).reshape(-1))) == xs
    assert values(Dataset.range(len(xs))) == list(range(len(xs)))


def test_range_forms_and_dtype():
    assert values(Dataset.range(2, 11, 3)) == [2, 5, 8]
    assert values(Dataset.range(5, 0, -2)) == [5, 3, 1]
    assert Dataset.range(3).element_spec == fl.TensorSpec([], fl.int64)
    assert next(iter(Dataset.range(3, dtype=fl.int32))).dtype == fl.int32


def test_from_tensor_slices_nested_structures_and_spec():
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    ds = Dataset.from_tensor_slices(({"image": x, "id": [7, 8, 9]}, fl.constant([0, 1, 0])))
    elements = values(ds)
    assert elements == [({"image": x[i].tolist(), "id": 7 + i}, [0, 1, 0][i]) for i in range(3)]
    first = next(iter(ds))
    assert isinstance(first[0]["image"], fl.Tensor)
    spec = ds.element_spec
    assert spec[0]["image"] == fl.TensorSpec([4], fl.float32) and spec[1] == fl.TensorSpec([], fl.int32)


def test_from_tensor_slices_copies_the_callers_array():
    x = np.arange(3)
    ds = Dataset.from_tensor_slices(x)
    x[0] = 99
    assert values(ds) == [0, 1, 2]


def test_from_tensor_slices_mismatched_lengths_name_each_component():
    with pytest.raises(ValueError, match=r"different lengths.*\[0\]: 3.*\[1\]\['b'\]: 2"):
        Dataset.from_tensor_slices((np.zeros(3), {"b": np.zeros(2)}))
    with pytest.raises(ValueError, match="scalars"):
        Dataset.from_tensor_slices(5.0)


def test_from_tensors_is_one_element():
    assert values(Dataset.from_tensors(([1, 2], 3.0))) == [([1, 2], 3.0)]


def test_from_generator_converts_to_the_signature_and_restarts_each_iteration():
    calls = []

    def gen():
        calls.append(1)
        for i in range(3):
            yield i, [i, i]
    sig = (fl.TensorSpec([], fl.int64), fl.TensorSpec([2], fl.float32))
    ds = Dataset.from_generator(gen, output_signature=sig)
    first = next(iter(ds))
    assert first[0].dtype == fl.int64 and first[1].dtype == fl.float32
    assert values(ds) == values(ds) == [(i, [float(i)] * 2) for i in range(3)]
    assert ds.element_spec == sig and len(calls) >= 3


def test_from_generator_rejects_elements_that_do_not_match():
    ds = Dataset.from_generator(lambda: iter([[1, 2], [1, 2, 3]]), output_signature=fl.TensorSpec([2], fl.int32))
    with pytest.raises(fl.errors.InvalidArgumentError, match="element 1 does not match"):
        values(ds)
    with pytest.raises(TypeError, match="callable"):
        Dataset.from_generator(iter([1, 2]))


def test_zip_stops_at_the_shortest_and_keeps_structure():
    a, b = Dataset.range(5), Dataset.range(10, 13)
    assert values(Dataset.zip(a, b)) == [(0, 10), (1, 11), (2, 12)]
    assert values(Dataset.zip({"a": a, "b": (b, a)})) == [{"a": i, "b": (10 + i, i)} for i in range(3)]
    assert Dataset.zip((a, b)).element_spec == (fl.TensorSpec([], fl.int64),) * 2
    with pytest.raises(TypeError):
        Dataset.zip((a, [1, 2]))


# -- transformations --------------------------------------------------------------------------------
@SMALL
@given(lists, st.integers(1, 7), st.booleans())
def test_batch_and_unbatch_match_python(xs, size, drop):
    chunks = [xs[i:i + size] for i in range(0, len(xs), size)]
    if drop:
        chunks = [c for c in chunks if len(c) == size]
    ds = Dataset.from_tensor_slices(np.array(xs, np.int32).reshape(-1))
    assert values(ds.batch(size, drop_remainder=drop)) == chunks
    assert values(ds.batch(size, drop_remainder=drop).unbatch()) == [x for c in chunks for x in c]


def test_batch_stacks_nested_structures_and_reports_shapes():
    ds = Dataset.from_tensor_slices({"x": np.arange(10).reshape(5, 2), "y": np.arange(5)}).batch(2)
    assert values(ds)[0] == {"x": [[0, 1], [2, 3]], "y": [0, 1]}
    assert ds.element_spec["x"] == fl.TensorSpec([None, 2], fl.int64)
    assert Dataset.range(5).batch(2, drop_remainder=True).element_spec == fl.TensorSpec([2], fl.int64)
    ragged = Dataset.from_generator(lambda: iter([[1], [1, 2]])).batch(2)
    with pytest.raises(fl.errors.InvalidArgumentError, match="different shapes"):
        values(ragged)


@SMALL
@given(lists, st.integers(-1, 35), st.integers(-1, 35))
def test_take_skip_match_python(xs, n, m):
    ds = Dataset.from_tensor_slices(np.array(xs, np.int32).reshape(-1))
    assert values(ds.take(n)) == (xs if n < 0 else xs[:n])
    assert values(ds.skip(m)) == ([] if m < 0 else xs[m:])


@SMALL
@given(lists, st.integers(1, 5), st.data())
def test_shard_enumerate_filter_map_match_python(xs, num_shards, data):
    index = data.draw(st.integers(0, num_shards - 1))
    ds = Dataset.from_tensor_slices(np.array(xs, np.int32).reshape(-1))
    assert values(ds.shard(num_shards, index)) == xs[index::num_shards]
    assert values(ds.enumerate(start=3)) == [(i + 3, x) for i, x in enumerate(xs)]
    assert values(ds.filter(lambda x: x % 3 == 0)) == [x for x in xs if x % 3 == 0]
    assert values(ds.map(lambda x: x * 2 + 1)) == [x * 2 + 1 for x in xs]


def test_map_unpacks_tuples_and_turns_lists_into_tuples():
    ds = Dataset.zip(Dataset.range(3), Dataset.range(10, 13))
    assert values(ds.map(lambda a, b: a + b)) == [10, 12, 14]
    assert values(ds.map(lambda a, b: [a, {"b": b}])) == [(i, {"b": 10 + i}) for i in range(3)]
    as_dict = Dataset.from_tensor_slices({"a": [1, 2]}).map(lambda d: d["a"] * 2)   # a dict is one argument
    assert values(as_dict) == [2, 4]
    assert values(Dataset.range(2).map(lambda x: np.float64(1.5) * np.ones(2))) == [[1.5, 1.5]] * 2


def test_map_element_spec_comes_from_the_first_element():
    assert Dataset.range(3).map(lambda x: (fl.cast(x, fl.float32), [x, x])).element_spec == (
        fl.TensorSpec([], fl.float32), (fl.TensorSpec([], fl.int64), fl.TensorSpec([], fl.int64)))


def test_filter_predicate_must_be_a_scalar_bool():
    with pytest.raises(fl.data.PipelineError, match="filter.*element 0.*scalar bool"):
        values(Dataset.range(3).filter(lambda x: x + 1))


def test_repeat_restarts_and_stops_on_empty_input():
    assert values(Dataset.range(3).repeat(2)) == [0, 1, 2, 0, 1, 2]
    assert values(Dataset.range(3).repeat().take(7)) == [0, 1, 2, 0, 1, 2, 0]
    assert values(Dataset.range(0).repeat()) == []
    assert values(Dataset.range(3).repeat(0)) == []


@SMALL
@given(st.integers(0, 40), st.integers(1, 50), st.integers(0, 2**31))
def test_shuffle_is_a_permutation_bounded_by_its_buffer(n, buffer_size, seed):
    out = values(Dataset.range(n).shuffle(buffer_size, seed=seed))
    assert sorted(out) == list(range(n))
    for position, x in enumerate(out):   # element j enters the buffer after output j - buffer_size
        assert position >= x - buffer_size + 1
    if buffer_size == 1:
        assert out == list(range(n))


def test_shuffle_seeds_make_orders_repeatable():
    fixed = Dataset.range(50).shuffle(50, seed=3, reshuffle_each_iteration=False)
    assert values(fixed) == values(fixed) != list(range(50))
    again = Dataset.range(50).shuffle(50, seed=3, reshuffle_each_iteration=True)
    epochs = [values(again) for _ in range(3)]
    assert epochs[0] != epochs[1] != epochs[2]
    same_seed = Dataset.range(50).shuffle(50, seed=3, reshuffle_each_iteration=True)
    assert [values(same_seed) for _ in range(3)] == epochs        # each epoch's order is seeded too
    # shuffle then repeat: a new order each epoch, the same sequence of epochs for the same seed
    repeated = values(Dataset.range(20).shuffle(20, seed=1).repeat(3))
    assert repeated == values(Dataset.range(20).shuffle(20, seed=1).repeat(3))
    assert repeated[:20] != repeated[20:40] and sorted(repeated[20:40]) == list(range(20))


def test_shuffle_without_seed_follows_the_global_seed():
    fl.random.set_seed(7)
    first = values(Dataset.range(30).shuffle(30))
    fl.random.set_seed(7)
    assert values(Dataset.range(30).shuffle(30)) == first


def test_cache_runs_the_stages_above_once_and_only_keeps_complete_passes():
    calls = []
    ds = Dataset.range(4).map(lambda x: calls.append(int(x)) or x * 10).cache()
    assert values(ds.take(2)) == [0, 10]          # a partial pass is not cached
    assert values(ds) == values(ds) == [0, 10, 20, 30]
    assert calls == [0, 1, 0, 1, 2, 3]


def test_interleave_matches_the_tf_data_example():
    ds = Dataset.range(1, 6)
    expected = [1] * 4 + [2] * 4 + [1] * 2 + [2] * 2 + [3] * 4 + [4] * 4 + [3] * 2 + [4] * 2 + [5] * 6
    for parallel in (None, 2):
        out = ds.interleave(lambda x: Dataset.from_tensors(x).repeat(6), cycle_length=2, block_length=4,
                            num_parallel_calls=parallel)
        assert values(out) == expected


@SMALL
@given(st.lists(st.integers(0, 4), max_size=8), st.integers(1, 4), st.integers(1, 3))
def test_interleave_matches_a_python_reference(lengths, cycle, block):
    def reference():
        pending, slots, out, i = list(enumerate(lengths)), [None] * cycle, [], 0
        while True:
            if slots[i] is None and pending:
                k, n = pending.pop(0)
                slots[i] = [k * 10 + j for j in range(n)]
            if slots[i] is not None:
                take, slots[i] = slots[i][:block], slots[i][block:]
                out += take
                if len(take) < block:
                    slots[i] = None
            if not pending and all(s is None for s in slots):
                return out
            i = (i + 1) % cycle
    ds = Dataset.from_tensor_slices(np.array(lengths, np.int64).reshape(-1)).enumerate()
    out = ds.interleave(lambda k, n: Dataset.range(n).map(lambda j: k * 10 + j), cycle_length=cycle, block_length=block)
    assert values(out) == reference()


def test_apply_with_options_and_option_merging():
    ds = Dataset.range(6).apply(lambda d: d.filter(lambda x: x > 2))
    assert values(ds) == [3, 4, 5]
    with pytest.raises(TypeError):
        Dataset.range(3).apply(lambda d: [1])
    a = fl.data.Options()
    a.deterministic = False
    b = fl.data.Options()
    b.threading.private_threadpool_size = 3
    merged = Dataset.range(3).with_options(a).map(lambda x: x).with_options(b).options()
    assert merged.deterministic is False and merged.threading.private_threadpool_size == 3
    assert merged.autotune.enabled is None and merged.autotune._get("enabled") is True
    with pytest.raises(AttributeError, match="no option"):
        a.determinstic = True
    with pytest.raises(TypeError):
        Dataset.range(3).with_options({"deterministic": False})


def test_iterator_protocol_and_tensors():
    it = iter(Dataset.range(2))
    assert isinstance(it.get_next(), fl.Tensor) and int(next(it)) == 1
    with pytest.raises(StopIteration):
        next(it)
    assert it.element_spec == fl.TensorSpec([], fl.int64)
    with pytest.raises(ValueError, match="empty"):
        Dataset.range(3).filter(lambda x: x > 5).map(lambda x: x).element_spec
    assert list(itertools.islice(Dataset.range(100).as_numpy_iterator(), 2)) == [0, 1]


def test_bytes_components_pass_through_stages_and_batch_into_object_arrays():
    ds = Dataset.from_generator(lambda: iter([b"a", b"bc"])).map(lambda b: (b, len(b)))
    assert values(ds.map(lambda b, n: (b, n)).shuffle(2, seed=0).take(5)) in (
        [(b"a", 1), (b"bc", 2)], [(b"bc", 2), (b"a", 1)])
    assert ds.element_spec == (bytes, fl.TensorSpec([], fl.int32))
    (strings, lengths), = list(ds.batch(2))      # byte strings stack into a numpy object array of bytes
    assert strings.dtype == object and strings.tolist() == [b"a", b"bc"] and lengths.numpy().tolist() == [1, 2]
    assert [b for b, _ in values(ds.batch(2).unbatch())] == [b"a", b"bc"]
    mixed = Dataset.from_generator(lambda: iter([b"a", "b"]))
    with pytest.raises(fl.errors.InvalidArgumentError, match="only tensors can be stacked"):
        values(mixed.batch(2))


# -- list_files -------------------------------------------------------------------------------------
@pytest.fixture
def folder(tmp_path):
    for name in ("b.rec", "a.rec", "c.rec", "notes.txt"):
        (tmp_path / name).write_bytes(b"")
    return tmp_path


def test_list_files_matches_glob_sorted_without_shuffle(folder):
    ds = Dataset.list_files(str(folder / "*.rec"), shuffle=False)
    assert list(ds) == [str(folder / n) for n in ("a.rec", "b.rec", "c.rec")]
    assert ds.element_spec is str and len(ds) == 3
    several = Dataset.list_files([str(folder / "*.txt"), folder / "a.*"], shuffle=False)   # PathLike too
    assert list(several) == [str(folder / "a.rec"), str(folder / "notes.txt")]


def test_list_files_shuffles_each_epoch_and_seeds_repeat(folder):
    for name in "defghijklm":
        (folder / f"{name}.rec").write_bytes(b"")
    everything = sorted(str(p) for p in folder.glob("*.rec"))
    ds = Dataset.list_files(str(folder / "*.rec"), seed=5)
    epochs = [list(ds) for _ in range(3)]
    assert all(sorted(e) == everything for e in epochs)
    assert epochs[0] != epochs[1] or epochs[1] != epochs[2]        # 13 files: repeating orders are unlikely
    assert [list(Dataset.list_files(str(folder / "*.rec"), seed=5)) for _ in range(1)][0] == epochs[0]


def test_list_files_without_a_match_names_the_pattern(tmp_path):
    with pytest.raises(fl.errors.InvalidArgumentError, match=r"list_files: no files match .*nothing-\*"):
        Dataset.list_files(str(tmp_path / "nothing-*"))


def test_list_files_feeds_a_record_dataset(tmp_path):
    for shard in range(3):
        with fl.data.RecordWriter(tmp_path / f"part-{shard}.flrec") as w:
            for i in range(4):
                w.write({"x": np.int64(shard * 10 + i)})
    files = Dataset.list_files(str(tmp_path / "part-*.flrec"), shuffle=False)
    ds = files.interleave(lambda path: fl.data.RecordDataset(path, decode=True), cycle_length=3)
    got = [int(e["x"]) for e in ds]
    assert got == [0, 10, 20, 1, 11, 21, 2, 12, 22, 3, 13, 23]


# -- cardinality ------------------------------------------------------------------------------------
UNKNOWN, INFINITE = fl.data.UNKNOWN_CARDINALITY, fl.data.INFINITE_CARDINALITY


def test_cardinality_constants_are_tensorflows():
    assert (INFINITE, UNKNOWN) == (-1, -2)


@SMALL
@given(st.integers(0, 30), st.integers(1, 7), st.booleans(), st.integers(-1, 40), st.integers(-1, 40),
       st.integers(1, 4), st.data())
def test_cardinality_matches_the_number_of_elements(n, size, drop, take, skip, shards, data):
    index = data.draw(st.integers(0, shards - 1))
    base = Dataset.range(n)
    pipelines = [base, base.map(lambda x: x), base.batch(size, drop), base.padded_batch(size, drop_remainder=drop),
                 base.take(take), base.skip(skip), base.shard(shards, index), base.repeat(3), base.repeat(0),
                 base.shuffle(4, seed=1).prefetch(2).cache().enumerate(), Dataset.zip(base, base.take(take)),
                 base.map(lambda x: x, num_parallel_calls=2).take(take).skip(skip).batch(size, drop)]
    for ds in pipelines:
        assert int(ds.cardinality()) == len(list(ds)) == len(ds), ds


def test_cardinality_infinite_and_unknown():
    forever = Dataset.range(3).repeat()
    assert int(forever.cardinality()) == INFINITE and int(forever.take(5).cardinality()) == 5
    assert int(forever.batch(2).cardinality()) == INFINITE and int(forever.skip(2).cardinality()) == INFINITE
    assert int(Dataset.zip(forever, Dataset.range(4)).cardinality()) == 4
    assert int(Dataset.range(0).repeat().cardinality()) == 0
    unknown = [Dataset.range(5).filter(lambda x: x > 1), Dataset.from_generator(lambda: iter([1])),
               Dataset.range(5).batch(2).unbatch(), Dataset.range(3).interleave(lambda x: Dataset.range(x)),
               Dataset.zip(forever, Dataset.range(3).filter(lambda x: True))]
    for ds in unknown:
        assert int(ds.cardinality()) == UNKNOWN
    assert int(unknown[0].repeat().cardinality()) == INFINITE      # as tf.data says, though it may be empty
    assert int(unknown[0].take(0).cardinality()) == UNKNOWN
    c = Dataset.range(7).cardinality()
    assert isinstance(c, fl.Tensor) and c.dtype == fl.int64 and c.shape == ()


def test_len_raises_type_error_when_not_known_and_bool_is_always_true():
    with pytest.raises(TypeError, match="infinite"):
        len(Dataset.range(3).repeat())
    with pytest.raises(TypeError, match="unknown"):
        len(Dataset.range(3).filter(lambda x: x > 0))
    assert bool(Dataset.range(0)) and bool(Dataset.range(3).filter(lambda x: x > 0))
    assert list(Dataset.range(3).filter(lambda x: x > 0)) != []     # list() survives the TypeError of len()


# -- padded_batch -----------------------------------------------------------------------------------
def reference_padded_batch(rows, size, width=None, pad=0, drop=False):
    batches = [rows[i:i + size] for i in range(0, len(rows), size)]
    if drop:
        batches = [b for b in batches if len(b) == size]
    out = []
    for b in batches:
        w = width if width is not None else max(len(r) for r in b)
        out.append([list(r) + [pad] * (w - len(r)) for r in b])
    return out


@SMALL
@given(st.lists(st.lists(st.integers(-5, 5), max_size=6), min_size=1, max_size=15), st.integers(1, 5), st.booleans(),
       st.integers(-3, 3))
def test_padded_batch_matches_a_python_reference(rows, size, drop, pad):
    ds = Dataset.from_generator(lambda: (np.array(r, np.int32) for r in rows))
    assert values(ds.padded_batch(size, padding_values=pad, drop_remainder=drop)) == \
        reference_padded_batch(rows, size, pad=pad, drop=drop)
    fixed = ds.padded_batch(size, padded_shapes=[6], padding_values=np.int32(pad), drop_remainder=drop)
    assert values(fixed) == reference_padded_batch(rows, size, width=6, pad=pad, drop=drop)


def test_padded_batch_nested_structures_shapes_and_values():
    def gen():
        for n in (1, 3, 2):
            yield {"tokens": np.arange(n, dtype=np.int64), "image": np.ones((n, 2), np.float32)}, np.int64(n)
    ds = Dataset.from_generator(gen)
    out = ds.padded_batch(3, padded_shapes=({"tokens": [None], "image": [4, None]}, []),
                          padding_values=({"tokens": -1, "image": 0.5}, 0))
    (features, label), = values(out)
    assert features["tokens"] == [[0, -1, -1], [0, 1, 2], [0, 1, -1]]
    assert np.array(features["image"]).shape == (3, 4, 2) and features["image"][0][1] == [0.5, 0.5]
    assert label == [1, 3, 2]
    spec = out.element_spec
    assert spec[0]["image"] == fl.TensorSpec([None, 4, None], fl.float32)
    assert spec[1] == fl.TensorSpec([None], fl.int64)
    assert Dataset.range(4).map(lambda x: fl.fill([x], x)).padded_batch(2, drop_remainder=True).element_spec == \
        fl.TensorSpec([2, None], fl.int64)


def test_padded_batch_pads_2d_components_along_every_dimension():
    ds = Dataset.from_generator(lambda: iter([np.ones((1, 3)), np.ones((2, 1))]))
    (batch,) = values(ds.padded_batch(2))
    assert batch == [[[1, 1, 1], [0, 0, 0]], [[1, 0, 0], [1, 0, 0]]]


def test_padded_batch_errors_name_the_component_and_shapes():
    rows = Dataset.from_generator(lambda: (np.zeros(n, np.float32) for n in (2, 5)))
    with pytest.raises(fl.errors.InvalidArgumentError, match=r"element 1 in the batch has shape \[5\], larger "
                                                             r"than its padded shape \[3\] in dimension 0"):
        values(rows.padded_batch(2, padded_shapes=[3]))
    with pytest.raises(fl.errors.InvalidArgumentError, match=r"padded_shapes for the element is \[3, 3\] \(rank 2\)"):
        values(rows.padded_batch(2, padded_shapes=[3, 3]))
    mixed = Dataset.from_generator(lambda: iter([np.zeros(2), np.zeros((2, 2))]))
    with pytest.raises(fl.errors.InvalidArgumentError, match="different ranks"):
        values(mixed.padded_batch(2))
    pairs = Dataset.zip(rows, rows)
    with pytest.raises(ValueError, match=r"padded_shapes has 3 parts, but the element has 2"):
        values(pairs.padded_batch(2, padded_shapes=([None], [None], [None])))
    with pytest.raises(fl.errors.InvalidArgumentError, match=r"component \[1\] .*must be a scalar"):
        values(pairs.padded_batch(2, padding_values=(0.0, np.zeros(2))))
    words = Dataset.from_generator(lambda: iter([b"a", b"bc"]))
    with pytest.raises(fl.errors.InvalidArgumentError, match="only tensors can be padded"):
        values(words.padded_batch(2))
