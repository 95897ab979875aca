"""The reports ``flowlab grade`` writes: ``grades.csv`` (student, exercise, points, max, status,
reason), ``grades.json`` (everything, per case and per notebook), ``<student>/results.json`` in
Gradescope's autograder format (one test per case; hidden cases with visibility "hidden"), and a
summary table (text)."""
from __future__ import annotations

import csv
import json
import os
from pathlib import Path

__all__ = ["write_reports", "summary_table", "gradescope", "student_reason"]


def _num(x: float) -> str:
    return f"{x:g}" if x == int(x) else f"{x:.2f}".rstrip("0").rstrip(".")


def student_reason(row: dict) -> str:
    """Why an exercise did not pass, as a student may read it: a visible case's difference, how many
    hidden cases failed (never their values), or what went wrong with the run."""
    cases = row.get("cases") or []
    failed = [c for c in cases if not c["passed"]]
    if not cases or len({c["why"] for c in failed}) == 1 and len(failed) == len(cases):
        return row["reason"]      # one cause for all: the answer is missing, the kernel died...
    parts = []
    shown = [c for c in failed if not c["hidden"]]
    if shown:
        parts.append(f"case '{shown[0]['name']}': {shown[0]['why']}")
    hidden = sum(1 for c in failed if c["hidden"])
    if hidden:
        parts.append(f"{hidden} hidden case{'s' if hidden != 1 else ''} failed")
    return "; ".join(parts)


def gradescope(result: dict) -> dict:
    """One student's grading ``result`` as Gradescope's ``results.json``."""
    tests = []
    for n, row in enumerate(result["rows"], 1):
        cases = row.get("cases") or []
        if not cases:
            tests.append({"name": f"{row['title']}", "number": str(n), "score": row["points"],
                          "max_score": row["max"], "output": student_reason(row), "visibility": "visible"})
            continue
        each = row["max"] / len(cases)
        everything = all(c["passed"] for c in cases)
        for m, case in enumerate(cases, 1):
            earned = each if case["passed"] and (everything or not row.get("all_or_nothing")) else 0.0
            output = "passed" if case["passed"] else (case["why"] or row["reason"])
            if case["passed"] and not earned:
                output = "passed, but this exercise is all or nothing"
            tests.append({"name": f"{row['title']}: {case['name']}", "number": f"{n}.{m}",
                          "score": round(earned, 4), "max_score": round(each, 4), "output": output,
                          "visibility": "hidden" if case["hidden"] else "visible"})
    score = round(sum(r["points"] for r in result["rows"]), 4)
    total = round(sum(r["max"] for r in result["rows"]), 4)
    lines = [f"{_num(score)} / {_num(total)} points"]
    lines += [f"{r['title']}: {_num(r['points'])}/{_num(r['max'])} {r['status']}"
              + ("" if r["status"] == "pass" else f" ({student_reason(r)})") for r in result["rows"]]
    return {"score": score, "execution_time": int(round(result.get("seconds") or 0)),
            "output": "\n".join(lines), "visibility": "visible", "stdout_visibility": "hidden",
            "tests": tests}


def summary_table(results: list, exercises: list) -> str:
    """Students down, exercises across (points/max), a total; then each exercise that did not pass
    with its reason."""
    ids = [ex["id"] for ex in exercises]
    header = ["student", *ids, "total"]
    table = [header]
    for res in results:
        by_id = {r["exercise"]: r for r in res["rows"]}
        cells = [res["student"]]
        for i in ids:
            r = by_id.get(i)
            cells.append("-" if r is None else f"{_num(r['points'])}/{_num(r['max'])}")
        score = sum(r["points"] for r in res["rows"])
        total = sum(r["max"] for r in res["rows"])
        cells.append(f"{_num(score)}/{_num(total)}")
        table.append(cells)
    widths = [max(len(row[k]) for row in table) for k in range(len(header))]
    lines = ["  ".join(c.ljust(w) if k == 0 else c.rjust(w) for k, (c, w) in enumerate(zip(row, widths))).rstrip()
             for row in table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    trouble = [(res["student"], r) for res in results for r in res["rows"] if r["status"] != "pass"]
    if trouble:
        lines += ["", "not passed:"]
        lines += [f"  {s} / {r['exercise']}: {r['status']}: {r['reason']}" for s, r in trouble]
    return "\n".join(lines)


def _safe(name: str) -> str:
    keep = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
    return keep.lstrip(".") or "student"


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def write_reports(out: Path, results: list, exercises: list) -> tuple:
    """Write every report into ``out``; ``(rows, summary)`` where rows are the CSV's rows as dicts."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for res in results:
        for r in res["rows"]:
            rows.append({"student": res["student"], "exercise": r["exercise"], "points": r["points"],
                         "max": r["max"], "status": r["status"], "reason": r["reason"],
                         **({"note": r["note"]} if r.get("note") else {}), "cases": r.get("cases") or []})
    tmp = out / "grades.csv.tmp"
    with open(tmp, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["student", "exercise", "points", "max", "status", "reason"])
        for r in rows:
            w.writerow([r["student"], r["exercise"], _num(r["points"]), _num(r["max"]), r["status"],
                        r["reason"] + (f" ({r['note']})" if r.get("note") else "")])
    os.replace(tmp, out / "grades.csv")
    summary = summary_table(results, exercises)
    doc = {"exercises": [{"id": ex["id"], "title": ex.get("title"), "notebook": ex["notebook"],
                          "points": ex.get("points")} for ex in exercises],
           "students": [{"student": res["student"],
                         "score": round(sum(r["points"] for r in res["rows"]), 4),
                         "max": round(sum(r["max"] for r in res["rows"]), 4),
                         "seconds": res.get("seconds"), "exercises": res["rows"],
                         "notebooks": res.get("notebooks", {})} for res in results]}
    _write(out / "grades.json", json.dumps(doc, indent=1))
    for res in results:
        d = out / _safe(res["student"])
        d.mkdir(exist_ok=True)
        _write(d / "results.json", json.dumps(gradescope(res), indent=1))
    _write(out / "summary.txt", summary + "\n")
    return rows, summary
