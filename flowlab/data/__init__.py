"""flowlab.data: tf.data-style input pipelines (``fl.data.Dataset``) whose parallel stages really run
in parallel threads. Importing it starts no thread; iterating a pipeline does, and stopping it
(exhaustion, an error, ``close()``, or dropping the iterator) stops them.

>>> import flowlab as fl
>>> ds = fl.data.Dataset.from_tensor_slices([1.0, 2.0, 3.0, 4.0])
>>> ds = ds.map(lambda x: x * 10, num_parallel_calls=fl.data.AUTOTUNE).batch(2).prefetch(1)
>>> [b.tolist() for b in ds.as_numpy_iterator()]
[[10.0, 20.0], [30.0, 40.0]]
"""
from ._parallel import PipelineError
from .dataset import Dataset, Iterator
from .options import AUTOTUNE, AutotuneOptions, Options, ThreadingOptions
from .records import (DataLossError, RecordDataset, RecordSkippedWarning, RecordWriter, decode_example,
                      encode_example, read_records)

__all__ = ["Dataset", "Iterator", "AUTOTUNE", "Options", "AutotuneOptions", "ThreadingOptions",
           "PipelineError", "RecordDataset", "RecordWriter", "DataLossError", "RecordSkippedWarning",
           "read_records", "encode_example", "decode_example"]
