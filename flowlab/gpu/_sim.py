"""Run a CUDA C kernel on the CPU, every thread of it, and report what a learner needs: the results
(written into the numpy arrays passed, as a GPU writes device memory), out-of-bounds accesses with the
thread and the line, races on shared and global memory, barriers that not every thread reaches, and
how many loads and stores each array saw.

How it runs: ``_cparse.translate`` turns each ``__global__`` function into a Python generator run once
per thread; ``__syncthreads()`` is its ``yield``. Blocks run one after another. Within a block every
live thread is advanced until it reaches a barrier or returns (threads in x-fastest order); when all
of them wait at the same ``__syncthreads()`` the next phase begins. That is a legal schedule of the
kernel, so a correct kernel gives the GPU's results (up to float rounding; see ``_cparse``), and a
racy one is caught by the race detector even when this schedule happens to give the right answer.

Warps: threads are lanes ``linear thread index % 32`` of warp ``linear index // 32`` (threadIdx.x
fastest). A warp-level call (``__shfl_*_sync``, ``__ballot_sync``, ``__any_sync``, ``__all_sync``,
``__syncwarp``, ``__activemask``) is a ``yield`` of a request: the thread waits (``_Warps``) until every
thread its mask names has reached the same call, then all resume with their results; a named thread
that returned or waits elsewhere is a ``WarpSyncError`` naming the lanes and the line.

Coalescing (``simulate(..., transactions=True)``): the global loads/stores a warp makes at one access
site (same line, array and direction; a thread's k-th time there) form one request; the distinct
32-byte sectors it touches are what a GPU moves. ``report.coalescing()`` compares them with the ideal
(32 consecutive floats: 4 sectors). ``report._repr_html_`` shows the report as tables in a notebook.

    >>> import numpy as np
    >>> src = '''extern "C" __global__ void scale(float* x, float a, int n) {
    ...     int i = blockIdx.x * blockDim.x + threadIdx.x;
    ...     if (i < n) x[i] = a * x[i];
    ... }'''
    >>> x = np.arange(5, dtype=np.float32)
    >>> report = simulate(src, "scale", grid=1, block=8, args=[x, np.float32(2), 5])
    >>> x.tolist(), report.global_loads, report.ok
    ([0.0, 2.0, 4.0, 6.0, 8.0], {'x': 5}, True)
"""
from __future__ import annotations

import array
import functools
import html
import itertools
import math
import re
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from ._cparse import KernelSourceError, translate

__all__ = ["simulate", "SimReport", "Race", "KernelFault", "OutOfBoundsError", "RaceError",
           "DivergentBarrierError", "WarpSyncError", "KernelTimeoutError", "KernelArgumentError", "KernelSourceError",
           "parse_kernels", "DEFAULT_MAX_STEPS"]

DEFAULT_MAX_STEPS = 1_000_000      # loop iterations per launch, all threads together (about two seconds)
MAX_BLOCK_THREADS = 1024           # CUDA's limit per block
MAX_SHARED_BYTES = 48 * 1024       # per block, without opting in to more (cudaFuncSetAttribute)
WARP_SIZE = 32                     # threads that execute together (lanes 0..31, threadIdx.x fastest)
SECTOR_BYTES = 32                  # the unit in which global memory moves between DRAM/L2 and a warp


# -- errors ------------------------------------------------------------------------------------------
class KernelFault(RuntimeError):
    """A simulated kernel failed while running: ``kernel``, ``thread`` (threadIdx) and ``block``
    (blockIdx) as tuples, ``line`` and ``line_text`` of the source."""

    def __init__(self, message, kernel=None, thread=None, block=None, line=None, line_text=None, **extra):
        super().__init__(message)
        self.kernel, self.thread, self.block, self.line, self.line_text = kernel, thread, block, line, line_text
        for k, v in extra.items():
            setattr(self, k, v)


class OutOfBoundsError(KernelFault):
    """A load or store outside its array (a GPU reports an illegal address, or silently reads
    someone else's memory). ``array``, ``index`` (flat), ``size``; ``index_nd`` for arrays of 2-3 dims."""


class RaceError(KernelFault):
    """Two threads touched one element in the same barrier interval, at least one writing
    (raised at the first race with ``simulate(..., races="raise")``); ``race`` is the Race."""


class DivergentBarrierError(KernelFault):
    """Some threads of a block wait at a ``__syncthreads()`` that others never reach."""


class WarpSyncError(DivergentBarrierError):
    """A warp-level call (``__shfl_down_sync`` & co, ``__syncwarp``) that not every thread named in
    its mask reaches (one returned, or waits at another call), or that a thread calls with a mask
    leaving itself out. ``warp`` (index in the block), ``mask``, ``lanes`` (the lanes at fault)."""


class KernelTimeoutError(KernelFault):
    """The launch ran more loop iterations than its budget (``max_steps``): an endless loop?"""


class KernelArgumentError(KernelFault, TypeError):
    """The launch does not fit the kernel: argument count or types, grid or block sizes."""


class Race(NamedTuple):
    """A data race: ``array`` name, ``index`` of one element involved, ``kind`` ("write-write" or
    "read-write"), ``first`` and ``second`` accesses as (blockIdx, threadIdx, line)."""
    array: str
    index: object
    kind: str
    first: tuple
    second: tuple


class _Raise(Exception):
    """Raised inside a running thread; the executor adds the thread and the line, then raises ``cls``."""

    def __init__(self, cls, detail, line=None, **extra):
        super().__init__(detail)
        self.cls, self.detail, self.line, self.extra = cls, detail, line, extra


# -- memory ------------------------------------------------------------------------------------------
_FORMATS = {"float": "f", "double": "d", "int": "i", "unsigned int": "I", "long": "q", "unsigned long": "Q",
            "long long": "q", "unsigned long long": "Q", "short": "h", "unsigned short": "H",
            "char": "b", "signed char": "b", "unsigned char": "B", "bool": "?"}
_DTYPES = {"float": ("float32",), "double": ("float64",), "int": ("int32",), "unsigned int": ("uint32",),
           "long": ("int64",), "unsigned long": ("uint64",), "long long": ("int64",),
           "unsigned long long": ("uint64",), "short": ("int16",), "unsigned short": ("uint16",),
           "char": ("int8", "uint8"), "signed char": ("int8",), "unsigned char": ("uint8",), "bool": ("bool",)}


