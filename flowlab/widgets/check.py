"""The live view of a :class:`~flowlab.grading.CheckResult`: a green or red banner with the checks
passed and the points, the cases (inputs, expected, received, why), the hint for this try, and how
many hidden checks the grader runs. Static: a check's result does not change."""
from __future__ import annotations

from ._view import SnapshotView, css, esm

__all__ = ["CheckView"]


class CheckView(SnapshotView):
    _esm = esm("check.js")
    _css = css("check.css")
