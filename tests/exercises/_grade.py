"""Run one real exercise's checks (visible and hidden) on an answer, here, as the grader's probe
and comparison do, and say how each case went. Used by tests/exercises/test_*.py to show that the
reference passes every case and that typical wrong answers fail with a reason."""
from __future__ import annotations

from pathlib import Path

from flowlab.grading import compare, to_plain
from flowlab.grading.manifest import load_checks

EXERCISES = Path(__file__).resolve().parents[2] / "exercises"


def outcomes(ex_id: str, answer, hidden: bool = True) -> list:
    """``[(case name, ok, why)]`` for every case of ``ex_id`` (also the hidden ones unless
    ``hidden=False``): ``answer`` run by the checks file's ``run``, expected and received turned into
    plain data and compared with the checks' tolerance. An answer that raises gives
    ``(name, False, "raised ...")``."""
    checks = load_checks(EXERCISES, ex_id)
    cases = checks.cases() + (checks.hidden_cases() if hidden else [])
    out = []
    for case in cases:
        expected = to_plain(case.expected_value())
        try:
            received = to_plain(checks.run(answer, case))
        except Exception as e:   # noqa: BLE001 - the answer under test may raise: that is a fail
            out.append((case.name, False, f"raised {type(e).__name__}: {e}"))
            continue
        ok, why = compare(expected, received, **case.tolerance(checks.TOLERANCE))
        out.append((case.name, bool(ok), why))
    return out


def all_pass(ex_id: str, answer) -> bool:
    return all(ok for _, ok, _ in outcomes(ex_id, answer))


def failures(ex_id: str, answer) -> list:
    """The ``(name, why)`` of every case ``answer`` fails."""
    return [(name, why) for name, ok, why in outcomes(ex_id, answer) if not ok]