class _Buffer:
    """One array's memory (a memoryview on the caller's numpy array, or shared/local memory), its
    access counts and, for global and shared memory, what the race detector remembers per element:
    the last writer and the first and last readers, as (thread, phase, line)."""
    __slots__ = ("name", "space", "mem", "size", "itemsize", "dims", "ctype", "loads", "stores",
                 "writer", "readers", "launch", "tx")

    def __init__(self, name, space, mem, ctype, dims, launch):
        self.name, self.space, self.mem, self.ctype, self.launch = name, space, mem, ctype, launch
        self.size, self.dims = len(mem), dims
        self.itemsize = mem.itemsize
        self.loads = self.stores = 0
        watch = space != "local" and launch is not None and launch.races != "off"
        self.writer, self.readers = ({}, {}) if watch else (None, None)
        # coalescing: per direction (0 loads, 1 stores), (warp, line, occurrence) -> element indices
        self.tx = ({}, {}) if space == "global" and launch is not None and launch.transactions else None

    def oob(self, k, what, line, index_nd=None):
        shown = "[" + "][".join(map(str, index_nd)) + "]" if index_nd else f"[{k}]"
        shape = "[" + "][".join(map(str, self.dims)) + "]" if index_nd else f" has {self.size} elements"
        valid = f"valid indices 0..{self.size - 1}" if self.size else (
            "it is empty: pass simulate(..., shared_mem=bytes) for extern __shared__" if self.space == "shared" else "it is empty")
        detail = (f"{what} {self.name}{shown} is out of bounds: {self.space} array {self.name}{shape} ({valid})"
                  if not index_nd else f"{what} {self.name}{shown} is out of bounds: it is declared {self.name}{shape}")
        return _Raise(OutOfBoundsError, detail, line, array=self.name, index=k, size=self.size,
                      index_nd=tuple(index_nd) if index_nd else None)

    def read(self, t, k, line):
        ph = self.launch.phase
        w = self.writer.get(k)
        if w is not None and (w[0].blk != t.blk or (w[1] == ph and w[0] is not t)):
            self.launch.race(self, k, "read-write", w, (t, ph, line))
        r = self.readers.get(k)
        if r is None or (r[0][0].blk == t.blk and (r[0][1] != ph or r[0][0] is t)):
            self.readers[k] = [(t, ph, line), (t, ph, line)]
        else:
            r[1] = (t, ph, line)

    def write(self, t, k, line):
        ph = self.launch.phase
        w = self.writer.get(k)
        if w is not None and (w[0].blk != t.blk or (w[1] == ph and w[0] is not t)):
            self.launch.race(self, k, "write-write", w, (t, ph, line))
        r = self.readers.get(k)
        if r is not None:
            for x in r:
                if x[0].blk != t.blk or (x[1] == ph and x[0] is not t):
                    self.launch.race(self, k, "read-write", x, (t, ph, line))
                    break
        self.writer[k] = (t, ph, line)

    def nd(self, k):
        """Flat index -> the index per dimension."""
        out = []
        for d in reversed(self.dims):
            out.append(k % d)
            k //= d
        return tuple(reversed(out))


class _Ptr:
    """A pointer: a buffer and an element offset. C's pointer arithmetic moves the offset."""
    __slots__ = ("buf", "off")

    def __init__(self, buf, off=0):
        self.buf, self.off = buf, off

    def __add__(self, k):
        if isinstance(k, _Ptr):
            raise _Raise(KernelFault, "cannot add two pointers")
        return _Ptr(self.buf, self.off + k)

    __radd__ = __add__

    def __sub__(self, k):
        if isinstance(k, _Ptr):
            if k.buf is not self.buf:
                raise _Raise(KernelFault, f"subtracting pointers into different arrays ({self.buf.name}, {k.buf.name})")
            return self.off - k.off
        return _Ptr(self.buf, self.off - k)

    def __repr__(self):
        return f"&{self.buf.name}[{self.off}]"


def _ld(t, p, i, line):
    b = p.buf
    k = p.off + i
    if k < 0 or k >= b.size:
        raise b.oob(k, "reading", line)
    b.loads += 1
    if b.writer is not None:
        b.read(t, k, line)
    if b.tx is not None:
        _note(b, b.tx[0], t, k, line)
    return b.mem[k]


def _note(b, groups, t, k, line):
    """Remember global access ``b[k]`` for coalescing: the k-th time a thread runs one access site
    (here: the line, the array and the direction) it meets the other threads of its warp there, as the
    warp executes that instruction together."""
    key = (b.name, line, groups is b.tx[1])
    occ = t.occ
    n = occ.get(key, 0)
    occ[key] = n + 1
    g = (t.warp, line, n)
    elems = groups.get(g)
    if elems is None:
        groups[g] = {k}
    else:
        elems.add(k)


def _st(t, p, i, v, line):
    b = p.buf
    k = p.off + i
    if k < 0 or k >= b.size:
        raise b.oob(k, "writing", line)
    b.stores += 1
    if b.writer is not None:
        b.write(t, k, line)
    if b.tx is not None:
        _note(b, b.tx[1], t, k, line)
    try:
        b.mem[k] = v
    except (TypeError, ValueError) as e:
        raise _Raise(KernelFault, f"cannot store {v!r} into {b.name} ({b.ctype}): "
                     + ("the array is read-only" if b.mem.readonly else f"{e} (integer overflow?)"), line) from None
    return v


def _flat(b, idx, what, line):
    k = 0
    for i, d in zip(idx, b.dims):
        if i < 0 or i >= d:
            raise b.oob(None, what, line, idx)
        k = k * d + i
    return k


def _ldn(t, p, idx, line):
    b = p.buf
    k = _flat(b, idx, "reading", line)
    b.loads += 1
    if b.writer is not None:
        b.read(t, k, line)
    return b.mem[k]


def _stn(t, p, idx, v, line):
    return _st(t, _Ptr(p.buf), _flat(p.buf, idx, "writing", line), v, line)


def _addr(p, i):
    return p + i


def _addrn(p, idx):
    k = 0
    for i, d in zip(idx, p.buf.dims):
        k = k * d + i
    return _Ptr(p.buf, k)


