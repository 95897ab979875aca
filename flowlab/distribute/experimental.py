"""``fl.distribute.experimental``: the names TensorFlow keeps (or kept) under
``tf.distribute.experimental``, so code written for it runs as it is.

- the strategies ``MultiWorkerMirroredStrategy`` (whose first argument here is the older
  ``communication``), ``ParameterServerStrategy``, ``CentralStorageStrategy``; ``TPUStrategy``
  raises an error that says what to use instead;
- ``CommunicationImplementation`` (``AUTO``, ``RING``, ``NCCL``), its older name
  ``CollectiveCommunication``, and ``CommunicationOptions`` (see :mod:`.collective_options`).

>>> import flowlab as fl
>>> s = fl.distribute.experimental.MultiWorkerMirroredStrategy(
...     fl.distribute.experimental.CollectiveCommunication.RING)
>>> s.num_replicas_in_sync
1
"""
from __future__ import annotations

from . import multi_worker as _multi_worker
from .collective_options import CollectiveCommunication, CommunicationImplementation, CommunicationOptions
from .mirrored import CentralStorageStrategy
from .parameter_server import ParameterServerStrategy
from .tpu import TPUStrategy

__all__ = ["MultiWorkerMirroredStrategy", "ParameterServerStrategy", "CentralStorageStrategy", "TPUStrategy",
           "CommunicationImplementation", "CollectiveCommunication", "CommunicationOptions"]


class MultiWorkerMirroredStrategy(_multi_worker.MultiWorkerMirroredStrategy):
    """``fl.distribute.MultiWorkerMirroredStrategy`` with TensorFlow's older argument order:
    ``(communication=CollectiveCommunication.AUTO, cluster_resolver=None, communication_options=None)``."""

    def __init__(self, communication=CommunicationImplementation.AUTO, cluster_resolver=None,
                 communication_options=None, **kwargs):
        if isinstance(communication, CommunicationOptions) and communication_options is None:
            communication, communication_options = CommunicationImplementation.AUTO, communication
        super().__init__(cluster_resolver, communication_options, communication=communication, **kwargs)


def __getattr__(name):
    raise AttributeError(f"fl.distribute.experimental has no {name!r}: flowlab keeps TensorFlow's "
                         f"{', '.join(__all__)} here; the other strategies and tools are in fl.distribute")
