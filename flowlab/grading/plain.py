"""Plain data: the only thing that crosses from a student's code to the grader.

:func:`to_plain` turns an answer into a tagged, JSON-safe dict *without trusting it*: types are
tested with ``type(x) is ...`` (never ``isinstance``), so a float subclass, an ndarray subclass or an
object whose ``__eq__`` always says True is ``{"t": "object", "type": "module.Class"}``, and no method
of an unknown object is ever called. :func:`compare` compares two plain dicts (expected first) in the
grader's process: types exactly, arrays' dtypes and shapes, values within a tolerance, and names the
first difference ("at [1, 2]: expected 3.0, got 2.5").

>>> to_plain([1, 2.5])
{'t': 'list', 'v': [{'t': 'int', 'v': 1}, {'t': 'float', 'v': 2.5}]}
>>> compare(to_plain(3.0), to_plain(3))
(False, 'expected a float, got an int (3.0 vs 3)')
"""
from __future__ import annotations

import json
import math
import sys
from collections import Counter, OrderedDict, defaultdict

__all__ = ["to_plain", "compare", "render", "MAX_ELEMENTS", "MAX_DEPTH"]

MAX_ELEMENTS = 1_000_000     # numbers in one answer (all arrays and lists together)
MAX_DEPTH = 20               # nesting of lists, tuples and dicts
MAX_STR = 100_000            # characters in one string

_DICTS = (dict, OrderedDict, defaultdict, Counter)   # exact types whose items are read with dict.items
_NUMPY_SCALARS: dict = {}   # exact numpy scalar type -> "bool" / "int" / "float", filled on first use
_ARRAY_KINDS = "biuf"        # bool, signed, unsigned, float arrays carry numbers; "U" strings too


class _Refused(Exception):
    pass


def _type_name(cls) -> str:
    try:
        module = type.__getattribute__(cls, "__module__")
        name = type.__getattribute__(cls, "__qualname__")
        return name if module == "builtins" else f"{module}.{name}"
    except Exception:   # noqa: BLE001 - a metaclass that misbehaves: still an object
        return "?"


def _float(v: float):
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return v


def _numpy():
    """numpy if it is imported (no numpy value can exist before), filling the scalar table once.
    The comparing process imports it only for arrays: its start stays quick."""
    np = sys.modules.get("numpy")
    if np is not None and not _NUMPY_SCALARS:
        for name, kind in (("bool_", "bool"), ("float16", "float"), ("float32", "float"), ("float64", "float"),
                           ("int8", "int"), ("int16", "int"), ("int32", "int"), ("int64", "int"),
                           ("uint8", "int"), ("uint16", "int"), ("uint32", "int"), ("uint64", "int")):
            _NUMPY_SCALARS[getattr(np, name)] = kind
    return np


def _tensor_types():
    mod = sys.modules.get("flowlab.core.tensor")   # no flowlab tensor can exist before it is imported
    return (mod.Tensor, mod.Variable) if mod is not None else ()


def to_plain(value) -> dict:
    """``value`` as tagged plain data (see the module's docstring). Never raises and never calls a
    method of an object it does not know: an array over :data:`MAX_ELEMENTS` numbers, nesting deeper
    than :data:`MAX_DEPTH` or a string over :data:`MAX_STR` characters gives
    ``{"t": "refused", "why": "..."}``."""
    budget = [MAX_ELEMENTS]
    try:
        return _plain(value, 0, budget)
    except _Refused as e:
        return {"t": "refused", "why": str(e)}
    except RecursionError:
        return {"t": "refused", "why": f"nested deeper than {MAX_DEPTH} levels"}


def _spend(budget, n):
    budget[0] -= n
    if budget[0] < 0:
        raise _Refused(f"too large to check: more than {MAX_ELEMENTS:,} numbers in all")