def _incdec(t, p, i, delta, post, line):
    old = _ld(t, p, i, line)
    new = _wrap_to(p.buf.ctype, old + delta)
    _st(t, p, i, new, line)
    return old if post else new


def _wrap_to(ctype, v):
    if ctype.kind != "i" or ctype.name == "bool":
        return v
    m = (1 << ctype.bits) - 1
    v &= m
    return v - (1 << ctype.bits) if ctype.signed and v >> (ctype.bits - 1) else v


def _atomic(t, op, p, *rest):
    """atomicAdd & co: read, modify, write as one step, returning the old value. They are never
    reported as races (that is what they are for); each counts as one load and one store."""
    *values, line = rest
    b, k = p.buf, p.off
    if k < 0 or k >= b.size:
        raise b.oob(k, f"atomic{op.capitalize()} on", line)
    old = b.mem[k]
    v = values[0]
    if op == "add":
        new = old + v
    elif op == "sub":
        new = old - v
    elif op == "max":
        new = max(old, v)
    elif op == "min":
        new = min(old, v)
    elif op == "exch":
        new = v
    elif op == "cas":
        new = values[1] if old == v else old
    elif op == "and":
        new = old & v
    elif op == "or":
        new = old | v
    else:
        new = old ^ v
    b.mem[k] = _wrap_to(b.ctype, new)
    b.loads += 1
    b.stores += 1
    return old


def _local(t, name, tname, dims, init):
    """A thread's local array. Its elements start as NaN (floats) or 0: a GPU gives garbage."""
    from ._cparse import _T
    ctype = _T[tname]
    size = math.prod(dims)
    buf = _Buffer(name, "local", _new_memory(ctype, size), ctype, dims, None)
    for k, v in enumerate(init or ()):
        buf.mem[k] = v
    if init is not None:
        for k in range(len(init), size):
            buf.mem[k] = 0
    return _Ptr(buf)


def _new_memory(ctype, size):
    fmt = _FORMATS[ctype.name]
    if fmt == "?":
        return memoryview(bytearray(size)).cast("?")
    fill = math.nan if ctype.kind == "f" else 0
    return memoryview(array.array(fmt, [fill]) * size)


def _pcmp(a, op, b):
    """Pointer comparison: by offset within one array; pointers into different arrays are unequal."""
    if a is None or b is None or a.buf is not b.buf:
        if op in ("==", "!="):
            return (a is b) == (op == "==")
        raise _Raise(KernelFault, f"comparing pointers into different arrays with '{op}' (undefined in C)")
    return {"==": a.off == b.off, "!=": a.off != b.off, "<": a.off < b.off, ">": a.off > b.off,
            "<=": a.off <= b.off, ">=": a.off >= b.off}[op]


# -- arithmetic and math with C's behaviour ----------------------------------------------------------
_F32 = memoryview(array.array("f", [0.0]))


def _f32(v):
    """Round to float32 (inf when out of range), as storing into a C float does."""
    _F32[0] = v
    return _F32[0]


def _idiv(a, b):
    if b == 0:
        raise _Raise(KernelFault, f"integer division by zero ({a} / 0)")
    q = abs(a) // abs(b)
    return q if (a < 0) == (b < 0) else -q


def _imod(a, b):
    if b == 0:
        raise _Raise(KernelFault, f"integer remainder by zero ({a} % 0)")
    return a - b * _idiv(a, b)


def _fdiv(a, b):
    try:
        return a / b
    except ZeroDivisionError:
        if a != a or a == 0:
            return math.nan
        return math.copysign(math.inf, a) * math.copysign(1.0, b)


def _f2i(v):
    try:
        return int(v)
    except (ValueError, OverflowError):
        raise _Raise(KernelFault, f"converting {v} to an integer (undefined in C)") from None


def _safe(fn, overflow=math.inf, domain=math.nan):
    def call(*args):
        try:
            return fn(*args)
        except OverflowError:
            return overflow
        except (ValueError, ZeroDivisionError):
            return domain
    return call


def _log(x):
    if x == 0:
        return -math.inf
    return math.log(x) if x > 0 else (x if x != x else math.nan)


def _rsqrt(x):
    return math.inf if x == 0 else _safe(lambda v: 1.0 / math.sqrt(v))(x)


def _fmax(a, b):
    return b if a != a else a if b != b else max(a, b)


def _fmin(a, b):
    return b if a != a else a if b != b else min(a, b)


def _rounder(fn):
    return lambda x: float(fn(x)) if math.isfinite(x) else x


def _pow(a, b):
    try:
        return math.pow(a, b)
    except OverflowError:
        return math.inf
    except (ValueError, ZeroDivisionError):
        return math.inf if a == 0 else math.nan


_C_FORMAT = re.compile(r"%([-+ #0]*\d*(?:\.\d+)?)(hh|h|ll|l|z|j|t)?([diouxXeEfgGcsp%])")


def _printf(fmt=None, *args):
    """printf, as a GPU prints it (each thread's line; no order promised between threads)."""
    text = _C_FORMAT.sub(lambda m: "%%" if m.group(3) == "%" else
                         "%" + m.group(1) + {"u": "d", "i": "d", "p": "s", "c": "c"}.get(m.group(3), m.group(3)),
                         fmt or "")
    print(text % tuple(args), end="")
    return len(args)


def _assert(ok):
    if not ok:
        raise _Raise(KernelFault, "assert() failed")
    return 0


def _timeout():
    raise _Raise(KernelTimeoutError, "")


