"""``Case``: one input of an exercise's checks and the value it should give.

A checks file (``exercises/checks/<id>.py``) yields cases from ``cases()`` (shown to the student)
and ``hidden_cases()`` (run by the grader only). ``expected`` is a plain value, or a callable
``expected(args) -> value`` computed by the instructor's reference (numpy) in the checking process.
"""
from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Case"]


@dataclass(frozen=True)
class Case:
    """One check: ``run(answer, case)`` (by default ``answer(*args, **kwargs)``) must give ``expected``.

    ``loose_types=True`` lets an int stand for a float, a list for a tuple, a tensor for a numpy
    array (and arrays' dtypes differ); otherwise types must match exactly. ``rtol``/``atol``, when
    given, replace the checks file's ``TOLERANCE`` for this case."""

    name: str
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    expected: object = None
    hidden: bool = False
    loose_types: bool = False
    rtol: float | None = None
    atol: float | None = None

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise TypeError(f"Case(name=...) must be a non-empty string, got {self.name!r}")
        if not isinstance(self.args, tuple):
            object.__setattr__(self, "args", tuple(self.args) if isinstance(self.args, list) else (self.args,))
        if not isinstance(self.kwargs, dict):
            raise TypeError(f"Case {self.name!r}: kwargs must be a dict, got {type(self.kwargs).__name__}")

    def expected_value(self):
        """The value this case should give: ``expected(args)`` when it is callable, else ``expected``."""
        return self.expected(self.args) if callable(self.expected) else self.expected

    def tolerance(self, default: dict | None = None) -> dict:
        """``{"rtol", "atol", "loose_types"}`` for :func:`flowlab.grading.compare`: this case's own
        tolerances over ``default`` (a checks file's ``TOLERANCE``)."""
        tol = {"rtol": 1e-6, "atol": 0.0}
        tol.update(default or {})
        if self.rtol is not None:
            tol["rtol"] = float(self.rtol)
        if self.atol is not None:
            tol["atol"] = float(self.atol)
        tol["loose_types"] = bool(self.loose_types)
        return tol
