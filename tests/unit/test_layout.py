"""The architecture of DESIGN.md, checked: layers import downwards only, no package reads another's
private names, no files import each other in a circle, importing flowlab stays light, and the engine
stays small enough to read."""
import ast
import functools
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import flowlab

PKG = Path(flowlab.__file__).parent
CORE_LINE_BUDGET = 6170   # non-blank, non-comment lines in flowlab/core (eager, autodiff, graphs, passes,
#                           devices, numerics): the engine must still fit in a head; raise it only on purpose
#                           (4500 -> 4950: compiled fusion, about 450 lines: passes/_cfusion.py, with its
#                           C source of ~90 lines, passes/_ccompile.py and the switch in config.py;
#                           4950 -> 5000: control dependencies, the public naming API, composite arguments;
#                           +116: the ops tutorials call that had no kernel: fl.print (a stateful op, so a
#                           traced function prints at every call), split, top_k, log1p, softplus, round...;
#                           +103: unknown rank, TensorShape(None) for tf.placeholder(dtype), shape rules probed
#                           per rank in Graph.add_node, the sum_to_like op for gradients of broadcasting;
#                           +141: the copy rule between host and GPU in backends/ (eager, plans, assigns),
#                           fl.config.set_visible_devices, true device labels of traced results;
#                           +6: ConcreteFunction's display methods: its placement graph in a notebook;
#                           +138: the event log moved down from cluster (core/events.py), below all that record;
#                           +76: the stack of interpreters (core/interpreters.py, GraphBuilder, init_scope), the
#                           hook for traced functions with ops on other tasks (set_graph_partitioner), the ops'
#                           pass facets in OpDef (which removed about 28 lines of name lists from the passes);
#                           +70: one path per op in every mode: variable reads and assignments as table ops
#                           with their eager form (core/ops/variable_ops.py, the OpDef ``eager`` facet), the
#                           interpreters' answers (control dependencies, name scopes, inlining), the remote
#                           interpreter's registration with is_local and tape.record_op, and the executor's
#                           ``around`` so a cluster task runs its partition through the one runner;
#                           +500, the engine on a GPU: the GPU twin of compiled fusion, one generated CUDA
#                           kernel per fused chain (passes/cuda_fusion.py, ~190); the CUDA kernel files' registry,
#                           their CuPy launchers and the fused softmax/cross-entropy GPU kernels of the ops
#                           (backends/cuda_kernels.py, ~180); GPU memory counted per device, copies as events,
#                           the no-GPU reason, constants placed on their GPU once per plan, kernels placed on a
#                           device built once per op and device, not at every eager op (~125))
LAYERS = ["core", "gpu", "cluster", "data", "io", "nn", "compat", "grading", "distribute", "widgets"]
BELOW = {  # what each package may import from flowlab (besides itself)
    "core": set(),
    "gpu": {"core"},                            # kernels to read, compile-check, simulate and launch (fl.gpu)
    "cluster": {"core"},
    "data": {"core"},                           # records into core's event log, so it needs no cluster
    "io": {"core", "cluster", "data"},          # TFRecord writing and Example parsing, just above data
    "nn": {"core", "data", "io"},              # collectives only through the strategies (distribute)
    "compat": {"core", "cluster", "data", "io", "nn"},
    "grading": {"core", "gpu", "cluster", "data", "io", "nn"},
    "distribute": {"core", "cluster", "data", "io", "nn"},
    "widgets": set(LAYERS) - {"widgets"},
}
# Upward imports that exist on purpose, each inside a function (so importing the lower layer never
# imports the upper one): (file under flowlab/, package it imports). ``import flowlab`` (package
# "flowlab") counts as importing all that flowlab/__init__.py loads (core, data, io, nn), and ``fl.x``
# as importing flowlab.x. This list may only shrink.
UPWARD_EXCEPTIONS: set = {
    ("cluster/magic.py", "flowlab"),      # a %%px cell on a worker finds ``fl`` in its namespace, as in a notebook
    ("cluster/task_exec.py", "flowlab"),  # a worker runs flowlab/__init__ (every op registered) at its first remote op
}
# Reads of another package's private modules or names that exist today: (file under flowlab/, the
# private name). This list may only shrink: a new read fails test_no_package_reads_another_packages_private_names,
# and an entry no longer read fails test_private_reads_list_only_shrinks.
PRIVATE_READS: set = set()
# Files that import each other, in a circle, when imported (each a strongly connected set of modules,
# see test_no_import_circles). This list may only shrink.
KNOWN_CIRCLES: set = {
    frozenset({"flowlab.core.ops.array_ops", "flowlab.core.ops.math_ops", "flowlab.core.ops.reduction_ops"}),
    frozenset({"flowlab.cluster.server", "flowlab.cluster.task_exec"}),  # server imports task_exec's handlers last
}


