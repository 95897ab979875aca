"""The architecture of DESIGN.md, checked: layers import downwards only, importing flowlab stays
light, and the engine stays small enough to read."""
import ast
import subprocess
import sys
from pathlib import Path

import flowlab

PKG = Path(flowlab.__file__).parent
CORE_LINE_BUDGET = 5366   # non-blank, non-comment lines in flowlab/core (eager, autodiff, graphs, passes,
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
#                           +6: ConcreteFunction's display methods: its placement graph in a notebook)
LAYERS = ["core", "cluster", "data", "io", "nn", "compat", "grading", "distribute", "widgets"]
BELOW = {  # what each package may import from flowlab (besides itself)
    "core": set(),
    "cluster": {"core"},
    "data": {"core", "cluster"},
    "io": {"core", "cluster", "data"},          # TFRecord writing and Example parsing, just above data
    "nn": {"core", "cluster", "data", "io"},
    "compat": {"core", "cluster", "data", "io", "nn"},
    "grading": {"core", "cluster", "data", "io", "nn"},
    "distribute": {"core", "cluster", "data", "io", "nn"},
    "widgets": set(LAYERS) - {"widgets"},
}
# Upward imports that exist on purpose, each inside a function (so importing the lower layer never
# imports the upper one): (file under flowlab/, package it imports).
UPWARD_EXCEPTIONS: set = set()   # (file, package) pairs allowed to import upwards: keep it empty


def _flowlab_imports(path: Path):
    tree = ast.parse(path.read_text(), str(path))
    pkg_parts = path.relative_to(PKG.parent).with_suffix("").parts
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                base = list(pkg_parts[:-node.level]) if node.level <= len(pkg_parts) else []
                parts = base + (node.module.split(".") if node.module else [])
                names = [parts + [a.name] for a in node.names] if not node.module else [parts]
            else:
                names = [node.module.split(".")] if node.module else []
        elif isinstance(node, ast.Import):
            names = [a.name.split(".") for a in node.names]
        else:
            continue
        for parts in names:
            if parts and parts[0] == "flowlab" and len(parts) > 1:
                yield parts[1], node.lineno


def test_layers_import_downwards_only():
    bad = []
    for layer, allowed in BELOW.items():
        folder = PKG / layer
        for path in folder.rglob("*.py") if folder.exists() else []:
            for target, line in _flowlab_imports(path):
                rel = (path.relative_to(PKG).as_posix(), target)
                if target in LAYERS and target != layer and target not in allowed and rel not in UPWARD_EXCEPTIONS:
                    bad.append(f"{path.relative_to(PKG.parent)}:{line} imports flowlab.{target}")
    assert not bad, "imports that point up the layers of DESIGN.md:\n" + "\n".join(bad)


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
