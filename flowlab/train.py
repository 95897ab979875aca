"""``fl.train``: checkpoints (``Checkpoint``, ``CheckpointManager``) and the cluster model
(``ClusterSpec``, ``Server``), under the names TensorFlow material uses. Each name is imported from
its own layer on first use, so ``import flowlab`` stays light."""
from __future__ import annotations

import importlib

_HOME = {
    "Checkpoint": "flowlab.nn.checkpoint",
    "CheckpointManager": "flowlab.nn.checkpoint",
    "latest_checkpoint": "flowlab.nn.checkpoint",
    "list_variables": "flowlab.nn.checkpoint",
    "ClusterSpec": "flowlab.cluster",
    "Server": "flowlab.cluster",
    **{name: "flowlab.io.example" for name in ("Example", "Features", "Feature", "BytesList", "FloatList",
                                                "Int64List", "FeatureList", "FeatureLists", "SequenceExample")},
}
__all__ = sorted(_HOME)


def __getattr__(name):
    if name in _HOME:
        value = getattr(importlib.import_module(_HOME[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'flowlab.train' has no attribute {name!r}")


def __dir__():
    return __all__
