"""tf.train.Example records: building them (fl.train.*), parsing them (fl.io.parse_single_example,
fl.io.parse_example), compared with what real TensorFlow wrote and parsed (data_tfrecord/)."""
import json
from pathlib import Path

import numpy as np
import pytest

import flowlab as fl

HERE = Path(__file__).parent / "data_tfrecord"
RECORDS = list(fl.data.TFRecordDataset(str(HERE / "examples.tfrecord")))

# The spec make_tfrecord_fixtures.py parsed with TensorFlow into parsed.json.
FEATURES = {
    "x": fl.io.FixedLenFeature([2, 2], fl.float32),
    "label": fl.io.FixedLenFeature([], fl.int64),
    "big": fl.io.FixedLenFeature([2], fl.int64),
    "name": fl.io.FixedLenFeature([], fl.string),
    "missing": fl.io.FixedLenFeature([3], fl.float32, default_value=[1.0, 2.0, 3.0]),
    "tags": fl.io.VarLenFeature(fl.string),
    "weights": fl.io.VarLenFeature(fl.float32),
}


def plain(value):
    """A parsed value as plain Python, strings decoded (as parsed.json stores them)."""
    if isinstance(value, fl.Tensor):
        value = value.numpy()
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, np.ndarray) and value.dtype == object:
        return np.vectorize(lambda b: b.decode(), otypes=[object])(value).tolist() if value.size else value.tolist()
    return value.tolist()


def test_tutorial_example_builds_and_serializes_as_tensorflow_does():
    # raw.tfrecord's last record: TensorFlow's Example({"a": floats, "b": ints, "c": bytes}), deterministic.
    tf_bytes = list(fl.data.TFRecordDataset(str(HERE / "raw.tfrecord")))[2]
    example = fl.train.Example(features=fl.train.Features(feature={
        "a": fl.train.Feature(float_list=fl.train.FloatList(value=[1.5, 2.5])),
        "b": fl.train.Feature(int64_list=fl.train.Int64List(value=[7])),
        "c": fl.train.Feature(bytes_list=fl.train.BytesList(value=[b"zz", b""]))}))
    assert example.SerializeToString(deterministic=True) == tf_bytes
    back = fl.train.Example.FromString(tf_bytes)
    assert back == example and list(back.features.feature["c"].bytes_list.value) == [b"zz", b""]
    assert fl.train.Example.DESCRIPTOR.full_name == "tensorflow.Example"


def test_sequence_example_and_feature_lists_exist():
    seq = fl.train.SequenceExample(
        context=fl.train.Features(feature={"n": fl.train.Feature(int64_list=fl.train.Int64List(value=[2]))}),
        feature_lists=fl.train.FeatureLists(feature_list={"steps": fl.train.FeatureList(feature=[
            fl.train.Feature(float_list=fl.train.FloatList(value=[0.5])),
            fl.train.Feature(float_list=fl.train.FloatList(value=[1.5]))])}))
    again = fl.train.SequenceExample.FromString(seq.SerializeToString())
    assert [f.float_list.value[0] for f in again.feature_lists.feature_list["steps"].feature] == [0.5, 1.5]


def test_parse_example_matches_tensorflow_on_tensorflows_records():
    reference = json.loads((HERE / "parsed.json").read_text())["parsed"]
    parsed = fl.io.parse_example(RECORDS, FEATURES)
    assert set(parsed) == set(reference)
    for key, value in parsed.items():
        assert plain(value) == reference[key], key
    assert parsed["x"].dtype == fl.float32 and parsed["big"].dtype == fl.int64
    assert parsed["name"].dtype == object and parsed["tags"].shape == (5, 4)


def test_parse_single_example_matches_tensorflow_record_by_record():
    reference = json.loads((HERE / "parsed.json").read_text())["parsed"]
    for i, record in enumerate(RECORDS):
        parsed = fl.io.parse_single_example(record, FEATURES)
        assert plain(parsed["x"]) == reference["x"][i]
        assert plain(parsed["label"]) == reference["label"][i] and parsed["label"].shape == ()
        assert parsed["name"] == f"item-{i}".encode()                  # a string scalar is bytes
        assert plain(parsed["tags"]) == [f"t{j}" for j in range(i)]    # VarLen: the values, dense
        assert plain(parsed["weights"]) == [0.25 * j for j in range(i % 3)]


def test_map_parse_over_a_tfrecord_dataset_then_batch():
    def parse(record):
        parsed = fl.io.parse_single_example(record, FEATURES)
        return {"x": parsed["x"], "label": parsed["label"], "name": parsed["name"]}

    ds = fl.data.TFRecordDataset(str(HERE / "examples.tfrecord")).map(parse, num_parallel_calls=2).batch(5)
    (batch,) = list(ds)
    assert batch["x"].shape == (5, 2, 2) and batch["label"].numpy().tolist() == [0, 1, 2, 3, 4]
    assert batch["name"].tolist() == [f"item-{i}".encode() for i in range(5)]


