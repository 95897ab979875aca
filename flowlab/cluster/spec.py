"""``ClusterSpec``: which jobs a cluster has and where each task listens, as in TensorFlow.

A cluster is made of jobs (``"worker"``, ``"ps"``), each a list of tasks; a task is one process,
named ``/job:worker/task:1`` and reached at an address ``host:port``.

>>> spec = ClusterSpec({"worker": ["localhost:2222", "localhost:2223"], "ps": ["localhost:2224"]})
>>> spec.jobs, spec.num_tasks("worker"), spec.task_address("worker", 1)
(['worker', 'ps'], 2, 'localhost:2223')
>>> ClusterSpec({"worker": {3: "10.0.0.7:2222"}}).as_dict()
{'worker': {3: '10.0.0.7:2222'}}

``FLOWLAB_CONFIG`` (shaped like TensorFlow's ``TF_CONFIG``) describes the cluster and this process's
place in it, for a task started from a shell::

    FLOWLAB_CONFIG='{"cluster": {"worker": ["host1:2222", "host2:2222"]}, "task": {"type": "worker", "index": 1}}'

:func:`config_from_env` reads one variable; :func:`cluster_config` reads ``TF_CONFIG`` or
``FLOWLAB_CONFIG``, whichever is set (a script written for TensorFlow sets ``TF_CONFIG``), as
``MultiWorkerMirroredStrategy`` and ``TFConfigClusterResolver`` do.
"""
from __future__ import annotations

import json
import os
import re
from typing import NamedTuple

__all__ = ["ClusterSpec", "ClusterConfig", "config_from_env", "cluster_config", "task_name", "parse_task",
           "split_address", "CONFIG_VARIABLES"]

CONFIG_VARIABLES = ("TF_CONFIG", "FLOWLAB_CONFIG")   # read by cluster_config, in this order

_TASK_RE = re.compile(r"^/?job:([A-Za-z0-9_.-]+)(?:/replica:\d+)?(?:/task:(\d+))?(?:/.*)?$")


def task_name(job: str, index: int) -> str:
    """The name of a task as a device-string prefix: ``/job:worker/task:1``."""
    return f"/job:{job}/task:{index}"


def parse_task(task, default_job: str = "worker") -> tuple[str, int]:
    """``(job, index)`` from ``/job:worker/task:1`` (replica and device parts allowed),
    ``"worker:1"``, ``("worker", 1)`` or a bare index of the default job."""
    if isinstance(task, tuple) and len(task) == 2:
        return str(task[0]), int(task[1])
    if isinstance(task, int) and not isinstance(task, bool):
        return default_job, task
    if isinstance(task, str):
        m = _TASK_RE.match(task.strip())
        if m:
            return m.group(1), int(m.group(2) or 0)
        job, sep, index = task.partition(":")
        if sep and index.isdecimal():
            return job, int(index)
    raise ValueError(f"cannot read {task!r} as a task: use '/job:worker/task:1', 'worker:1', "
                     f"('worker', 1) or an index of job {default_job!r}")


def split_address(address: str) -> tuple[str, int]:
    """``("host", port)`` from ``"host:port"`` or ``"tcp://host:port"`` (IPv6 hosts in brackets:
    ``"[::1]:2222"``)."""
    address = str(address)
    host, sep, port = (address[6:] if address.startswith("tcp://") else address).rpartition(":")
    if not sep or not host or not port.isdecimal() or not 0 <= int(port) < 65536:
        raise ValueError(f"task address {address!r} should read host:port, e.g. localhost:2222")
    return host.strip("[]"), int(port)