# -- what a file imports, resolved ------------------------------------------------------------------

class _Import(NamedTuple):
    line: int
    module: tuple          # the module it imports, or imports from: ("flowlab", "cluster", "events")
    name: str | None       # the name taken from it (``from module import name``); None for ``import module``
    binds: tuple           # (local name, parts) for each name it binds to a module of flowlab or a name in one
    at_import: bool        # runs when the file is imported (not inside a function or ``if TYPE_CHECKING``)


def _here(rel: str) -> tuple:
    """The module parts of a file, from its path under flowlab/ (``cluster/events.py``)."""
    return ("flowlab", *Path(rel).with_suffix("").parts)


def _module_parts(path: Path) -> tuple:
    parts = _here(path.relative_to(PKG).as_posix())
    return parts[:-1] if parts[-1] == "__init__" else parts


@functools.lru_cache(maxsize=None)
def _is_module(parts: tuple) -> bool:
    """Whether ``parts`` (("flowlab", "cluster", "events")) names a module or package of flowlab."""
    if not parts or parts[0] != "flowlab":
        return False
    p = PKG.joinpath(*parts[1:])
    return p.with_suffix(".py").is_file() or (p / "__init__.py").is_file()


def _imports_in(tree: ast.AST, here: tuple) -> tuple:
    """Every import statement of a file, relative ones resolved against its package."""
    out = []

    def visit(node, at_import):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            at_import = False
        elif isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            at_import = False
        if isinstance(node, ast.Import):
            for a in node.names:
                parts = tuple(a.name.split("."))
                bind = (a.asname, parts) if a.asname else (parts[0], parts[:1])
                out.append(_Import(node.lineno, parts, None, (bind,) if _is_module(bind[1]) else (), at_import))
        elif isinstance(node, ast.ImportFrom):
            module = here[:-node.level] if node.level else ()
            module += tuple(node.module.split(".")) if node.module else ()
            for a in node.names:
                flowlab_name = module[:1] == ("flowlab",) and a.name != "*"
                binds = ((a.asname or a.name, module + (a.name,)),) if flowlab_name else ()
                out.append(_Import(node.lineno, module, a.name, binds, at_import))
        for child in ast.iter_child_nodes(node):
            visit(child, at_import)

    visit(tree, True)
    return tuple(out)


@functools.lru_cache(maxsize=None)
def _parsed(path: Path):
    rel = path.relative_to(PKG).as_posix()
    tree = ast.parse(path.read_text(), str(path))
    return rel, tree, _imports_in(tree, _here(rel))


def _imports(path: Path) -> tuple:
    return _parsed(path)[2]


def _attribute_reads(tree: ast.AST, imports: tuple):
    """``(line, parts)`` for each attribute read ``m.x`` whose base ``m`` is a module of flowlab, or a
    name in one, bound by an import of this file (``m.sub.x``, ``m.Class.x`` too): parts are the
    base's and ``x``. A name the file also assigns or takes as an argument is left out (it may not be
    what was imported). Attributes of instances (``tensor._value``) are not seen."""
    binds = {}
    for imp in imports:
        for name, parts in imp.binds:
            binds.setdefault(name, set()).add(parts)
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            binds.pop(node.id, None)
        elif isinstance(node, ast.arg):
            binds.pop(node.arg, None)

    def base_of(node):
        if isinstance(node, ast.Name):
            found = binds.get(node.id, ())
            return next(iter(found)) if len(found) == 1 else None
        if isinstance(node, ast.Attribute):
            base = base_of(node.value)
            if base and _is_module(base + (node.attr,)):
                return base + (node.attr,)
        return None

    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            base = base_of(node.value)
            if base:
                yield node.lineno, base + (node.attr,)


# -- layers -------------------------------------------------------------------------------------------

