"""flowlab.data: tf.data-style input pipelines (``fl.data.Dataset``) whose parallel stages really run
in parallel: threads for numpy work, worker processes for Python-heavy functions. Importing it starts
no thread; iterating a pipeline does, and stopping it (exhaustion, an error, ``close()``, or dropping
the iterator) stops them. Every stage records what it does (``ds.stats()``, ``fl.data.timeline``),
and AUTOTUNE stages size themselves from those measurements.

>>> import flowlab as fl
>>> ds = fl.data.Dataset.from_tensor_slices([1.0, 2.0, 3.0, 4.0])
>>> ds = ds.map(lambda x: x * 10, num_parallel_calls=fl.data.AUTOTUNE).batch(2).prefetch(1)
>>> [b.tolist() for b in ds.as_numpy_iterator()]
[[10.0, 20.0], [30.0, 40.0]]
>>> [stage.name for stage in ds.stats().stages]
['from_tensor_slices#0', 'map#1', 'batch#2', 'prefetch#3']
"""
import types as _types

from ._autoshard import auto_shard
from ._parallel import PipelineError
from .dataset import INFINITE_CARDINALITY, UNKNOWN_CARDINALITY, Dataset, Iterator
from .options import (AUTOTUNE, AutoShardPolicy, AutotuneOptions, DistributeOptions, OptimizationOptions, Options,
                      StatsOptions, ThreadingOptions)
from .records import (DataLossError, RecordDataset, RecordSkippedWarning, RecordWriter, decode_example,
                      encode_example, read_records)
from .stats import Decision, PipelineStats
from .tfrecord import TFRecordDataset
from .timeline import Timeline, plot_timeline, timeline

#: ``fl.data.experimental``: where TensorFlow code looks for these names (``tf.data.experimental``).
experimental = _types.SimpleNamespace(AUTOTUNE=AUTOTUNE, AutoShardPolicy=AutoShardPolicy)

__all__ = ["Dataset", "Iterator", "AUTOTUNE", "INFINITE_CARDINALITY", "UNKNOWN_CARDINALITY", "Options",
           "AutotuneOptions", "StatsOptions", "ThreadingOptions", "DistributeOptions", "OptimizationOptions",
           "AutoShardPolicy",
           "experimental", "PipelineError", "PipelineStats", "Decision",
           "Timeline", "timeline", "plot_timeline", "RecordDataset", "RecordWriter", "DataLossError",
           "RecordSkippedWarning", "read_records", "encode_example", "decode_example", "TFRecordDataset",
           "auto_shard"]
