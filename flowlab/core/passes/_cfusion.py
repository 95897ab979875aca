"""Compiled elementwise fusion: a fused group becomes one C function that runs every member op
over blocks of elements kept in L1 (``c_function``), compiled for this CPU (see _ccompile.py).

Which groups compile (``compilable``): at least ``MIN_OPS`` ops; every input of the group's dtype,
float32 or float64; every op with a C expression (``OpDef.c_expr``; float32 only for an op with a
``c_block`` function); each step's result of that dtype, or bool for an op whose expression gives
1 or 0 (``c_bool``: comparisons and logical ops; a bool is held as 0.0 or 1.0, which is what numpy
casts it to when it meets a float); at least one input that is full size (static shape of the
result's rank), the others known to hold one element (they broadcast). At call time
full-size inputs that are not C-contiguous, or broadcast (an unknown dimension of 1), are copied
first; only inputs of another dtype run the group's numpy kernel. Why at least ``MIN_OPS``: gcc
costs 0.2-0.7 s per plan (a library found in the disk cache: about 15 ms), and most graphs in
tests and lessons are small (a few ops per group, where numpy's per-call cost is small already);
a long chain is where one loop wins, 3x and more. The fast test tier compiles 2 libraries outside
test_fusion_compiled.py. Compiling happens when a plan is built, one C file per plan.

Arithmetic, comparisons and logical ops are the same IEEE operations numpy runs, so the same bits
(maximum/minimum and sign follow numpy's NaN and signed-zero rules, tested bit for bit). exp, log,
tanh and sigmoid are our own (in ``_cfusion_prelude.c``), float32 only: range reduction and a short
polynomial, using only +, -, *, /, fma and bit operations (each correctly rounded, so vector and
scalar code, and any two runs, give the same bits); exp, log and sigmoid computed in double
precision then rounded, tanh in float32 (it is what long chains are made of; twice the vector
lanes). Each result is within ``ULP_BOUND`` of the correctly rounded value over the whole float32
range: measured over every 97th float32 bit pattern (44 million values), exp and log were always correctly rounded, sigmoid at most
1 ULP off, tanh at most 2 (tests/unit/test_fusion_compiled.py checks 4 million values per op).
NOTE: eager sigmoid is 0.5 * (tanh(x / 2) + 1), which loses relative accuracy for x below about
-9 (6e-8 at -17, where the true value is 4e-8; 0 from about -18); the compiled 1 / (1 + e^-x) does
not, so there the two differ by more than the bound in relative terms (by under 1e-7 absolute).
"""
from __future__ import annotations

import os

import numpy as np

from ..execute import get_op
from . import _ccompile

MIN_OPS = 8
# float32 ULPs from the correctly rounded result, by function of the prelude (an op's ``c_block``;
# tests/unit/test_fusion_compiled.py checks them)
ULP_BOUND = {"fl_expf": 1, "fl_logf": 1, "fl_sigmoidf": 1, "fl_tanhf": 2}

_F32, _F64, _BOOL = np.dtype(np.float32), np.dtype(np.float64), np.dtype(bool)
_PRELUDE_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_cfusion_prelude.c")
_prelude = []


def prelude() -> str:
    """The C every generated file starts with (``_cfusion_prelude.c``, read on first use)."""
    if not _prelude:
        with open(_PRELUDE_FILE, encoding="utf-8") as f:
            _prelude.append(f.read())
    return _prelude[0]


def compilable(steps, inputs, min_ops=None, blocks_in_double=False) -> bool:
    """Whether the group (``steps`` and the ``(shape, dtype)`` of its ``inputs``) compiles; see above.
    (cuda_fusion.py asks with its own ``min_ops``, and CUDA has exp, log... in double too.)"""
    if len(steps) < (MIN_OPS if min_ops is None else min_ops) or not steps[-1][2]:
        return False
    dtype, out_shape = steps[-1][3], steps[-1][2]
    if dtype not in (_F32, _F64) or any(d != dtype for _, d in inputs):
        return False
    for name, _, _, d in steps:
        op = get_op(name)
        if op.c_expr is None or (op.c_block is not None and dtype != _F32 and not blocks_in_double):
            return False
        if d != dtype and not (d == _BOOL and op.c_bool):
            return False
    kinds = [_kind(shape, out_shape) for shape, _ in inputs]
    return None not in kinds and "full" in kinds