def _reached(imp: _Import):
    """What of flowlab an import reaches: ``("flowlab", item)`` for a layer or another top-level
    module or package of flowlab (``core``, ``_display``, ``keras``...), ``("flowlab",)`` for the
    top-level package itself (``import flowlab``, ``from flowlab import constant``), None if not flowlab."""
    if not imp.module or imp.module[0] != "flowlab":
        return None
    if len(imp.module) > 1:
        return imp.module[:2]
    if imp.name and _is_module(("flowlab", imp.name)):
        return ("flowlab", imp.name)
    return ("flowlab",)


_LOADS: dict = {}


def _layers_loaded_by(item) -> frozenset:
    """The layers that importing top-level ``item`` of flowlab loads (None: the package ``flowlab``
    itself; else a module or folder beside the layers: ``errors``, ``_names``, ``keras``...): its
    files' imports that run at import time, followed through the other top-level items."""
    if item in _LOADS:
        return _LOADS[item]
    _LOADS[item] = frozenset()          # a circle among top-level items adds nothing twice
    if item is None:
        files = [PKG / "__init__.py"]
    elif (PKG / f"{item}.py").is_file():
        files = [PKG / f"{item}.py"]
    else:
        files = sorted((PKG / item).rglob("*.py"))
    layers = set()
    for f in files:
        for imp in _imports(f):
            reached = _reached(imp) if imp.at_import else None
            target = reached[1] if reached and len(reached) > 1 else None
            if target in LAYERS:
                layers.add(target)
            elif reached and target != item:
                layers |= _layers_loaded_by(target)
    _LOADS[item] = frozenset(layers)
    return _LOADS[item]


def _upward(layer: str, reached: tuple):
    """Why reaching ``reached`` from ``layer`` points up the layers, or None if it does not."""
    target = reached[1] if len(reached) > 1 else None
    if target == layer:
        return None
    if target in LAYERS:
        return None if target in BELOW[layer] else f"imports flowlab.{target}"
    above = _layers_loaded_by(target) - BELOW[layer] - {layer}
    if target is None and layer in _layers_loaded_by(None):
        above |= {layer}               # a layer that ``import flowlab`` loads must not import flowlab
    what = "the top-level package flowlab" if target is None else f"flowlab.{target}"
    return f"imports {what}, which loads {', '.join(sorted(above))}" if above else None


def _upward_imports(rel: str, tree: ast.AST, imports: tuple) -> list:
    """``(line, why, package)`` for each import (or ``fl.x`` read) of a layer's file that points up."""
    layer = rel.split("/")[0]
    reaches = [(imp.line, r) for imp in imports if (r := _reached(imp))]
    reaches += [(line, parts) for line, parts in _attribute_reads(tree, imports)
                if len(parts) == 2 and _is_module(parts)]            # fl.cluster, fl.keras...
    found = []
    for line, reached in reaches:
        why = _upward(layer, reached)
        if why:
            found.append((line, why, reached[1] if len(reached) > 1 else "flowlab"))
    return found


def test_layers_import_downwards_only():
    """Imports (``from flowlab.x import``, relative ones, and ``import flowlab`` itself, whose
    ``fl.cluster`` would reach every layer) point down the layers only."""
    bad = []
    for layer in LAYERS:
        folder = PKG / layer
        for path in sorted(folder.rglob("*.py")) if folder.exists() else []:
            rel, tree, imports = _parsed(path)
            bad += [f"flowlab/{rel}:{line} {why}" for line, why, target in _upward_imports(rel, tree, imports)
                    if (rel, target) not in UPWARD_EXCEPTIONS]
    assert not bad, "imports that point up the layers of DESIGN.md:\n" + "\n".join(sorted(set(bad)))


# -- private names --------------------------------------------------------------------------------------

def _owner(rel: str):
    """The package a file belongs to: its folder under flowlab/, or the module itself beside them
    (None: flowlab/__init__.py)."""
    parts = Path(rel).parts
    return parts[0] if len(parts) > 1 else (None if rel == "__init__.py" else Path(rel).stem)


def _private_part(parts: tuple, own):
    """The dotted private name in ``parts`` (a module path, then maybe names in it) that belongs to a
    package other than ``own``; None if none does."""
    if len(parts) < 2 or parts[0] != "flowlab" or parts[1] == own:
        return None
    for i, part in enumerate(parts[1:], 1):
        if part.startswith("_") and not (part.startswith("__") and part.endswith("__")):
            if i == 1 and _is_module(parts[:2]):
                continue               # flowlab/_display.py and its kind: helpers of the whole package (§1)
            return ".".join(parts[:i + 1])
    return None


