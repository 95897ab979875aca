"""Checking an answer in place: ``fl.grading.check("ring-allreduce", ring_allreduce)``.

The exercise's visible cases run on the answer here, in the learner's process, each under a time
limit and with the same code the batch grader's probe runs (:mod:`flowlab.grading._probe`); the
results become plain data and are compared by ``python -m flowlab.grading.compare`` in a process of
its own, so the answer's ``__eq__`` never takes part. A failed check does not raise: it shows which
case failed and why, and a hint (the k-th hint after the k-th failed try of that exercise).

Scoring, the same as the grader's (:func:`score`): the share of an exercise's cases that passed, or
all or nothing where its manifest entry says so.

What ran is not always what will be graded (cells run out of order, edits not saved): in a notebook
opened in Jupyter the result says when the answer is not the one in the saved file, and a clean run
grades the saved file as the grader does (:mod:`._clean`).
"""
from __future__ import annotations

import html
import os
import threading

from .plain import render, to_plain

__all__ = ["check", "CheckResult", "score", "reset_attempts"]

_attempts: dict = {}                 # exercise id -> failed tries in this process
_attempts_lock = threading.Lock()
MAX_CASES_SHOWN = 50


def score(max_points: float, passed: int, total: int, all_or_nothing: bool = False) -> float:
    """The points an exercise scores, here and in ``flowlab grade``: ``max_points`` times the share of
    its ``total`` cases that passed (0 without cases); with ``all_or_nothing`` (the manifest entry's
    ``"all_or_nothing": true``) all of them or 0."""
    if total <= 0 or (all_or_nothing and passed < total):
        return 0
    return round(max_points * passed / total, 4)


def reset_attempts(ex_id: str | None = None) -> None:
    """Forget the failed tries (of one exercise, or all): the next failure shows the first hint again."""
    with _attempts_lock:
        if ex_id is None:
            _attempts.clear()
        else:
            _attempts.pop(ex_id, None)


def _inputs(case) -> str:
    parts = [render(to_plain(a), 40) for a in case.args]
    parts += [f"{k}={render(to_plain(v), 40)}" for k, v in case.kwargs.items()]
    text = ", ".join(parts)
    return text if len(text) <= 80 else text[:79] + "…"


def check(ex_id: str, answer, *, timeout: float | None = None, exercises=None, clean=False) -> "CheckResult":
    """Run exercise ``ex_id``'s visible cases on ``answer`` (a function, or a value) and return a
    :class:`CheckResult` (shown in place: a widget in JupyterLab, text headless). ``timeout``: seconds
    per case (default: the checks file's ``TIME_LIMIT``, else the grader's default); ``exercises``: the
    exercises folder (default :func:`~flowlab.grading.find_exercises`). A wrong id raises
    UnknownExerciseError ("did you mean"); a failing answer does not raise.

    In a notebook opened in Jupyter, the result also says when the answer that ran is not the one in
    the saved file (the grader runs the saved file); ``clean=True`` (or a notebook's path) grades the
    saved notebook for this exercise as ``flowlab grade`` does, in a fresh kernel, and shows that too
    (the widget has a button for it)."""
    from . import _clean, _probe
    from .compare import compare_elsewhere
    from .manifest import entry, find_exercises, load_checks, load_manifest

    folder = find_exercises(exercises) if exercises is None or not _has_manifest(exercises) else exercises
    manifest = load_manifest(folder)
    item = entry(manifest, ex_id)
    checks = load_checks(folder, ex_id)
    max_points = item.get("points")
    if max_points is None:
        max_points = checks.POINTS if checks.POINTS is not None else 1
    limit = float(timeout or getattr(checks, "TIME_LIMIT", None) or _probe.DEFAULT_TIME_LIMIT)
    tolerance = checks.TOLERANCE

    drawn = [c[0] if isinstance(c, tuple) else c for c in _probe.all_cases(checks)]   # seeded, as the grader draws
    visible = [case for case in drawn if not case.hidden]
    n_hidden = checks.n_hidden()
    rows, pairs, pending = [], [], []
    for case in visible:
        row = {"name": case.name, "passed": False, "why": "", "inputs": _inputs(case), "expected": "",
               "received": ""}
        rows.append(row)
        try:
            expected = to_plain(case.expected_value())       # before the answer runs (it may change the args)
        except Exception as e:   # noqa: BLE001 - the instructor's reference failed: say so, fail the case
            row["why"] = f"the expected value could not be computed: {type(e).__name__}: {e}"
            continue
        row["expected"] = render(expected)
        got = _probe._one(checks.run, answer, case, limit)
        if got.get("error"):
            row["why"] = _explain(got["error"])
            continue
        received = got.get("received")
        if not isinstance(received, dict):
            row["why"] = "no result was recorded"
            continue
        row["received"] = render(received)
        pairs.append([expected, received, case.tolerance(tolerance)])
        pending.append(row)
    compared_in = None
    if pairs:
        try:
            verdicts, compared_in = compare_elsewhere(pairs, with_pid=True)
        except Exception as e:   # noqa: BLE001 - fail closed: no comparison, no pass
            verdicts = [[False, f"could not compare: {e}"]] * len(pairs)
        for row, (ok, why) in zip(pending, verdicts):
            row["passed"], row["why"] = bool(ok is True), str(why)
    n_passed = sum(r["passed"] for r in rows)
    passed = bool(rows) and n_passed == len(rows)
    hint, hint_number = None, 0
    if not passed:
        with _attempts_lock:
            _attempts[ex_id] = _attempts.get(ex_id, 0) + 1
            tries = _attempts[ex_id]
        if checks.HINTS:
            hint_number = min(tries, len(checks.HINTS))
            hint = str(checks.HINTS[hint_number - 1])
    notebook = _clean.notebook_path() if clean is False or clean is True else clean
    notes = []
    if notebook is not None and clean is False:
        note = _clean.saved_note(item["answer"], answer, notebook)
        if note:
            notes.append(note)
    elif clean is True and notebook is None and not os.environ.get("FLOWLAB_GRADER"):
        notes.append("clean=True: this kernel does not know its notebook's file (Jupyter's server tells it); "
                     "pass the path instead: check(..., clean='my_notebook.ipynb')")
    result = CheckResult(ex_id, item.get("title") or ex_id, rows, max_points=max_points, hidden=n_hidden,
                         all_or_nothing=bool(item.get("all_or_nothing")),
                         hint=hint, hint_number=hint_number, hints_total=len(checks.HINTS),
                         compared_in=compared_in, notes=notes,
                         clean_from=(ex_id, str(folder), str(notebook)) if notebook is not None else None)
    if clean is not False and notebook is not None:
        result.run_clean()
    return result