_RUNTIME = {
    "_ld": _ld, "_st": _st, "_ldn": _ldn, "_stn": _stn, "_addr": _addr, "_addrn": _addrn, "_incdec": _incdec,
    "_atomic": _atomic, "_local": _local, "_pcmp": _pcmp, "_f32": _f32, "_idiv": _idiv, "_imod": _imod,
    "_fdiv": _fdiv, "_f2i": _f2i, "_printf": _printf, "_assert": _assert, "_timeout": _timeout,
    "_inf": math.inf, "_nan": math.nan,
    "_exp": _safe(math.exp), "_log": _log, "_sqrt": _safe(math.sqrt), "_rsqrt": _rsqrt, "_fmax": _fmax,
    "_fmin": _fmin, "_pow": _pow, "_tanh": math.tanh, "_sin": _safe(math.sin), "_cos": _safe(math.cos),
    "_tan": _safe(math.tan), "_atan": math.atan, "_floor": _rounder(math.floor), "_ceil": _rounder(math.ceil),
    "_round": _rounder(lambda x: math.floor(abs(x) + 0.5) * (1 if x >= 0 else -1)),
    "_trunc": _rounder(math.trunc), "_fma": lambda a, b, c: a * b + c, "_fmod": _safe(math.fmod),
    "_log2": lambda x: _log(x) / math.log(2) if x > 0 else _log(x), "_exp2": _safe(lambda x: 2.0 ** x),
    "_erf": math.erf, "_log1p": _safe(math.log1p, domain=math.nan), "_expm1": _safe(math.expm1),
    "_isnan": math.isnan, "_isinf": math.isinf, "_isfinite": math.isfinite,
}


# -- the compiled program ----------------------------------------------------------------------------
_PROGRAM_IDS = itertools.count()


@functools.lru_cache(maxsize=64)
def _compiled(source: str):
    """(Program, its namespace, the file name its Python runs under: tracebacks find C lines by it)."""
    program = translate(source)
    filename = f"<cuda-sim {next(_PROGRAM_IDS)}>"
    namespace = dict(_RUNTIME)
    exec(compile(program.python, filename, "exec"), namespace)
    return program, namespace, filename


def parse_kernels(source: str) -> dict:
    """The ``__global__`` functions of ``source`` and their parameters, for launchers and graders:
    ``{name: [(param name, C type name, is_pointer)]}``.

    >>> parse_kernels('extern "C" __global__ void add(const float* a, float* b, int n) {}')
    {'add': [('a', 'float', True), ('b', 'float', True), ('n', 'int', False)]}
    """
    return {name: [(p, t.name, bool(t.ptr)) for p, t in k.params]
            for name, k in translate(source).kernels.items()}


# -- the report --------------------------------------------------------------------------------------
@dataclass
class SimReport:
    """What one simulated launch did. Counts are per array (the kernel's parameter names, and its
    __shared__ arrays' names): ``global_loads``/``global_stores``, ``shared_loads``/``shared_stores``;
    ``global_bytes`` counts both directions. ``races`` lists each race once per (array, kind, lines)."""
    kernel: str
    grid: tuple
    block: tuple
    threads: int = 0
    blocks: int = 0
    barriers: int = 0
    global_loads: dict = field(default_factory=dict)
    global_stores: dict = field(default_factory=dict)
    shared_loads: dict = field(default_factory=dict)
    shared_stores: dict = field(default_factory=dict)
    global_bytes: int = 0
    races: list = field(default_factory=list)
    source_lines: list = field(default_factory=list, repr=False)
    transactions: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.races

    def coalescing(self) -> str:
        """A table of how well each global array's accesses coalesce: warp-level ``requests``, the
        32-byte ``sectors`` they moved, sectors per request, and the ideal per request for the same
        elements side by side (4 when 32 threads read 32 consecutive floats). More sectors than the
        ideal means the warp's threads read far-apart addresses (a stride): memory moves bytes
        nobody uses, and the kernel runs slower on a GPU."""
        if not self.transactions:
            return f"{self.kernel}: no global memory transactions counted (simulate(..., transactions=True))"
        rows = [f"{self.kernel}: global memory per warp request (32 threads, one access site, 32-byte sectors)",
                f"  {'array':<12} {'requests':>8} {'sectors':>8} {'per req':>8} {'ideal':>6}  verdict"]
        for name, c in self.transactions.items():
            if not c["requests"]:
                continue
            sectors = c["loads"] + c["stores"]
            rows.append(f"  {name:<12} {c['requests']:>8} {sectors:>8} {sectors / c['requests']:>8.1f} "
                        f"{c['ideal'] / c['requests']:>6.1f}  {_verdict(c)}")
        return "\n".join(rows)

    def __str__(self):
        rows = [f"{self.kernel}<<<{_dim_text(self.grid)}, {_dim_text(self.block)}>>>: {_count(self.blocks, 'block')}, "
                f"{_count(self.threads, 'thread')}, {_count(self.barriers, 'barrier phase')}, "
                f"{self.global_bytes} bytes of global memory",
                f"  {'array':<12} {'memory':<7} {'loads':>8} {'stores':>8}"]
        for space, loads, stores in (("global", self.global_loads, self.global_stores),
                                     ("shared", self.shared_loads, self.shared_stores)):
            for name in loads:
                rows.append(f"  {name:<12} {space:<7} {loads[name]:>8} {stores[name]:>8}")
        if not self.races:
            rows.append("  races: none")
        for r in self.races:
            rows.append(f"  RACE ({r.kind}) on {r.array}{_index_text(r.index)}: " + _access_text(r.first, self.source_lines)
                        + "  and  " + _access_text(r.second, self.source_lines))
        return "\n".join(rows)

    def _repr_pretty_(self, p, cycle):
        p.text(str(self))

    def _repr_html_(self):
        """The report as HTML tables for a notebook (no JavaScript): what ``str`` shows, the
        coalescing columns when counted, and each race with both threads and both lines."""
        esc = html.escape
        counted = bool(self.transactions)
        head = ["array", "memory", "loads", "stores"] + (
            ["requests", "sectors", "sectors/request", "ideal", "verdict"] if counted else [])
        rows = []
        for space, loads, stores in (("global", self.global_loads, self.global_stores),
                                     ("shared", self.shared_loads, self.shared_stores)):
            for name in loads:
                cells = [name, space, loads[name], stores[name]]
                c = self.transactions.get(name) if space == "global" else None
                if counted and c and c["requests"]:
                    sectors = c["loads"] + c["stores"]
                    cells += [c["requests"], sectors, f"{sectors / c['requests']:.1f}",
                              f"{c['ideal'] / c['requests']:.1f}", _verdict(c)]
                elif counted:
                    cells += [""] * 5
                rows.append(cells)
        out = [f"<div class=\"flowlab-simreport\"><p><code>{esc(str(self).split(chr(10))[0])}</code></p>",
               _html_table(head, rows)]
        if not self.races:
            out.append("<p>races: none</p>")
        else:
            race_rows = []
            for r in self.races:
                first, second = ([f"threadIdx={a[1]} blockIdx={a[0]}", f"line {a[2]}: {_line_text(self.source_lines, a[2])}"]
                                 for a in (r.first, r.second))
                race_rows.append([r.kind, f"{r.array}{_index_text(r.index)}"] + first + second)
            out.append(f"<p><b>{len(self.races)} race(s)</b></p>")
            out.append(_html_table(["race", "element", "first thread", "its line", "second thread", "its line"],
                                   race_rows, code_columns=(3, 5)))
        out.append("</div>")
        return "\n".join(out)


