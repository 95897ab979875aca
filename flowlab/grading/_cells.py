"""What a notebook's code cells are and which names each defines, read from the file (no kernel):
the grader uses it to blame the cells that define an answer, and the in-place check to tell a learner
that the answer they ran is not the one in the saved notebook."""
from __future__ import annotations

import ast
import json
from pathlib import Path

__all__ = ["python_of", "defined_names", "read_cells"]


def python_of(source: str) -> str:
    try:
        from IPython.core.inputtransformer2 import TransformerManager
        return TransformerManager().transform_cell(source)
    except Exception:   # noqa: BLE001 - no IPython, or a cell it cannot read: the source as it is
        return source


def defined_names(source: str) -> set:
    """Top-level names a cell binds (def, class, assignment, import, for, with)."""
    try:
        tree = ast.parse(python_of(source))
    except SyntaxError:
        return set()
    names: set = set()

    def targets(node):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, (ast.Tuple, ast.List)):
            for elt in node.elts:
                targets(elt)
        elif isinstance(node, ast.Starred):
            targets(node.value)

    def walk(body):
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Assign):
                for t in node.targets:
                    targets(t)
            elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
                targets(node.target)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                for a in node.names:
                    names.add((a.asname or a.name).split(".")[0])
            elif isinstance(node, (ast.For, ast.AsyncFor)):
                targets(node.target)
            elif isinstance(node, (ast.With, ast.AsyncWith)):
                for item in node.items:
                    if item.optional_vars is not None:
                        targets(item.optional_vars)
            for field in ("body", "orelse", "finalbody"):
                if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    walk(getattr(node, field, []) or [])
            for handler in getattr(node, "handlers", []) or []:
                walk(handler.body)

    walk(tree.body)
    return names


def read_cells(path: Path) -> list:
    """``[(cell number (1-based, all cells counted), source), ...]`` of the code cells."""
    nb = json.loads(path.read_text(encoding="utf-8"))
    cells = nb.get("cells") if isinstance(nb, dict) else None
    if not isinstance(cells, list):
        raise ValueError("no list of cells")
    out = []
    for k, cell in enumerate(cells, 1):
        if isinstance(cell, dict) and cell.get("cell_type") == "code":
            src = cell.get("source", "")
            out.append((k, "".join(src) if isinstance(src, list) else str(src)))
    return out
