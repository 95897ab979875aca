"""An op is one entry (``OpDef``, flowlab/core/execute.py): what the graph passes need of an op is a
field of its entry, and no pass keeps a list of op names.

Three checks: the passes and the executor hold no op names (an AST scan); an op defined here, with
its fields set and nothing else changed, is folded, fused, compiled to C and written into by the
passes like a built-in one; the C prelude of compiled fusion is a file that ships with the package.
"""
from __future__ import annotations

import ast
import importlib
import pathlib
import tomllib

import numpy as np
import pytest

import flowlab as fl
from flowlab.core.execute import defop, execute, get_op, list_ops
from flowlab.core.executor import compile_plan
from flowlab.core.ops import _rules as R
from flowlab.core.passes import (DEFAULT_PASSES, _ccompile, _cfusion, fold_constants, fuse_elementwise,
                                 prune_dead_nodes, reuse_buffers)

ROOT = pathlib.Path(__file__).resolve().parents[2]
execute_module = importlib.import_module("flowlab.core.execute")
SCANNED = sorted((ROOT / "flowlab" / "core" / "passes").glob("*.py")) + [ROOT / "flowlab" / "core" / "executor.py"]
# (file, string) -> why a string equal to an op's name is not an op name there
NOT_OP_NAMES = {
    ("_cfusion.py", "shape"): "getattr(x, 'shape'): an array's attribute",
    ("fusion.py", "shape"): "__slots__ of the fused op's shape-rule spec",
}


# -- no pass keeps a list of op names ------------------------------------------------------------
def _docstrings(tree):
    return {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}


def _is_op_name(node) -> bool:
    """``op.name`` or ``<anything>.op.name``."""
    return (isinstance(node, ast.Attribute) and node.attr == "name"
            and (isinstance(node.value, ast.Name) and node.value.id == "op"
                 or isinstance(node.value, ast.Attribute) and node.value.attr == "op"))


def test_the_passes_and_the_executor_hold_no_op_names():
    """A pass learns what it needs of an op from the op's fields (``OpDef.elementwise``, ``c_expr``,
    ``fresh``, ``shape_only``, ``stateful``, ``inplace_kernel``), and the graph's own ops (const,
    placeholder, read) by identity: no string that names a registered op, and no test or lookup
    keyed on ``op.name``."""
    names = set(list_ops())
    found, keyed = [], []
    for path in SCANNED:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docs = _docstrings(tree)
        for node in ast.walk(tree):
            if (isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names
                    and id(node) not in docs and (path.name, node.value) not in NOT_OP_NAMES):
                found.append(f"{path.name}:{node.lineno}: {node.value!r}")
            if isinstance(node, ast.Compare) and any(_is_op_name(x) for x in [node.left, *node.comparators]):
                keyed.append(f"{path.name}:{node.lineno}: a comparison of op.name")
            if isinstance(node, ast.Subscript) and _is_op_name(node.slice):
                keyed.append(f"{path.name}:{node.lineno}: a lookup by op.name")
    assert not found, "op names in a pass (make it a field of OpDef instead): " + ", ".join(found)
    assert not keyed, "behaviour keyed on an op's name (make it a field of OpDef instead): " + ", ".join(keyed)


def test_the_scan_sees_op_names():
    """The scan above finds what it looks for (a pass with an op-name set would fail it)."""
    tree = ast.parse('FRESH = {"matmul", "softmax"}\nif node.op.name in FRESH: pass\n')
    strings = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and n.value in set(list_ops())]
    assert strings == ["matmul", "softmax"]
    assert any(isinstance(n, ast.Compare) and _is_op_name(n.left) for n in ast.walk(tree))


def test_every_op_with_a_c_expression_has_a_fusible_form():
    for name in list_ops():
        op = get_op(name)
        if op.c_expr is not None or op.c_block is not None or op.c_bool:
            assert op.elementwise is not None and op.c_expr is not None, name
        if op.c_block is not None:
            assert op.c_block in _cfusion.ULP_BOUND and f"FL_BLOCK({op.c_block})" in _cfusion.prelude(), name


# -- adding an op is one entry, for every pass ------------------------------------------------------
def _cube_out(x, out=None):
    """x * x * x with ``out=``: the kernel's ufuncs, in its order (so the same bits); ``out`` may be
    ``x`` (buffer reuse donates a dying input), so only the last ufunc writes into it."""
    return np.multiply(np.multiply(x, x), x, out=out)


def _filled_like_rule(value, like):
    return R.spec(like)[0], R.spec(value)[1]


