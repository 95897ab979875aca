"""CUDA C (the subset a learner writes for CuPy's ``RawKernel``) to Python, for the simulator in
``_sim.py``: a ``__global__`` function becomes a generator run once per thread, whose ``yield`` is
``__syncthreads()``; a ``__device__`` function becomes a plain function (or a generator, when it
reaches a ``__syncthreads()`` or a warp-level call, called with ``yield from``). A warp-level call
(``__shfl_down_sync(mask, v, delta)`` & co, votes, ``__syncwarp``, ``__activemask``) becomes
``(yield request)``, an expression whose value ``_sim``'s scheduler sends back once the warp has met.

The source goes through a small preprocessor (comments, ``#define``, ``#ifdef``; CUDA keywords become
markers pycparser accepts), then pycparser (a C99 parser), then ``_Translator``, which keeps a small
symbol table of C types so that the Python it writes has C's semantics: integer ``/`` and ``%``
truncate toward zero, unsigned arithmetic wraps, ``float`` values are rounded to float32 wherever C
stores one (variables, arrays, casts, results of float math functions), and every array access goes
through a helper of ``_sim`` that checks the bounds, counts it and watches for races.

NOTE: float expressions are evaluated in double precision and rounded to float32 where they are
stored, not after every operation; a GPU rounds each operation (and may fuse ``a * b + c`` into one
FMA), so results can differ in the last bits: compare with a tolerance, as with a real GPU.
"""
from __future__ import annotations

import ast
import functools
import re
from dataclasses import dataclass, field
from typing import NamedTuple

__all__ = ["KernelSourceError", "CType", "Program", "translate", "SUPPORTED"]

SUPPORTED = ("the simulator runs a subset of CUDA C: __global__ and __device__ functions; scalar types "
             "(bool, char, short, int, unsigned, long long, size_t, float, double, intN_t); pointers "
             "and pointer arithmetic; __shared__ arrays (1-3 dimensions, static or extern); local arrays; "
             "if/for/while/do/break/continue/return; C operators; math functions; atomics; "
             "__syncthreads(); warp shuffles and votes (__shfl*_sync, __ballot_sync, __any_sync, __all_sync, "
             "__activemask, __syncwarp); printf; #define")


class KernelSourceError(SyntaxError):
    """The kernel's source is not valid CUDA C or uses something the simulator does not support;
    ``lineno`` and ``text`` are the line of the learner's source."""

    def __init__(self, message, line=None, source_lines=()):
        text = source_lines[line - 1].strip() if line and 0 < line <= len(source_lines) else None
        where = f"line {line}: {text}\n  " if line else ""
        super().__init__(f"{where}{message}")
        self.lineno, self.text, self.filename = line, text, "<cuda source>"

    def __str__(self):
        return self.msg


# -- types -------------------------------------------------------------------------------------------
class CType(NamedTuple):
    """A C scalar type, or a pointer to one (``ptr`` = 1): ``kind`` is "i" (integer), "f" (floating)
    or "v" (void); ``bits`` its width."""
    name: str
    kind: str
    bits: int
    signed: bool
    ptr: int = 0

    def pointer(self):
        return self._replace(ptr=self.ptr + 1)

    def element(self):
        return self._replace(ptr=self.ptr - 1)

    def __str__(self):
        return self.name + "*" * self.ptr


_T = {n: CType(n, k, b, s) for n, k, b, s in [
    ("bool", "i", 8, False), ("char", "i", 8, True), ("signed char", "i", 8, True),
    ("unsigned char", "i", 8, False), ("short", "i", 16, True), ("unsigned short", "i", 16, False),
    ("int", "i", 32, True), ("unsigned int", "i", 32, False), ("long", "i", 64, True),
    ("unsigned long", "i", 64, False), ("long long", "i", 64, True), ("unsigned long long", "i", 64, False),
    ("float", "f", 32, True), ("double", "f", 64, True), ("void", "v", 0, False)]}
INT, UINT, FLOAT, DOUBLE, BOOL, LONG = _T["int"], _T["unsigned int"], _T["float"], _T["double"], _T["bool"], _T["long"]

# pycparser's IdentifierType names (sorted words) -> our type; typedef names the prelude declares
_SPELLINGS = {
    ("_Bool",): "bool", ("bool",): "bool", ("char",): "char", ("char", "signed"): "signed char",
    ("char", "unsigned"): "unsigned char", ("short",): "short", ("int", "short"): "short",
    ("short", "unsigned"): "unsigned short", ("int", "short", "unsigned"): "unsigned short",
    ("int",): "int", ("signed",): "int", ("int", "signed"): "int", ("unsigned",): "unsigned int",
    ("int", "unsigned"): "unsigned int", ("long",): "long", ("int", "long"): "long",
    ("long", "unsigned"): "unsigned long", ("int", "long", "unsigned"): "unsigned long",
    ("long", "long"): "long long", ("int", "long", "long"): "long long",
    ("long", "long", "unsigned"): "unsigned long long", ("int", "long", "long", "unsigned"): "unsigned long long",
    ("float",): "float", ("double",): "double", ("double", "long"): "double", ("void",): "void",
    ("size_t",): "unsigned long", ("ptrdiff_t",): "long", ("int8_t",): "signed char",
    ("uint8_t",): "unsigned char", ("int16_t",): "short", ("uint16_t",): "unsigned short",
    ("int32_t",): "int", ("uint32_t",): "unsigned int", ("int64_t",): "long long",
    ("uint64_t",): "unsigned long long",
}
_PRELUDE_TYPEDEFS = ("typedef _Bool bool; typedef unsigned long size_t; typedef long ptrdiff_t; "
                     "typedef signed char int8_t; typedef unsigned char uint8_t; typedef short int16_t; "
                     "typedef unsigned short uint16_t; typedef int int32_t; typedef unsigned uint32_t; "
                     "typedef long long int64_t; typedef unsigned long long uint64_t; ")
_PRELUDE_NAMES = {"bool", "size_t", "ptrdiff_t", "int8_t", "uint8_t", "int16_t", "uint16_t", "int32_t",
                  "uint32_t", "int64_t", "uint64_t"}


def _arith(a: CType, b: CType) -> CType:
    """C's usual arithmetic conversions (LP64: long is 64 bits)."""
    if a.kind == "f" or b.kind == "f":
        return DOUBLE if DOUBLE in (a, b) else FLOAT
    a, b = (x if x.bits >= 32 else INT for x in (a, b))
    if a.bits != b.bits:
        return a if a.bits > b.bits else b
    return a if not a.signed else b


