"""Checkpoints: save a model's and an optimizer's variables to disk and restore them
(``fl.train.Checkpoint``, ``fl.train.CheckpointManager``, ``fl.train.latest_checkpoint``).

What is saved is the *object graph*: ``Checkpoint(model=m, optimizer=opt)`` walks from its
keyword arguments through the objects they hold (a model's layers by attribute name, a layer's
weights by name, an optimizer's step count and slots) and names every variable by its path, e.g.
``model/dense1/kernel`` or ``optimizer/slots/model/dense1/kernel/m``. Restoring walks a new object
graph the same way and assigns each variable the value saved under its path, so a checkpoint fits
any program that builds the same objects, whatever their Python ids or variable names.

File format (no pickle): one ``.npz`` per checkpoint, ``<prefix>.npz``, holding each value as an
array ``v0``, ``v1``... and a JSON index (``__index__``, UTF-8 bytes) that maps paths to those
arrays with their shapes and dtypes. A ``CheckpointManager`` also keeps a small JSON file named
``checkpoint`` in its directory listing the checkpoints it keeps, newest last.

Writes are atomic: each file is written to a temporary file in the same directory, flushed and
fsynced, then renamed over its final name (``os.replace``) and the directory fsynced. A process
killed in the middle of a save leaves at most a stray ``.tmp-*`` file; the last good checkpoint
and the ``checkpoint`` file that points to it are never half-written.

One copy per variable: a variable reachable by several paths (a layer shared by two models) is
saved once, under the first path found, and the other paths are recorded as aliases of it. An
object that stands for several copies of one value -- as a mirrored variable of a distribution
strategy does, one copy per device -- takes part through two methods instead of being a
``fl.Variable``: ``_checkpoint_read()`` returns the one array to save (e.g. the primary copy's)
and ``_checkpoint_write(array)`` sets every copy. Such an object is then saved once, like any variable.
Objects with children give ``_checkpoint_children()`` (a dict from name to child).
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import tempfile

import numpy as np

from ..core import dtypes
from ..core.backends import backend_for_device
from ..core.tensor import Variable

__all__ = ["Checkpoint", "CheckpointManager", "latest_checkpoint", "list_variables", "CheckpointLoadStatus",
           "record_checkpoint"]

FORMAT = "flowlab-checkpoint"
VERSION = 1
SUFFIX = ".npz"
STATE_FILE = "checkpoint"
_INDEX = "__index__"


# -- atomic files -------------------------------------------------------------------------------
def _fsync_dir(directory):
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:      # some platforms cannot open a directory: the rename is still atomic
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that ``path`` holds either its old content or all of ``data``,
    never a part: temp file in the same directory, fsync, rename, fsync of the directory."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".tmp-{os.path.basename(path)}-", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(directory)


# -- walking the object graph --------------------------------------------------------------------
def _is_leaf(obj):
    return isinstance(obj, Variable) or hasattr(obj, "_checkpoint_read")


def _children(obj):
    if hasattr(obj, "_checkpoint_children"):
        return obj._checkpoint_children()
    if isinstance(obj, dict):
        return {str(k): v for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return {str(i): v for i, v in enumerate(obj)}
    return None


class _Graph:
    """Every saveable value reachable from the roots, by path (first path found wins), and the
    optimizers found on the way with their paths."""

    def __init__(self, roots: dict):
        self.leaves: dict[str, object] = {}
        self.aliases: dict[str, str] = {}
        self.optimizers: list = []
        self._path_of: dict[int, str] = {}
        self._seen: set = set()
        for name, obj in roots.items():
            self._visit(name, obj)

    def _visit(self, path, obj):
        if obj is None:
            return
        if _is_leaf(obj):
            first = self._path_of.get(id(obj))
            if first is None:
                self._path_of[id(obj)] = path
                self.leaves[path] = obj
            elif first != path:
                self.aliases[path] = first
            return
        children = _children(obj)
        if children is None:
            raise TypeError(f"checkpoint: cannot save {path!r}, a {type(obj).__name__}: give variables, layers, "
                            "models, optimizers, metrics, or lists and dicts of them")
        if id(obj) in self._seen:
            return
        self._seen.add(id(obj))
        if hasattr(obj, "_slot_items"):
            self.optimizers.append((path, obj))
        for name, child in children.items():
            self._visit(f"{path}/{name}", child)

    def path_of(self, var):
        return self._path_of.get(id(var))

    def slots(self):
        """(path, optimizer, variable, slot name, array) for each slot of a variable in the graph."""
        out = []
        for opath, opt in self.optimizers:
            for var, name, value in opt._slot_items():
                vpath = self.path_of(var)
                if vpath is not None:
                    out.append((f"{opath}/slots/{vpath}/{name}", opt, var, name, value))
        return out


def _read(leaf):
    if isinstance(leaf, Variable):
        return np.array(leaf)
    return np.asarray(leaf._checkpoint_read())


def _write(leaf, value, path):
    if isinstance(leaf, Variable):
        want_shape, want_dtype = tuple(leaf.shape), leaf.dtype.as_numpy_dtype
    else:
        current = np.asarray(leaf._checkpoint_read())
        want_shape, want_dtype = current.shape, current.dtype
    if tuple(value.shape) != tuple(want_shape):
        raise ValueError(f"checkpoint: {path!r} has shape {tuple(want_shape)} here but {tuple(value.shape)} in "
                         "the checkpoint; was it saved from a different model?")
    if value.dtype != want_dtype:
        if not np.can_cast(value.dtype, want_dtype, casting="same_kind"):
            raise ValueError(f"checkpoint: {path!r} is {np.dtype(want_dtype).name} here but "
                             f"{value.dtype.name} in the checkpoint")
        value = value.astype(want_dtype)
    if isinstance(leaf, Variable):
        if leaf._device is not None:       # a variable on a GPU gets the value in that device's memory
            value = backend_for_device(leaf._device).asarray(value)
        leaf.assign(value)
    else:
        leaf._checkpoint_write(value)


def _file(prefix):
    prefix = os.fspath(prefix)
    return prefix if prefix.endswith(SUFFIX) else prefix + SUFFIX


def _prefix(path):
    path = os.fspath(path)
    return path[:-len(SUFFIX)] if path.endswith(SUFFIX) else path


def read_index(path) -> dict:
    """The JSON index of the checkpoint at ``path`` (prefix or file): paths, shapes, dtypes."""
    with np.load(_file(path), allow_pickle=False) as data:
        return _load_index(data, path)


def list_variables(path) -> list:
    """(path, shape) of every value in the checkpoint at ``path`` (prefix or file), sorted by path,
    as ``tf.train.list_variables`` lists a TensorFlow checkpoint."""
    return [(name, tuple(entry["shape"])) for name, entry in sorted(read_index(path)["values"].items())]


def _load_index(data, path):
    if _INDEX not in data.files:
        raise ValueError(f"{_file(path)} is not a flowlab checkpoint (it has no index)")
    index = json.loads(bytes(data[_INDEX]).decode("utf-8"))
    if index.get("format") != FORMAT or index.get("version") != VERSION:
        raise ValueError(f"{_file(path)}: unknown checkpoint format {index.get('format')!r} "
                         f"version {index.get('version')!r}")
    return index


# -- Checkpoint ----------------------------------------------------------------------------------
class CheckpointLoadStatus:
    """What a restore matched. ``assert_consumed()`` checks that every saved value found an object
    and every object a value; ``assert_existing_objects_matched()`` only the second;
    ``expect_partial()`` says a partial match is intended."""

    def __init__(self, path, restored, unused, missing):
        self.path, self.restored = path, restored
        self.unused_values, self.missing_objects = sorted(unused), sorted(missing)

    def assert_consumed(self):
        if self.unused_values or self.missing_objects:
            raise AssertionError(
                f"checkpoint {self.path}: "
                + (f"saved values nothing here took: {self.unused_values}; " if self.unused_values else "")
                + (f"objects the checkpoint has no value for: {self.missing_objects}" if self.missing_objects else ""))
        return self

    def assert_existing_objects_matched(self):
        if self.missing_objects:
            raise AssertionError(f"checkpoint {self.path}: objects the checkpoint has no value for: "
                                 f"{self.missing_objects}")
        return self

    def expect_partial(self):
        return self

    def __repr__(self):
        return (f"<CheckpointLoadStatus {self.path}: {len(self.restored)} restored, "
                f"{len(self.unused_values)} unused, {len(self.missing_objects)} missing>")


class Checkpoint:
    """Saves and restores the variables of the objects given as keyword arguments.

    >>> import flowlab as fl, tempfile, os
    >>> w = fl.Variable([1.0, 2.0])
    >>> ckpt = fl.train.Checkpoint(weights=w)
    >>> path = ckpt.save(os.path.join(tempfile.mkdtemp(), "ckpt"))
    >>> os.path.basename(path)
    'ckpt-1'
    >>> _ = w.assign([0.0, 0.0])
    >>> _ = ckpt.restore(path).assert_consumed()
    >>> w.numpy().tolist()
    [1.0, 2.0]
    """

    def __init__(self, **objects):
        if not objects:
            raise ValueError("Checkpoint needs the objects to save as keyword arguments, e.g. "
                             "Checkpoint(model=model, optimizer=optimizer)")
        for name in objects:
            if "/" in name:
                raise ValueError(f"Checkpoint: names may not contain '/', got {name!r}")
        self._objects = dict(objects)
        self.save_counter = Variable(0, dtype=dtypes.int64, trainable=False, name="save_counter")

    def __getattr__(self, name):
        objects = self.__dict__.get("_objects", {})
        if name in objects:
            return objects[name]
        raise AttributeError(f"'Checkpoint' object has no attribute {name!r}")

    def _checkpoint_children(self):
        return {**self._objects, "save_counter": self.save_counter}

    def _values(self):
        graph = _Graph(self._checkpoint_children())
        values = {path: _read(leaf) for path, leaf in graph.leaves.items()}
        for path, _opt, _var, _name, value in graph.slots():
            values[path] = np.array(value)
        return values, graph.aliases

    def write(self, file_prefix) -> str:
        """Write a checkpoint to exactly ``file_prefix`` + ".npz" (atomically); returns the prefix."""
        values, aliases = self._values()
        index = {"format": FORMAT, "version": VERSION, "values": {}, "aliases": aliases}
        arrays = {}
        for i, (path, value) in enumerate(sorted(values.items())):
            key = f"v{i}"
            arrays[key] = value
            index["values"][path] = {"key": key, "shape": list(value.shape), "dtype": value.dtype.name}
        arrays[_INDEX] = np.frombuffer(json.dumps(index, indent=1, sort_keys=True).encode("utf-8"), dtype=np.uint8)
        buffer = io.BytesIO()
        np.savez(buffer, **arrays)
        atomic_write(_file(file_prefix), buffer.getvalue())
        return _prefix(file_prefix)

    def save(self, file_prefix) -> str:
        """Count one more save and write to ``file_prefix-N`` (N = ``save_counter``); returns that path.
        The directory's ``checkpoint`` state file then names it, so ``fl.train.latest_checkpoint(dir)``
        finds it (``write`` leaves the state file alone)."""
        self.save_counter.assign_add(1)
        return record_checkpoint(self.write(f"{_prefix(file_prefix)}-{int(self.save_counter)}"))

    def restore(self, save_path) -> CheckpointLoadStatus:
        """Assign every variable the value saved under its path. ``None`` (no checkpoint yet, e.g.
        ``manager.latest_checkpoint`` before the first save) restores nothing."""
        if save_path is None:
            return CheckpointLoadStatus(None, [], [], [])
        path = _file(save_path)
        if not os.path.exists(path):
            raise FileNotFoundError(f"no checkpoint at {path}")
        graph = _Graph(self._checkpoint_children())
        with np.load(path, allow_pickle=False) as data:
            index = _load_index(data, save_path)
            saved, aliases = index["values"], index.get("aliases", {})

            def lookup(p):
                entry = saved.get(p) or saved.get(aliases.get(p, ""))
                return None if entry is None else data[entry["key"]]

            restored, used, missing = [], set(), []
            for p, leaf in graph.leaves.items():
                value = lookup(p)
                if value is None:
                    missing.append(p)
                    continue
                _write(leaf, value, p)
                restored.append(p)
                used.add(p if p in saved else aliases[p])
            for opath, opt in graph.optimizers:   # slots, made now if the optimizer has not stepped yet
                prefix = f"{opath}/slots/"
                for p in saved:
                    if not p.startswith(prefix):
                        continue
                    vpath, _, name = p[len(prefix):].rpartition("/")
                    var = graph.leaves.get(vpath)
                    if var is None:
                        continue
                    opt._restore_slot(var, name, data[saved[p]["key"]])
                    restored.append(p)
                    used.add(p)
        unused = [p for p in saved if p not in used]
        return CheckpointLoadStatus(_prefix(save_path), restored, unused, missing)

    read = restore


# -- keeping the last N --------------------------------------------------------------------------
def _read_state(directory):
    path = os.path.join(directory, STATE_FILE)
    try:
        with open(path, encoding="utf-8") as f:
            state = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: not a readable checkpoint state file ({e})") from None
    return state


def _write_state(directory, kept):
    state = {"format": FORMAT, "latest": kept[-1] if kept else None, "all": kept}
    atomic_write(os.path.join(directory, STATE_FILE), json.dumps(state, indent=1).encode("utf-8"))


def record_checkpoint(path, max_to_keep=None) -> str:
    """Name the checkpoint at ``path`` (a prefix ``Checkpoint.write`` wrote) the newest of its
    directory in the ``checkpoint`` state file, so ``latest_checkpoint`` finds it; with
    ``max_to_keep``, delete the oldest recorded there beyond that many. Returns ``path``."""
    directory, name = os.path.split(os.path.abspath(_prefix(path)))
    try:
        state = _read_state(directory) or {}
    except ValueError:       # an unreadable state file is replaced, as TensorFlow does
        state = {}
    kept = [n for n in state.get("all", []) if n != name and os.path.exists(_file(os.path.join(directory, n)))]
    kept.append(name)
    dropped = kept[:-max_to_keep] if max_to_keep else []
    _write_state(directory, kept[len(dropped):])    # the new one is recorded before any old one goes
    for old in dropped:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(_file(os.path.join(directory, old)))
    return path


def latest_checkpoint(checkpoint_dir):
    """The path (prefix) of the newest checkpoint that ``Checkpoint.save`` or a ``CheckpointManager``
    wrote in ``checkpoint_dir`` (what ``Checkpoint.restore`` takes), or None if there is none."""
    state = _read_state(os.fspath(checkpoint_dir))
    if not state or not state.get("all"):
        return None
    prefix = os.path.join(os.fspath(checkpoint_dir), state["all"][-1])
    return prefix if os.path.exists(_file(prefix)) else None


class CheckpointManager:
    """Saves ``checkpoint`` into ``directory`` as ``<checkpoint_name>-<N>`` and keeps the newest
    ``max_to_keep`` (None: all). A manager made on a directory picks up the checkpoints kept there.

    >>> import flowlab as fl, tempfile
    >>> step = fl.Variable(0)
    >>> manager = fl.train.CheckpointManager(fl.train.Checkpoint(step=step), tempfile.mkdtemp(), max_to_keep=2)
    >>> for _ in range(3):
    ...     _ = step.assign_add(1); _ = manager.save()
    >>> [p.rsplit("/", 1)[-1] for p in manager.checkpoints]
    ['ckpt-2', 'ckpt-3']
    """

    def __init__(self, checkpoint, directory, max_to_keep=5, checkpoint_name="ckpt"):
        if max_to_keep is not None and (int(max_to_keep) != max_to_keep or max_to_keep < 1):
            raise ValueError(f"CheckpointManager: max_to_keep must be None or a whole number >= 1, got {max_to_keep!r}")
        self._checkpoint = checkpoint
        self.directory = os.fspath(directory)
        self.max_to_keep = max_to_keep
        self._name = checkpoint_name
        os.makedirs(self.directory, exist_ok=True)
        state = _read_state(self.directory) or {}
        self._kept = [n for n in state.get("all", []) if os.path.exists(_file(os.path.join(self.directory, n)))]
        for stray in os.listdir(self.directory):   # what a save killed half-way left behind
            if stray.startswith(".tmp-"):
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(self.directory, stray))

    @property
    def checkpoints(self) -> list:
        """The kept checkpoints' paths, oldest first."""
        return [os.path.join(self.directory, n) for n in self._kept]

    @property
    def latest_checkpoint(self):
        return self.checkpoints[-1] if self._kept else None

    def save(self, checkpoint_number=None) -> str:
        """Write a new checkpoint (numbered ``checkpoint_number``, else the checkpoint's save
        counter), record it, then delete the oldest beyond ``max_to_keep``. Returns its path."""
        ckpt = self._checkpoint
        if checkpoint_number is None:
            ckpt.save_counter.assign_add(1)
            number = int(ckpt.save_counter)
        else:
            number = int(checkpoint_number)
        name = f"{self._name}-{number}"
        path = ckpt.write(os.path.join(self.directory, name))
        kept = [n for n in self._kept if n != name] + [name]
        dropped = kept[:-self.max_to_keep] if self.max_to_keep is not None else []
        kept = kept[len(dropped):]
        self._write_state(kept)          # the new checkpoint is recorded before any old one goes
        self._kept = kept
        for old in dropped:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(_file(os.path.join(self.directory, old)))
        return path

    def _write_state(self, kept):
        _write_state(self.directory, kept)

    def restore_or_initialize(self):
        """Restore the latest checkpoint if there is one; returns its path, or None."""
        latest = self.latest_checkpoint
        if latest is not None:
            self._checkpoint.restore(latest)
        return latest

    def delete_all(self):
        """Delete every kept checkpoint and the state file."""
        for name in self._kept:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(_file(os.path.join(self.directory, name)))
        self._kept = []
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(self.directory, STATE_FILE))

    def __repr__(self):
        return f"<CheckpointManager {self.directory!r}: {len(self._kept)} kept, max_to_keep={self.max_to_keep}>"
