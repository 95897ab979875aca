"""Devices: where an op runs. ``DeviceSpec`` is a parsed device string, ``fl.device`` a scope.

A device string is TensorFlow's ``/job:J/replica:R/task:T/device:TYPE:N``, or a short form of it
(``/cpu:0``, ``/GPU:1``, ``gpu:0``, ``/job:worker/task:1``); any field may be left out.

The placement rule of an eager op:

- Inside ``fl.device(...)`` it runs on the scope's device. Fields the scope leaves out take this
  process's defaults, ``/job:localhost/replica:0/task:0/device:CPU:0``: ``/gpu:1`` is GPU:1 of
  this process, ``/job:localhost`` is its CPU:0. Its inputs' devices do not matter (as in TF).
- Outside any scope, or inside ``fl.device(None)``, it runs on the device of its first input that
  is not on the default CPU (so ``a @ b`` with ``a`` on GPU:1 runs on GPU:1), else on the default CPU.
- Nested scopes merge as TensorFlow merges them: inner fields override outer ones and unset inner
  fields inherit (``/job:worker`` then ``/gpu:0`` is ``/job:worker/device:GPU:0``). One refinement:
  an inner device type without an index does not inherit an outer index of another type
  (``/gpu:1`` then ``/cpu`` is CPU:0, not the CPU:1 of a field-by-field merge).

Tensors on the default CPU keep ``_device`` None, so the eager fast paths test one attribute; any
other device is stored as its canonical full string.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import numbers
import sys
import threading

from . import config
from ._context import ACTIVE, state
from .backends import kernel_for_device
from .errors import InvalidArgumentError, did_you_mean, source_line

__all__ = ["DeviceSpec", "device", "current_device_spec", "resolve", "place", "RemoteDeviceError",
           "DEFAULT_DEVICE", "set_log_device_placement", "get_log_device_placement", "log_placement",
           "is_local", "set_remote_interpreter", "remote_interpreter", "REMOTE"]

DEFAULT_DEVICE = "/job:localhost/replica:0/task:0/device:CPU:0"
_TYPES = ("CPU", "GPU")
_FORMS = "/job:NAME, /replica:N, /task:N, /device:CPU:N or /device:GPU:N (short: /cpu:N, /gpu:N)"


class RemoteDeviceError(NotImplementedError):
    """An eager op was placed on another job or task, which needs a cluster to run there."""


@dataclasses.dataclass(frozen=True)
class DeviceSpec:
    """A device name, parsed; every field may be None (unset). Frozen and hashable.

    >>> import flowlab as fl
    >>> spec = fl.DeviceSpec.from_string("/job:worker/gpu:0")
    >>> spec.device_type, spec.device_index, spec.to_string()
    ('GPU', 0, '/job:worker/device:GPU:0')
    >>> spec.make_merged_spec(fl.DeviceSpec(task=1)).to_string()
    '/job:worker/task:1/device:GPU:0'
    """

    job: str | None = None
    replica: int | None = None
    task: int | None = None
    device_type: str | None = None
    device_index: int | None = None

    def __post_init__(self):
        if self.device_type is not None:
            object.__setattr__(self, "device_type", _device_type(str(self.device_type), None,
                                                                   f"device_type={self.device_type!r}"))
        for field in ("replica", "task", "device_index"):
            value = getattr(self, field)
            if value is not None:
                object.__setattr__(self, field, _number(field, value, None, f"{field}={value!r}"))

    @classmethod
    def from_string(cls, spec: str) -> "DeviceSpec":
        """Parse a full or short device string; "" is the unconstrained spec. Device types are
        case-insensitive. A malformed string raises ValueError naming the part that is wrong."""
        return _parse(spec)

    def to_string(self) -> str:
        """TensorFlow's canonical form with only the fields that are set (``/device:GPU:*``: any GPU)."""
        parts = [f"/job:{self.job}" if self.job is not None else "",
                 f"/replica:{self.replica}" if self.replica is not None else "",
                 f"/task:{self.task}" if self.task is not None else ""]
        if self.device_type is not None:
            parts.append(f"/device:{self.device_type}:{'*' if self.device_index is None else self.device_index}")
        return "".join(parts)

    def make_merged_spec(self, other: "DeviceSpec") -> "DeviceSpec":
        """This spec with every field that ``other`` sets taken from ``other`` (TF's rule)."""
        if not other:
            return self
        if not self:
            return other
        return DeviceSpec(*(b if b is not None else a for a, b in zip(_fields(self), _fields(other))))

    def replace(self, **fields) -> "DeviceSpec":
        return dataclasses.replace(self, **fields)

    def resolve_eager(self, input_device):
        """Where an eager op runs in a scope on this spec (see the module docstring): None for the
        default CPU, else a full device string. ``input_device``: the op's own choice without a scope."""
        cached = self.__dict__.get("_eager")   # (version of the device list, device): not a field
        if cached is None or cached[0] != config.devices_version():
            device = _FOLLOW if not self else resolve(self, allow_remote=True)   # None: no constraint
            cached = (config.devices_version(), None if device == DEFAULT_DEVICE else device)
            object.__setattr__(self, "_eager", cached)
        return input_device if cached[1] is _FOLLOW else cached[1]

    def __bool__(self):   # False for the empty (unconstrained) spec
        return _fields(self) != (None, None, None, None, None)

    __str__ = to_string

    def __repr__(self):
        set_fields = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in dataclasses.fields(self)
                               if getattr(self, f.name) is not None)
        return f"DeviceSpec({set_fields})"


