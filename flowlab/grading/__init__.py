"""Graded exercises: checks in place with hints, and the plain data a grader compares.

- :func:`check` (``fl.grading.check("ring-allreduce", ring_allreduce)``): run an exercise's visible
  cases on an answer in this process, compare the results in another one, and show a
  :class:`CheckResult` (which case failed and why, a hint after a failed try, the points, how many
  hidden checks the grader runs);
- :class:`Case`: one input and its expected value, as a checks file yields them;
- :func:`to_plain` / :func:`compare`: the tagged plain data that is all that crosses from a student's
  code to the grader, compared with exact types and a tolerance (never the student's ``__eq__``);
- :func:`find_exercises` / :func:`load_manifest`: where the exercises are and what they are;
- distributed properties as checks (:mod:`.properties`), each a :class:`Verdict` with its reason:
  :func:`same_weights` (1 replica vs N), :func:`collective_cost` / :func:`ring_optimum` (messages and
  bytes from the event log), :func:`every_rank_holds`, :func:`no_process_left`, :func:`under_orderings`
  (the same answer under several message delivery orders).

``check`` is imported at once (the function shadows its module's name, ``flowlab.grading.check``);
the other names on first use. Nothing here imports a widget library.
"""
import importlib

from .case import Case
from .check import CheckResult, check   # noqa: F401 - after this line ``flowlab.grading.check`` is the function
from .plain import compare, render, to_plain

_HOME = {"load_manifest": ".manifest", "find_exercises": ".manifest", "load_checks": ".manifest",
         "ExerciseError": ".manifest", "grade": ".grader", "Grades": ".grader", "release": ".release",
         "ReleaseError": ".release",
         **{name: ".properties" for name in ("Verdict", "same_weights", "collective_cost", "ring_optimum",
                                             "every_rank_holds", "process_snapshot", "no_process_left",
                                             "under_orderings")}}
__all__ = sorted(["Case", "check", "CheckResult", "compare", "render", "to_plain", *_HOME])


def __getattr__(name):
    if name in _HOME:
        return getattr(importlib.import_module(_HOME[name], __name__), name)
    from .._names import missing_attribute
    raise missing_attribute(__name__, name, [*globals(), *_HOME])


def __dir__():
    return sorted({*globals(), *_HOME})