def _plain(x, depth, budget):
    t = type(x)
    if x is None:
        return {"t": "none"}
    if t is bool:
        return {"t": "bool", "v": x}
    if t is int:
        _spend(budget, 1)
        return {"t": "int", "v": x}
    if t is float:
        _spend(budget, 1)
        return {"t": "float", "v": _float(x)}
    if t is str:
        if len(x) > MAX_STR:
            raise _Refused(f"a string of {len(x):,} characters is too long to check (at most {MAX_STR:,})")
        return {"t": "str", "v": x}
    np = _numpy()
    if np is not None and t in _NUMPY_SCALARS:   # np.float64(2.0) is a float for a learner; its subclasses are not
        _spend(budget, 1)
        kind = _NUMPY_SCALARS[t]
        v = x.item()
        return {"t": kind, "v": _float(float(v)) if kind == "float" else v}
    if np is not None and t is np.ndarray:
        return _array(x, "ndarray", budget)
    tensors = _tensor_types()
    if tensors and (t is tensors[0] or t is tensors[1]):
        arr = np.array(tensors[0].__array__(x))      # the Tensor class's own method, not an override
        return _array(arr, "tensor", budget)
    if t in (list, tuple, set, frozenset, *_DICTS):
        if depth >= MAX_DEPTH:
            raise _Refused(f"nested deeper than {MAX_DEPTH} levels")
        if t is list or t is tuple:
            items = list.__iter__(x) if t is list else tuple.__iter__(x)
            _spend(budget, len(x))
            return {"t": t.__name__, "v": [_plain(v, depth + 1, budget) for v in items]}
        if t is set or t is frozenset:
            _spend(budget, len(x))
            members = [_plain(v, depth + 1, budget) for v in (set.__iter__(x) if t is set else frozenset.__iter__(x))]
            members.sort(key=_key)
            return {"t": "set", "v": members}
        _spend(budget, len(x))
        return {"t": "dict", "v": [[_plain(k, depth + 1, budget), _plain(v, depth + 1, budget)]
                                   for k, v in dict.items(x)]}
    return {"t": "object", "type": _type_name(t)}


def _array(arr, tag: str, budget) -> dict:
    kind = arr.dtype.kind
    if kind not in _ARRAY_KINDS and kind != "U":
        return {"t": "object", "type": f"numpy.ndarray[{arr.dtype}]"}
    if arr.size > MAX_ELEMENTS:
        raise _Refused(f"an array of {arr.size:,} elements {list(arr.shape)} is too large to check "
                       f"(at most {MAX_ELEMENTS:,})")
    _spend(budget, int(arr.size))
    v = arr.tolist()
    if kind == "f" and not sys.modules["numpy"].isfinite(arr).all():
        v = _nonfinite(v)
    return {"t": tag, "dtype": str(arr.dtype), "shape": list(arr.shape), "v": v}


def _nonfinite(v):
    if isinstance(v, list):
        return [_nonfinite(i) for i in v]
    return _float(v)


def _key(plain) -> str:
    return json.dumps(plain, sort_keys=True)


# -- comparing --------------------------------------------------------------------------------
_ARTICLE = {"int": "an int", "float": "a float", "bool": "a bool", "str": "a str", "none": "None",
            "ndarray": "a numpy array", "tensor": "a flowlab Tensor", "list": "a list", "tuple": "a tuple",
            "dict": "a dict", "set": "a set", "object": "an object", "refused": "a value too large to check"}
_LOOSE = [{"int", "float"}, {"list", "tuple"}, {"ndarray", "tensor"}]


def _what(p) -> str:
    t = p.get("t") if isinstance(p, dict) else None
    if t == "object":
        return f"an object of type {p.get('type', '?')}"
    if t in ("ndarray", "tensor"):
        return f"{_ARTICLE[t]} {p.get('dtype')} of shape {tuple(p.get('shape', ()))}"
    return _ARTICLE.get(t, f"malformed data ({t!r})")


def _num(v, limit=4) -> str:   # 4 digits: a float32 sum's last digits differ between CPUs
    if isinstance(v, str):
        return v
    if isinstance(v, bool) or isinstance(v, int):
        return str(v)
    if not isinstance(v, float):
        return repr(v)
    text = format(v, f".{limit}g") if limit else repr(v)
    return text if any(c in text for c in ".einf") else text + ".0"


def _pair(e, r) -> tuple:
    """Two numbers as text, rounded unless rounding would make them look the same."""
    a, b = _num(e), _num(r)
    if a == b:
        a, b = _num(e, 0), _num(r, 0)
    return a, b