_EMPTY = DeviceSpec()
_FOLLOW = object()


def _fields(spec):
    return spec.job, spec.replica, spec.task, spec.device_type, spec.device_index


def _bad(text, part, why, hint=""):
    if text is None:   # from the DeviceSpec constructor
        return ValueError(f"DeviceSpec({part}) {why}")
    return ValueError(f"cannot parse device {text!r}: {part!r} {why}{hint}; a device string is made of {_FORMS}")


_KEYS = ("job", "replica", "task", "device", "cpu", "gpu")


def _fix_part(text, part):
    """'; did you mean ...?' with the key of ``part`` replaced by the closest known one
    (``/devcie:CPU:0`` -> ``/device:CPU:0``, ``/cpu0`` -> ``/cpu:0``), or "" when none is close."""
    import difflib
    key, sep, rest = part.partition(":")
    digits = len(key) - len(key.rstrip("0123456789"))
    if not sep and 0 < digits < len(key):      # /cpu0
        key, sep, rest = key[:-digits], ":", key[-digits:]
    match = difflib.get_close_matches(key.lower(), _KEYS, n=1, cutoff=0.5)
    fixed = text.replace(part, match[0] + sep + rest, 1) if match else text
    return f"; did you mean {fixed!r}?" if fixed != text else ""


def _number(what, value, text, part=None):
    ok = value.isdecimal() if isinstance(value, str) else (
        isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= 0)
    if not ok:
        raise _bad(text, part or value, f"gives a {what} that is not a whole number >= 0")
    return int(value)


def _device_type(name, text, part=None):
    if name.upper() not in _TYPES:
        hint = _fix_part(text, part) if text is not None and name.lower() not in ("cpu", "gpu") else ""
        raise _bad(text, part or name, f"names device type {name.upper()!r}, which flowlab does not have "
                                       f"(it has {' and '.join(_TYPES)})", hint)
    return name.upper()


@functools.lru_cache(maxsize=256)
def _parse(text):
    if not isinstance(text, str):
        raise TypeError(f"a device string must be a str, not {type(text).__name__}")
    fields = {}

    def put(field, value, part):
        if field in fields:
            raise _bad(text, part, f"sets {'the device' if field == 'device_type' else field} a second time")
        fields[field] = value

    for part in text.strip().split("/"):
        if not part:
            continue
        key, *rest = part.split(":")
        key = key.lower()
        if key in ("job", "replica", "task"):
            if len(rest) != 1 or not rest[0]:
                raise _bad(text, part, f"should read {key}:{'NAME' if key == 'job' else 'N'} "
                                       f"(a {'name' if key == 'job' else 'number'} after '{key}:')")
            put(key, rest[0] if key == "job" else _number(key, rest[0], text, part), part)
            continue
        if key == "device":          # /device:GPU:1, /device:GPU:*, /device:GPU
            if not 1 <= len(rest) <= 2:
                raise _bad(text, part, "should read device:TYPE:N")
            key, rest = rest[0], rest[1:]
        elif len(rest) > 1 or not key.isalpha():
            raise _bad(text, part, "is not a part of a device string", _fix_part(text, part))
        put("device_type", _device_type(key, text, part), part)
        if rest and rest[0] != "*":
            fields["device_index"] = _number("device index", rest[0], text, part)
    return DeviceSpec(**fields)


