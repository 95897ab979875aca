"""``fl.io``: TensorFlow's record files and Examples (``tf.io``): ``TFRecordWriter``/``TFRecordOptions``
to write TFRecord files (read them with ``fl.data.TFRecordDataset``), and ``parse_single_example`` /
``parse_example`` with ``FixedLenFeature``, ``VarLenFeature`` and ``FixedLenSequenceFeature`` to turn
``tf.train.Example`` records into tensors. The Example messages themselves are ``fl.train.Example``
and friends (``flowlab/io/example.py``); the ``protobuf`` package they need is imported on first use.

Layer: ``io`` sits just above ``data`` (it uses data's record files; ``nn`` and the layers above
may use it; ``data`` never imports it).

>>> import os, tempfile
>>> import flowlab as fl
>>> path = os.path.join(tempfile.mkdtemp(), "train.tfrecord")
>>> with fl.io.TFRecordWriter(path) as writer:
...     for i in range(3):
...         example = fl.train.Example(features=fl.train.Features(feature={
...             "x": fl.train.Feature(float_list=fl.train.FloatList(value=[i, i + 0.5])),
...             "y": fl.train.Feature(int64_list=fl.train.Int64List(value=[i % 2]))}))
...         writer.write(example.SerializeToString())
>>> spec = {"x": fl.io.FixedLenFeature([2], fl.float32), "y": fl.io.FixedLenFeature([], fl.int64)}
>>> ds = fl.data.TFRecordDataset(path).map(lambda r: fl.io.parse_single_example(r, spec)).batch(3)
>>> batch = next(iter(ds))
>>> batch["x"].numpy().tolist(), batch["y"].numpy().tolist()
([[0.0, 0.5], [1.0, 1.5], [2.0, 2.5]], [0, 1, 0])
"""
from ..data.tfrecord import TFRecordCompressionType, TFRecordOptions, TFRecordWriter, tf_record_iterator
from .parsing import (FixedLenFeature, FixedLenSequenceFeature, VarLenFeature, parse_example,
                      parse_single_example)
from .strings import string

__all__ = ["TFRecordWriter", "TFRecordOptions", "TFRecordCompressionType", "tf_record_iterator",
           "FixedLenFeature", "VarLenFeature", "FixedLenSequenceFeature", "parse_single_example",
           "parse_example", "string"]
