"""``TPUStrategy``: deliberately not in flowlab. flowlab teaches distribution on the CPUs (and GPUs)
of ordinary machines; TPUs are Google's own accelerators, reachable only in its cloud, so there is
nothing here for a TPU strategy to run on. Making one raises an error that says what to use.
"""
from __future__ import annotations

__all__ = ["TPUStrategy"]

_INSTEAD = ("flowlab deliberately leaves TPUs out: they are Google's cloud accelerators, and flowlab runs on the "
            "CPUs and GPUs of your own machine. For the same synchronous all-reduce training, use "
            "fl.distribute.MirroredStrategy() on several logical devices (fl.config.set_logical_devices('CPU', 4) "
            "first), or fl.distribute.MultiWorkerMirroredStrategy() in several processes (a LocalCluster, "
            "'flowlab run -np N', or TF_CONFIG)")


class TPUStrategy:
    """Not available: see the module docstring. Constructing it raises NotImplementedError."""

    def __init__(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__}: {_INSTEAD}")