def _has_manifest(path) -> bool:
    from pathlib import Path
    return (Path(path) / "manifest.json").is_file()


def _explain(error: str) -> str:
    error = error.rstrip().rstrip(":")
    if error.startswith("raised NotImplementedError"):
        return error + " (replace `raise NotImplementedError()` with your code)"
    return error


class CheckResult:
    """What :func:`check` found: ``passed``, ``points`` of ``max_points`` (on the visible cases, as
    :func:`score` counts them in ``flowlab grade`` too), ``cases``
    (dicts: name, passed, why, inputs, expected, received), ``hint`` (None when passed or when the
    exercise has no hints), ``hidden`` (cases the grader runs that are not shown here)."""

    _view = "flowlab.widgets.check:CheckView"

    def __init__(self, ex_id, title, cases, *, max_points=1, hidden=0, hint=None, hint_number=0,
                 hints_total=0, compared_in=None, all_or_nothing=False, notes=(), clean_from=None):
        self.id, self.title, self.cases = ex_id, title, list(cases)
        self.max_points, self.hidden = max_points, int(hidden)
        self.hint, self.hint_number, self.hints_total = hint, hint_number, hints_total
        self.compared_in = compared_in      # pid of the process that compared (not this one)
        self.n_passed = sum(1 for c in self.cases if c["passed"])
        self.passed = bool(self.cases) and self.n_passed == len(self.cases)
        self.points = score(max_points, self.n_passed, len(self.cases), all_or_nothing)
        self.notes = list(notes)            # e.g. "the f that ran is not the one in the saved notebook"
        self._clean_from = clean_from       # (id, exercises folder, notebook) when a clean run is possible
        self.clean = None                   # what the clean run found (:meth:`run_clean`)

    def run_clean(self) -> dict:
        """Grade this exercise on the saved notebook as ``flowlab grade`` does (a fresh kernel, the file
        top to bottom): ``{"status", "points", "max", "reason", "errors", "seconds"}``, also kept as
        ``self.clean`` and shown with the result."""
        from ._clean import clean_run
        if self._clean_from is None:
            raise RuntimeError(f"{self.id}: no saved notebook is known for a clean run; "
                               f"call fl.grading.check(..., clean='path/to/notebook.ipynb')")
        self.clean = clean_run(*self._clean_from)
        return self.clean

    def _clean_lines(self) -> list:
        c = self.clean
        if not c:
            return []
        if c["status"] == "error":
            return [f"clean kernel: {c['reason']}"]
        head = (f"clean kernel, the saved notebook run top to bottom as the grader does: "
                f"{_pts(c['points'])}/{_pts(c['max'])} points ({c['reason']})")
        return [head] + [f"  cell {cell}: {error}" for cell, error in c.get("errors", [])]

    def __bool__(self):
        return self.passed

    # -- what is shown ------------------------------------------------------------------------
    def _headline(self) -> str:
        n = len(self.cases)
        if self.passed:
            counted = f"all {n} checks passed" if n > 1 else "the check passed"
        else:
            counted = f"{self.n_passed} of {n} checks passed" if n else "no checks to run"
        pts = f"{_pts(self.points)}/{_pts(self.max_points)} points"
        if self.passed and self.hidden:
            pts += " if the hidden checks pass too"
        return f"{self.id}: {counted} · {pts}"

    def _hidden_line(self) -> str:
        if not self.hidden:
            return ""
        return (f"{self.hidden} hidden check{'s are' if self.hidden != 1 else ' is'} not shown: "
                f"the grader runs {'them' if self.hidden != 1 else 'it'}")

    def _hint_line(self) -> str:
        if not self.hint:
            return ""
        more = f" ({self.hint_number} of {self.hints_total})" if self.hints_total > 1 else ""
        return f"hint{more}: {self.hint}"

    def __repr__(self):
        lines = [self._headline()]
        for c in self.cases[:MAX_CASES_SHOWN]:
            if not c["passed"]:
                inputs = f" (inputs: {c['inputs']})" if c["inputs"] else ""
                lines.append(f"  ✗ {c['name']}: {c['why']}{inputs}")
        if len(self.cases) > MAX_CASES_SHOWN:
            lines.append(f"  ... {len(self.cases) - MAX_CASES_SHOWN} more cases not shown")
        for line in (self._hint_line(), self._hidden_line(), *("⚠ " + n for n in self.notes),
                     *self._clean_lines()):
            if line:
                lines.append("  " + line)
        return "\n".join(lines)

    def snapshot(self) -> dict:
        shown = self.cases[:MAX_CASES_SHOWN]
        return {"id": self.id, "title": self.title, "passed": self.passed, "points": self.points,
                "max_points": self.max_points, "n_passed": self.n_passed, "n_cases": len(self.cases),
                "cases": [dict(c) for c in shown], "cases_left_out": len(self.cases) - len(shown),
                "hint": self.hint, "hint_number": self.hint_number, "hints_total": self.hints_total,
                "hidden": self.hidden, "headline": self._headline(), "hidden_line": self._hidden_line(),
                "notes": list(self.notes), "can_clean": self._clean_from is not None,
                "clean_lines": self._clean_lines(),
                "clean_passed": bool(self.clean and self.clean["status"] == "pass")}

    def _repr_html_(self) -> str:
        e = html.escape
        ok = self.passed
        colour, bg = ("#1e7b34", "#e6f4ea") if ok else ("#b3261e", "#fdecea")
        head = (f'<div style="background:{bg};color:{colour};border-left:4px solid {colour};padding:4px 8px;'
                f'font-weight:600">{"✓" if ok else "✗"} {e(self._headline())}</div>')
        cell = 'style="padding:2px 8px;text-align:left;vertical-align:top"'
        rows = []
        for c in self.cases[:MAX_CASES_SHOWN]:
            mark = ('<span style="color:#1e7b34">✓</span>' if c["passed"]
                    else '<span style="color:#b3261e">✗</span>')
            rows.append(f"<tr><td {cell}>{mark}</td><td {cell}>{e(c['name'])}</td><td {cell}><code>{e(c['inputs'])}"
                        f"</code></td><td {cell}><code>{e(c['expected'])}</code></td><td {cell}><code>"
                        f"{e(c['received'])}</code></td><td {cell}>{e(c['why'])}</td></tr>")
        heads = "".join(f"<th {cell}>{h}</th>" for h in ("", "case", "inputs", "expected", "received", "why"))
        table = (f'<table style="border-collapse:collapse;font-size:12px;margin-top:4px"><thead><tr>{heads}'
                 f"</tr></thead><tbody>{''.join(rows)}</tbody></table>")
        extra = ""
        if self._hint_line():
            extra += f'<div style="margin-top:4px">💡 {e(self._hint_line())}</div>'
        if self._hidden_line():
            extra += f'<div style="margin-top:4px;color:#666">{e(self._hidden_line())}</div>'
        for note in self.notes:
            extra += f'<div style="margin-top:4px;color:#8a5300">⚠ {e(note)}</div>'
        if self._clean_lines():
            extra += f'<pre style="margin-top:4px">{e(chr(10).join(self._clean_lines()))}</pre>'
        return f'<div class="fl-check-static">{head}{table}{extra}</div>'

    def _repr_mimebundle_(self, include=None, exclude=None):
        from .._display import mimebundle
        return mimebundle(self, include, exclude)


def _pts(p) -> str:
    return str(int(p)) if float(p).is_integer() else f"{p:.3g}"
