"""One run of a pipeline: what every stage iterator needs to know while the chain is being built.

``iter(dataset)`` makes a ``Run``: the pipeline's merged options, a name for every stage (its kind and
its position from the source: ``range#0``, ``map#1``...), the run's ``PipelineStats`` and the budget
its AUTOTUNE stages share. The run is current (thread-locally) while stage iterators are made, and
every stage makes its input's iterator with ``iterate(input)``, which wraps a sequential stage in a
timing generator when stats are on (parallel stages record themselves, see ``_parallel.py``).
"""
from __future__ import annotations

import contextlib
import threading

from ..core.events import now
from ._parallel import close_iterator
from .autotune import Budget
from .options import Options, ram_budget, usable_cores
from .stats import PipelineStats

__all__ = ["Run", "current_run", "current_options", "run_scope", "iterate", "stage_names"]

_scope = threading.local()


def stage_names(root) -> dict:
    """{id(dataset): (name, kind)} for every named stage under ``root``, numbered sources first.
    A dataset whose ``_stage_kind()`` is None (a pass-through such as ``with_options``) has no name."""
    names, seen = {}, set()
    stack = [(root, False)]
    while stack:                         # an iterative post-order walk: long chains need no recursion
        dataset, expanded = stack.pop()
        if expanded:
            kind = dataset._stage_kind()
            if kind is not None:
                names[id(dataset)] = (f"{kind}#{len(names)}", kind)
            continue
        if id(dataset) in seen:
            continue
        seen.add(id(dataset))
        stack.append((dataset, True))
        stack.extend((d, False) for d in reversed(dataset._inputs()))
    return names


class Run:
    """One iteration of a pipeline. ``record=False``: count nothing (a peek such as element_spec)."""

    def __init__(self, root, record: bool = True):
        self.options = root.options()
        stats_options = self.options.stats
        names = stage_names(root)
        self.stats = PipelineStats(names.values(), counting=record and stats_options._get("enabled"),
                                   events=stats_options._get("events"), log=stats_options._get("log"))
        self._recorders = {key: self.stats.stage(name) for key, (name, _) in names.items()}
        self.budget = Budget(usable_cores(), ram_budget(self.options))
        self._keep = root        # the ids above stay valid while the run lives

    def recorder(self, dataset):
        """The StageRecorder of ``dataset`` in this run, or None if it is not one of its named stages."""
        return self._recorders.get(id(dataset))


def current_run() -> Run | None:
    return getattr(_scope, "run", None)


def current_options() -> Options:
    """The merged options of the pipeline whose iterator is being made (defaults outside one)."""
    run = getattr(_scope, "run", None)
    return run.options if run is not None else Options()


@contextlib.contextmanager
def run_scope(run: Run | None):
    previous = getattr(_scope, "run", None)
    _scope.run = run
    try:
        yield
    finally:
        _scope.run = previous


def iterate(dataset):
    """A new iterator over ``dataset`` inside the current run: timed if it is a named stage."""
    iterator = dataset._make_iterator()
    run = getattr(_scope, "run", None)
    if run is None or getattr(iterator, "records_itself", False):
        return iterator
    recorder = run._recorders.get(id(dataset))
    lane = recorder.producer() if recorder is not None else None
    return iterator if lane is None else _timed(iter(iterator), lane)


def _timed(iterator, lane):
    """``iterator``'s elements, each ``next()`` recorded as one "produce" span."""
    pull, produce = iterator.__next__, lane.produce
    try:
        while True:
            start = now()
            try:
                element = pull()
            except StopIteration:
                return
            produce(start, now())
            yield element
    finally:
        lane.flush()
        close_iterator(iterator)