def _html_table(head, rows, code_columns=()):
    """An HTML table: a header row, then one row per list of cells (``code_columns`` as <code>)."""
    def cells(row, tag):
        return "".join(f"<{tag}>" + (f"<code>{html.escape(str(v))}</code>" if tag == "td" and i in code_columns
                                     else html.escape(str(v))) + f"</{tag}>" for i, v in enumerate(row))
    return ("<table>\n<tr>" + cells(head, "th") + "</tr>\n"
            + "".join("<tr>" + cells(row, "td") + "</tr>\n" for row in rows) + "</table>")


def _verdict(c):
    sectors = c["loads"] + c["stores"]
    if sectors <= c["ideal"]:
        return "broadcast (one element per warp)" if c["elements"] == c["requests"] else "coalesced"
    return f"strided: {sectors / c['ideal']:.1f}x the sectors needed"


def _count(n, what):
    return f"{n} {what}" if n == 1 else f"{n} {what}s"


def _dim_text(d):
    return str(d[0]) if d[1:] == (1, 1) else "(" + ", ".join(map(str, d)) + ")"


def _index_text(index):
    return "[" + "][".join(map(str, index)) + "]" if isinstance(index, tuple) else f"[{index}]"


def _access_text(access, lines):
    block, thread, line = access
    return f"threadIdx={thread} blockIdx={block} line {line}: {_line_text(lines, line)}"


def _line_text(lines, line):
    return lines[line - 1].strip() if line and 0 < line <= len(lines) else "?"


# -- the launch --------------------------------------------------------------------------------------
class _Thread:
    """One thread's coordinates, as the translated code reads them (``_t.tx`` is threadIdx.x)."""
    __slots__ = ("tx", "ty", "tz", "bx", "by", "bz", "bdx", "bdy", "bdz", "gdx", "gdy", "gdz",
                 "blk", "shared", "budget", "lane", "warp", "occ")

    def ids(self):
        return (self.tx, self.ty, self.tz), (self.bx, self.by, self.bz)


class _Launch:
    """State shared by all threads of a launch: the barrier phase, the races found, the step budget."""
    transactions = False           # count coalescing (simulate(..., transactions=True))

    def __init__(self, kernel, races, lines):
        self.kernel, self.races, self.lines = kernel, races, lines
        self.phase = 0
        self.found, self.seen = [], set()

    def race(self, buf, k, kind, first, second):
        key = (buf.name, kind, first[2], second[2])
        if key in self.seen:
            return
        self.seen.add(key)
        index = buf.nd(k) if buf.dims and len(buf.dims) > 1 else k
        t1, t2 = first[0], second[0]
        race = Race(buf.name, index, kind, (t1.ids()[1], t1.ids()[0], first[2]), (t2.ids()[1], t2.ids()[0], second[2]))
        self.found.append(race)
        if self.races == "raise":
            where = "threads of different blocks" if t1.blk != t2.blk else "two threads between the same barriers"
            raise _Raise(RaceError, f"{kind} race on {buf.space} {buf.name}{_index_text(index)} by {where}: "
                         f"{_access_text(race.first, self.lines)}  and  {_access_text(race.second, self.lines)}",
                         second[2], race=race)


def _dim3(value, what):
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        dims = (int(value),)
    elif isinstance(value, (tuple, list)) and 1 <= len(value) <= 3 and all(
            isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in value):
        dims = tuple(int(v) for v in value)
    else:
        raise KernelArgumentError(f"{what} must be an int or a tuple of 1 to 3 ints, not {value!r}")
    dims = dims + (1,) * (3 - len(dims))
    if min(dims) < 1:
        raise KernelArgumentError(f"{what}={value!r}: every dimension must be at least 1")
    return dims


def _bind(kernel, args, launch):
    """Check the arguments against the kernel's parameters (as CuPy would pass them) and make the
    values the translated code takes: a pointer for each array, a Python number for each scalar."""
    name = kernel.name
    if not isinstance(args, (list, tuple)):
        raise KernelArgumentError(f"{name}: args must be a list or tuple of the kernel's arguments")
    if len(args) != len(kernel.params):
        sig = ", ".join(f"{t} {p}" for p, t in kernel.params)
        raise KernelArgumentError(f"{name} takes {len(kernel.params)} arguments ({sig}), but {len(args)} were given")
    values, buffers = [], []
    for (pname, ctype), arg in zip(kernel.params, args):
        where = f"{name}: argument '{pname}' ({ctype})"
        if ctype.ptr:
            if not isinstance(arg, np.ndarray):
                hint = " (the simulator runs on the CPU: pass numpy arrays, e.g. cupy.asnumpy(x))" \
                    if type(arg).__module__.startswith("cupy") else ""
                raise KernelArgumentError(f"{where} needs a numpy array, not {type(arg).__name__}{hint}")
            elem = ctype.element()
            if elem.kind == "v":
                raise KernelArgumentError(f"{where}: void* parameters are not supported; give the element type")
            if arg.dtype.name not in _DTYPES[elem.name]:
                raise KernelArgumentError(f"{where} needs an array of {' or '.join(_DTYPES[elem.name])}, "
                                          f"not {arg.dtype}: convert it with .astype(np.{_DTYPES[elem.name][0]})")
            if not arg.flags.c_contiguous:
                raise KernelArgumentError(f"{where}: the array is not contiguous (a kernel sees raw memory); "
                                          "pass np.ascontiguousarray(x)")
            mem = memoryview(arg).cast("B").cast(_FORMATS[elem.name]) if arg.size else memoryview(b"").cast(_FORMATS[elem.name])
            buf = _Buffer(pname, "global", mem, elem, None, launch)
            buffers.append(buf)
            values.append(_Ptr(buf))
        else:
            values.append(_scalar(where, ctype, arg))
    return values, buffers