class ClusterSpec:
    """Jobs and their tasks' addresses. ``cluster``: a dict job -> list of ``"host:port"`` (task i
    at position i) or job -> {index: address} (sparse), or another ClusterSpec."""

    def __init__(self, cluster=None):
        if isinstance(cluster, ClusterSpec):
            cluster = cluster.as_dict()
        self._jobs: dict[str, dict[int, str]] = {}
        self._sparse: set[str] = set()
        for job, tasks in (cluster or {}).items():
            if not isinstance(job, str) or not re.fullmatch(r"[A-Za-z0-9_.-]+", job):
                raise ValueError(f"job name {job!r} should be a word such as 'worker' or 'ps'")
            if isinstance(tasks, dict):
                items = {int(i): str(a) for i, a in tasks.items()}
                self._sparse.add(job)
            elif isinstance(tasks, (list, tuple)):
                items = {i: str(a) for i, a in enumerate(tasks)}
            else:
                raise TypeError(f"job {job!r}: tasks should be a list of 'host:port' or a dict "
                                f"{{index: 'host:port'}}, not {type(tasks).__name__}")
            for i, address in items.items():
                if i < 0:
                    raise ValueError(f"job {job!r}: task index {i} is negative")
                split_address(address)
            self._jobs[job] = dict(sorted(items.items()))

    @property
    def jobs(self) -> list[str]:
        return list(self._jobs)

    def as_dict(self) -> dict:
        """job -> list of addresses, or job -> {index: address} for a job with gaps or given sparse."""
        out = {}
        for job, tasks in self._jobs.items():
            dense = job not in self._sparse and list(tasks) == list(range(len(tasks)))
            out[job] = list(tasks.values()) if dense else dict(tasks)
        return out

    def num_tasks(self, job_name: str) -> int:
        return len(self._job(job_name))

    def task_indices(self, job_name: str) -> list[int]:
        return list(self._job(job_name))

    def task_address(self, job_name: str, task_index: int) -> str:
        tasks = self._job(job_name)
        try:
            return tasks[int(task_index)]
        except KeyError:
            raise ValueError(f"job {job_name!r} has no task {task_index} (it has {list(tasks)})") from None

    def job_tasks(self, job_name: str) -> list[str | None]:
        """Addresses in index order, None for a missing index (TensorFlow's ``job_tasks``)."""
        tasks = self._job(job_name)
        return [tasks.get(i) for i in range(max(tasks) + 1)] if tasks else []

    def tasks(self) -> list[str]:
        """Every task's name, job by job: ``['/job:worker/task:0', ...]``."""
        return [task_name(job, i) for job, tasks in self._jobs.items() for i in tasks]

    def address_of(self, task) -> str:
        """The address of a task given by name (``/job:ps/task:0``) or ``(job, index)``."""
        return self.task_address(*parse_task(task))

    def _job(self, job_name):
        try:
            return self._jobs[job_name]
        except KeyError:
            raise ValueError(f"this cluster has no job {job_name!r} (it has {self.jobs})") from None

    def to_json(self) -> str:
        return json.dumps(self.as_dict())

    def __eq__(self, other):
        return isinstance(other, ClusterSpec) and self._jobs == other._jobs

    def __bool__(self):
        return bool(self._jobs)

    def __repr__(self):
        return f"ClusterSpec({self.as_dict()!r})"


class ClusterConfig(NamedTuple):
    """What ``FLOWLAB_CONFIG`` (or ``TF_CONFIG``) says: the cluster, this process's job and index
    (None if unset), and the optional ``rpc_layer`` and ``environment`` fields TensorFlow reads."""
    spec: ClusterSpec
    job: str | None
    index: int | None
    rpc_layer: str | None = None
    environment: str | None = None


def config_from_env(environ=None, name: str = "FLOWLAB_CONFIG") -> ClusterConfig | None:
    """Read ``FLOWLAB_CONFIG`` (JSON with ``cluster`` and ``task``, as ``TF_CONFIG``); None when
    unset or empty. A malformed value raises ValueError that names the variable."""
    text = (os.environ if environ is None else environ).get(name, "").strip()
    if not text:
        return None
    try:
        cfg = json.loads(text)
        if not isinstance(cfg, dict):
            raise TypeError(f"it is a JSON {type(cfg).__name__}, not an object")
        cluster = cfg.get("cluster") or {}
        task = cfg.get("task") or {}
        job = task.get("type")
        index = task.get("index")
        spec = ClusterSpec({j: ({int(k): v for k, v in t.items()} if isinstance(t, dict) else t)
                            for j, t in cluster.items()})
        if job is not None and not (job == "evaluator" and "evaluator" not in spec.jobs):
            spec.task_address(job, 0 if index is None else int(index))   # an evaluator may stand outside
    except (ValueError, TypeError, AttributeError) as e:
        raise ValueError(f"{name} is not a valid cluster configuration ({e}); expected e.g. "
                         '{"cluster": {"worker": ["localhost:2222"]}, "task": {"type": "worker", "index": 0}}') from None
    return ClusterConfig(spec, job, None if index is None else int(index), cfg.get("rpc_layer") or None,
                         cfg.get("environment") or None)


def cluster_config(environ=None) -> tuple[ClusterConfig | None, str | None]:
    """``(config, variable)`` from ``TF_CONFIG`` or ``FLOWLAB_CONFIG``, whichever is set; ``(None,
    None)`` when neither is. Both set to different clusters or tasks: ValueError naming both."""
    found = [(config_from_env(environ, name), name) for name in CONFIG_VARIABLES]
    found = [(c, n) for c, n in found if c is not None]
    if not found:
        return None, None
    if len(found) > 1 and found[0][0][:3] != found[1][0][:3]:
        raise ValueError("TF_CONFIG and FLOWLAB_CONFIG are both set and describe different clusters or tasks: "
                         "unset one of them (flowlab reads either; TF_CONFIG is the one TensorFlow scripts set)")
    return found[0]
