"""``tf.train.replica_device_setter``: variables on parameter-server tasks, other ops on a worker.

>>> import flowlab.compat.v1 as tf
>>> setter = tf.train.replica_device_setter(ps_tasks=2, worker_device="/job:worker/task:0")
>>> with tf.Graph().as_default(), tf.device(setter):
...     a, b = tf.Variable(tf.zeros([2])), tf.Variable(tf.ones([3]))
...     c = a + 1.0
>>> a.device, b.device, c.device
('/job:ps/task:0', '/job:ps/task:1', '/job:worker/task:0')

The setter is a scope on ``worker_device`` that also hands each variable made inside it the next
ps task in turn (round robin, as TensorFlow's default strategy does), so a session on a cluster
keeps every variable on its ps task and runs the rest on the worker (``flowlab/cluster/partition.py``).
"""
from __future__ import annotations

import threading

from ..core.device import DeviceSpec, as_spec
from ..core.device import device as _core_device

__all__ = ["replica_device_setter", "device", "variable_device"]

_local = threading.local()


class ReplicaDeviceSetter:
    """What ``replica_device_setter`` returns: give it to ``tf.device``. Called with an op (as a
    TensorFlow device function is), it answers that op's device."""

    def __init__(self, ps_tasks, ps_device, worker_device, ps_strategy=None):
        self.ps_tasks, self.ps_device, self.worker_device = ps_tasks, ps_device, worker_device
        self.ps_strategy = ps_strategy
        self._next = 0

    def next_variable_device(self, name=None) -> str:
        """The device of the next variable: the ps tasks in turn (or ``ps_strategy(name)``)."""
        if self.ps_strategy is not None:
            index = int(self.ps_strategy(name))
        else:
            index, self._next = self._next, (self._next + 1) % self.ps_tasks
        spec = as_spec(self.ps_device)
        return spec.make_merged_spec(DeviceSpec(task=index) if spec.task is None else DeviceSpec()).to_string()

    def __call__(self, op):
        kind = getattr(getattr(op, "op", None), "name", None) or getattr(op, "type", None)
        return self.next_variable_device() if kind in ("Variable", "VariableV2", "VarHandleOp") else self.worker_device

    def __repr__(self):
        return (f"replica_device_setter(ps_tasks={self.ps_tasks}, ps_device={self.ps_device!r}, "
                f"worker_device={self.worker_device!r})")


def replica_device_setter(ps_tasks=0, ps_device="/job:ps", worker_device="/job:worker", merge_devices=True,
                          cluster=None, ps_ops=None, ps_strategy=None):
    """A device setter for ``tf.device``: variables round robin over the ``ps`` tasks, the other ops
    on ``worker_device``. ``cluster`` (a ClusterSpec or dict) gives the number of ps tasks; with
    none, returns None (``tf.device(None)``: no placement), as TensorFlow does."""
    if cluster is not None:
        from ..cluster.spec import ClusterSpec
        spec = cluster if isinstance(cluster, ClusterSpec) else ClusterSpec(cluster)
        job = as_spec(ps_device).job or "ps"
        ps_tasks = spec.num_tasks(job) if job in spec.jobs else 0
    if not isinstance(ps_tasks, int) or ps_tasks < 0:
        raise ValueError(f"replica_device_setter: ps_tasks must be a whole number >= 0, not {ps_tasks!r}")
    if ps_tasks == 0:
        return None
    as_spec(ps_device), as_spec(worker_device)     # a bad device string fails here, not later
    return ReplicaDeviceSetter(ps_tasks, ps_device, worker_device, ps_strategy)


class _SetterScope:
    def __init__(self, setter):
        self.setter, self._scopes = setter, []

    def __enter__(self):
        scope = _core_device(self.setter.worker_device)
        spec = scope.__enter__()
        self._scopes.append(scope)
        _stack().append(self.setter)
        return spec

    def __exit__(self, *exc):
        _stack().pop()
        self._scopes.pop().__exit__(*exc)


def _stack():
    stack = getattr(_local, "setters", None)
    if stack is None:
        stack = _local.setters = []
    return stack


def device(device_name_or_function):
    """``tf.device``: a device string, a DeviceSpec, None, or a ``replica_device_setter``."""
    if isinstance(device_name_or_function, ReplicaDeviceSetter):
        return _SetterScope(device_name_or_function)
    if callable(device_name_or_function) and not isinstance(device_name_or_function, (str, DeviceSpec)):
        raise TypeError("tf.device takes a device string, a DeviceSpec, None or tf.train.replica_device_setter(...); "
                        "flowlab does not run other device functions")
    return _core_device(device_name_or_function)


def variable_device(name=None):
    """The device scope a variable made now should be created in: the innermost replica setter's
    next ps device, or None (no setter: the variable follows the enclosing scope)."""
    stack = _stack()
    return _core_device(stack[-1].next_variable_device(name)) if stack else None