# -- preprocessor ------------------------------------------------------------------------------------
_UNSUPPORTED = [
    (r"\btemplate\s*<", "templates are not supported"),
    (r"\b(static_cast|reinterpret_cast|const_cast|dynamic_cast)\b", "C++ casts are not supported: write a C cast, (float)x"),
    (r"\b(class|namespace|new|delete|operator|typename|using)\b", "C++ classes, namespaces and operators are not supported"),
    (r"::", "C++ scopes (::) are not supported"),
    (r"\b(auto|register)\b", "'auto' and 'register' are not supported"),
    (r"\b__constant__\b", "__constant__ memory is not supported: pass the values as a pointer argument"),
    (r"\b(__shfl|__shfl_up|__shfl_down|__shfl_xor|__ballot|__any|__all)\b",
     "the warp functions without _sync (before CUDA 9) are not supported: write __shfl_down_sync(mask, ...)"),
    (r"\b(__syncthreads_(count|and|or)|__match_\w+|__reduce_\w+_sync)\b",
     "this warp/block primitive is not supported (the warp shuffles, votes and __syncwarp are)"),
    (r"\b(texture|surface|tex1D\w*|tex2D\w*|__ldg)\b", "textures and __ldg are not supported"),
    (r"\b(__half|half2|__nv_bfloat16|float[234]|int[234]|double2)\b|\bhalf\b(?=\s*\*?\s*[A-Za-z_])",
     "vector and half types are not supported"),   # half as a type (half x); a variable named half is fine
    (r"\bgoto\b", "goto is not supported"),
]


def _strip_comments(src: str) -> str:
    """Comments become spaces (newlines kept, so line numbers stay)."""
    out, i, n = [], 0, len(src)
    while i < n:
        c = src[i]
        if c in "\"'":
            j = i + 1
            while j < n and src[j] != c and src[j] != "\n":
                j += 2 if src[j] == "\\" else 1
            out.append(src[i:j + 1])
            i = j + 1
        elif src.startswith("//", i):
            j = src.find("\n", i)
            i = n if j < 0 else j
        elif src.startswith("/*", i):
            j = src.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("\n" * src.count("\n", i, j))
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _call_args(text: str, start: int):
    """The comma-separated arguments of the parenthesis at ``text[start]``, and the index after it."""
    depth, args, cur, i = 0, [], [], start
    while i < len(text):
        c = text[i]
        if c == "(":
            depth += 1
            if depth == 1:
                i += 1
                continue
        elif c == ")":
            depth -= 1
            if depth == 0:
                args.append("".join(cur).strip())
                return args, i + 1
        elif c == "," and depth == 1:
            args.append("".join(cur).strip())
            cur = []
            i += 1
            continue
        cur.append(c)
        i += 1
    return None, start


def _expand(line: str, defines: dict) -> str:
    for _ in range(16):                       # nested macros, but never forever
        before = line
        for name, (params, body) in defines.items():
            if params is None:
                line = re.sub(rf"\b{name}\b", lambda m: body, line)
                continue
            pos = 0
            while (m := re.compile(rf"\b{name}\s*\(").search(line, pos)):
                args, end = _call_args(line, m.end() - 1)
                if args is None or len(args) != len(params):
                    break
                text = body
                for p, a in zip(params, args):
                    text = re.sub(rf"\b{p}\b", lambda _m, a=a: f"({a})", text)
                line = line[:m.start()] + f"({text})" + line[end:]
                pos = m.start() + 1
        if line == before:
            return line
    return line


def _preprocess(source: str):
    """(C text pycparser can read, with the same line numbers; names of the __global__ functions)."""
    lines = _strip_comments(source).split("\n")
    defines, out, active = {}, [], []        # active: stack of booleans for #ifdef blocks
    i = 0
    while i < len(lines):
        line, lineno = lines[i], i + 1
        while line.rstrip().endswith("\\") and i + 1 < len(lines):   # continued #define
            out.append("")
            i += 1
            line = line.rstrip()[:-1] + " " + lines[i]
        stripped = line.strip()
        skipping = not all(active)
        if stripped.startswith("#"):
            words = stripped[1:].split(None, 1)
            word, rest = (words[0] if words else ""), (words[1] if len(words) > 1 else "")
            if word in ("ifdef", "ifndef"):
                active.append((rest.strip() in defines) == (word == "ifdef"))
            elif word == "else" and active:
                active[-1] = not active[-1]
            elif word == "endif" and active:
                active.pop()
            elif skipping or word in ("include", "pragma", ""):
                pass
            elif word == "define":
                m = re.match(r"(\w+)(\(([^)]*)\))?\s*(.*)$", rest)
                if not m:
                    raise KernelSourceError("cannot read this #define", lineno, source.split("\n"))
                params = [p.strip() for p in m.group(3).split(",")] if m.group(2) else None
                defines[m.group(1)] = (params, _expand(m.group(4).strip(), defines))
            elif word == "undef":
                defines.pop(rest.strip(), None)
            else:
                raise KernelSourceError(f"the preprocessor directive #{word} is not supported (only #define, "
                                        "#ifdef/#ifndef/#else/#endif; #include and #pragma are ignored)",
                                        lineno, source.split("\n"))
            out.append("")
        else:
            out.append("" if skipping else _expand(line, defines))
        i += 1
    src_lines = source.split("\n")
    for n, line in enumerate(out, 1):
        for pattern, why in _UNSUPPORTED:
            if re.search(pattern, line):
                raise KernelSourceError(f"{why}; {SUPPORTED}", n, src_lines)
    text = "\n".join(out)
    text = re.sub(r'extern\s+"C"\s*\{', lambda m: "\n" * m.group().count("\n") + "\x00", text)
    text = _drop_matching_brace(text)
    text = re.sub(r'extern\s+"C"', "", text)
    text = re.sub(r"__launch_bounds__\s*\([^)]*\)", "", text)
    text = re.sub(r"\bstatic\b", "", text)
    text = re.sub(r"\bconstexpr\b", "const", text)
    text = re.sub(r"\b(__device__|__host__|__forceinline__|__noinline__|__restrict__|__restrict|inline)\b", "", text)
    text = re.sub(r"\bextern\s+__shared__\b", "extern register", text)   # dynamic shared memory
    text = re.sub(r"\b__shared__\b", "register", text)
    text = re.sub(r"\b__global__\b", "static", text)                      # marks a kernel
    return _PRELUDE_TYPEDEFS + text


def _drop_matching_brace(text: str) -> str:
    """Removes the marker left by ``extern "C" {`` and the brace that closes it."""
    while (start := text.find("\x00")) >= 0:
        depth, j = 1, start + 1
        while j < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            j += 1
        text = text[:start] + " " + text[start + 1:j - 1] + " " + text[j:]
    return text


# -- the translated program --------------------------------------------------------------------------
@dataclass
class SharedDecl:
    name: str
    ctype: CType
    dims: tuple            # () for extern (dynamic) shared memory
    line: int