def render(plain, limit: int = 60) -> str:
    """A short Python-like text of a plain value (numbers rounded to 4 digits), cut at ``limit``
    characters: how a check shows inputs, expected and received values."""
    text = _render(plain)
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _render(p) -> str:
    t = p.get("t") if isinstance(p, dict) else None
    if t in ("int", "float"):
        return _num(p["v"])
    if t == "bool":
        return repr(p["v"])
    if t == "str":
        return repr(p["v"])
    if t == "none":
        return "None"
    if t in ("ndarray", "tensor"):
        return f"{'array' if t == 'ndarray' else 'tensor'}({_render_list(p['v'])}, {p['dtype']})"
    if t == "list":
        return "[" + ", ".join(_render(v) for v in p["v"][:50]) + "]"
    if t == "tuple":
        inner = ", ".join(_render(v) for v in p["v"][:50])
        return f"({inner},)" if len(p["v"]) == 1 else f"({inner})"
    if t == "set":
        return "{" + ", ".join(_render(v) for v in p["v"][:50]) + "}" if p["v"] else "set()"
    if t == "dict":
        return "{" + ", ".join(f"{_render(k)}: {_render(v)}" for k, v in p["v"][:50]) + "}"
    if t == "object":
        return f"<{p.get('type', '?')} object>"
    if t == "refused":
        return f"<not checkable: {p.get('why', '')}>"
    return "<malformed>"


def _render_list(v) -> str:
    if isinstance(v, list):
        return "[" + ", ".join(_render_list(i) for i in v[:50]) + (", …" if len(v) > 50 else "") + "]"
    return _num(v)


def compare(expected: dict, received: dict, rtol: float = 1e-6, atol: float = 0.0,
            loose_types: bool = False) -> tuple:
    """``(ok, why)``: whether plain ``received`` matches plain ``expected``. Types must match exactly
    (unless ``loose_types``: int and float, list and tuple, tensor and ndarray, arrays' dtypes), ints
    and bools exactly, floats within ``atol + rtol * |expected|``, NaN only where expected has NaN.
    ``why`` names the first difference, or is "" when they match. Never raises: malformed data fails."""
    try:
        return _cmp(expected, received, "", float(rtol), float(atol), bool(loose_types))
    except Exception as e:   # noqa: BLE001 - received data is untrusted: anything odd is a fail
        return False, f"{_where('')}could not compare: {type(e).__name__}: {e}"


def _where(path: str) -> str:
    return f"at {path}: " if path else ""


def _cmp(e, r, path, rtol, atol, loose):
    te, tr = e.get("t"), r.get("t")
    if te == "refused":
        return False, f"{_where(path)}the expected value cannot be checked: {e.get('why')}"
    if tr == "refused":
        return False, f"{_where(path)}your answer cannot be checked: {r.get('why')}"
    if te == "object":
        return False, f"{_where(path)}the expected value is {_what(e)}: checks compare plain values only"
    if tr == "object":
        return False, (f"{_where(path)}expected {_what(e)}, got {_what(r)}: only plain values are checked "
                       f"(numbers, strings, lists, tuples, dicts, numpy arrays, tensors)")
    if te != tr and not (loose and any({te, tr} <= pair for pair in _LOOSE)):
        extra = ""
        if {te, tr} <= {"int", "float", "bool"}:
            extra = f" ({_render(e)} vs {_render(r)})"
        elif {te, tr} == {"ndarray", "tensor"}:
            extra = " (call .numpy() on a tensor)" if te == "ndarray" else " (wrap it with fl.constant)"
        return False, f"{_where(path)}expected {_what(e)}, got {_what(r)}{extra}"
    if te in ("int", "float") or tr in ("int", "float"):
        return _cmp_number(e["v"], r["v"], te == "float" or tr == "float", path, rtol, atol)
    if te in ("bool", "str"):
        if type(r["v"]) is not type(e["v"]) or r["v"] != e["v"]:
            return False, f"{_where(path)}expected {_render(e)}, got {_render(r)}"
        return True, ""
    if te == "none":
        return True, ""
    if te in ("ndarray", "tensor"):
        return _cmp_array(e, r, path, rtol, atol, loose)
    if te in ("list", "tuple"):
        ev, rv = e["v"], r["v"]
        if len(ev) != len(rv):
            return False, f"{_where(path)}expected {len(ev)} items, got {len(rv)}"
        for i, (a, b) in enumerate(zip(ev, rv)):
            ok, why = _cmp(a, b, f"{path}[{i}]", rtol, atol, loose)
            if not ok:
                return ok, why
        return True, ""
    if te == "set":
        ek, rk = {_key(v): v for v in e["v"]}, {_key(v): v for v in r["v"]}
        missing = [ek[k] for k in ek if k not in rk]
        if missing:
            return False, f"{_where(path)}the set misses {_render(missing[0])}"
        extra = [rk[k] for k in rk if k not in ek]
        if extra:
            return False, f"{_where(path)}the set has {_render(extra[0])}, which is not expected"
        return True, ""
    if te == "dict":
        ek = {_key(k): (k, v) for k, v in e["v"]}
        rk = {_key(k): (k, v) for k, v in r["v"]}
        for key, (k, v) in ek.items():
            if key not in rk:
                return False, f"{_where(path)}missing key {_render(k)}"
            ok, why = _cmp(v, rk[key][1], f"{path}[{_render(k)}]", rtol, atol, loose)
            if not ok:
                return ok, why
        for key, (k, _v) in rk.items():
            if key not in ek:
                return False, f"{_where(path)}unexpected key {_render(k)}"
        return True, ""
    return False, f"{_where(path)}malformed data: tag {te!r}"