def _private_reads_in(rel: str, tree: ast.AST, imports: tuple) -> dict:
    """{private name of another package: first line} read by a file: ``from ..pkg.mod import _name``,
    ``from ..pkg import _mod``, ``import flowlab.pkg._mod``, ``mod._name``, ``Class._name``."""
    own, found = _owner(rel), {}
    reads = [(imp.line, imp.module + ((imp.name,) if imp.name else ())) for imp in imports]
    for line, parts in reads + list(_attribute_reads(tree, imports)):
        name = _private_part(parts, own)
        if name:
            found[name] = min(line, found.get(name, line))
    return found


@functools.lru_cache(maxsize=None)
def _private_reads() -> dict:
    found = {}
    for path in sorted(PKG.rglob("*.py")):
        rel, tree, imports = _parsed(path)
        found.update({(rel, name): line for name, line in _private_reads_in(rel, tree, imports).items()})
    return found


def test_no_package_reads_another_packages_private_names():
    """A package's underscored modules and names are its own (a package: a folder under flowlab/, or a
    module beside them). Those read today are listed in PRIVATE_READS."""
    new = [f"flowlab/{rel}:{line} reads {name}, private to flowlab.{name.split('.')[1]}"
           for (rel, name), line in sorted(_private_reads().items()) if (rel, name) not in PRIVATE_READS]
    assert not new, ("reads of another package's private names (make the name public in its package, or give "
                     "that package a public function for it):\n" + "\n".join(new))


def test_private_reads_list_only_shrinks():
    gone = sorted(PRIVATE_READS - set(_private_reads()))
    assert not gone, "no longer read, so take them out of PRIVATE_READS:\n" + "\n".join(map(str, gone))


# -- private state bolted on ------------------------------------------------------------------------------
# Underscored attributes that a package writes or reads on objects whose package does not own them
# (see _bolted_on): (file under flowlab/, what it does). This list may only shrink.
BOLTED_ON: set = {
    ("_display.py", "getattr(obj, '_live_view')"),          # the live view of any object shown
    ("_display.py", "obj._live_view ="),
    ("cluster/partition.py", "getattr(variable, '_device')"),  # core's Variable and Tensor internals
    ("cluster/partition.py", "hasattr(v, '_id')"),
    ("cluster/remote.py", "h._device ="),
    ("data/_autoshard.py", "getattr(dataset, '_batch')"),
    ("data/dataset.py", "stage._batch ="),
    ("distribute/keras_fit.py", "self.function._warned ="),  # on core's traced function
    ("horovod/_elastic.py", "getattr(opt, '_lr_variable')"),  # nn's optimizer internals
    ("horovod/_elastic.py", "getattr(opt, '_schedule')"),
    ("nn/checkpoint.py", "hasattr(obj, '_checkpoint_read')"),
    ("nn/keras/layers/base.py", "err._layer ="),             # the layer an error came from, on the error
    ("nn/keras/layers/base.py", "getattr(error, '_layer')"),
    ("nn/keras/layers/base.py", "new._layer ="),
    ("widgets/_view.py", "comm._reply_subshell_for ="),     # ipykernel's comm: a subshell for replies
    ("widgets/_view.py", "getattr(comm, '_reply_subshell_for')"),
}
_PROTOCOL_NAMES = {"_fields", "_asdict", "_replace", "_make"}   # namedtuple's public API, underscored


def _private_attr(name) -> bool:
    """An underscored attribute name that is nobody's protocol (``_repr_html_``, ``_fields`` are)."""
    return (isinstance(name, str) and name.startswith("_") and not name.endswith("_")
            and name not in _PROTOCOL_NAMES)


def _own_attributes(tree: ast.AST) -> set:
    """The attribute names a file owns: set on ``self``/``cls``, named in a class body (methods,
    class attributes, ``__slots__``), or assigned at its top level (a module's globals)."""
    own = set()
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and isinstance(node.value, ast.Name)
                and node.value.id in ("self", "cls")):
            own.add(node.attr)
        body = node.body if isinstance(node, (ast.ClassDef, ast.Module)) else ()
        for item in body:
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                own.add(item.name)
            for target in item.targets if isinstance(item, ast.Assign) else [getattr(item, "target", None)]:
                for name in ast.walk(target) if target is not None else ():
                    if isinstance(name, ast.Name):
                        own.add(name.id)
                if isinstance(target, ast.Name) and target.id == "__slots__":
                    own.update(c.value for c in ast.walk(item.value) if isinstance(c, ast.Constant))
    return own


