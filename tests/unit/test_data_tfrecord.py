"""TFRecord files: reading what TensorFlow wrote (fixtures made by real TensorFlow 2.21, see
data_tfrecord/make_tfrecord_fixtures.py), writing what TensorFlow writes, and corruption reported
with the file and the offset."""
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import flowlab as fl
from flowlab.data.tfrecord import crc32c, masked_crc32c

HERE = Path(__file__).parent / "data_tfrecord"
EXAMPLES = str(HERE / "examples.tfrecord")
COUNT = 5


def example_values(i):
    """The values make_tfrecord_fixtures.py wrote into record ``i`` (kept in step with it)."""
    return {
        "x": [i * 0.5, -float(i), 1e-3, 3.25],
        "label": [i],
        "big": [2 ** 40 + i, -(2 ** 33) - i],
        "name": [f"item-{i}".encode()],
        "tags": [f"t{j}".encode() for j in range(i)],
        "weights": [0.25 * j for j in range(i % 3)],
    }


def decoded(record):
    """Every feature of one Example record as a list, read through fl.train.Example."""
    example = fl.train.Example.FromString(record)
    out = {}
    for key, feature in example.features.feature.items():
        kind = feature.WhichOneof("kind")
        out[key] = list(getattr(feature, kind).value) if kind else []
    return out


def expected(i):
    values = example_values(i)
    values["x"] = np.float32(values["x"]).tolist()        # float_list holds float32
    values["weights"] = np.float32(values["weights"]).tolist()
    return values


# -- reading TensorFlow's files ----------------------------------------------------------------------
@pytest.mark.parametrize("suffix, compression", [("", None), (".gz", "GZIP"), (".zz", "ZLIB")])
def test_reads_every_value_tensorflow_wrote(suffix, compression):
    records = list(fl.data.TFRecordDataset(EXAMPLES + suffix, compression_type=compression))
    assert len(records) == COUNT and all(type(r) is bytes for r in records)
    for i, record in enumerate(records):
        got = decoded(record)
        want = expected(i)
        assert set(got) == set(want) | ({"weights"} if not want["weights"] else set())
        for key, values in want.items():
            assert got[key] == values, (i, key)


def test_raw_records_including_an_empty_one_and_a_long_one():
    records = list(fl.data.TFRecordDataset(HERE / "raw.tfrecord"))
    assert records[0] == b""
    assert records[1] == bytes(range(256)) * 11 + bytes(range(184))
    assert len(records) == 3


def test_crc32c_is_castagnoli_and_masked_as_tensorflow_does():
    assert crc32c(b"123456789") == 0xE3069283                       # the standard check value
    assert crc32c(memoryview(b"123456789")) == crc32c(bytearray(b"123456789")) == 0xE3069283
    head = (HERE / "raw.tfrecord").read_bytes()[:12]                # first record: length 0
    assert struct.unpack("<QI", head) == (0, masked_crc32c(struct.pack("<Q", 0)))


# -- writing -----------------------------------------------------------------------------------------
def test_writer_writes_the_same_bytes_as_tensorflow(tmp_path):
    records = list(fl.data.TFRecordDataset(EXAMPLES))
    path = tmp_path / "copy.tfrecord"
    with fl.io.TFRecordWriter(str(path)) as writer:
        for r in records:
            writer.write(r)
    assert path.read_bytes() == Path(EXAMPLES).read_bytes()


@pytest.mark.parametrize("options", ["GZIP", "ZLIB", fl.io.TFRecordOptions("GZIP", compression_level=1),
                                     fl.io.TFRecordOptions(compression_type="ZLIB", compression_level=9)])
def test_compressed_round_trip(tmp_path, options):
    records = [b"", b"a", os.urandom(5000), b"z" * 70000]
    path = str(tmp_path / "c.tfrecord")
    writer = fl.io.TFRecordWriter(path, options=options)
    for r in records[:2]:
        writer.write(r)
    writer.flush()          # what was flushed is readable while the writer is open, and the end is reported
    name = fl.io.TFRecordOptions.get_compression_type_string(options)
    early = []
    with pytest.raises(fl.errors.DataLossError, match="truncated compressed stream in record 2.*not been closed"):
        for r in fl.data.TFRecordDataset(path, compression_type=name):
            early.append(r)
    assert early == records[:2]
    for r in records[2:]:
        writer.write(r)
    writer.close()
    assert list(fl.data.TFRecordDataset(path, compression_type=name)) == records
    assert list(fl.io.tf_record_iterator(path, options)) == records
    with pytest.raises(ValueError, match="closed TFRecordWriter"):
        writer.write(b"late")


