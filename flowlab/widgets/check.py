"""The live view of a :class:`~flowlab.grading.CheckResult`: a green or red banner with the checks
passed and the points, the cases (inputs, expected, received, why), the hint for this try, and how
many hidden checks the grader runs, a warning when the answer is not the one in the saved notebook,
and a button that grades the saved notebook in a fresh kernel as ``flowlab grade`` does (``clean``)."""
from __future__ import annotations

from ._view import SnapshotView, css, esm

__all__ = ["CheckView"]


class CheckView(SnapshotView):
    _esm = esm("check.js")
    _css = css("check.css")
    actions = ("clean",)

    def do_clean(self):
        """Grade the saved notebook for this exercise in a fresh kernel (seconds: it runs the file)."""
        out = self.obj.run_clean()
        self.refresh()
        return out
