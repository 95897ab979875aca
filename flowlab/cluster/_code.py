"""Pickling code by value, so functions written in a notebook cell can run on a worker.

pickle saves a function by reference (module + name), which fails for a function defined in
``__main__`` (a notebook, a script), a lambda or a nested function: the worker cannot import it.
This Pickler saves such functions by value instead: the marshalled code object, the globals it
reads (each pickled in turn: modules by name, other notebook functions by value), its defaults and
its closure. Functions that can be imported travel by reference as usual. Classes are not sent by
value: a class defined in a notebook must move into a module the workers can import.

The marshalled code needs the same Python version on both sides (checked when loading).
"""
from __future__ import annotations

import builtins
import dis
import functools
import importlib
import marshal
import pickle
import sys
import types

_PY = sys.version_info[:2]
_GLOBAL_OPS = frozenset({"LOAD_GLOBAL", "STORE_GLOBAL", "DELETE_GLOBAL", "LOAD_NAME"})


class Pickler(pickle.Pickler):
    """pickle.Pickler that sends non-importable functions by value and modules by name."""

    def reducer_override(self, obj):
        if isinstance(obj, types.FunctionType) and not _importable(obj):
            return _reduce_function(obj)
        if isinstance(obj, types.ModuleType):
            return importlib.import_module, (obj.__name__,)
        return NotImplemented


def _importable(fn) -> bool:
    module, qualname = fn.__module__, fn.__qualname__
    if not module or module == "__main__" or "<" in qualname:
        return False
    obj = sys.modules.get(module)
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    return obj is fn


@functools.lru_cache(maxsize=1024)
def _global_names(code) -> tuple:
    names = set()
    for ins in dis.get_instructions(code):
        if ins.opname in _GLOBAL_OPS:
            names.add(ins.argval)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names.update(_global_names(const))
    return tuple(sorted(names))


def _reduce_function(fn):
    code = fn.__code__
    g = fn.__globals__
    globals_used = {n: g[n] for n in _global_names(code) if n in g and not _wraps_builtin(n, g[n])}
    cells = fn.__closure__ or ()
    closure = tuple(_cell_value(c) for c in cells)
    state = (globals_used, fn.__defaults__, fn.__kwdefaults__, closure, fn.__dict__ or None, fn.__doc__)
    skeleton_args = (_PY, marshal.dumps(code), fn.__name__, fn.__qualname__, fn.__module__, len(cells))
    return _skeleton, skeleton_args, state, None, None, _fill


def _wraps_builtin(name: str, value) -> bool:
    """IPython puts its own wrapper of a builtin (``open``) in a notebook's namespace; it is not
    importable, so it would travel by value with all its globals (7 KB for each function that calls
    ``open``). The worker has the real builtin: leave the name out, and the builtin is found there."""
    real = getattr(builtins, name, None)
    return real is not None and getattr(value, "__wrapped__", None) is real


def _cell_value(cell):
    try:
        return cell.cell_contents
    except ValueError:
        return _EMPTY_MARK


class _EmptyMark:
    def __reduce__(self):
        return _empty_mark, ()


def _empty_mark():
    return _EMPTY_MARK


_EMPTY_MARK = _EmptyMark()


def _skeleton(py, code_bytes, name, qualname, module, ncells):
    """A function with the code but nothing filled in yet (the state comes after, so functions
    that refer to themselves or to each other rebuild without endless recursion)."""
    if tuple(py) != _PY:
        raise RuntimeError(f"function {qualname!r} was sent from Python {py[0]}.{py[1]} but this "
                           f"worker runs Python {_PY[0]}.{_PY[1]}: the same version is needed on both sides")
    code = marshal.loads(code_bytes)
    g = {"__builtins__": builtins, "__name__": module}
    cells = tuple(types.CellType() for _ in range(ncells))
    fn = types.FunctionType(code, g, name, None, cells or None)
    fn.__qualname__ = qualname
    fn.__module__ = module
    return fn


def _fill(fn, state):
    globals_used, defaults, kwdefaults, closure, attrs, doc = state
    fn.__globals__.update(globals_used)
    fn.__defaults__, fn.__kwdefaults__, fn.__doc__ = defaults, kwdefaults, doc
    for cell, value in zip(fn.__closure__ or (), closure):
        if value is not _EMPTY_MARK:
            cell.cell_contents = value
    if attrs:
        fn.__dict__.update(attrs)
    return fn