def _scalar(where, ctype, arg):
    if isinstance(arg, np.ndarray) or (not isinstance(arg, np.generic) and (
            hasattr(arg, "__array_interface__") or hasattr(arg, "__cuda_array_interface__"))):
        raise KernelArgumentError(f"{where} is a scalar, but an array was given")
    if ctype.kind == "f":
        want = np.float32 if ctype.bits == 32 else np.float64
        if isinstance(arg, np.floating) and type(arg) is want:
            return float(arg)
        if ctype.bits == 64 and isinstance(arg, float):
            return float(arg)
        hint = (" CuPy passes a Python float as a double and an int as a long long, so the kernel would read "
                "the wrong bytes") if ctype.bits == 32 else " CuPy would pass the wrong bytes"
        raise KernelArgumentError(f"{where} needs np.{want.__name__}(...), not {type(arg).__name__} {arg!r}:{hint}")
    if isinstance(arg, (bool, np.bool_)):
        return int(arg) if ctype.name != "bool" else bool(arg)
    if isinstance(arg, np.integer) and arg.dtype.itemsize * 8 < ctype.bits:
        raise KernelArgumentError(f"{where} is {ctype.bits} bits, but a {arg.dtype} was given: CuPy would pass "
                                  "too few bytes; pass a Python int")
    if not isinstance(arg, (int, np.integer)):
        raise KernelArgumentError(f"{where} needs an integer, not {type(arg).__name__} {arg!r}")
    value = int(arg)
    lo, hi = (-(1 << (ctype.bits - 1)), (1 << (ctype.bits - 1)) - 1) if ctype.signed else (0, (1 << ctype.bits) - 1)
    if ctype.name == "bool":
        lo, hi = 0, 1
    if not lo <= value <= hi:
        raise KernelArgumentError(f"{where}: {value} does not fit in {ctype.name} ({lo}..{hi})")
    return bool(value) if ctype.name == "bool" else value