def _kind(shape, out_shape):
    """'scalar' (one element, known), 'full' (the result's rank, dimensions that may match), or None."""
    if shape is None or out_shape is None:
        return None
    if None not in shape and int(np.prod(shape, dtype=np.int64)) == 1 and len(shape) <= len(out_shape):
        return "scalar"
    if len(shape) == len(out_shape) and all(a is None or b is None or a == b for a, b in zip(shape, out_shape)):
        return "full"
    return None


BLOCK = 256   # elements per block: the block's intermediate buffers stay in L1
SEGMENT = 8   # cheap ops per loop at most


def c_function(fname, steps, inputs) -> str:
    """The C function ``fname(n, o0, ..., o_out)`` that computes ``steps`` for the ``n`` elements of
    the numpy arrays ``o0``... into the array ``o_out``.

    Steps whose arguments are all one-element values run once, before the loop. The rest run over
    blocks of ``BLOCK`` elements, in segments: a transcendental op is one call of its block function
    (compiled once, not once per use), and up to ``SEGMENT`` other ops share one loop over the
    block. Short loops let the CPU overlap consecutive elements' work (one loop through all 100 ops
    of a chain would wait on each op's latency in turn). A value read in a later segment goes
    through a block buffer, reused once the value is dead; one read only in its own loop stays in a
    register."""
    ctype = "float" if steps[-1][3] == _F32 else "double"
    kinds = [_kind(shape, steps[-1][2]) for shape, _ in inputs]
    once = {f"x{k}" for k, kind in enumerate(kinds) if kind == "scalar"}
    segment, size, seg, blocked, after_block = {}, 0, -1, set(), False
    for j, (name, args, _, _) in enumerate(steps):
        if all(a in once for a in args) and j != len(steps) - 1:
            once.add(f"t{j}")
            continue
        block = get_op(name).c_block is not None and args[0] not in once   # else it runs inline, per element
        if block or size == SEGMENT or seg < 0 or after_block:
            seg, size = seg + 1, 0
        segment[j], size, after_block = seg, size + 1, block
        if block:
            blocked.add(j)
    last = len(steps) - 1
    last_seg = dict(segment)
    for j, (_, args, _, _) in enumerate(steps):
        for a in args:
            if a[0] == "t" and int(a[1:]) in segment and j in segment:
                last_seg[int(a[1:])] = max(last_seg[int(a[1:])], segment[j])
    buffer, free, live, count = {}, [], {}, 0
    for s in range(seg + 1):
        for j in [j for j in live if last_seg[j] < s]:
            free.append(live.pop(j))
        for j in [j for j in segment if segment[j] == s and j != last
                  and (last_seg[j] > s or j in blocked)]:
            if not free:
                free.append(count)
                count += 1
            buffer[j] = live[j] = free.pop()

    def expr(j):
        name, args, _, _ = steps[j]
        a, b = (list(args) + [None, None])[:2]
        return get_op(name).c_expr.format(a=a, b=b, T=ctype)

    def pointer(a):   # a full input's or a buffered value's block, for a block function
        return f"p{a[1:]} + i0" if a[0] == "x" else f"b{buffer[int(a[1:])]}"

    params = ", ".join([f"const void *o{k}" for k in range(len(inputs))] + ["void *o_out"])
    lines = [f"void {fname}(int64_t n, {params}) {{"]
    lines += [f"    const {ctype} *restrict p{k} = FL_DATA(o{k});" for k in range(len(inputs))]
    lines.append(f"    {ctype} *restrict out = FL_DATA(o_out);")
    lines += [f"    const {ctype} x{k} = p{k}[0];" for k, kind in enumerate(kinds) if kind == "scalar"]
    lines += [f"    const {ctype} t{j} = {expr(j)};" for j in range(len(steps)) if f"t{j}" in once]
    lines += [f"    {ctype} b{k}[{BLOCK}] __attribute__((aligned(64)));" for k in range(count)]
    lines += [f"    for (int64_t i0 = 0; i0 < n; i0 += {BLOCK}) {{",
              f"        const int64_t m = n - i0 < {BLOCK} ? n - i0 : {BLOCK};"]
    for s in range(seg + 1):
        members = [j for j in segment if segment[j] == s]
        if members[0] in blocked:
            j = members[0]
            target = "out + i0" if j == last else f"b{buffer[j]}"
            lines.append(f"        {get_op(steps[j][0]).c_block}_n(m, {pointer(steps[j][1][0])}, {target});")
            continue
        lines.append("        for (int64_t i = 0; i < m; i++) {")
        for a in sorted({a for j in members for a in steps[j][1]}):
            if a[0] == "x" and kinds[int(a[1:])] == "full":
                lines.append(f"            const {ctype} {a} = p{a[1:]}[i0 + i];")
            elif a[0] == "t" and a not in once and segment[int(a[1:])] != s:
                lines.append(f"            const {ctype} {a} = b{buffer[int(a[1:])]}[i];")
        for j in members:
            lines.append(f"            const {ctype} t{j} = {expr(j)};")
            if j in buffer:
                lines.append(f"            b{buffer[j]}[i] = t{j};")
        if last in members:
            lines.append(f"            out[i0 + i] = t{last};")
        lines.append("        }")
    lines += ["    }", "}"]
    return "\n".join(lines)