def as_spec(value) -> DeviceSpec:
    """A DeviceSpec from a spec, a device string or a logical device (anything with a ``.name``)."""
    if isinstance(value, DeviceSpec):
        return value
    if isinstance(value, str):
        return _parse(value)
    if isinstance(getattr(value, "name", None), str):
        return _parse(value.name)
    raise TypeError(f"expected a device string such as '/gpu:0', a DeviceSpec or None, not {type(value).__name__}")


# -- scopes -----------------------------------------------------------------------------------
def device(device_name):
    """A scope that places the ops inside it: ``with fl.device("/gpu:1"): ...``.

    ``device_name`` is a device string, a ``DeviceSpec``, or None (no placement inside: ops follow
    their inputs again). Nested scopes merge (see ``flowlab/core/device.py``); ``as`` gives the
    merged spec. A device that does not exist is reported when an op runs.

    >>> import flowlab as fl
    >>> with fl.device("/job:worker"):
    ...     with fl.device("/gpu:0") as spec:
    ...         print(spec)
    /job:worker/device:GPU:0
    """
    return _Scope(None if device_name is None else as_spec(device_name))


class _Scope:
    __slots__ = ("spec", "_entered")

    def __init__(self, spec):
        self.spec, self._entered = spec, []

    def __enter__(self) -> DeviceSpec:
        st = state()
        merged = _EMPTY if self.spec is None else merge_scopes(current_device_spec(), self.spec)
        st.push("device_stack", merged)   # counted in ACTIVE: the eager fast paths step aside
        self._entered.append((st, merged))
        return merged

    def __exit__(self, *exc):
        st, merged = self._entered.pop()
        st.pop("device_stack", merged)


def merge_scopes(outer: DeviceSpec, inner: DeviceSpec) -> DeviceSpec:
    """The spec of a scope ``inner`` opened inside a scope ``outer`` (see the module docstring)."""
    merged = outer.make_merged_spec(inner)
    if inner.device_index is None and inner.device_type not in (None, outer.device_type):
        merged = merged.replace(device_index=None)
    return merged


def current_device_spec() -> DeviceSpec:
    """The merged spec of the innermost ``fl.device`` scope of this thread (empty outside any)."""
    stack = state().device_stack
    return stack[-1] if stack else _EMPTY


# -- resolution -------------------------------------------------------------------------------
_LOCAL = DeviceSpec("localhost", 0, 0, "CPU", 0)


def resolve(spec, allow_remote: bool = False) -> str:
    """The canonical full name of the device ``spec`` names, its unset fields taken from
    ``/job:localhost/replica:0/task:0/device:CPU:0``.

    A local device must exist (``fl.config.list_logical_devices()``), else InvalidArgumentError
    lists the ones that do. A device of another job or task raises RemoteDeviceError, or with
    ``allow_remote`` is returned unchecked (a graph node to be run by a cluster).

    >>> from flowlab.core.device import resolve
    >>> resolve("/cpu:0")
    '/job:localhost/replica:0/task:0/device:CPU:0'
    """
    full = _LOCAL.make_merged_spec(as_spec(spec))
    name = full.to_string()
    if (full.job, full.replica, full.task) != (_LOCAL.job, _LOCAL.replica, _LOCAL.task):
        if allow_remote:
            return name
        raise RemoteDeviceError(_remote_message(name))
    if full.device_index >= config.logical_device_count(full.device_type):
        where = source_line()
        short = [f"/{d.device_type.lower()}:{d.name.rpartition(':')[2]}" for d in config.list_logical_devices()]
        why = ""
        if full.device_type == "GPU" and not config.logical_device_count("GPU"):
            from .backends import no_gpu_reason
            why = f" (this process has no GPU: {no_gpu_reason()}; logical GPUs run on the CPU)"
        raise InvalidArgumentError(
            f"no device {name}; this process has: {_have()}; use fl.config.set_logical_devices(\"{full.device_type}\", "
            f"{full.device_index + 1}) to make more{did_you_mean(f'/{full.device_type.lower()}:{full.device_index}', short)}"
            + why + _at(where), source=where)
    return name


def _remote_message(name):
    return (f"{name} is not in this process (/job:localhost/replica:0/task:0): running ops on another "
            f"job or task needs a cluster: start one with fl.cluster.LocalCluster(workers=N), and flowlab will not "
            f"quietly run them here instead. This process has: {_have()}" + _at(source_line()))


