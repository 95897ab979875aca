"""What ``flowlab grade`` runs *inside* a student's kernel, one call per exercise: every case of the
instructor's checks (visible and hidden) on the student's answer, each under a time limit, the
results written as plain data to a file the grader reads. Nothing here judges: the grader compares,
in its own process, and an exercise with no file, or a case missing from it, fails.

The grader sends one cell::

    __import__("flowlab.grading._probe", fromlist=["run"]).run(id, answer_name, out_path, exercises_dir)
"""
from __future__ import annotations

import json
import os
import random
import sys
import threading
import time

__all__ = ["run", "all_cases", "DEFAULT_TIME_LIMIT"]

DEFAULT_TIME_LIMIT = 10.0     # seconds per case, unless the checks file says TIME_LIMIT = ...
SEED = 0


def all_cases(checks) -> list:
    """A loaded checks file's (:class:`flowlab.grading.manifest.Checks`) visible then hidden cases,
    drawn with ``random`` and numpy seeded, so the grader and the kernel draw the same ones."""
    import numpy as np
    state = random.getstate(), np.random.get_state()
    random.seed(SEED)
    np.random.seed(SEED)
    try:
        return checks.all_cases()
    finally:
        random.setstate(state[0])
        np.random.set_state(state[1])


def _user_namespace() -> dict:
    try:
        from IPython import get_ipython
        ip = get_ipython()
    except ImportError:
        ip = None
    return ip.user_ns if ip is not None else sys.modules["__main__"].__dict__


_MISSING = object()


def _lookup(ns: dict, name: str):
    """``name`` (``f`` or ``model.fit``) in the namespace, or _MISSING."""
    first, *rest = name.split(".")
    value = ns.get(first, _MISSING)
    for attr in rest:
        if value is _MISSING:
            break
        try:
            value = getattr(value, attr)
        except Exception:   # noqa: BLE001 - the student's object: no such attribute, whatever it raised
            value = _MISSING
    return value


def _one(runner, answer, case, limit: float) -> dict:
    """Run one case in a daemon thread: ``{"received", "error", "seconds"}`` (``"stuck": True``
    when the thread was still running at the limit)."""
    from .plain import to_plain
    box = {}

    def work():
        t0 = time.perf_counter()
        try:
            value = runner(answer, case)
            box["received"] = to_plain(_verdicts_as_text(value))
        except BaseException as e:   # noqa: BLE001 - the student's code: anything it raises is a result
            text = _short(e)
            box["error"] = f"raised {type(e).__name__}" + (f": {text}" if text else "")
        box["seconds"] = time.perf_counter() - t0

    thread = threading.Thread(target=work, name=f"flowlab-probe-{case.name}", daemon=True)
    t0 = time.perf_counter()
    thread.start()
    thread.join(limit)
    if thread.is_alive():
        return {"received": None, "error": f"took longer than {limit:g} s", "seconds": round(limit, 3),
                "stuck": True}
    return {"received": box.get("received"), "error": box.get("error"),
            "seconds": round(box.get("seconds", time.perf_counter() - t0), 3)}


def _verdicts_as_text(value, depth: int = 0):
    """A checks file's ``run`` may return :class:`~flowlab.grading.properties.Verdict` s (alone, or as
    values of a dict or items of a list): each becomes the text compared, ``"holds"`` or ``"does not
    hold: <why>"``, so a case's ``expected`` says ``"holds"`` and a failure shows why."""
    props = sys.modules.get("flowlab.grading.properties")
    if props is None or depth > 3:        # no Verdict can exist before that module is imported
        return value
    t = type(value)
    if t is props.Verdict:
        return "holds" if value.ok is True else f"does not hold: {value.why}"
    if t is dict:
        return {k: _verdicts_as_text(v, depth + 1) for k, v in value.items()}
    if t in (list, tuple):
        return t(_verdicts_as_text(v, depth + 1) for v in value)
    return value


def _short(e, limit: int = 300) -> str:
    try:
        text = str(e)
    except BaseException:   # noqa: BLE001 - a hostile __str__
        text = "?"
    return text if len(text) <= limit else text[:limit] + "..."


def _write(out_path: str, record: dict) -> None:
    tmp = f"{out_path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(record, f)
    os.replace(tmp, out_path)


def run(exercise_id: str, answer_name: str, out_path: str, exercises_dir: str,
        time_limit: float | None = None) -> None:
    """Probe ``answer_name`` (``f`` or ``obj.attr``) of this kernel's namespace with every case of
    ``exercise_id``, the checks read from the instructor's ``exercises_dir/checks/``, and write
    ``{"id", "answer", "error", "cases": [{"name", "hidden", "received", "error", "seconds"}]}`` to
    ``out_path`` (atomically). ``time_limit``: seconds per case (default: the checks' TIME_LIMIT)."""
    record = {"id": exercise_id, "answer": answer_name, "error": None, "cases": []}
    try:
        answer = _lookup(_user_namespace(), answer_name)
        if answer is _MISSING:
            record["error"] = f"answer '{answer_name}' is not defined"
        else:
            from .manifest import load_checks
            checks = load_checks(exercises_dir, exercise_id)
            limit = float(time_limit or checks.namespace.get("TIME_LIMIT") or DEFAULT_TIME_LIMIT)
            for case in all_cases(checks):
                rec = {"name": case.name, "hidden": bool(case.hidden)}
                rec.update(_one(checks.run, answer, case, limit))
                record["cases"].append(rec)
                if rec.get("stuck"):
                    record["stuck"] = True
    except BaseException as e:   # noqa: BLE001 - recorded: the grader fails the exercise with it
        record["error"] = f"the checks could not run: {type(e).__name__}: {_short(e)}"
    _write(out_path, record)