def test_writer_takes_bytes_and_says_what_to_do_with_anything_else(tmp_path):
    with fl.io.TFRecordWriter(str(tmp_path / "w.tfrecord")) as writer:
        example = fl.train.Example()
        with pytest.raises(TypeError, match="SerializeToString"):
            writer.write(example)
        with pytest.raises(TypeError, match="fl.train.Example"):
            writer.write({"x": 1})
        with pytest.raises(TypeError, match="not str"):
            writer.write("text")
    with pytest.raises(ValueError, match="GZIP"):
        fl.io.TFRecordWriter(str(tmp_path / "v.tfrecord"), options="BZIP2")


# -- corruption ----------------------------------------------------------------------------------------
def corrupt(tmp_path, position):
    data = bytearray(Path(EXAMPLES).read_bytes())
    data[position] ^= 0x40
    path = tmp_path / "bad.tfrecord"
    path.write_bytes(bytes(data))
    return str(path)


def record_offsets():
    offsets, pos = [], 0
    data = Path(EXAMPLES).read_bytes()
    while pos < len(data):
        offsets.append(pos)
        pos += 16 + struct.unpack_from("<Q", data, pos)[0]
    return offsets


def test_a_flipped_data_byte_names_the_file_record_and_offset(tmp_path):
    offsets = record_offsets()
    path = corrupt(tmp_path, offsets[2] + 12 + 5)               # inside record 2's data
    with pytest.raises(fl.errors.DataLossError) as info:
        list(fl.data.TFRecordDataset(path))
    message = str(info.value)
    assert "payload CRC mismatch" in message and "record 2" in message
    assert f"byte offset {offsets[2]}" in message and "bad.tfrecord" in message
    ds = fl.data.TFRecordDataset(path, ignore_errors=True)      # skip it and go on with record 3
    with pytest.warns(fl.data.RecordSkippedWarning):
        kept = list(ds)
    assert [decoded(r)["label"] for r in kept] == [[0], [1], [3], [4]] and ds.skipped == 1


def test_a_flipped_length_byte_and_a_truncated_file(tmp_path):
    offsets = record_offsets()
    path = corrupt(tmp_path, offsets[1] + 1)
    with pytest.raises(fl.errors.DataLossError, match=rf"length CRC mismatch in record 1 at byte offset {offsets[1]}"):
        list(fl.data.TFRecordDataset(path))
    short = tmp_path / "short.tfrecord"
    short.write_bytes(Path(EXAMPLES).read_bytes()[:-3])
    with pytest.raises(fl.errors.DataLossError, match=rf"truncated record in record 4 at byte offset {offsets[4]}"):
        list(fl.data.TFRecordDataset(str(short)))