# -- ops on other tasks -----------------------------------------------------------------------
_HERE = "/job:localhost/replica:0/task:0/"
REMOTE = object()          # the "kernel" place() gives for an op placed on another task
_remote = None             # the interpreter a cluster registered (process(op, inputs, attrs, device))
_remote_type = None        # the class of its handles (tensors whose value is elsewhere)


def is_local(device) -> bool:
    """Whether a full device string (as ``resolve`` gives; None: the default CPU) is of this process."""
    return device is None or device.startswith(_HERE)


def set_remote_interpreter(interp) -> None:
    """Let an Interpreter of a higher layer run eager ops off this process (core knows no cluster): the
    eager interpreter hands ``interp.process(op, inputs, attrs, device)`` each op placement put on
    another task and each op with an ``interp.handle_type`` input (``device``: placement's choice).
    It shows the tapes what it runs (``tape.record_op``). None removes it (RemoteDeviceError again)."""
    global _remote, _remote_type
    _remote, _remote_type = interp, getattr(interp, "handle_type", None)


def remote_interpreter():
    """The registered remote interpreter, or None."""
    return _remote


def has_remote(inputs) -> bool:
    """Whether an input is a handle to a value on another task (only asked when an interpreter is set)."""
    for x in inputs:
        if x.__class__ is _remote_type:
            return True
    return False


def _have():
    return ", ".join(d.name for d in config.list_logical_devices())


def _at(where):
    return f"\n  at {where}" if where else ""


def place(op, input_device, stack):
    """The device an eager op runs on (None: the default CPU) and the kernel that runs it there.
    ``input_device``: its first input's device; ``stack``: the thread's ``device_stack``."""
    try:
        device = stack[-1].resolve_eager(input_device) if stack else input_device
    except InvalidArgumentError as e:
        raise InvalidArgumentError(f"{op.name}: {e}", op=op.name, source=e.source) from None
    if _log_placement:
        log_placement(op.name, device)
    if device is not None and not device.startswith(_HERE):   # another job or task
        if _remote is None:
            raise RemoteDeviceError(f"{op.name}: " + _remote_message(device))
        return device, REMOTE
    if device is None and input_device is None:
        return None, op.kernel
    return device, kernel_for_device(op, device or DEFAULT_DEVICE)   # a scope's CPU: on the host


# -- the placement log ------------------------------------------------------------------------
_logger = logging.getLogger("flowlab.placement")
_log_placement = False
_log_lock = threading.Lock()


class _CurrentStderr(logging.StreamHandler):
    """Writes to ``sys.stderr`` as it is when a line is logged: in Jupyter that is the stream of
    the cell that runs the op, so the line shows under that cell (pytest's capsys sees it too)."""

    def __init__(self):
        logging.Handler.__init__(self)

    @property
    def stream(self):
        return sys.stderr


def set_log_device_placement(enabled: bool) -> None:
    """Log every eager op's device, as TensorFlow does, to stderr (logger "flowlab.placement"):
    ``Executing op matmul in device /job:localhost/replica:0/task:0/device:GPU:1``. While on, every
    op takes the full dispatch path (slower), so turn it off when done.

    >>> import flowlab as fl
    >>> fl.debugging.set_log_device_placement(True)
    >>> y = fl.constant([1.0]) + 1.0      # stderr: Executing op add in device .../device:CPU:0
    >>> fl.debugging.set_log_device_placement(False)
    """
    global _log_placement
    with _log_lock:
        if bool(enabled) == _log_placement:
            return
        _log_placement = bool(enabled)
        ACTIVE.add(1 if enabled else -1)
        if enabled and not any(isinstance(h, _CurrentStderr) for h in _logger.handlers):
            _logger.addHandler(_CurrentStderr())
            _logger.setLevel(logging.INFO)
            _logger.propagate = False   # one line per op, even where the root logger has a handler


def get_log_device_placement() -> bool:
    return _log_placement


def log_placement(op_name: str, device) -> None:
    """Log one placement decision (``device`` None: the default CPU) if the log is on; a graph
    executor calls this for each node it runs, as eager ``place`` does for each op."""
    if _log_placement:
        _logger.info("Executing op %s in device %s", op_name, device or DEFAULT_DEVICE)
