"""Cluster resolvers, as ``tf.distribute.cluster_resolver``: objects that say what the cluster is
(``cluster_spec()``) and which task this process is (``task_type``, ``task_id``).

- :class:`TFConfigClusterResolver` reads ``TF_CONFIG`` (or flowlab's ``FLOWLAB_CONFIG``; both set
  and different: an error) each time it is asked, as TensorFlow's does.
- :class:`SimpleClusterResolver` holds a ClusterSpec and a task given to it.

``strategy.cluster_resolver`` is the resolver a strategy was made from: for
``MultiWorkerMirroredStrategy`` in a LocalCluster worker or a ``flowlab run`` rank, a
SimpleClusterResolver of that cluster and task; on its own (nothing set), a TFConfigClusterResolver
whose ``task_type`` and ``task_id`` are None, as in TensorFlow.

>>> import os, json
>>> os.environ["TF_CONFIG"] = json.dumps({"cluster": {"worker": ["localhost:12345", "localhost:23456"]},
...                                       "task": {"type": "worker", "index": 1}})
>>> r = TFConfigClusterResolver()
>>> r.task_type, r.task_id, r.cluster_spec().num_tasks("worker"), r.master()
('worker', 1, 2, 'localhost:23456')
>>> del os.environ["TF_CONFIG"]

Resolvers for cluster managers (Slurm, Kubernetes, GCE, TPUs) are deliberately not in flowlab:
asking for one says what to do instead.
"""
from __future__ import annotations

from ..cluster.spec import ClusterSpec, cluster_config

__all__ = ["ClusterResolver", "SimpleClusterResolver", "TFConfigClusterResolver"]


class ClusterResolver:
    """Base of the resolvers: ``cluster_spec()``, ``master()``, ``task_type``, ``task_id``,
    ``rpc_layer``, ``environment`` and ``num_accelerators()``."""

    _task_type = None
    _task_id = None
    _rpc_layer = None
    _environment = ""

    def cluster_spec(self) -> ClusterSpec:
        raise NotImplementedError

    # -- this task ------------------------------------------------------------------------------
    @property
    def task_type(self):
        """This process's job (``"worker"``, ``"chief"``...), or None when unknown."""
        return self._task_type

    @task_type.setter
    def task_type(self, value):
        self._task_type = None if value is None else str(value)

    @property
    def task_id(self):
        """This process's index in its job, or None when unknown."""
        return self._task_id

    @task_id.setter
    def task_id(self, value):
        self._task_id = None if value is None else int(value)

    @property
    def rpc_layer(self):
        return self._rpc_layer

    @rpc_layer.setter
    def rpc_layer(self, value):
        self._rpc_layer = value

    @property
    def environment(self) -> str:
        return self._environment or ""

    def master(self, task_type=None, task_id=None, rpc_layer=None) -> str:
        """The address of a task (by default this one), prefixed with ``rpc_layer://`` when there is
        one; ``""`` when the cluster or the task is unknown."""
        spec = self.cluster_spec()
        task_type = self.task_type if task_type is None else task_type
        task_id = self.task_id if task_id is None else task_id
        if not spec or task_type is None or task_type not in spec.jobs:
            return ""
        address = spec.task_address(task_type, 0 if task_id is None else task_id)
        layer = rpc_layer or self.rpc_layer
        return f"{layer}://{address}" if layer else address

    def num_accelerators(self, task_type=None, task_id=None, config_proto=None) -> dict:
        """``{"GPU": n}`` for this process's logical GPUs (``{}`` without any), as TensorFlow reports
        them for a local task."""
        from ..core import config
        n = config.logical_device_count("GPU")
        return {"GPU": n} if n else {}

    def __repr__(self):
        return (f"<{type(self).__name__} task_type={self.task_type!r} task_id={self.task_id!r} "
                f"cluster={self.cluster_spec().as_dict()!r}>")