def test_compressed_corruption_and_the_wrong_compression_are_explained(tmp_path):
    data = bytearray(Path(EXAMPLES + ".gz").read_bytes())
    (tmp_path / "cut.gz").write_bytes(bytes(data[: len(data) // 2]))
    with pytest.raises(fl.errors.DataLossError, match="GZIP-decompressed stream of .*cut.gz"):
        list(fl.data.TFRecordDataset(str(tmp_path / "cut.gz"), compression_type="GZIP"))
    with pytest.raises(fl.errors.DataLossError, match="compression_type='GZIP'"):
        list(fl.data.TFRecordDataset(EXAMPLES + ".gz"))                    # read without the compression
    with pytest.raises(fl.errors.DataLossError, match="is the file really ZLIB-compressed"):
        list(fl.data.TFRecordDataset(EXAMPLES, compression_type="ZLIB"))
    with pytest.raises(FileNotFoundError, match="TFRecordDataset.*nowhere.tfrecord"):
        list(fl.data.TFRecordDataset(str(tmp_path / "nowhere.tfrecord")))


def test_the_two_kinds_of_record_file_point_at_each_other(tmp_path):
    path = str(tmp_path / "mine.flrec")
    with fl.data.RecordWriter(path) as w:
        w.write(b"abc")
    with pytest.raises(fl.errors.DataLossError, match="flowlab record file: read it with fl.data.RecordDataset"):
        list(fl.data.TFRecordDataset(path))
    with pytest.raises(fl.errors.DataLossError, match="TFRecordDataset"):
        list(fl.data.RecordDataset(EXAMPLES))


# -- the dataset in pipelines ---------------------------------------------------------------------------
def test_many_files_in_order_and_in_parallel(tmp_path):
    paths = []
    for f in range(3):
        paths.append(str(tmp_path / f"part-{f}.tfrecord"))
        with fl.io.TFRecordWriter(paths[-1]) as w:
            for i in range(4 + f):
                w.write(f"{f}:{i}".encode())
    in_order = [f"{f}:{i}".encode() for f in range(3) for i in range(4 + f)]
    assert list(fl.data.TFRecordDataset(paths)) == in_order
    mixed = list(fl.data.TFRecordDataset(paths, num_parallel_reads=3))
    assert sorted(mixed) == sorted(in_order) and mixed[:3] == [b"0:0", b"1:0", b"2:0"]  # one from each file in turn
    assert sorted(fl.data.TFRecordDataset(paths, num_parallel_reads=fl.data.AUTOTUNE)) == sorted(in_order)
    assert list(fl.data.TFRecordDataset(np.array(paths), buffer_size=64)) == in_order
    with pytest.raises(ValueError, match="buffer_size"):
        fl.data.TFRecordDataset(paths, buffer_size=-5)
    with pytest.raises(ValueError, match="num_parallel_calls"):
        fl.data.TFRecordDataset(paths, num_parallel_reads=0)


def test_tutorial_pipeline_list_files_interleave_map_batch_prefetch(tmp_path):
    # The tf.data talk's program: files -> interleave(TFRecordDataset) -> map(parse) -> batch -> prefetch.
    for shard in range(2):
        with fl.io.TFRecordWriter(str(tmp_path / f"train-{shard}.tfrecord")) as writer:
            for i in range(6):
                n = shard * 6 + i
                example = fl.train.Example(features=fl.train.Features(feature={
                    "image": fl.train.Feature(float_list=fl.train.FloatList(value=[n] * 4)),
                    "label": fl.train.Feature(int64_list=fl.train.Int64List(value=[n % 3]))}))
                writer.write(example.SerializeToString())
    features = {"image": fl.io.FixedLenFeature([2, 2], fl.float32), "label": fl.io.FixedLenFeature([], fl.int64)}

    def parse(record):
        parsed = fl.io.parse_single_example(record, features)
        return parsed["image"] / 10.0, parsed["label"]

    files = fl.data.Dataset.list_files(str(tmp_path / "train-*.tfrecord"), shuffle=False)
    dataset = files.interleave(fl.data.TFRecordDataset, cycle_length=2, num_parallel_calls=fl.data.AUTOTUNE)
    dataset = dataset.map(parse, num_parallel_calls=fl.data.AUTOTUNE).batch(4).prefetch(fl.data.AUTOTUNE)
    batches = list(dataset)
    assert [b[0].shape.as_list() for b in batches] == [[4, 2, 2]] * 3
    labels = np.concatenate([b[1].numpy() for b in batches])
    images = np.concatenate([b[0].numpy() for b in batches])
    order = [0, 6, 1, 7, 2, 8, 3, 9, 4, 10, 5, 11]                         # two files, one record each in turn
    assert labels.tolist() == [n % 3 for n in order]
    np.testing.assert_allclose(images[:, 0, 0], np.float32(order) / 10.0, rtol=1e-6)


def test_file_sharding_sees_the_tfrecord_files(tmp_path):
    from flowlab.data._autoshard import auto_shard
    paths = [str(tmp_path / f"s{i}.tfrecord") for i in range(4)]
    for i, p in enumerate(paths):
        with fl.io.TFRecordWriter(p) as w:
            w.write(str(i).encode())
    ds = fl.data.TFRecordDataset(paths, compression_type=None).batch(2)
    shard = auto_shard(ds, 2, 1, fl.data.AutoShardPolicy.FILE)    # worker 1 of 2 reads files 1 and 3
    assert [b.tolist() for b in shard] == [[b"1"], [b"3"]]


def test_import_flowlab_needs_neither_protobuf_nor_crc32c():
    code = "import sys, flowlab; print(sorted(m for m in ('google.protobuf', 'google_crc32c') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"