def test_batch_then_parse_example_the_vectorized_way():
    ds = fl.data.TFRecordDataset(str(HERE / "examples.tfrecord")).batch(2)
    ds = ds.map(lambda records: fl.io.parse_example(records, {"label": fl.io.FixedLenFeature([], fl.int64),
                                                               "tags": fl.io.VarLenFeature(fl.string)}))
    batches = list(ds)
    assert [b["label"].numpy().tolist() for b in batches] == [[0, 1], [2, 3], [4]]
    assert batches[1]["tags"].tolist() == [[b"t0", b"t1", b""], [b"t0", b"t1", b"t2"]]   # padded with b""


def test_fixed_len_sequence_feature_and_scalar_default():
    record = fl.train.Example(features=fl.train.Features(feature={
        "pts": fl.train.Feature(float_list=fl.train.FloatList(value=[1, 2, 3, 4, 5, 6]))})).SerializeToString()
    empty = fl.train.Example().SerializeToString()
    spec = {"pts": fl.io.FixedLenSequenceFeature([2], fl.float32, allow_missing=True, default_value=-1.0),
            "w": fl.io.FixedLenFeature([2], fl.float32, default_value=0.5)}
    one = fl.io.parse_single_example(record, spec)
    assert one["pts"].numpy().tolist() == [[1, 2], [3, 4], [5, 6]] and one["w"].numpy().tolist() == [0.5, 0.5]
    both = fl.io.parse_example([empty, record], spec)
    assert both["pts"].numpy().tolist() == [[[-1, -1]] * 3, [[1, 2], [3, 4], [5, 6]]]
    with pytest.raises(fl.errors.InvalidArgumentError, match="allow_missing=True"):
        fl.io.parse_single_example(empty, {"pts": fl.io.FixedLenSequenceFeature([2], fl.float32)})


def test_errors_name_the_feature_and_say_what_to_do():
    record = RECORDS[1]
    with pytest.raises(fl.errors.InvalidArgumentError, match=r"'absent' is required.*default_value"):
        fl.io.parse_single_example(record, {"absent": fl.io.FixedLenFeature([], fl.float32)})
    with pytest.raises(fl.errors.InvalidArgumentError, match=r"'label'.*int64_list.*dtype=fl.int64"):
        fl.io.parse_single_example(record, {"label": fl.io.FixedLenFeature([], fl.float32)})
    with pytest.raises(fl.errors.InvalidArgumentError, match=r"'x'.*shape \[3\] needs 3 values.*has 4.*VarLenFeature"):
        fl.io.parse_single_example(record, {"x": fl.io.FixedLenFeature([3], fl.float32)})
    short = fl.train.Example(features=fl.train.Features(feature={
        "x": fl.train.Feature(float_list=fl.train.FloatList(value=[1, 2, 3]))})).SerializeToString()
    with pytest.raises(fl.errors.InvalidArgumentError, match=r"parse_example, record 1, feature 'x'.*has 3"):
        fl.io.parse_example([RECORDS[0], short], {"x": fl.io.FixedLenFeature([4], fl.float32)})
    with pytest.raises(fl.errors.InvalidArgumentError, match=r"record 1: could not parse 2 bytes"):
        fl.io.parse_example([RECORDS[0], b"\xff\xff"], {"x": fl.io.FixedLenFeature([4], fl.float32)})
    with pytest.raises(fl.errors.InvalidArgumentError, match="could not parse 5 bytes as a tf.train.Example"):
        fl.io.parse_single_example(b"\x0a\x05hello"[:5], {"x": fl.io.VarLenFeature(fl.float32)})
    with pytest.raises(TypeError, match="parse_example"):
        fl.io.parse_single_example([record], FEATURES)
    with pytest.raises(TypeError, match="parse_single_example"):
        fl.io.parse_example(record, FEATURES)
    with pytest.raises(TypeError, match="not str"):
        fl.io.parse_single_example("text", FEATURES)
    with pytest.raises(TypeError, match=r"fl.float32, fl.int64 or fl.string.*cast after"):
        fl.io.FixedLenFeature([], fl.int32)
    with pytest.raises(ValueError, match="fully known"):
        fl.io.FixedLenFeature([None], fl.float32)
    with pytest.raises(TypeError, match="SparseFeature"):
        fl.io.parse_single_example(record, {"x": ("not", "a spec")})


def test_fl_string_is_tf_string_for_specs_only():
    assert fl.string == "string" and fl.string != fl.float32 and fl.float32 != fl.string
    assert fl.io.VarLenFeature("string").dtype is fl.string and fl.io.VarLenFeature(bytes).dtype is fl.string
    with pytest.raises(TypeError, match="not bytes"):
        fl.constant(b"abc")                      # still not a tensor dtype, and says so
