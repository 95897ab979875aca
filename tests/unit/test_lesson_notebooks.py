"""The notebooks under lessons/ and exercises/, read as files (no kernel): what nbval will check in
the notebook tier must be able to pass on any machine, and nothing meant for nbval shows up as code
a learner reads.

- nbval's markers live in cell tags, never in `# NBVAL_...` comment lines;
- every cell tag is one that nbval 0.11 reads (a misspelt tag would silently do nothing);
- every notebook names its kernel (kernelspec), so Jupyter and nbval start the right one;
- no stored output that nbval compares shows a float with more than 6 significant digits: digits
  that far down change with the CPU's SIMD paths, the BLAS build and its thread count. Outputs are
  read after the sanitizing regexes of tests/nbval_sanitize.cfg, as nbval compares them.
"""
import re
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK_DIRS = ("lessons", "exercises")
SANITIZE_CFG = ROOT / "tests" / "nbval_sanitize.cfg"
MAX_SIGNIFICANT_DIGITS = 6

# The tags nbval 0.11 acts on (nbval/plugin.py: `metadata_tags`, the comment markers lower-cased with
# '-' for '_', plus 'raises-exception'); test_known_tags_match_nbval checks this list against nbval.
NBVAL_TAGS = frozenset({
    "nbval-ignore-output", "nbval-check-output", "nbval-raises-exception", "nbval-skip",
    "raises-exception", "pytest-validate-ignore-output",
})
NOT_COMPARED_TAGS = frozenset({"nbval-ignore-output", "pytest-validate-ignore-output", "nbval-skip"})
# What nbval compares of an output's data (images other than SVG are skipped by nbval itself; SVG
# drawings hold layout coordinates, not computed results).
TEXT_MIMETYPES = ("text/plain", "text/html", "text/markdown", "text/latex")

MARKER_COMMENT = re.compile(r"^\s*#.*\b(NBVAL_[A-Z_]+|PYTEST_VALIDATE_[A-Z_]+)", re.M)
# A decimal number with a fraction, alone: not part of a word, a version (2.4.6) or an address
# (127.0.0.1). Integers never match: their digits are exact on every machine.
DECIMAL = re.compile(r"(?<![\w.])(\d+)\.(\d+)(?:[eE][-+]?\d+)?(?![\w.])")


def _notebooks():
    found = []
    for folder in NOTEBOOK_DIRS:
        found += [p for p in sorted((ROOT / folder).rglob("*.ipynb")) if ".ipynb_checkpoints" not in p.parts]
    return found


NOTEBOOKS = _notebooks()
IDS = [p.relative_to(ROOT).as_posix() for p in NOTEBOOKS]


def _read(path):
    return nbformat.read(str(path), as_version=4)


def _sanitizers():
    # read as nbval 0.11 reads it (plugin.get_sanitize_patterns): a "regex:" line, then "replace:"
    pairs = re.findall(r"^regex: (.*)$\n^replace: (.*)$", SANITIZE_CFG.read_text(), flags=re.M)
    assert pairs, f"no regex/replace pairs in {SANITIZE_CFG}"
    return [(re.compile(regex), replacement) for regex, replacement in pairs]


def _compared_texts(cell):
    """The text of each output of a code cell that nbval compares."""
    for output in cell.get("outputs", []):
        if output.output_type == "stream":
            yield output.text
        elif output.output_type in ("execute_result", "display_data"):
            for mime in TEXT_MIMETYPES:
                if mime in output.data:
                    value = output.data[mime]
                    yield value if isinstance(value, str) else "".join(value)
        elif output.output_type == "error":
            yield output.evalue


def too_precise(text, limit=MAX_SIGNIFICANT_DIGITS):
    """The decimal numbers in ``text`` printed with more than ``limit`` significant digits."""
    bad = []
    for m in DECIMAL.finditer(text):
        digits = (m.group(1) + m.group(2)).lstrip("0")
        if len(digits) > limit:
            bad.append(m.group(0))
    return bad


def test_notebooks_are_found():
    assert any(p.parent.name == "lessons" for p in NOTEBOOKS), f"no notebooks under {ROOT / 'lessons'}"


@pytest.mark.parametrize("text, flagged", [
    ("sum of |weights| = 230.543317", ["230.543317"]),
    ("loss 8.509045600891113", ["8.509045600891113"]),
    ("w = [5.522472 5.827278]", ["5.522472", "5.827278"]),
    ("tiny 0.0000001234567", ["0.0000001234567"]),
    ("sum of |weights| = 230.5, loss 0.0094, 6.0e-08, 99.5%", []),
    ("mean 2.000000", ["2.000000"]),
    ("Total params: 4,810 (18.79 KB); 1437 examples; seed 1234567890", []),
    ("numpy 2.4.6 on 127.0.0.1:43631, array([1., 2.])", []),
    ("max 123456.7", ["123456.7"]),
])
def test_too_precise_flags_long_floats_only(text, flagged):
    assert too_precise(text) == flagged


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_no_nbval_comment_markers(path):
    nb = _read(path)
    bad = [f"cell {i}: {m.group(0).strip()!r}" for i, cell in enumerate(nb.cells)
           if cell.cell_type == "code" for m in [MARKER_COMMENT.search(cell.source)] if m]
    assert not bad, (f"{path.name}: nbval markers written as comments a learner reads: {bad}; "
                     "remove the line and put the tag (e.g. 'nbval-ignore-output') in the cell's "
                     "metadata.tags instead")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_cell_tags_are_known_to_nbval(path):
    nb = _read(path)
    bad = [(i, tag) for i, cell in enumerate(nb.cells) for tag in cell.metadata.get("tags", [])
           if tag not in NBVAL_TAGS]
    assert not bad, f"{path.name}: tags nbval does not know (cell, tag): {bad}; known: {sorted(NBVAL_TAGS)}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_notebook_names_its_kernel(path):
    spec = _read(path).metadata.get("kernelspec", {})
    assert spec.get("name") and spec.get("language") == "python", (
        f"{path.name}: metadata.kernelspec is {spec!r}; it needs a name (e.g. 'python3') and "
        "language 'python' (open the notebook in JupyterLab, pick the kernel and save)")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_compared_outputs_print_no_machine_dependent_digits(path):
    nb = _read(path)
    sanitizers = _sanitizers()
    bad = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or NOT_COMPARED_TAGS & set(cell.metadata.get("tags", [])):
            continue
        for text in _compared_texts(cell):
            for regex, replacement in sanitizers:
                text = regex.sub(replacement, text)
            bad += [(i, number) for number in too_precise(text)]
    assert not bad, (
        f"{path.name}: stored outputs show floats whose last digits depend on the CPU, BLAS and "
        f"thread count (cell, number): {bad}; print them rounded to what the lesson means (3-4 "
        "significant digits), compare in code (np.allclose(...) printed as True), or tag the cell "
        "'nbval-ignore-output' when the figure itself is the point")


def test_known_tags_match_nbval():
    plugin = pytest.importorskip("nbval.plugin")
    assert NBVAL_TAGS == set(plugin.metadata_tags)
