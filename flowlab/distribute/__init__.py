"""Distribution strategies, TensorFlow-shaped: ``MirroredStrategy`` (devices of one process),
``CentralStorageStrategy``, ``MultiWorkerMirroredStrategy`` (one replica per process),
``ParameterServerStrategy`` with a ``ClusterCoordinator`` (asynchronous, variables on ps tasks), with
``scope``, ``run``, ``reduce``, distributed datasets and ``InputContext``; and the Horovod-style
API in :mod:`.horovod` (``import flowlab.horovod as hvd``).

TensorFlow's other names are here too: the cross-device-ops classes (``NcclAllReduce``,
``HierarchicalCopyAllReduce``, ``ReductionToOneDevice``), ``strategy.cluster_resolver`` and
:mod:`.cluster_resolver` (``TFConfigClusterResolver``, ``SimpleClusterResolver``),
:mod:`.experimental` (``CommunicationOptions``, ``CommunicationImplementation``, the strategy
aliases); ``TPUStrategy`` raises an error that says what to use instead.
``run_with_recovery`` runs a training function on every worker of a LocalCluster and restarts a
worker that dies, then runs the function again (it resumes from its ``BackupAndRestore`` backup);
with ``wait=False`` it trains in the background and returns a :class:`RecoveryRun` at once.

>>> import flowlab as fl
>>> from flowlab import distribute
>>> s = distribute.MirroredStrategy(["/cpu:0"])
>>> s.num_replicas_in_sync
1
"""
from . import cluster_resolver, experimental  # noqa: F401
from .cross_device_ops import (CrossDeviceOps, HierarchicalCopyAllReduce, NcclAllReduce,  # noqa: F401
                               ReductionToOneDevice)
from .input import DistributedDataset, DistributedDatasetFromFunction, InputContext  # noqa: F401
from .mirrored import CentralStorageStrategy, MirroredStrategy  # noqa: F401
from .multi_worker import MultiWorkerMirroredStrategy  # noqa: F401
from .parameter_server import ClusterCoordinator, ParameterServerStrategy, RemoteValue  # noqa: F401
from ._recovery import RecoveredResults, RecoveryError, RecoveryRun, Restart, run_with_recovery  # noqa: F401
from .reduce_op import ReduceOp  # noqa: F401
from .strategy import (ReplicaContext, Strategy, compute_average_loss, get_replica_context,  # noqa: F401
                       get_strategy, has_strategy, in_cross_replica_context)
from .tpu import TPUStrategy  # noqa: F401
from .values import PerReplica  # noqa: F401

__all__ = ["Strategy", "MirroredStrategy", "CentralStorageStrategy", "MultiWorkerMirroredStrategy", "ParameterServerStrategy",
           "ClusterCoordinator", "RemoteValue", "ReduceOp",
           "InputContext", "DistributedDataset", "DistributedDatasetFromFunction", "PerReplica", "ReplicaContext",
           "get_strategy", "has_strategy", "get_replica_context", "in_cross_replica_context",
           "compute_average_loss", "CrossDeviceOps", "NcclAllReduce", "HierarchicalCopyAllReduce",
           "ReductionToOneDevice", "TPUStrategy", "cluster_resolver", "experimental",
           "run_with_recovery", "Restart", "RecoveryError", "RecoveredResults", "RecoveryRun"]