@dataclass
class KernelInfo:
    name: str
    params: list                              # [(name, CType)]
    shared: list = field(default_factory=list)   # [SharedDecl]
    line: int = 0


@dataclass
class Program:
    """The Python translation of one source: ``python`` defines ``k_<name>`` per kernel and ``f_<name>``
    per device function; ``line_map[i]`` is the C line of Python line ``i + 1``."""
    source: str
    python: str
    line_map: list
    kernels: dict                             # name -> KernelInfo
    source_lines: list


@functools.lru_cache(maxsize=64)
def translate(source: str) -> Program:
    """Parse and translate CUDA C source (cached by its text)."""
    from pycparser import c_ast                # only when a kernel is simulated: import flowlab stays light
    src_lines = source.split("\n")
    text = _preprocess(source)
    try:
        tree = _parser().parse(text, filename="<cuda source>")
    except Exception as e:                      # pycparser's ParseError: "<cuda source>:LINE:COL: message"
        m = re.search(r":(\d+):(\d+): (.*)", str(e))
        line = int(m.group(1)) if m else None
        raise KernelSourceError(f"cannot parse this ({m.group(3) if m else e}); {SUPPORTED}",
                                line, src_lines) from None
    return _Translator(c_ast, tree, source, src_lines).program()


@functools.lru_cache(maxsize=1)
def _parser():
    from pycparser import c_parser
    return c_parser.CParser()                  # building its tables takes a moment: once


# -- translator --------------------------------------------------------------------------------------
class _E(NamedTuple):
    code: str
    t: CType
    exact: bool = False        # already a value of its C type (no float32 rounding needed)


class _Sym(NamedTuple):
    py: str
    t: CType
    dims: tuple = None         # arrays: their dimensions
    const: bool = False


_MATH = {   # C name: (Python helper, result: "f" float, "d" double, "a" the arguments' type, "o" overload)
    "expf": ("_exp", "f"), "__expf": ("_exp", "f"), "exp": ("_exp", "o"), "logf": ("_log", "f"),
    "__logf": ("_log", "f"), "log": ("_log", "o"), "sqrtf": ("_sqrt", "f"), "sqrt": ("_sqrt", "o"),
    "rsqrtf": ("_rsqrt", "f"), "rsqrt": ("_rsqrt", "o"), "fabsf": ("abs", "f"), "fabs": ("abs", "o"),
    "fmaxf": ("_fmax", "f"), "fminf": ("_fmin", "f"), "fmax": ("_fmax", "o"), "fmin": ("_fmin", "o"),
    "max": ("max", "a"), "min": ("min", "a"), "abs": ("abs", "a"), "powf": ("_pow", "f"), "pow": ("_pow", "o"),
    "__powf": ("_pow", "f"), "tanhf": ("_tanh", "f"), "tanh": ("_tanh", "o"), "sinf": ("_sin", "f"),
    "sin": ("_sin", "o"), "cosf": ("_cos", "f"), "cos": ("_cos", "o"), "__sinf": ("_sin", "f"),
    "__cosf": ("_cos", "f"), "floorf": ("_floor", "f"), "floor": ("_floor", "o"), "ceilf": ("_ceil", "f"),
    "ceil": ("_ceil", "o"), "__fdividef": ("_fdiv", "f"), "fmaf": ("_fma", "f"), "fma": ("_fma", "o"),
    "fmodf": ("_fmod", "f"), "fmod": ("_fmod", "o"), "log2f": ("_log2", "f"), "exp2f": ("_exp2", "f"),
    "roundf": ("_round", "f"), "truncf": ("_trunc", "f"), "erff": ("_erf", "f"), "erf": ("_erf", "o"),
    "isnan": ("_isnan", "b"), "isinf": ("_isinf", "b"), "isfinite": ("_isfinite", "b"),
    "log1pf": ("_log1p", "f"), "expm1f": ("_expm1", "f"), "tanf": ("_tan", "f"), "atanf": ("_atan", "f"),
}
_ATOMICS = {"atomicAdd": "add", "atomicSub": "sub", "atomicMax": "max", "atomicMin": "min",
            "atomicExch": "exch", "atomicCAS": "cas", "atomicAnd": "and", "atomicOr": "or", "atomicXor": "xor"}
_BUILTIN_IDS = {"true": ("True", BOOL), "false": ("False", BOOL), "warpSize": ("32", INT),
                "INFINITY": ("_inf", FLOAT), "NAN": ("_nan", FLOAT), "FLT_MAX": ("3.4028234663852886e+38", FLOAT),
                "FLT_MIN": ("1.1754943508222875e-38", FLOAT), "FLT_EPSILON": ("1.1920928955078125e-07", FLOAT),
                "INT_MAX": ("2147483647", INT), "INT_MIN": ("(-2147483648)", INT), "NULL": ("None", INT.pointer())}
# warp-level calls: C name -> (argument counts allowed, result type or None for "the value's type")
_WARP = {"__shfl_sync": ((3, 4), None), "__shfl_up_sync": ((3, 4), None), "__shfl_down_sync": ((3, 4), None),
         "__shfl_xor_sync": ((3, 4), None), "__ballot_sync": ((2,), UINT), "__any_sync": ((2,), INT),
         "__all_sync": ((2,), INT), "__syncwarp": ((0, 1), _T["void"]), "__activemask": ((0,), UINT)}
_DIMS = {"threadIdx": "t", "blockIdx": "b", "blockDim": "bd", "gridDim": "gd"}
_PY_OPS = {"+": "+", "-": "-", "*": "*", "<": "<", ">": ">", "<=": "<=", ">=": ">=", "==": "==", "!=": "!=",
           "&": "&", "|": "|", "^": "^", "<<": "<<", ">>": ">>"}


def _mask(bits):
    return hex((1 << bits) - 1)