class SimpleClusterResolver(ClusterResolver):
    """A resolver that returns what it was given: ``cluster_spec`` (a ClusterSpec or a dict of
    jobs), ``task_type``, ``task_id``, ``rpc_layer``; ``master`` overrides the computed address."""

    def __init__(self, cluster_spec, master: str = "", task_type=None, task_id=None, environment: str = "",
                 num_accelerators=None, rpc_layer=None):
        self._spec = cluster_spec if isinstance(cluster_spec, ClusterSpec) else ClusterSpec(cluster_spec)
        self._master = master
        self.task_type, self.task_id = task_type, task_id
        self._environment = environment
        self._accelerators = num_accelerators
        self._rpc_layer = rpc_layer

    def cluster_spec(self) -> ClusterSpec:
        return self._spec

    def master(self, task_type=None, task_id=None, rpc_layer=None) -> str:
        if self._master and task_type is None and task_id is None:
            layer = rpc_layer or self.rpc_layer
            bare = self._master.split("://", 1)[-1]
            return f"{layer}://{bare}" if layer else self._master
        return super().master(task_type, task_id, rpc_layer)

    def num_accelerators(self, task_type=None, task_id=None, config_proto=None) -> dict:
        if self._accelerators is not None:
            return dict(self._accelerators)
        return super().num_accelerators(task_type, task_id, config_proto)


class TFConfigClusterResolver(ClusterResolver):
    """The cluster and task of ``TF_CONFIG`` (or ``FLOWLAB_CONFIG``), read again at each call.
    ``task_type``, ``task_id`` and ``rpc_layer`` given here (or set later) override the variable's;
    ``environment``: a dict used instead of ``os.environ``."""

    def __init__(self, task_type=None, task_id=None, rpc_layer=None, environment=None):
        self.task_type, self.task_id = task_type, task_id
        self._rpc_layer = rpc_layer
        self._environ = environment

    def _config(self):
        return cluster_config(self._environ)[0]

    def cluster_spec(self) -> ClusterSpec:
        cfg = self._config()
        return cfg.spec if cfg is not None else ClusterSpec({})

    @property
    def task_type(self):
        if self._task_type is not None:
            return self._task_type
        cfg = self._config()
        return cfg.job if cfg is not None else None

    @task_type.setter
    def task_type(self, value):
        self._task_type = None if value is None else str(value)

    @property
    def task_id(self):
        if self._task_id is not None:
            return self._task_id
        cfg = self._config()
        if cfg is None or cfg.job is None:
            return None
        return 0 if cfg.index is None else cfg.index

    @task_id.setter
    def task_id(self, value):
        self._task_id = None if value is None else int(value)

    @property
    def rpc_layer(self):
        if self._rpc_layer is not None:
            return self._rpc_layer
        cfg = self._config()
        return cfg.rpc_layer if cfg is not None else None

    @rpc_layer.setter
    def rpc_layer(self, value):
        self._rpc_layer = value

    @property
    def environment(self) -> str:
        cfg = self._config()
        return (cfg.environment if cfg is not None else None) or ""

    def variable(self) -> str | None:
        """Which variable the configuration came from (``"TF_CONFIG"`` / ``"FLOWLAB_CONFIG"``), or None."""
        return cluster_config(self._environ)[1]


_LEFT_OUT = {
    "TPUClusterResolver": "flowlab deliberately leaves TPUs out",
    "SlurmClusterResolver": "flowlab does not talk to Slurm",
    "KubernetesClusterResolver": "flowlab does not talk to Kubernetes",
    "GCEClusterResolver": "flowlab does not talk to Google Compute Engine",
    "UnionResolver": "flowlab has no UnionResolver",
}


def __getattr__(name):
    if name in _LEFT_OUT:
        raise AttributeError(
            f"fl.distribute.cluster_resolver.{name}: {_LEFT_OUT[name]}. Describe the cluster in TF_CONFIG (or "
            f"FLOWLAB_CONFIG) and use TFConfigClusterResolver, or pass a SimpleClusterResolver(ClusterSpec(...), "
            f"task_type=..., task_id=...); on one machine, fl.cluster.LocalCluster starts the tasks for you")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
