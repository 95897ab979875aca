"""The live view of a :class:`~flowlab.widgets.replay.CollectiveReplay`: the ranks as a ring, a
tree or a star, each step's chunks moving between them (play, pause, step back and forward, a
scrubber), what every rank holds, the model beside the measurement, and a form whose Re-run
button records a fresh all-reduce in this kernel (``do_rerun``) and shows it instead."""
from __future__ import annotations

from ._view import SnapshotView, css, esm

__all__ = ["ReplayView"]


class ReplayView(SnapshotView):
    _esm = esm("replay.js")
    _css = css("replay.css")
    actions = ("rerun",)

    def do_rerun(self, algorithm="ring", nbytes=1 << 20, world_size=4, slow_rank=None, delay_ms=0.0):
        """Record a fresh all-reduce with these settings (a LocalGroup in this kernel, about a
        second at most within the limits) and replace the recording."""
        return self.obj.rerun(algorithm=algorithm, nbytes=nbytes, world_size=world_size,
                              slow_rank=slow_rank, delay_ms=delay_ms)