def _bolted_on_in(tree: ast.AST, own: set) -> dict:
    """{what: first line} for each place a file bolts state onto, or reads private state of, an object
    its package does not own: ``x._a = ...`` / ``del x._a`` / ``setattr(x, "_a", ...)`` and
    ``getattr``/``hasattr(x, "_a")`` with ``_a`` an attribute no file of the package owns, and
    ``x.__dict__["_a"]`` (or ``.get``/``.setdefault``/``.pop``) on anything but ``self``/``cls``."""
    found = {}

    def foreign(node):
        return not (isinstance(node, ast.Name) and node.id in ("self", "cls"))

    for node in ast.walk(tree):
        what = None
        if (isinstance(node, ast.Attribute) and isinstance(node.ctx, (ast.Store, ast.Del)) and _private_attr(node.attr)
                and node.attr not in own and foreign(node.value)):
            what = f"{ast.unparse(node)} ="
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and len(node.args) >= 2
              and node.func.id in ("getattr", "setattr", "hasattr", "delattr")
              and isinstance(node.args[1], ast.Constant) and _private_attr(node.args[1].value)
              and node.args[1].value not in own and foreign(node.args[0])):
            what = f"{node.func.id}({ast.unparse(node.args[0])}, {node.args[1].value!r})"
        elif (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute)
              and node.value.attr == "__dict__" and foreign(node.value.value)
              and isinstance(node.slice, ast.Constant) and _private_attr(node.slice.value)):
            what = ast.unparse(node)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and isinstance(node.func.value, ast.Attribute) and node.func.value.attr == "__dict__"
              and foreign(node.func.value.value) and node.args and isinstance(node.args[0], ast.Constant)
              and _private_attr(node.args[0].value)):
            what = f"{ast.unparse(node.func.value)}[{node.args[0].value!r}]"
        if what:
            found[what] = min(node.lineno, found.get(what, node.lineno))
    return found


@functools.lru_cache(maxsize=None)
def _bolted_on() -> dict:
    owned, trees = {}, {}
    for path in sorted(PKG.rglob("*.py")):
        rel, tree, _ = _parsed(path)
        trees[rel] = tree
        owned.setdefault(_owner(rel), set()).update(_own_attributes(tree))
    return {(rel, what): line for rel, tree in trees.items()
            for what, line in _bolted_on_in(tree, owned[_owner(rel)]).items()}


def test_no_package_bolts_state_onto_another_packages_objects():
    """A package keeps its state in its own objects, or in the documented place an object offers
    (``Server.state(name)``), or in a record of its own (a WeakKeyDictionary keyed by the object):
    never in underscored attributes of another package's (or a library's) objects. Those today are
    listed in BOLTED_ON."""
    new = [f"flowlab/{rel}:{line} {what}" for (rel, what), line in sorted(_bolted_on().items())
           if (rel, what) not in BOLTED_ON]
    assert not new, ("private state bolted onto (or read from) objects of another package: keep it in "
                     "a record of this package, or use the place the object documents for it:\n" + "\n".join(new))
    gone = sorted(BOLTED_ON - set(_bolted_on()))
    assert not gone, "no longer done, so take them out of BOLTED_ON:\n" + "\n".join(map(str, gone))


def test_the_checks_catch_private_state_bolted_on():
    source = ("def f(server, comm, fn, obj):\n"
              "    server._faults = 1\n"                                  # an attribute set on a foreign object
              "    x = getattr(server, '_faults', None)\n"                # ... and read
              "    notes = server.__dict__.setdefault('_flowlab_gone', {})\n"
              "    server.__dict__['_flowlab_gone'] = notes\n"
              "    setattr(comm, '_flowlab_collectives', x)\n"
              "    fn._flowlab_original = fn\n"
              "    return obj._fields, getattr(obj, '_repr_html_', None), obj._mine\n"
              "class Mine:\n"
              "    def __init__(self):\n"
              "        self._mine = 1\n"
              "        self.__dict__['_own'] = 2\n")
    found = _bolted_on_in(ast.parse(source), {"_mine"})
    assert found == {"server._faults =": 2, "getattr(server, '_faults')": 3,
                     "server.__dict__['_flowlab_gone']": 4, "setattr(comm, '_flowlab_collectives')": 6,
                     "fn._flowlab_original =": 7}
    assert _own_attributes(ast.parse("_g = 1\nclass A:\n    __slots__ = ('_s',)\n    def _m(self):\n"
                                     "        self._a, self._b = 1, 2\n")) >= {"_g", "_s", "_m", "_a", "_b", "A"}