class _Translator:
    def __init__(self, c_ast, tree, source, src_lines):
        self.c, self.tree, self.source, self.src = c_ast, tree, source, src_lines
        self.out, self.line_map = [], []
        self.kernels, self.functions, self.typedefs = {}, {}, {}
        self.generators = set()            # device functions that reach a __syncthreads()
        self.constants = {}                # Python name of a const int -> its literal value
        self.nsite = 0                     # warp-level call sites, numbered

    # -- errors and output ------------------------------------------------------------------------
    def fail(self, node, message):
        line = node.coord.line if node is not None and getattr(node, "coord", None) else None
        raise KernelSourceError(f"{message}; {SUPPORTED}" if "supported" in message else message, line, self.src)

    def emit(self, text, line):
        self.out.append("    " * self.indent + text)
        self.line_map.append(line)

    def tmp(self, stem="_x"):
        self.ntmp += 1
        return f"{stem}{self.ntmp}"

    # -- the whole file ---------------------------------------------------------------------------
    def program(self) -> Program:
        c = self.c
        funcs = []
        for ext in self.tree.ext:
            if isinstance(ext, c.Typedef):
                if ext.name not in _PRELUDE_NAMES:
                    self.typedefs[ext.name] = self.ctype(ext.type, ext)
            elif isinstance(ext, c.FuncDef):
                funcs.append(ext)
                self.functions[ext.decl.name] = ext
            elif isinstance(ext, c.Decl) and isinstance(ext.type, c.FuncDecl):
                continue                         # a prototype
            else:
                self.fail(ext, "file-scope variables and structs are not supported")
        self.find_generators(funcs)
        for f in funcs:
            self.function(f)
        if not self.kernels:
            raise KernelSourceError("no __global__ function (kernel) in this source", None, self.src)
        return Program(self.source, "\n".join(self.out) + "\n", self.line_map, self.kernels, self.src)

    def is_kernel(self, f):
        return "static" in (f.decl.storage or [])

    def find_generators(self, funcs):
        """Device functions that call __syncthreads(), directly or through others, run as generators."""
        calls = {}
        for f in funcs:
            names = set()
            for node in _walk(f.body, self.c):
                if isinstance(node, self.c.FuncCall) and isinstance(node.name, self.c.ID):
                    names.add(node.name.name)
            calls[f.decl.name] = names
        changed = True
        while changed:
            changed = False
            for name, names in calls.items():
                if name not in self.generators and ("__syncthreads" in names or names & self.generators
                                                    or names & _WARP.keys()):
                    self.generators.add(name)
                    changed = True

    def ctype(self, node, where) -> CType:
        """The CType of a declaration's type node (TypeDecl / PtrDecl / IdentifierType)."""
        c = self.c
        if isinstance(node, c.PtrDecl):
            inner = self.ctype(node.type, where)
            if inner.ptr:
                self.fail(where, "pointers to pointers are not supported")
            return inner.pointer()
        if isinstance(node, c.TypeDecl):
            return self.ctype(node.type, where)
        if isinstance(node, c.IdentifierType):
            names = tuple(sorted(node.names))
            if len(names) == 1 and names[0] in self.typedefs:
                return self.typedefs[names[0]]
            if names not in _SPELLINGS:
                self.fail(where, f"the type '{' '.join(node.names)}' is not supported")
            return _T[_SPELLINGS[names]]
        if isinstance(node, c.Typename):
            return self.ctype(node.type, where)
        self.fail(where, f"this declaration ({type(node).__name__}) is not supported")

    def function(self, f):
        c = self.c
        name, kernel = f.decl.name, self.is_kernel(f)
        ftype = f.decl.type
        ret = self.ctype(ftype.type, f)
        if kernel and (ret.kind != "v" or ret.ptr):
            self.fail(f, f"the kernel '{name}' must return void")
        params = []
        for p in (ftype.args.params if ftype.args else []):
            if isinstance(p, c.Typename) and self.ctype(p.type, p).kind == "v":
                continue                              # f(void)
            if isinstance(p, c.EllipsisParam) or not getattr(p, "name", None):
                self.fail(p, "every parameter needs a name")
            if isinstance(p.type, c.ArrayDecl):
                self.fail(p, "array parameters are not supported: write a pointer, float* x")
            params.append((p.name, self.ctype(p.type, p), "const" in (p.quals or [])
                           or "const" in (getattr(p.type, "quals", None) or [])))
        self.fname, self.kernel, self.ret, self.ntmp, self.indent = name, kernel, ret, 0, 0
        self.scopes, self.loops, self.used = [{}], [], set()
        self.info = KernelInfo(name, [(n, t) for n, t, _ in params], line=f.coord.line)
        py_params = ", ".join(["_t"] + [self.declare(n, t, None, f).py for n, t, _ in params])
        line = f.coord.line
        self.emit(f"def {'k_' if kernel else 'f_'}{name}({py_params}):", line)
        self.indent = 1
        self.emit("_B = _t.budget", line)
        if kernel or name in self.generators:
            self.emit("if False: yield", line)       # always a generator, even without a barrier
        self.block(f.body)
        self.emit("return" + ("" if kernel or ret.kind == "v" else " 0"), line)
        self.indent = 0
        if kernel:
            self.kernels[name] = self.info

    # -- symbols ----------------------------------------------------------------------------------
    def declare(self, name, t, dims, node, const=False):
        if name in self.scopes[-1]:
            self.fail(node, f"'{name}' is declared twice in the same scope")
        py = f"v_{name}"
        while py in self.used:                       # a shadowing declaration gets its own Python name
            py += "_"
        self.used.add(py)
        sym = _Sym(py, t, dims, const)
        self.scopes[-1][name] = sym
        return sym

    def lookup(self, name, node):
        for scope in reversed(self.scopes):
            if name in scope:
                return scope[name]
        return None

    # -- statements -------------------------------------------------------------------------------
    def block(self, node):
        self.scopes.append({})
        start = len(self.out)
        for item in (node.block_items or []) if isinstance(node, self.c.Compound) else [node]:
            self.stmt(item)
        if len(self.out) == start:
            self.emit("pass", node.coord.line if node.coord else 0)
        self.scopes.pop()

    def body(self, node, line):
        """A statement as an indented Python block."""
        self.indent += 1
        start = len(self.out)
        if node is not None:
            self.block(node)
        if len(self.out) == start:
            self.emit("pass", line)
        self.indent -= 1

    def tick(self, line):
        self.emit("_B[0] -= 1", line)
        self.emit("if _B[0] < 0: _timeout()", line)

    def stmt(self, node):
        c, line = self.c, node.coord.line if node.coord else 0
        if isinstance(node, c.Compound):
            self.block(node)
        elif isinstance(node, c.Decl):
            self.decl(node)
        elif isinstance(node, c.DeclList):
            for d in node.decls:
                self.decl(d)
        elif isinstance(node, c.If):
            self.emit(f"if {self.cond(node.cond)}:", line)
            self.body(node.iftrue, line)
            if node.iffalse is not None:
                self.emit("else:", node.iffalse.coord.line if node.iffalse.coord else line)
                self.body(node.iffalse, line)
        elif isinstance(node, c.For):
            self.scopes.append({})
            if node.init is not None:
                self.stmt(node.init) if isinstance(node.init, (c.DeclList, c.Decl)) else self.expr_stmt(node.init)
            self.emit(f"while {self.cond(node.cond) if node.cond is not None else 'True'}:", line)
            self.loops.append(node.next)
            self.indent += 1
            self.tick(line)
            self.block(node.stmt) if node.stmt is not None else None
            if node.next is not None:
                self.expr_stmt(node.next)
            self.indent -= 1
            self.loops.pop()
            self.scopes.pop()
        elif isinstance(node, c.While):
            self.emit(f"while {self.cond(node.cond)}:", line)
            self.loops.append(None)
            self.indent += 1
            self.tick(line)
            self.block(node.stmt) if node.stmt is not None else None
            self.indent -= 1
            self.loops.pop()
        elif isinstance(node, c.DoWhile):
            first = self.tmp("_first")
            self.emit(f"{first} = True", line)
            cond_line = node.cond.coord.line if node.cond.coord else line
            self.emit(f"while {first} or {self.cond(node.cond)}:", cond_line)
            self.loops.append(None)
            self.indent += 1
            self.emit(f"{first} = False", line)
            self.tick(line)
            self.block(node.stmt) if node.stmt is not None else None
            self.indent -= 1
            self.loops.pop()
        elif isinstance(node, c.Break):
            self.emit("break", line)
        elif isinstance(node, c.Continue):
            if not self.loops:
                self.fail(node, "'continue' outside a loop")
            if self.loops[-1] is not None:          # a for loop's increment runs on continue too
                self.expr_stmt(self.loops[-1])
            self.emit("continue", line)
        elif isinstance(node, c.Return):
            if node.expr is None:
                self.emit("return", line)
            elif self.kernel or self.ret.kind == "v":
                self.fail(node, "a void function cannot return a value")
            else:
                self.emit(f"return {self.convert(self.expr(node.expr), self.ret, node)}", line)
        elif isinstance(node, c.EmptyStatement):
            pass
        elif isinstance(node, (c.Switch, c.Goto, c.Label, c.Case, c.Default)):
            self.fail(node, f"'{type(node).__name__.lower()}' is not supported (write if/else)")
        else:
            self.expr_stmt(node)

    def decl(self, node):
        c, line = self.c, node.coord.line
        storage = node.storage or []
        if isinstance(node.type, c.FuncDecl):
            self.fail(node, "function declarations inside a function are not supported")
        if "register" in storage:                   # __shared__ (our marker)
            return self.shared_decl(node, "extern" in storage)
        if isinstance(node.type, c.ArrayDecl):
            dims, inner = self.array_dims(node.type, node)
            t = self.ctype(inner, node)
            sym = self.declare(node.name, t, dims, node)
            size = 1
            for d in dims:
                size *= d
            init = "None"
            if isinstance(node.init, c.InitList):
                values = [self.convert(self.expr(e), t, node) for e in node.init.exprs]
                if len(values) > size or len(dims) > 1:
                    self.fail(node, "only a flat initializer list that fits a 1-D local array is supported")
                init = "[" + ", ".join(values) + "]"
            elif node.init is not None:
                self.fail(node, "this array initializer is not supported")
            self.emit(f"{sym.py} = _local(_t, {node.name!r}, {t.name!r}, {dims!r}, {init})", line)
            return
        t = self.ctype(node.type, node)
        if t.kind == "v" and not t.ptr:
            self.fail(node, "a void variable")
        value = self.convert(self.expr(node.init), t, node) if node.init is not None else (
            "None" if t.ptr else "0.0" if t.kind == "f" else "0")
        if isinstance(node.init, c.InitList):
            self.fail(node, "an initializer list needs an array")
        const = "const" in (node.quals or [])
        sym = self.declare(node.name, t, None, node, const)
        if const and t.kind == "i" and not t.ptr and re.fullmatch(r"\(?-?\d+\)?", value):
            self.constants[sym.py] = value             # const int TILE = 16; sizes arrays like a #define
        self.emit(f"{sym.py} = {value}", line)

    def array_dims(self, node, where):
        dims = []
        while isinstance(node, self.c.ArrayDecl):
            if node.dim is None:
                self.fail(where, "an array needs a size (or extern __shared__ for dynamic shared memory)")
            dims.append(self.const_int(node.dim))
            node = node.type
        return tuple(dims), node

    def const_int(self, node):
        """A constant integer expression (array sizes), evaluated now."""
        e = self.expr(node)
        try:
            value = eval(e.code, {"_idiv": _idiv, "_imod": _imod})   # only literals and operators reach here
        except Exception:
            self.fail(node, "an array size must be a constant (a number or a #define)")
        if not isinstance(value, int) or value <= 0:
            self.fail(node, f"an array size must be a positive integer, not {value!r}")
        return value

    def shared_decl(self, node, dynamic):
        c, line = self.c, node.coord.line
        if not self.kernel:
            self.fail(node, "__shared__ arrays in __device__ functions are not supported: declare them in the kernel")
        if dynamic:
            if not (isinstance(node.type, c.ArrayDecl) and node.type.dim is None):
                self.fail(node, "extern __shared__ must be an array with no size: extern __shared__ float s[];")
            t, dims = self.ctype(node.type.type, node), ()
        elif isinstance(node.type, c.ArrayDecl):
            dims, inner = self.array_dims(node.type, node)
            if len(dims) > 3:
                self.fail(node, "__shared__ arrays of more than 3 dimensions are not supported")
            t = self.ctype(inner, node)
        else:
            t, dims = self.ctype(node.type, node), (1,)            # a __shared__ scalar: one element
        if node.init is not None:
            self.fail(node, "a __shared__ variable cannot have an initializer (CUDA forbids it too)")
        if any(s.name == node.name for s in self.info.shared):
            self.fail(node, f"two __shared__ declarations of '{node.name}'")
        self.info.shared.append(SharedDecl(node.name, t, dims, line))
        sym = self.declare(node.name, t, dims or (0,), node)          # (0,): extern, sized at launch
        if dims == (1,) and not isinstance(node.type, c.ArrayDecl):
            sym = self.scopes[-1][node.name] = sym._replace(dims=("scalar",))
        self.emit(f"{sym.py} = _t.shared[{node.name!r}]", line)

    def expr_stmt(self, node):
        c, line = self.c, node.coord.line if node.coord else 0
        if isinstance(node, c.ExprList):
            for e in node.exprs:
                self.expr_stmt(e)
        elif isinstance(node, c.FuncCall) and isinstance(node.name, c.ID) and node.name.name == "__syncthreads":
            if node.args is not None and node.args.exprs:
                self.fail(node, "__syncthreads() takes no arguments")
            self.emit(f"yield {line}", line)
        elif isinstance(node, c.Assignment):
            self.assign(node, statement=True)
        elif isinstance(node, c.UnaryOp) and node.op in ("p++", "p--", "++", "--"):
            self.assign(c.Assignment("+=" if "+" in node.op else "-=", node.expr,
                                     c.Constant("int", "1", node.coord), node.coord), statement=True)
        else:
            e = self.expr(node)
            self.emit(e.code, line)

    # -- assignment -------------------------------------------------------------------------------
    def assign(self, node, statement):
        """``lvalue op= value``: as a statement, or as an expression (returns _E)."""
        c, line = self.c, node.coord.line
        target = node.lvalue
        op = node.op[:-1]
        if isinstance(target, c.ID):
            sym = self.lookup(target.name, target)
            if sym is None:
                self.fail(target, f"'{target.name}' is not declared")
            if sym.dims and sym.dims != ("scalar",):
                self.fail(target, f"cannot assign to the array '{target.name}'")
            if sym.const:
                self.fail(target, f"'{target.name}' is const")
            if sym.dims == ("scalar",):                    # a __shared__ scalar: element 0 of its array
                return self.store(c.ArrayRef(target, c.Constant("int", "0", node.coord), node.coord), op, node, statement)
            value = self.expr(node.rvalue) if not op else self.binop(op, _E(sym.py, sym.t, True), self.expr(node.rvalue), node)
            code = self.convert(value, sym.t, node)
            if statement:
                self.emit(f"{sym.py} = {code}", line)
                return None
            return _E(f"({sym.py} := {code})", sym.t, True)
        if isinstance(target, c.ArrayRef) or (isinstance(target, c.UnaryOp) and target.op == "*"):
            return self.store(target, op, node, statement)
        self.fail(node, "this kind of assignment target is not supported")

    def element(self, target):
        """(pointer code, index code or tuple code, element CType, load/store helper suffix) of a[i], a[i][j], *p."""
        c = self.c
        if isinstance(target, c.UnaryOp):                  # *p
            p = self.expr(target.expr)
            if not p.t.ptr:
                self.fail(target, "'*' needs a pointer")
            return p.code, "0", p.t.element(), ""
        subs, base = [], target
        while isinstance(base, c.ArrayRef):
            subs.append(base.subscript)
            base = base.name
        subs.reverse()
        if isinstance(base, c.ID):
            sym = self.lookup(base.name, base)
            if sym is not None and sym.dims == ("scalar",):
                return sym.py, "0", sym.t, ""
            if sym is not None and sym.dims and len(sym.dims) > 1:
                if len(subs) != len(sym.dims):
                    self.fail(target, f"'{base.name}' has {len(sym.dims)} dimensions: index it as "
                              + base.name + "".join("[i]" for _ in sym.dims))
                idx = [self.int_index(s) for s in subs]
                return sym.py, "(" + ", ".join(idx) + ",)", sym.t, "n"
        if len(subs) != 1:
            self.fail(target, "only 1-D indexing of a pointer is supported")
        p = self.expr(base)
        if not p.t.ptr:
            self.fail(target, "indexing needs a pointer or an array")
        return p.code, self.int_index(subs[0]), p.t.element(), ""

    def int_index(self, node):
        e = self.expr(node)
        if e.t.kind != "i" or e.t.ptr:
            self.fail(node, f"an array index must be an integer, not {e.t}")
        return e.code

    def store(self, target, op, node, statement):
        line = node.coord.line
        p, idx, t, n = self.element(target)
        stored = DOUBLE if t == FLOAT else t          # float memory rounds what it stores by itself
        if not op:
            value = self.convert(self.expr(node.rvalue), stored, node)
            code = f"_st{n}(_t, {p}, {idx}, {value}, {line})"
        else:                        # a[i] op= v: pointer and index evaluated once, into temporaries
            pv, iv = self.tmp("_p"), self.tmp("_i")
            old = _E(f"_ld{n}(_t, {pv}, {iv}, {line})", t, True)
            value = self.convert(self.binop(op, old, self.expr(node.rvalue), node), stored, node)
            code = f"_st{n}(_t, {pv}, {iv}, {value}, {line})"
            if statement:
                self.emit(f"{pv} = {p}; {iv} = {idx}", line)
            else:
                code = f"(({pv} := {p}), ({iv} := {idx}), {code})[-1]"
        if statement:
            self.emit(code, line)
            return None
        return _E(code, t, True)

    # -- expressions ------------------------------------------------------------------------------
    def cond(self, node):
        e = self.expr(node)
        return e.code

    def convert(self, e: _E, t: CType, node) -> str:
        """Code for the value of ``e`` converted to C type ``t`` (as assignment does)."""
        s = e.t
        if t.ptr or s.ptr:
            if e.code == "None":
                return e.code
            if t.ptr != s.ptr or (t.element().name != s.element().name and t.kind != "v" and s.kind != "v"):
                self.fail(node, f"cannot convert {s} to {t}")
            return e.code
        if t.kind == "f":
            if s.kind == "i" and e.code.isdigit():
                return repr(_round32(float(e.code)) if t.bits == 32 else float(e.code))
            if s.kind == "f" and (e.exact and (s.bits <= t.bits)):
                return e.code
            if t.bits == 32:
                return f"_f32({e.code})"
            return e.code if s.kind == "f" else f"float({e.code})"
        if t.name == "bool":
            return e.code if s.name == "bool" else f"({e.code} != 0)"
        if s.kind == "f":
            code = f"_f2i({e.code})"
            return code if t.signed else f"({code} & {_mask(t.bits)})"
        if not t.signed:
            if (not s.signed and s.bits <= t.bits) or (e.code.isdigit() and int(e.code) >> t.bits == 0):
                return e.code
            return f"({e.code} & {_mask(t.bits)})"
        if (s.signed and s.bits <= t.bits) or (not s.signed and s.bits < t.bits):
            return e.code
        half = hex(1 << (t.bits - 1))
        if not s.signed and s.bits == t.bits:            # already in 0..2**bits-1: reinterpret the top bit
            return f"(({e.code} ^ {half}) - {half})"
        return f"(((({e.code}) & {_mask(t.bits)}) ^ {half}) - {half})"

    def expr(self, node) -> _E:
        method = getattr(self, "x_" + type(node).__name__, None)
        if method is None:
            self.fail(node, f"this expression ({type(node).__name__}) is not supported")
        return method(node)

    def x_Constant(self, node):
        v = node.value
        if node.type == "char":
            try:
                return _E(str(ord(ast.literal_eval(v))), _T["char"], True)
            except Exception:
                self.fail(node, f"cannot read the character {v}")
        if node.type == "string":
            return _E(repr(ast.literal_eval(v)), _T["char"].pointer(), True)
        if node.type in ("float", "double", "long double"):
            if v[-1] in "fF":
                return _E(repr(_round32(float(v[:-1]))), FLOAT, True)
            return _E(repr(float(v.rstrip("lL"))), DOUBLE, True)
        digits = v.rstrip("uUlL")
        suffix = v[len(digits):].lower()
        if digits.lower().startswith("0x"):
            value, decimal = int(digits, 16), False
        elif digits.startswith("0") and len(digits) > 1:
            value, decimal = int(digits, 8), False
        else:
            value, decimal = int(digits), True
        candidates = ["int", "long"] if decimal else ["int", "unsigned int", "long", "unsigned long"]
        if "u" in suffix:
            candidates = ["unsigned int", "unsigned long"]
        if "l" in suffix:
            candidates = [x for x in candidates if "long" in x] or candidates
        for name in candidates:
            t = _T[name]
            if value < (1 << (t.bits - (1 if t.signed else 0))):
                return _E(str(value), t, True)
        return _E(str(value), _T["unsigned long long"], True)

    def x_ID(self, node):
        sym = self.lookup(node.name, node)
        if sym is not None:
            if sym.dims == ("scalar",):
                return _E(f"_ld(_t, {sym.py}, 0, {node.coord.line})", sym.t, True)
            if sym.dims:
                return _E(sym.py, sym.t.pointer(), True)   # an array decays to a pointer to its first element
            return _E(self.constants.get(sym.py, sym.py), sym.t, True)
        if node.name in _BUILTIN_IDS:
            code, t = _BUILTIN_IDS[node.name]
            return _E(code, t, True)
        if node.name in _DIMS:
            self.fail(node, f"use {node.name}.x, .y or .z")
        self.fail(node, f"'{node.name}' is not declared")

    def x_StructRef(self, node):
        if (isinstance(node.name, self.c.ID) and node.name.name in _DIMS and node.type == "."
                and node.field.name in ("x", "y", "z")):
            return _E(f"_t.{_DIMS[node.name.name]}{node.field.name}", UINT, True)
        self.fail(node, "structs are not supported (only threadIdx, blockIdx, blockDim, gridDim .x/.y/.z)")

    def x_ArrayRef(self, node):
        p, idx, t, n = self.element(node)
        return _E(f"_ld{n}(_t, {p}, {idx}, {node.coord.line})", t, True)

    def x_Cast(self, node):
        t = self.ctype(node.to_type, node)
        e = self.expr(node.expr)
        if t.kind == "v" and not t.ptr:
            return _E(e.code, t)
        return _E(self.convert(e, t, node), t, True)

    def x_TernaryOp(self, node):
        a, b = self.expr(node.iftrue), self.expr(node.iffalse)
        if a.t.ptr or b.t.ptr:
            t = a.t if a.t.ptr else b.t
        else:
            t = _arith(a.t, b.t)
            a, b = _E(self.convert(a, t, node), t, a.exact), _E(self.convert(b, t, node), t, b.exact)
        return _E(f"({a.code} if {self.cond(node.cond)} else {b.code})", t, a.exact and b.exact)

    def x_Assignment(self, node):
        return self.assign(node, statement=False)

    def x_ExprList(self, node):
        parts = [self.expr(e) for e in node.exprs]
        return _E("(" + ", ".join(p.code for p in parts) + ")[-1]", parts[-1].t, parts[-1].exact)

    def x_UnaryOp(self, node):
        c, op = self.c, node.op
        if op == "sizeof":
            t = self.ctype(node.expr, node) if isinstance(node.expr, c.Typename) else self.expr(node.expr).t
            return _E(str(8 if t.ptr else t.bits // 8 or 1), _T["unsigned long"], True)
        if op in ("++", "--", "p++", "p--"):
            return self.incdec(node)
        if op == "&":
            target = node.expr
            if isinstance(target, c.ArrayRef):
                p, idx, t, n = self.element(target)
                return _E(f"_addr{n}({p}, {idx})", t.pointer(), True)
            if isinstance(target, c.ID):
                sym = self.lookup(target.name, target)
                if sym is not None and sym.dims == ("scalar",):
                    return _E(sym.py, sym.t.pointer(), True)
            self.fail(node, "'&' works on array elements (&a[i]) and __shared__ variables only")
        if op == "*":
            p, idx, t, n = self.element(node)
            return _E(f"_ld(_t, {p}, 0, {node.coord.line})", t, True)
        e = self.expr(node.expr)
        if op == "!":
            return _E(f"(not {e.code})", BOOL, True)
        if e.t.ptr:
            self.fail(node, f"'{op}' on a pointer")
        t = _arith(e.t, e.t) if e.t.kind == "i" else e.t
        code = self.convert(e, t, node)
        if op == "-":
            return _wrap(f"(-{code})", t)
        if op == "+":
            return _E(code, t, e.exact)
        if op == "~":
            if t.kind != "i":
                self.fail(node, "'~' needs an integer")
            return _wrap(f"(~{code})", t)
        self.fail(node, f"the operator '{op}' is not supported")

    def incdec(self, node):
        c = self.c
        delta = "+" if "+" in node.op else "-"
        target = node.expr
        post = node.op.startswith("p")
        if isinstance(target, c.ID):
            sym = self.lookup(target.name, target)
            if sym is None or (sym.dims and sym.dims != ("scalar",)):
                self.fail(node, f"cannot increment '{target.name}'")
            if sym.dims != ("scalar",):
                new = self.convert(self.binop(delta, _E(sym.py, sym.t, True), _E("1", INT, True), node), sym.t, node)
                if not post:
                    return _E(f"({sym.py} := {new})", sym.t, True)
                old = self.tmp("_o")
                return _E(f"(({old} := {sym.py}), ({sym.py} := {new}))[0]", sym.t, True)
            target = c.ArrayRef(target, c.Constant("int", "0", node.coord), node.coord)
        if isinstance(target, c.ArrayRef) or (isinstance(target, c.UnaryOp) and target.op == "*"):
            p, idx, t, n = self.element(target)
            if n:
                self.fail(node, "++/-- inside an expression on a multi-dimensional array is not supported")
            return _E(f"_incdec(_t, {p}, {idx}, {delta}1, {post}, {node.coord.line})", t, True)
        self.fail(node, "++/-- needs a variable or an array element")

    def x_BinaryOp(self, node):
        a = self.expr(node.left)
        b = self.expr(node.right)
        return self.binop(node.op, a, b, node)

    def binop(self, op, a: _E, b: _E, node) -> _E:
        if op in ("&&", "||"):
            return _E(f"(not not ({a.code} {'and' if op == '&&' else 'or'} {b.code}))", BOOL, True)
        if a.t.ptr or b.t.ptr:
            return self.pointer_op(op, a, b, node)
        if op in ("<<", ">>"):
            if a.t.kind != "i" or b.t.kind != "i":
                self.fail(node, f"'{op}' needs integers")
            t = _arith(a.t, a.t)
            code = f"({self.convert(a, t, node)} {op} {b.code})"
            return _wrap(code, t) if op == "<<" else _E(code, t, True)
        t = _arith(a.t, b.t)
        x, y = self.convert(a, t, node) if t.kind == "i" else a.code, self.convert(b, t, node) if t.kind == "i" else b.code
        if op in ("<", ">", "<=", ">=", "==", "!="):
            return _E(f"({x} {op} {y})", BOOL, True)
        if op == "/":
            return _wrap(f"_idiv({x}, {y})", t) if t.kind == "i" else _E(f"_fdiv({x}, {y})", t)
        if op == "%":
            if t.kind != "i":
                self.fail(node, "'%' needs integers (use fmodf for floats)")
            return _E(f"_imod({x}, {y})", t, True)
        if op in ("&", "|", "^") and t.kind != "i":
            self.fail(node, f"'{op}' needs integers")
        if op not in _PY_OPS:
            self.fail(node, f"the operator '{op}' is not supported")
        code = f"({x} {op} {y})"
        return _wrap(code, t) if t.kind == "i" and op in "+-*" else _E(code, t, t.kind == "i")

    def pointer_op(self, op, a, b, node):
        if op in ("+", "-") and a.t.ptr and not b.t.ptr and b.t.kind == "i":
            return _E(f"({a.code} {op} {b.code})", a.t, True)
        if op == "+" and b.t.ptr and not a.t.ptr and a.t.kind == "i":
            return _E(f"({b.code} + {a.code})", b.t, True)
        if op == "-" and a.t.ptr and b.t.ptr:
            return _E(f"({a.code} - {b.code})", LONG, True)
        if op in ("==", "!=", "<", ">", "<=", ">="):
            return _E(f"_pcmp({a.code}, {op!r}, {b.code})", BOOL, True)
        self.fail(node, f"'{op}' is not supported on pointers")

    def x_FuncCall(self, node):
        c, line = self.c, node.coord.line
        if not isinstance(node.name, c.ID):
            self.fail(node, "calls through function pointers are not supported")
        name = node.name.name
        args = node.args.exprs if node.args is not None else []
        if name == "__syncthreads":
            self.fail(node, "__syncthreads() must be a statement of its own")
        if name in _MATH:
            helper, rule = _MATH[name]
            es = [self.expr(a) for a in args]
            if any(e.t.ptr for e in es):
                self.fail(node, f"{name} takes numbers, not pointers")
            if rule == "b":
                return _E(f"{helper}({', '.join(e.code for e in es)})", BOOL, True)
            if rule == "f":
                t = FLOAT
            elif rule == "a":
                t = es[0].t
                for e in es[1:]:
                    t = _arith(t, e.t)
            else:                                  # C++ overloads: float in, float out
                t = DOUBLE if any(e.t == DOUBLE or e.t.kind == "i" for e in es) else FLOAT
            codes = [self.convert(e, t, node) if t.kind == "f" or e.t != t else e.code for e in es]
            call = f"{helper}({', '.join(codes)})"
            return _E(f"_f32({call})" if t == FLOAT else call, t, True)
        if name in _WARP:
            return self.warp_call(node, name, args)
        if name in _ATOMICS:
            if len(args) != (3 if name == "atomicCAS" else 2):
                self.fail(node, f"{name} takes {3 if name == 'atomicCAS' else 2} arguments")
            p = self.expr(args[0])
            if not p.t.ptr:
                self.fail(node, f"{name}'s first argument must be an address: {name}(&a[i], v) or {name}(a + i, v)")
            t = p.t.element()
            rest = [self.convert(self.expr(a), t, node) for a in args[1:]]
            return _E(f"_atomic(_t, {_ATOMICS[name]!r}, {p.code}, {', '.join(rest)}, {line})", t, True)
        if name == "printf":
            es = [self.expr(a) for a in args]
            return _E(f"_printf({', '.join(e.code for e in es)})", INT, True)
        if name == "assert":
            e = self.expr(args[0])
            return _E(f"_assert({e.code})", INT, True)
        if name in self.functions:
            f = self.functions[name]
            if self.is_kernel(f):
                self.fail(node, f"a kernel cannot call the kernel '{name}' (dynamic parallelism is not supported)")
            ftype = f.decl.type
            params = [p for p in (ftype.args.params if ftype.args else [])
                      if not (isinstance(p, c.Typename))]
            if len(params) != len(args):
                self.fail(node, f"'{name}' takes {len(params)} arguments, not {len(args)}")
            codes = [self.convert(self.expr(a), self.ctype(p.type, p), node) for a, p in zip(args, params)]
            ret = self.ctype(ftype.type, f)
            call = f"f_{name}({', '.join(['_t'] + codes)})"
            if name in self.generators:
                if not (self.kernel or self.fname in self.generators):
                    self.fail(node, "internal: barrier function called from a plain function")
                call = f"(yield from {call})"
            return _E(call, ret, True)
        self.fail(node, f"the function '{name}' is not supported or not defined in this source")

    def warp_call(self, node, name, args):
        """A warp-level call becomes ``(yield request)``: the thread pauses until every thread of its
        mask in its warp reaches the same call (``_sim`` runs the exchange and sends back the
        result). The request is (call site, line, name, mask, value, lane/delta/predicate, width)."""
        counts, result = _WARP[name]
        if len(args) not in counts:
            self.fail(node, f"{name} takes {' or '.join(map(str, counts))} arguments, not {len(args)}")
        if not (self.kernel or self.fname in self.generators):
            self.fail(node, f"internal: {name} in a plain function")
        es = [self.expr(a) for a in args]
        for e in es:
            if e.t.ptr:
                self.fail(node, f"{name} takes numbers, not pointers")
        self.nsite += 1
        mask = self.convert(es[0], UINT, node) if es and name != "__activemask" else "0xffffffff"
        value, arg, width = "None", "None", "32"
        if result is None:                          # the shuffles: the value keeps its type
            t = es[1].t
            if t.kind == "i" and t.bits < 32:
                t = INT
            value = self.convert(es[1], t, node)
            arg = self.convert(es[2], INT, node)
            if len(es) == 4:
                width = self.convert(es[3], INT, node)
            result = t
        elif name in ("__ballot_sync", "__any_sync", "__all_sync"):
            arg = f"({es[1].code} != 0)"
        request = f"({self.nsite}, {node.coord.line}, {name!r}, {mask}, {value}, {arg}, {width})"
        return _E(f"(yield {request})", result, True)


def _wrap(code, t: CType) -> _E:
    """Unsigned arithmetic wraps around (mod 2**bits); signed overflow is undefined in C: left as is."""
    return _E(f"({code} & {_mask(t.bits)})" if not t.signed else code, t, True)


def _walk(node, c):
    yield node
    for _, child in node.children():
        yield from _walk(child, c)


def _round32(x: float) -> float:
    import struct
    try:
        return struct.unpack("f", struct.pack("f", x))[0]
    except OverflowError:
        return float("inf") if x > 0 else float("-inf")


def _idiv(a, b):
    """C's integer division: truncates toward zero."""
    q = abs(a) // abs(b)
    return q if (a < 0) == (b < 0) else -q


def _imod(a, b):
    """C's remainder: takes the sign of the dividend."""
    return a - b * _idiv(a, b)
