"""The event log, as the cluster sees it: every send, receive, reduction step, remote op and pipeline
stage leaves one event.

The log itself lives in :mod:`flowlab.core.events`, below everything that records into it
(pipelines, ops, collectives), so ``flowlab.data`` records without importing the cluster. This
module is the cluster's name for it (the same classes, the same process log) and registers the
cluster's Chrome trace writer (:func:`flowlab.cluster.trace.export_trace`) as
``EventLog.export_trace``'s.

>>> from flowlab.cluster.events import EventLog
>>> log = EventLog(task="/job:worker/task:0")
>>> with log.span("op", "matmul", bytes=64):
...     pass
>>> [(e.kind, e.name, e.bytes, e.task) for e in log.events()]
[('op', 'matmul', 64, '/job:worker/task:0')]
"""
from __future__ import annotations

from ..core.events import Event, EventLog, default_log, now, set_trace_exporter
from .trace import export_trace

__all__ = ["Event", "EventLog", "default_log", "now"]

set_trace_exporter(export_trace)