# -- circles ----------------------------------------------------------------------------------------------

def _import_graph() -> dict:
    """{module: modules it imports when imported}, the packages on the way in included (importing
    flowlab.core.tensor runs flowlab/core/__init__.py first), those it sits in left out."""
    edges = {}
    for path in sorted(PKG.rglob("*.py")):
        me = _module_parts(path)
        out = edges.setdefault(".".join(me), set())
        for imp in _imports(path):
            if not imp.at_import or imp.module[:1] != ("flowlab",):
                continue
            sub = imp.module + (imp.name,) if imp.name else ()
            target = sub if sub and _is_module(sub) else imp.module
            for i in range(2, len(target) + 1):
                if target[:i] != me[:i] and _is_module(target[:i]):
                    out.add(".".join(target[:i]))
    return edges


def _circles(edges: dict) -> set:
    """The strongly connected sets of more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), set()

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            circle = set()
            while not circle or w != v:
                w = stack.pop()
                on_stack.discard(w)
                circle.add(w)
            if len(circle) > 1:
                found.add(frozenset(circle))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_no_import_circles():
    """No two files import each other, directly or around a circle, when imported (imports inside
    functions run later, so they do not count). Those that do today are listed in KNOWN_CIRCLES."""
    circles = _circles(_import_graph())
    new = [" -> ".join(sorted(c)) for c in circles - KNOWN_CIRCLES]
    assert not new, "files that import each other in a circle when imported:\n" + "\n".join(sorted(new))
    gone = [" -> ".join(sorted(c)) for c in KNOWN_CIRCLES - circles]
    assert not gone, "circles gone (or changed), so update KNOWN_CIRCLES:\n" + "\n".join(sorted(gone))


# -- the checks catch what they should ----------------------------------------------------------------------

def _scan(rel: str, source: str):
    tree = ast.parse(source)
    imports = _imports_in(tree, _here(rel))
    return _upward_imports(rel, tree, imports), _private_reads_in(rel, tree, imports)


def test_the_checks_catch_top_level_imports_private_reads_and_circles():
    up, _ = _scan("cluster/fake.py", "def f():\n    import flowlab as fl\n    return fl.distribute\n")
    assert [(line, target) for line, _, target in up] == [(2, "flowlab"), (3, "distribute")]
    assert "which loads data, io, nn" in up[0][1]
    up, _ = _scan("cluster/fake.py", "from .. import constant\nfrom flowlab import keras, errors\n")
    assert [(line, target) for line, _, target in up] == [(1, "flowlab"), (2, "keras")]
    up, _ = _scan("data/fake.py", "from ..cluster.events import now\n")
    assert [(line, target) for line, _, target in up] == [(1, "cluster")]
    up, _ = _scan("distribute/fake.py", "import flowlab as fl\nfrom .. import _display, errors\nfl.nn\n")
    assert up == []
    _, private = _scan("data/fake.py", "from ..core._context import state\nfrom ..core import random as r\n"
                                       "import flowlab.cluster.server as s\nfrom ..core.tensor import Tensor\n"
                                       "def f(x):\n    return r._rng(x), s._private, Tensor._make, r.uniform\n")
    assert private == {"flowlab.core._context": 1, "flowlab.core.random._rng": 6,
                       "flowlab.cluster.server._private": 6, "flowlab.core.tensor.Tensor._make": 6}
    _, private = _scan("data/fake.py", "from . import _parallel\nfrom .._display import view\n"
                                       "from ..core import __all__\n_parallel._x\n")
    assert private == {}
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == {frozenset("abc")}


# -- mode tests: only the interpreters know which mode a thread is in ---------------------------------------
MODE_STATE = {"graph", "interpreter", "interpreters"}   # the thread state's fields that say the mode
MODE_READERS = {"core/interpreters.py", "core/execute.py"}   # the stack itself, and execute's dispatch
CURRENT_GRAPH_CALLS = {  # files outside core that call current_graph(), at most this often: may only shrink
    "compat/_graphs.py": 1,   # entered_graph(): compat's one question, the rest of compat asks it
    "distribute/strategy.py": 3, "distribute/_traced.py": 4, "distribute/horovod.py": 3}


def _mode_tests_in(tree: ast.AST):
    """``(reads, calls)``: the lines that read the thread state's mode fields (``state().graph``, or
    ``st.interpreter`` of a name bound to ``state()``), and those that call ``current_graph()``."""
    def called(node, name):
        f = node.func if isinstance(node, ast.Call) else None
        return f is not None and (getattr(f, "id", None) == name or getattr(f, "attr", None) == name)
    holders = set()   # names and attributes this file binds to state()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.NamedExpr)) and called(node.value, "state"):
            for t in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                holders.add(getattr(t, "id", None) or getattr(t, "attr", None))
    reads = [(node.lineno, node.attr) for node in ast.walk(tree)
             if isinstance(node, ast.Attribute) and node.attr in MODE_STATE and (
                 called(node.value, "state") or getattr(node.value, "id", getattr(node.value, "attr", None)) in holders)]
    return sorted(reads), [node.lineno for node in ast.walk(tree) if called(node, "current_graph")]


def test_no_mode_tests_outside_the_interpreters():
    """Code asks ``interpreters.current()`` for a behaviour, never thread state for the mode; outside
    core only the files of CURRENT_GRAPH_CALLS ask core for the graph being built."""
    bad, calls = [], {}
    for path in sorted(PKG.rglob("*.py")):
        rel, tree, _ = _parsed(path)
        reads, lines = _mode_tests_in(tree)
        bad += [f"flowlab/{rel}:{line} reads the thread state's {attr}" for line, attr in reads
                if rel not in MODE_READERS]
        if lines and not rel.startswith("core/"):
            calls[rel] = len(lines)
    assert not bad, "ask interpreters.current() (or current_graph()) instead:\n" + "\n".join(bad)
    over = {rel: n for rel, n in calls.items() if n > CURRENT_GRAPH_CALLS.get(rel, 0)}
    assert not over, f"current_graph() called more often than CURRENT_GRAPH_CALLS allows: {over}"
    gone = sorted(set(CURRENT_GRAPH_CALLS) - set(calls))
    assert not gone, f"no longer call current_graph(), so take them out of CURRENT_GRAPH_CALLS: {gone}"
    planted = ast.parse("from ..core._context import state\ndef f(g):\n    st = state()\n"
                        "    return st.graph, state().interpreter, g.graph, current_graph()\n")
    assert _mode_tests_in(planted) == ([(4, "graph"), (4, "interpreter")], [4])


def test_only_widgets_import_ipywidgets_and_only_the_cupy_backend_imports_cupy():
    bad = []
    for path in PKG.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            for m in mods:
                root = m.split(".")[0]
                rel = path.relative_to(PKG)
                if root in ("ipywidgets", "anywidget") and rel.parts[0] != "widgets":
                    bad.append(f"{rel}:{node.lineno} imports {m}")
                if root == "cupy" and rel.name != "cupy_backend.py":
                    bad.append(f"{rel}:{node.lineno} imports {m}")
    assert not bad, "\n".join(bad)


def test_import_flowlab_needs_no_widgets_gpu_mpi_or_transport():
    code = ("import sys, flowlab; print(','.join(sorted(m for m in "
            "('ipywidgets', 'anywidget', 'cupy', 'mpi4py', 'zmq', 'matplotlib', 'IPython') if m in sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "", f"import flowlab pulled in: {out.stdout.strip()}"


def test_core_fits_its_line_budget():
    total = 0
    for path in (PKG / "core").rglob("*.py"):
        total += sum(1 for line in path.read_text().splitlines()
                     if line.strip() and not line.strip().startswith("#"))
    assert total <= CORE_LINE_BUDGET, f"flowlab/core has {total} lines of code; the budget is {CORE_LINE_BUDGET}"


def test_test_files_have_unique_names():
    """pytest imports test files by base name (no __init__.py in tests/): two files with the same name
    in different tiers break collection of the whole tree, which the fast tier does. Helper modules
    (``tests/_distribute_helpers.py``) are imported by base name too, so they count as well."""
    tests = Path(__file__).resolve().parents[1]
    seen = {}
    for path in sorted(tests.rglob("*.py")):
        if path.name != "conftest.py":        # pytest keeps each conftest apart by its folder
            seen.setdefault(path.name, []).append(str(path.relative_to(tests)))
    assert {k: v for k, v in seen.items() if len(v) > 1} == {}
