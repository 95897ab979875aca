"""Distribution strategies, TensorFlow-shaped: ``MirroredStrategy`` (devices of one process),
``CentralStorageStrategy``, ``MultiWorkerMirroredStrategy`` (one replica per process),
``ParameterServerStrategy`` with a ``ClusterCoordinator`` (asynchronous, variables on ps tasks), with
``scope``, ``run``, ``reduce``, distributed datasets and ``InputContext``; and the Horovod-style
API in :mod:`.horovod` (``import flowlab.horovod as hvd``).

>>> import flowlab as fl
>>> from flowlab import distribute
>>> s = distribute.MirroredStrategy(["/cpu:0"])
>>> s.num_replicas_in_sync
1
"""
from .input import DistributedDataset, DistributedDatasetFromFunction, InputContext  # noqa: F401
from .mirrored import CentralStorageStrategy, MirroredStrategy  # noqa: F401
from .multi_worker import MultiWorkerMirroredStrategy  # noqa: F401
from .parameter_server import ClusterCoordinator, ParameterServerStrategy, RemoteValue  # noqa: F401
from .reduce_op import ReduceOp  # noqa: F401
from .strategy import (ReplicaContext, Strategy, compute_average_loss, get_replica_context,  # noqa: F401
                       get_strategy, has_strategy, in_cross_replica_context)
from .values import PerReplica  # noqa: F401

__all__ = ["Strategy", "MirroredStrategy", "CentralStorageStrategy", "MultiWorkerMirroredStrategy", "ParameterServerStrategy",
           "ClusterCoordinator", "RemoteValue", "ReduceOp",
           "InputContext", "DistributedDataset", "DistributedDatasetFromFunction", "PerReplica", "ReplicaContext",
           "get_strategy", "has_strategy", "get_replica_context", "in_cross_replica_context",
           "compute_average_loss"]