def _decode(v):
    if v == "nan":
        return math.nan
    if v == "inf":
        return math.inf
    if v == "-inf":
        return -math.inf
    return v


def _close(a: float, b: float, rtol: float, atol: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    if math.isinf(a) or math.isinf(b):
        return a == b
    return abs(a - b) <= atol + rtol * abs(a)


def _cmp_number(ev, rv, as_float, path, rtol, atol):
    if not as_float:
        if type(ev) is not int or type(rv) is not int:
            raise TypeError("an int tag without an int value")
        if ev != rv:
            return False, f"{_where(path)}expected {ev}, got {rv}"
        return True, ""
    a, b = _decode(ev), _decode(rv)
    if type(a) not in (int, float) or type(b) not in (int, float):
        raise TypeError("a number tag without a number")
    if _close(float(a), float(b), rtol, atol):
        return True, ""
    sa, sb = _pair(ev, rv)
    return False, f"{_where(path)}expected {sa}, got {sb}"


def _as_array(p):
    import numpy as np
    dtype = np.dtype(p["dtype"])
    if dtype.kind not in _ARRAY_KINDS and dtype.kind != "U":
        raise TypeError(f"unsupported dtype {dtype}")
    v = _nonfinite_decode(p["v"]) if dtype.kind == "f" else p["v"]
    arr = np.array(v, dtype=dtype)
    if list(arr.shape) != list(p["shape"]):
        raise ValueError(f"values of shape {list(arr.shape)} under a shape {p['shape']}")
    return arr


def _nonfinite_decode(v):
    if isinstance(v, list):
        return [_nonfinite_decode(i) for i in v]
    return _decode(v)


def _cmp_array(e, r, path, rtol, atol, loose):
    import numpy as np
    ea, ra = _as_array(e), _as_array(r)
    if ea.dtype != ra.dtype and not (loose and ea.dtype.kind in "biuf" and ra.dtype.kind in "biuf"):
        return False, f"{_where(path)}expected dtype {ea.dtype}, got {ra.dtype}"
    if ea.shape != ra.shape:
        return False, f"{_where(path)}expected shape {tuple(ea.shape)}, got {tuple(ra.shape)}"
    if ea.dtype.kind in "biuU" and ra.dtype.kind in "biuU":
        bad = ea != ra
    else:
        ef, rf = ea.astype(np.float64), ra.astype(np.float64)
        with np.errstate(invalid="ignore", over="ignore"):
            good = np.abs(ef - rf) <= atol + rtol * np.abs(ef)
        both_nan = np.isnan(ef) & np.isnan(rf)
        same_inf = np.isinf(ef) & (ef == rf)
        bad = ~(good | both_nan | same_inf)
    bad = np.asarray(bad)
    if not bad.any():
        return True, ""
    idx = tuple(int(i) for i in np.argwhere(bad)[0]) if bad.ndim else ()
    ev, rv = ea[idx].item(), ra[idx].item()
    sa, sb = _pair(_float(ev) if isinstance(ev, float) else ev, _float(rv) if isinstance(rv, float) else rv)
    n = int(bad.sum())
    where = f"{path}[{', '.join(map(str, idx))}]" if idx else path
    more = f" ({n} of {bad.size} elements differ)" if n > 1 else ""
    return False, f"{_where(where)}expected {sa}, got {sb}{more}"