def compile_groups(groups):
    """For each ``(steps, inputs)`` (``inputs``: (shape, dtype) pairs; None: a group not to compile), a
    function that wraps the group's numpy kernel into its compiled one, or None (not compilable, or no
    library). All the compilable groups of a plan go in one C file: one compiler run per plan."""
    import ctypes
    chosen = [k for k, group in enumerate(groups) if group is not None and compilable(*group)]
    if not chosen or not _ccompile.enabled():
        return [None] * len(groups)
    offset = _data_offset()
    if offset is None:
        return [None] * len(groups)
    source = (f"#define FL_DATA_OFFSET {offset}\n" + prelude()
              + "\n\n".join(c_function(f"flowlab_k{k}", *groups[k]) for k in chosen) + "\n")
    lib = _ccompile.load(source)
    wrappers = [None] * len(groups)
    if lib is None:
        return wrappers
    for k in chosen:
        steps, inputs = groups[k]
        func = getattr(lib, f"flowlab_k{k}")
        func.argtypes = [ctypes.c_int64] + [ctypes.py_object] * (len(inputs) + 1)
        func.restype = None
        kinds = [_kind(shape, steps[-1][2]) for shape, _ in inputs]
        wrappers[k] = (lambda fallback, func=func, kinds=kinds, dtype=steps[-1][3]:
                       _compiled_kernel(func, fallback, kinds, dtype))
    return wrappers


def _compiled_kernel(func, fallback, kinds, dtype):
    """``kernel(x0, x1, ...)`` that calls ``func``; it carries the numpy kernel's ``steps`` and
    ``source``. Inputs that are not C-contiguous, or full-size inputs of different shapes (an
    unknown dimension that broadcasts), are copied into the layout it needs first, so a group's
    bits never depend on how its inputs lie in memory. Only inputs of another dtype (a graph
    fed something else than it was traced for) go to ``fallback``, the numpy kernel."""
    full = [k for k, kind in enumerate(kinds) if kind == "full"]
    scalars = [k for k, kind in enumerate(kinds) if kind == "scalar"]
    first, ndarray = full[0], np.ndarray

    def kernel(*xs):
        x = xs[first]
        shape = getattr(x, "shape", None)
        for k in full:
            a = xs[k]
            if type(a) is not ndarray or a.shape != shape or a.dtype != dtype or not a.flags.c_contiguous:
                return slow(xs)
        for k in scalars:
            a = xs[k]
            if type(a) is not ndarray or a.size != 1 or a.dtype != dtype or a.ndim > len(shape):
                return slow(xs)
        out = np.empty(shape, dtype)
        func(x.size, *xs, out)
        return out

    def slow(xs):
        xs = [np.asarray(a) for a in xs]
        if any(a.dtype != dtype for a in xs) or any(xs[k].size != 1 for k in scalars):
            return fallback(*xs)
        shape = np.broadcast_shapes(*(a.shape for a in xs))
        xs = [a if k in scalars else np.ascontiguousarray(np.broadcast_to(a, shape)) for k, a in enumerate(xs)]
        out = np.empty(shape, dtype)
        func(out.size, *xs, out)
        return out

    kernel.steps, kernel.source, kernel.fallback, kernel.compiled = fallback.steps, fallback.source, fallback, True
    return kernel


def _data_offset():
    """Where a numpy array object keeps its data pointer (the first field after the object
    header: 16 bytes on CPython), found by looking, so the C code reads it from the array object
    itself (``a.ctypes.data`` costs microseconds per call). None if not found: no compiling."""
    import ctypes
    if "offset" not in _found:
        a = np.empty(3)
        _found["offset"] = next((off for off in range(8, 80, 8)
                                 if ctypes.c_void_p.from_address(id(a) + off).value == a.ctypes.data), None)
    return _found["offset"]


_found = {}
