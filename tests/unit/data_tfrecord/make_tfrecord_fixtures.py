"""How the TFRecord fixtures beside this file were made, with real TensorFlow (2.21, tensorflow-cpu).

Not a test and not run by the suite (flowlab never needs TensorFlow). To remake them::

    python3 -m venv /tmp/tfenv && /tmp/tfenv/bin/pip install tensorflow-cpu
    /tmp/tfenv/bin/python tests/unit/data_tfrecord/make_tfrecord_fixtures.py

``test_data_tfrecord.py`` rebuilds the same values with ``example_values(i)`` (kept in step with
the copy there) and checks every one. Files:

- ``examples.tfrecord``: ``COUNT`` ``tf.train.Example`` records (float, int64 and bytes features,
  fixed and variable length), uncompressed. ``examples.tfrecord.gz`` (GZIP) and
  ``examples.tfrecord.zz`` (ZLIB) hold the same records.
- ``raw.tfrecord``: raw records: an empty one, a 3000-byte pattern, and one Example serialized with
  ``deterministic=True`` (map keys sorted), to compare flowlab's serialization with byte for byte.
- ``parsed.json``: what ``tf.io.parse_example`` gives for the batch of all records under
  ``FEATURES`` below (VarLenFeature results densified with ``tf.sparse.to_dense``), so the test
  compares flowlab's parser with TensorFlow's own, defaults and padding included.
"""
import json
import os

import tensorflow as tf

HERE = os.path.dirname(os.path.abspath(__file__))
COUNT = 5


def example_values(i):
    return {
        "x": [i * 0.5, -float(i), 1e-3, 3.25],       # float, 4 values (exact in float32)
        "label": [i],                                  # int64 scalar
        "big": [2 ** 40 + i, -(2 ** 33) - i],          # int64 beyond 32 bits, negative too
        "name": [f"item-{i}".encode()],                # bytes scalar
        "tags": [f"t{j}".encode() for j in range(i)],  # bytes, variable length (0 for i == 0)
        "weights": [0.25 * j for j in range(i % 3)],   # float, variable length
    }


KINDS = {"x": "float", "label": "int64", "big": "int64", "name": "bytes", "tags": "bytes", "weights": "float",
         "a": "float", "b": "int64", "c": "bytes"}


def to_example(values):
    def feature(kind, v):
        if kind == "bytes":
            return tf.train.Feature(bytes_list=tf.train.BytesList(value=v))
        if kind == "float":
            return tf.train.Feature(float_list=tf.train.FloatList(value=v))
        return tf.train.Feature(int64_list=tf.train.Int64List(value=v))
    return tf.train.Example(features=tf.train.Features(
        feature={k: feature(KINDS[k], v) for k, v in values.items()}))


FEATURES = {
    "x": tf.io.FixedLenFeature([2, 2], tf.float32),
    "label": tf.io.FixedLenFeature([], tf.int64),
    "big": tf.io.FixedLenFeature([2], tf.int64),
    "name": tf.io.FixedLenFeature([], tf.string),
    "missing": tf.io.FixedLenFeature([3], tf.float32, default_value=[1.0, 2.0, 3.0]),
    "tags": tf.io.VarLenFeature(tf.string),
    "weights": tf.io.VarLenFeature(tf.float32),
}


def main():
    records = [to_example(example_values(i)).SerializeToString() for i in range(COUNT)]
    for suffix, compression in (("", None), (".gz", "GZIP"), (".zz", "ZLIB")):
        with tf.io.TFRecordWriter(os.path.join(HERE, "examples.tfrecord" + suffix), options=compression) as w:
            for r in records:
                w.write(r)
    fixed = to_example({"a": [1.5, 2.5], "b": [7], "c": [b"zz", b""]})
    with tf.io.TFRecordWriter(os.path.join(HERE, "raw.tfrecord")) as w:
        w.write(b"")
        w.write(bytes(range(256)) * 11 + bytes(range(184)))     # 3000 bytes
        w.write(fixed.SerializeToString(deterministic=True))

    parsed = tf.io.parse_example(tf.constant(records), FEATURES)
    out = {}
    for k, v in parsed.items():
        if isinstance(v, tf.SparseTensor):
            v = tf.sparse.to_dense(v)
        v = v.numpy()
        out[k] = [[b.decode() for b in row] for row in v.tolist()] if v.dtype == object and v.ndim == 2 else (
            [b.decode() for b in v.tolist()] if v.dtype == object else v.tolist())
    with open(os.path.join(HERE, "parsed.json"), "w") as f:
        json.dump({"tensorflow": tf.__version__, "parsed": out}, f, indent=1, sort_keys=True)


if __name__ == "__main__":
    main()
