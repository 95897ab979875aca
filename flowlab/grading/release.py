"""``flowlab exercises release``: the student version of an exercises folder.

Notebooks: every ``### BEGIN SOLUTION`` ... ``### END SOLUTION`` block of a code cell becomes
``# YOUR CODE HERE`` + ``raise NotImplementedError()`` (at the block's indentation; in a markdown
cell, ``YOUR ANSWER HERE``); ``### BEGIN HIDDEN TESTS`` blocks are removed; outputs, execution
counts, attachments of code cells, widget state and every metadata key but the kernel's and the
cells' tags go. Checks files (``checks/<id>.py``): each hidden-test block is replaced by one line,
``HIDDEN_COUNT = N``, the number of hidden cases it held (so a check in place can say how many it
does not show). The manifest and any other file are copied as they are. An unbalanced marker
raises :class:`ReleaseError` naming the file, the cell and the line.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

__all__ = ["release", "ReleaseError", "strip_solutions", "strip_hidden_tests"]

BEGIN_SOLUTION, END_SOLUTION = "### BEGIN SOLUTION", "### END SOLUTION"
BEGIN_HIDDEN, END_HIDDEN = "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS"
_SKIP = {"__pycache__", ".ipynb_checkpoints", ".git"}
_NOTEBOOK_META = ("kernelspec", "language_info")   # all else (widgets, execution, authors' notes) goes
_CELL_META = ("tags", "editable", "deletable")


class ReleaseError(ValueError):
    """An exercise that cannot be released as it is (an unbalanced marker), with where."""


def _blocks(lines, begin, end, where):
    """``[(first, last), ...]`` line indexes (inclusive) of the ``begin``/``end`` blocks of ``lines``."""
    blocks, start = [], None
    for i, line in enumerate(lines):
        text = line.strip()
        if text.startswith(begin):
            if start is not None:
                raise ReleaseError(f"{where}, line {i + 1}: '{begin}' inside the block opened on line "
                                   f"{start + 1} (close it with '{end}' first)")
            start = i
        elif text.startswith(end):
            if start is None:
                raise ReleaseError(f"{where}, line {i + 1}: '{end}' without a '{begin}' before it")
            blocks.append((start, i))
            start = None
    if start is not None:
        raise ReleaseError(f"{where}, line {start + 1}: '{begin}' is never closed with '{end}'")
    return blocks


def strip_solutions(source: str, where: str = "cell", code: bool = True) -> str:
    """``source`` with each solution block replaced by the student's stub (code) or
    ``YOUR ANSWER HERE`` (markdown), and hidden-test blocks removed."""
    lines = source.split("\n")
    out, i = [], 0
    sol = dict(_blocks(lines, BEGIN_SOLUTION, END_SOLUTION, where))
    hid = dict(_blocks(lines, BEGIN_HIDDEN, END_HIDDEN, where))
    while i < len(lines):
        if i in sol:
            indent = lines[i][:len(lines[i]) - len(lines[i].lstrip())]
            out += [indent + "# YOUR CODE HERE", indent + "raise NotImplementedError()"] if code else \
                   [indent + "YOUR ANSWER HERE"]
            i = sol[i] + 1
        elif i in hid:
            i = hid[i] + 1
        else:
            out.append(lines[i])
            i += 1
    return "\n".join(out)


def _count_hidden(path: Path) -> int:
    """How many cases the instructor's checks file yields from ``hidden_cases()``."""
    import runpy   # the instructor's own file: trusted code
    fn = runpy.run_path(str(path), run_name="flowlab_checks_release").get("hidden_cases")
    return sum(1 for _ in fn()) if callable(fn) else 0


def strip_hidden_tests(source: str, where: str = "checks file", hidden: int = 0) -> str:
    """``source`` (a checks file) with its hidden-test blocks replaced by ``HIDDEN_COUNT = hidden``."""
    lines = source.split("\n")
    blocks = dict(_blocks(lines, BEGIN_HIDDEN, END_HIDDEN, where))
    out, i, said = [], 0, False
    while i < len(lines):
        if i in blocks:
            if not said:
                out.append(f"HIDDEN_COUNT = {int(hidden)}   # hidden checks the grader runs (not in this copy)")
                said = True
            i = blocks[i] + 1
        else:
            out.append(lines[i])
            i += 1
    return "\n".join(out)


def _release_notebook(src: Path, dst: Path, name: str) -> None:
    try:
        nb = json.loads(src.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ReleaseError(f"{name}: not a readable notebook ({e})") from None
    for k, cell in enumerate(nb.get("cells", []), 1):
        source = cell.get("source", "")
        text = "".join(source) if isinstance(source, list) else source
        kind = cell.get("cell_type")
        text = strip_solutions(text, f"{name}, cell {k}", code=(kind == "code"))
        cell["source"] = text
        meta = cell.get("metadata", {})
        cell["metadata"] = {key: meta[key] for key in _CELL_META if key in meta}
        if kind == "code":
            cell["outputs"] = []
            cell["execution_count"] = None
            cell.pop("attachments", None)
    meta = nb.get("metadata", {})
    nb["metadata"] = {key: meta[key] for key in _NOTEBOOK_META if key in meta}
    tmp = dst.with_name(dst.name + ".tmp")
    tmp.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, dst)


def release(source_dir="exercises", out_dir="release") -> list:
    """Write the student version of ``source_dir`` into ``out_dir``; the released paths (relative).
    Raises :class:`ReleaseError` (nothing half-written is left in its place) on an unbalanced
    marker, naming the notebook, cell and line."""
    source, out = Path(source_dir).resolve(), Path(out_dir).resolve()
    if not (source / "manifest.json").is_file():
        raise ReleaseError(f"{source} has no manifest.json: is it an exercises folder?")
    if out == source or source in out.parents:
        # inside the source is fine only in a folder the walk below skips; keep them apart
        if out == source:
            raise ReleaseError(f"--out must not be the source folder ({source})")
    staging = out.with_name(out.name + ".partial")
    if staging.exists():
        shutil.rmtree(staging)
    written = []
    try:
        for path in sorted(source.rglob("*")):
            rel = path.relative_to(source)
            if any(part in _SKIP for part in rel.parts) or out in path.parents or path == out \
                    or staging in path.parents or path == staging or path.is_dir():
                continue
            dst = staging / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            if path.suffix == ".ipynb":
                _release_notebook(path, dst, str(rel))
            elif rel.parts[0] == "checks" and path.suffix == ".py":
                text = path.read_text(encoding="utf-8")
                hidden = _count_hidden(path) if BEGIN_HIDDEN in text else 0
                dst.write_text(strip_hidden_tests(text, str(rel), hidden), encoding="utf-8")
            else:
                shutil.copy2(path, dst)
            written.append(str(rel))
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if out.exists():
        shutil.rmtree(out)
    os.replace(staging, out)
    return written