@pytest.fixture(scope="module")
def new_ops():
    """Two ops that are not flowlab's, defined as a user would: one entry each, no pass changed.
    ``cube`` is elementwise (fusible, with a C expression, returning a new array); ``filled_like``
    reads its second input only for its shape. They leave the table afterwards: other tests check
    that every op in it has its cases."""
    cube = defop("test_op_entries_cube", lambda x: x * x * x, R.same, doc="x ** 3, as x * x * x.",
                 elementwise=_cube_out, c_expr="({a} * {a}) * {a}", fresh=True)
    filled = defop("test_op_entries_filled_like", lambda value, like: np.full(like.shape, value), _filled_like_rule,
                   doc="``like``'s shape, filled with ``value``.", shape_only=(1,))
    yield cube, filled
    for op in (cube, filled):
        del execute_module._OPS[op.name]   # NOTE: no public way to take an op out of the table (none is needed)


def _plan(build, arrays, passes):
    g = fl.Graph("op_entries")
    with g.as_default():
        xs = [g.placeholder(a.dtype, a.shape) for a in arrays]
        out = build(*xs)
    return compile_plan(g, [out], xs, passes=passes), compile_plan(g, [out], xs, passes=())


def test_a_new_elementwise_op_is_fused_and_written_into(new_ops):
    cube, _ = new_ops
    x, w = (np.random.default_rng(k).standard_normal((4, 4)).astype(np.float32) for k in range(2))
    before = fl.config.compiled_fusion_info()["enabled"]
    fl.config.set_compiled_fusion(False)   # the numpy kernels here; compiling is the next test's
    try:
        fused, plain = _plan(lambda x, w: fl.tanh(execute(cube, (x @ w,)) + 1.0), [x, w], DEFAULT_PASSES)
        reused, unreused = _plan(lambda x, w: execute(cube, (x @ w,)) * 2.0, [x, w], (reuse_buffers,))
    finally:
        fl.config.set_compiled_fusion(before)
    # fused with its neighbours, and the fused kernel writes into matmul's dying result
    assert [n.op.name for n in fused.nodes] == ["matmul", "const", f"fused({cube.name},add,tanh)[in-place]"]
    np.testing.assert_array_equal(fused(x, w)[0], plain(x, w)[0])
    # buffer reuse: the cube writes into matmul's dying result, and multiply into the cube's (fresh)
    assert [n.op.name for n in reused.nodes] == ["matmul", f"{cube.name}[in-place]", "const", "multiply[in-place]"]
    np.testing.assert_array_equal(reused(x, w)[0], unreused(x, w)[0])


def test_a_new_op_that_reads_a_shape_is_folded(new_ops):
    _, filled = new_ops
    x = np.ones((2, 3), np.float32)
    folded, _ = _plan(lambda x: execute(filled, (fl.constant(7.0), x)) + x, [x], (fold_constants, prune_dead_nodes))
    assert [n.op.name for n in folded.nodes] == ["const", "add"]
    np.testing.assert_array_equal(folded(x)[0], np.full((2, 3), 8.0, np.float32))


@pytest.mark.skipif(_ccompile.compiler() is None, reason="no C compiler: compiled fusion falls back to numpy here")
def test_a_new_op_with_a_c_expression_is_compiled(new_ops, tmp_path, monkeypatch):
    cube, _ = new_ops
    monkeypatch.setenv("FLOWLAB_CACHE_DIR", str(tmp_path))
    before = fl.config.compiled_fusion_info()["enabled"]
    fl.config.set_compiled_fusion(True)
    try:
        def build(x, c):
            for _ in range(_cfusion.MIN_OPS // 2):
                x = execute(cube, (x * c,))
            return x
        x = np.random.default_rng(3).uniform(-1.2, 1.2, (64, 33)).astype(np.float32)
        c = np.float32(0.9)
        plan, plain = _plan(build, [x, np.asarray(c)], (fuse_elementwise,))
    finally:
        fl.config.set_compiled_fusion(before)
    (node,) = plan.nodes
    assert node.op.name.startswith(f"fused(multiply,{cube.name},") and getattr(node.op.kernel, "compiled", False)
    got, want = plan(x, np.asarray(c))[0], plain(x, np.asarray(c))[0]
    assert got.tobytes() == want.tobytes()   # multiplications only: numpy's bits


# -- the C prelude is a file, shipped with the package -------------------------------------------------
def test_the_c_prelude_is_a_file_in_the_package():
    path = pathlib.Path(_cfusion._PRELUDE_FILE)
    assert path.parent == pathlib.Path(_cfusion.__file__).resolve().parent and path.suffix == ".c"
    assert _cfusion.prelude() == path.read_text(encoding="utf-8")
    assert "FL_BLOCK(fl_tanhf)" in _cfusion.prelude() and "PRELUDE" not in vars(_cfusion)
    package_data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert "*.c" in package_data["*"], "pyproject.toml must install the .c files of flowlab"