def simulate(source: str, name: str, grid, block, args, *, shared_mem: int = 0, races: str = "report",
             max_threads: int = 65536, max_steps: int = DEFAULT_MAX_STEPS, transactions: bool = False) -> SimReport:
    """Run kernel ``name`` of CUDA C ``source`` on the CPU with every thread of ``grid`` x ``block``.
    Arrays in ``args`` are numpy arrays; the kernel writes into them in place. ``shared_mem``: bytes of
    dynamic shared memory (``extern __shared__``) per block. ``races``: "report" (in the report),
    "raise" (RaceError at the first) or "off" (faster). ``max_threads`` refuses big launches (the
    simulator is for small sizes); ``max_steps`` bounds loop iterations (KernelTimeoutError).
    ``transactions=True`` counts the 32-byte sectors each warp's global loads and stores touch
    (``report.transactions``, ``report.coalescing()``); it is off by default because it makes a
    kernel that works in global memory about twice as slow to simulate.

    Raises OutOfBoundsError, DivergentBarrierError, KernelTimeoutError, RaceError (all KernelFault)
    while running, KernelArgumentError for a launch that does not fit, KernelSourceError for source
    the simulator cannot read."""
    if races not in ("report", "raise", "off"):
        raise ValueError(f"races must be 'report', 'raise' or 'off', not {races!r}")
    program, namespace, filename = _compiled(source)
    if name not in program.kernels:
        raise KernelArgumentError(f"no __global__ function named {name!r} in this source; it has: "
                                  + (", ".join(program.kernels) or "none"))
    kernel = program.kernels[name]
    grid3, block3 = _dim3(grid, "grid"), _dim3(block, "block")
    per_block, nblocks = math.prod(block3), math.prod(grid3)
    if per_block > MAX_BLOCK_THREADS or block3[2] > 64:
        raise KernelArgumentError(f"{name}: block={block!r} has {per_block} threads; CUDA allows at most "
                                  f"{MAX_BLOCK_THREADS} per block (and 64 in z): the launch would fail "
                                  "with 'invalid configuration argument'")
    if per_block * nblocks > max_threads:
        raise KernelArgumentError(f"{name}: {per_block * nblocks} threads is more than the simulator runs "
                                  f"(max_threads={max_threads}): simulate a smaller size; the same kernel "
                                  "scales up on a GPU")
    shared_bytes = sum(math.prod(d.dims) * d.ctype.bits // 8 for d in kernel.shared if d.dims) + shared_mem
    if shared_bytes > MAX_SHARED_BYTES:
        raise KernelArgumentError(f"{name}: {shared_bytes} bytes of shared memory per block; a launch may use "
                                  f"{MAX_SHARED_BYTES} without opting in to more")
    launch = _Launch(name, races, program.source_lines)
    launch.transactions, tx_totals = bool(transactions), {}
    values, buffers = _bind(kernel, args, launch)
    report = SimReport(name, grid3, block3, threads=per_block * nblocks, blocks=nblocks,
                       source_lines=program.source_lines)
    budget = [max_steps]
    fn = namespace["k_" + name]
    shared_totals = {}
    for blk, (bz, by, bx) in enumerate(itertools.product(*(range(g) for g in reversed(grid3)))):
        shared = {}
        for d in kernel.shared:
            if d.dims:
                size, dims = math.prod(d.dims), d.dims
            else:
                size, dims = shared_mem // (d.ctype.bits // 8), None
            buf = _Buffer(d.name, "shared", _new_memory(d.ctype, size), d.ctype, dims if dims and len(dims) > 1 else None, launch)
            shared[d.name] = _Ptr(buf)
        threads = []
        for lin, (tz, ty, tx) in enumerate(itertools.product(*(range(b) for b in reversed(block3)))):
            t = _Thread()
            t.tx, t.ty, t.tz, t.bx, t.by, t.bz = tx, ty, tz, bx, by, bz
            (t.bdx, t.bdy, t.bdz), (t.gdx, t.gdy, t.gdz) = block3, grid3
            t.blk, t.shared, t.budget = blk, shared, budget
            t.lane, t.warp, t.occ = lin % WARP_SIZE, (blk, lin // WARP_SIZE), {}
            threads.append(t)
        _run_block(fn, threads, values, launch, report, filename, program)
        if transactions:
            for b in buffers:
                _fold_transactions(b, tx_totals.setdefault(b.name, [0] * 5))
        for p in shared.values():
            b = p.buf
            loads, stores = shared_totals.setdefault(b.name, [0, 0])
            shared_totals[b.name] = [loads + b.loads, stores + b.stores]
    for b in buffers:
        report.global_loads[b.name] = b.loads
        report.global_stores[b.name] = b.stores
        report.global_bytes += (b.loads + b.stores) * b.itemsize
    for n, (loads, stores) in shared_totals.items():
        report.shared_loads[n], report.shared_stores[n] = loads, stores
    report.races = launch.found
    for n, (loads, stores, requests, ideal, elements) in tx_totals.items():
        report.transactions[n] = {"loads": loads, "stores": stores, "requests": requests, "ideal": ideal,
                                  "elements": elements}
    return report


def _fold_transactions(b, totals):
    """After a block: add up each warp-level request of array ``b`` into ``totals`` = [load sectors,
    store sectors, requests, ideal sectors, elements]. A request's sectors are the distinct 32-byte
    pieces of memory its elements lie in (cudaMalloc aligns arrays to 256 bytes, so offsets from the
    array's start give the GPU's sectors); its ideal is what the same number of distinct elements
    would need side by side: ceil(elements * itemsize / 32)."""
    size = b.itemsize
    for which, groups in enumerate(b.tx):
        for elems in groups.values():
            totals[which] += len({k * size // SECTOR_BYTES for k in elems})
            totals[2] += 1
            totals[3] += -(-len(elems) * size // SECTOR_BYTES)
            totals[4] += len(elems)
        groups.clear()


def _run_block(fn, threads, values, launch, report, filename, program):
    """Run one block in barrier phases: each live thread runs until its next __syncthreads() or its end.
    A thread at a warp-level call waits (in ``_Warps``) until the threads of its mask are there too;
    then they are resumed, in this same phase, with their results."""
    todo = [(t, fn(t, *values), None) for t in threads]
    finished, warps = [], None
    while todo:
        waiting = {}
        while todo:
            for t, g, v in todo:             # released warp groups are appended to todo as it runs
                try:
                    r = g.send(v)
                except StopIteration:
                    finished.append(t)
                    if warps is not None:
                        warps.exited[t.warp] |= 1 << t.lane
                    continue
                except Exception as e:            # noqa: BLE001 - every failure becomes a KernelFault naming the thread
                    raise _fault(e, t, launch, filename, program) from (None if isinstance(e, _Raise) else e)
                if r.__class__ is int:
                    waiting.setdefault(r, []).append((t, g))
                    continue
                if warps is None:
                    warps = _Warps(threads, finished)
                try:
                    todo.extend(warps.arrive(t, g, r, launch, program))
                except _Raise as e:
                    raise _fault(e, t, launch, filename, program) from None
            todo = warps.release_converged() if warps is not None and warps.pending else []
            if not todo and warps is not None and warps.pending:
                raise warps.stuck(waiting, launch, program)
        if not waiting:
            return
        if len(waiting) > 1 or finished:
            raise _divergence(waiting, finished, launch, program)
        report.barriers += 1
        launch.phase += 1
        todo = [(t, g, None) for t, g in next(iter(waiting.values()))]


class _Warps:
    """The warp-level calls of one block in flight. A thread at such a call waits, grouped by (warp,
    call site, mask), until every thread its mask names (that exists in a partial last warp) is there;
    then the exchange runs and all of them resume. ``__activemask()`` waits for the warp's other live
    threads, or, when nothing else can run, returns the lanes that did come (those that converged)."""

    def __init__(self, threads, finished):
        self.exists, self.thread, self.pending = {}, {}, {}
        for t in threads:
            self.exists[t.warp] = self.exists.get(t.warp, 0) | 1 << t.lane
            self.thread[t.warp, t.lane] = t
        self.exited = dict.fromkeys(self.exists, 0)
        for t in finished:
            self.exited[t.warp] |= 1 << t.lane

    def arrive(self, t, g, request, launch, program):
        """Park ``t`` at its call; return the (thread, generator, result) to resume, if its group is complete."""
        site, line, name, mask, value, arg, width = request
        w, bit = t.warp, 1 << t.lane
        if name == "__activemask":
            key, need = (w, site, None), self.exists[w] & ~self.exited[w]
        else:
            if not mask & bit:
                raise self.error(launch, program, t, line, mask, [t.lane],
                                 f"lane {t.lane} calls {name} with mask {mask:#010x}, which leaves it out: every "
                                 f"thread that calls {name} must be named in its mask (on a GPU this is undefined "
                                 "behaviour). Name the lanes that reach the call: 0xffffffff when the whole warp "
                                 "does, or the mask __ballot_sync gives for the condition around it.")
            key, need = (w, site, mask), mask & self.exists[w]
        group = self.pending.get(key)
        if group is None:
            group = self.pending[key] = [0, {}]
        group[0] |= bit
        group[1][t.lane] = (t, g, request)
        if group[0] & need != need:
            return ()
        del self.pending[key]
        return _exchange(group[0], group[1])

    def release_converged(self):
        """Nothing can run: each waiting __activemask() returns the lanes that reached it."""
        done = [key for key in self.pending if key[2] is None]
        released = []
        for key in done:
            bits, entries = self.pending.pop(key)
            released.extend(_exchange(bits, entries))
        return released

    def stuck(self, waiting, launch, program):
        """The error for a warp-level call that waits for lanes that will never come."""
        (w, site, mask), (bits, entries) = next(iter(self.pending.items()))
        t, _, request = next(iter(entries.values()))
        name, line = request[2], request[1]
        missing = mask & self.exists[w] & ~bits
        elsewhere = {}
        for bline, group in waiting.items():
            for u, _ in group:
                if u.warp == w:
                    elsewhere[u.lane] = f"wait at __syncthreads() on line {bline}"
        for (w2, site2, mask2), (_, other) in self.pending.items():
            for lane, (_, _, r) in other.items():
                if w2 == w and (site2, mask2) != (site, mask):
                    elsewhere[lane] = f"wait at {r[2]} on line {r[1]}" + (
                        f" with another mask ({mask2:#010x})" if site2 == site and mask2 is not None else "")
        sides = {}
        for lane in _lanes(missing):
            what = "already returned" if self.exited[w] >> lane & 1 else elsewhere.get(lane, "never arrive")
            sides.setdefault(what, []).append(lane)
        detail = [f"not all threads in the mask reached {name}: mask {mask:#010x} names lanes "
                  f"{_lane_text(_lanes(mask & self.exists[w]))}; lanes {_lane_text(_lanes(bits))} wait there"]
        for what, lanes in sides.items():
            u = self.thread[w, lanes[0]]
            detail.append(f"lane{'s' if len(lanes) > 1 else ''} {_lane_text(lanes)} {what} "
                          f"(e.g. threadIdx={u.ids()[0]})")
        detail.append("On a GPU this is undefined behaviour: the warp may hang or read garbage. Every thread "
                      "named in the mask must reach the same call (no return or if around it that some lanes "
                      "skip), or the mask must name only the lanes that do.")
        return self.error(launch, program, t, line, mask, _lanes(missing), "\n  ".join(detail))

    def error(self, launch, program, t, line, mask, lanes, detail):
        thread, block = t.ids()
        text = _line_text(program.source_lines, line)
        return WarpSyncError(f"kernel '{launch.kernel}', thread threadIdx={thread} blockIdx={block} (warp {t.warp[1]}), "
                             f"line {line}: {text}\n  {detail}", kernel=launch.kernel, thread=thread, block=block,
                             line=line, line_text=text, warp=t.warp[1], mask=mask, lanes=list(lanes))


def _exchange(bits, entries):
    """The results of one complete warp-level call: ``entries`` lane -> (thread, generator, request),
    ``bits`` the lanes taking part. Shuffles follow PTX's shfl.sync: a source lane outside the
    thread's segment of ``width`` lanes gives the thread its own value; one that does not take part
    gives garbage (NaN, or 0 for integers), as its value is undefined on a GPU."""
    name = next(iter(entries.values()))[2][2]
    if name in ("__syncwarp", "__activemask"):
        result = None if name == "__syncwarp" else bits
        return [(t, g, result) for t, g, _ in entries.values()]
    if name in ("__ballot_sync", "__any_sync", "__all_sync"):
        votes = sum(1 << lane for lane, e in entries.items() if e[2][5])
        result = votes if name == "__ballot_sync" else int(votes != 0 if name == "__any_sync" else votes == bits)
        return [(t, g, result) for t, g, _ in entries.values()]
    out = []
    for lane, (t, g, request) in entries.items():
        width, b = request[6], request[5] & 31
        if width not in (1, 2, 4, 8, 16, 32):
            raise _Raise(KernelFault, f"{name}: width {width} must be a power of 2 from 1 to 32", request[1])
        seg = WARP_SIZE - width                        # the lane bits that name the segment
        first, last = lane & seg, (lane & seg) | (31 & ~seg)
        if name == "__shfl_up_sync":
            j = lane - b
            ok = j >= first
        elif name == "__shfl_down_sync":
            j = lane + b
            ok = j <= last
        elif name == "__shfl_xor_sync":
            j = lane ^ b
            ok = j <= last
        else:
            j, ok = first | (b & ~seg), True
        if not ok:
            j = lane
        src = entries.get(j)
        own = request[4]
        out.append((t, g, src[2][4] if src is not None else (math.nan if isinstance(own, float) else 0)))
    return out


def _lanes(bits):
    return [lane for lane in range(WARP_SIZE) if bits >> lane & 1]


def _lane_text(lanes):
    """[0, 1, 2, 5] -> '0-2, 5'."""
    parts, start = [], None
    for i, lane in enumerate(lanes):
        if start is None:
            start = lane
        if i + 1 == len(lanes) or lanes[i + 1] != lane + 1:
            parts.append(str(start) if start == lane else f"{start}-{lane}")
            start = None
    return ", ".join(parts) or "none"


def _fault(e, t, launch, filename, program):
    line = getattr(e, "line", None)
    if line is None:                          # the deepest frame of the translated code has the C line
        tb, pyline = e.__traceback__, None
        while tb is not None:
            if tb.tb_frame.f_code.co_filename == filename:
                pyline = tb.tb_lineno
            tb = tb.tb_next
        line = program.line_map[pyline - 1] if pyline else None
    lines = program.source_lines
    thread, block = t.ids()
    if isinstance(e, _Raise):
        cls, detail, extra = e.cls, e.detail, e.extra
    elif isinstance(e, RecursionError):
        cls, detail, extra = KernelFault, "recursion too deep", {}
    else:
        cls, detail, extra = KernelFault, f"{type(e).__name__}: {e}", {}
    if cls is KernelTimeoutError:
        detail = ("still running after the launch's budget of loop iterations (max_steps) was spent: an endless "
                  "loop? On a GPU the kernel would never finish (pass max_steps=... for a longer run)")
    message = (f"kernel '{launch.kernel}', thread threadIdx={thread} blockIdx={block}, "
               f"line {line}: {_line_text(lines, line)}\n  {detail}")
    return cls(message, kernel=launch.kernel, thread=thread, block=block, line=line,
               line_text=_line_text(lines, line), **extra)


def _divergence(waiting, finished, launch, program):
    lines = program.source_lines
    sides = [f"{len(group)} thread(s) wait at line {line}: {_line_text(lines, line)} "
             f"(e.g. threadIdx={group[0][0].ids()[0]})" for line, group in waiting.items()]
    if finished:
        sides.append(f"{len(finished)} thread(s) already returned (e.g. threadIdx={finished[0].ids()[0]})")
    t = next(iter(waiting.values()))[0][0]
    thread, block = t.ids()
    first_line = next(iter(waiting))
    return DivergentBarrierError(
        f"kernel '{launch.kernel}', blockIdx={block}: not every thread of the block reaches the same "
        f"__syncthreads():\n  " + "\n  ".join(sides) + "\n  On a GPU this is undefined behaviour: the block may "
        "hang or go on with wrong data. Put __syncthreads() where every thread of the block reaches it "
        "(outside the if; no early return before it).",
        kernel=launch.kernel, thread=thread, block=block, line=first_line,
        line_text=_line_text(lines, first_line), lines=sorted(waiting))
