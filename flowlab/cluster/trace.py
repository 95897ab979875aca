"""Chrome trace export: the event log as a Trace Event Format file that Perfetto (ui.perfetto.dev)
and chrome://tracing open.

One *process* per rank (a LocalGroup's events) or task (a LocalCluster's), plus one for an input
pipeline's stages; one *thread* per lane of that process. Events carry no thread id, so lanes are
made from nesting: a trace viewer draws the slices of one thread as a call stack, which is only
right if every slice lies inside the slice below it. :func:`layout` walks each process's events in
start order and puts each one on the first lane where it nests (a collective's sends, receives and
reductions inside the collective, inside the ``op`` that called it); an event that overlaps without
nesting (two threads of one worker at once) moves to another lane, its own thread in the trace.

>>> from flowlab.cluster.events import Event
>>> evs = [Event("op", "step", 0.0, 1.0, rank=0), Event("send", "allreduce", 0.1, 0.2, rank=0),
...        Event("op", "fetch", 0.5, 1.5, rank=0)]          # overlaps "step" without nesting in it
>>> [(p.process, p.thread, p.depth) for p in layout(evs)]
[('rank 0', 0, 0), ('rank 0', 0, 1), ('rank 0', 1, 0)]

``export_trace(events, path)`` writes the file: complete events (``"ph": "X"``) with times in µs
from a stored base (``metadata.base_perf_counter``: the ``time.perf_counter()`` of time 0),
process and thread names, instants (``"ph": "i"``) for events without duration (a fault, an
AUTOTUNE decision), and a flow (``"ph": "s"`` then ``"f"``, ``"bp": "e"``) from each send to the
receive that took its message (:func:`messages`).
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import NamedTuple

__all__ = ["Placed", "TraceInfo", "events_of", "process_of", "process_order", "messages", "layout", "trace_events",
           "export_trace"]

PIPELINE_KINDS = ("produce", "wait", "autotune")    # an input pipeline's events (flowlab.data.stats)


def events_of(source) -> list:
    """The events of ``source``: a list of events, an ``EventLog``, a LocalGroup (``group.events``),
    a LocalCluster (``cluster.events()``), a dataset's ``stats()`` or a dataset (its last run)."""
    if isinstance(source, (list, tuple)):
        return list(source)
    events = getattr(source, "events", None)
    if events is None and callable(getattr(source, "stats", None)):     # a Dataset
        events = getattr(source.stats(), "events", None)
    if events is None:
        raise TypeError(f"no events in {type(source).__name__}: expected a list of Event, an EventLog, "
                        f"a LocalGroup, a LocalCluster or a dataset's stats()")
    if callable(events):
        events = events()
    if callable(getattr(events, "events", None)):     # an EventLog (group.events)
        events = events.events()
    return list(events)


def process_of(e) -> str:
    """The process an event belongs to: its input pipeline (``pipeline 3``; on a cluster task,
    ``/job:worker/task:0 pipeline 3``), else its cluster task (``/job:worker/task:0``), else
    ``rank N`` (a LocalGroup's), else its log's task name."""
    if e.kind in PIPELINE_KINDS:
        run = (e.attrs or {}).get("pipeline")
        name = "pipeline" if run is None else f"pipeline {run}"
        return f"{e.task} {name}" if e.task and e.task.startswith("/job:") else name   # ids count per process
    if e.task and e.task.startswith("/job:"):
        return e.task
    if e.rank is not None:
        return f"rank {e.rank}"
    return e.task or "local"


def _pipeline_lane(e) -> str:
    attrs = e.attrs or {}
    if e.kind == "wait":
        return f"{e.name} wait"
    if "worker" in attrs:
        return f"{e.name} worker {attrs['worker']}"
    return e.name


def process_order(name: str):
    """Sort key: ranks in number order, then tasks (chief, ps, worker by index), then pipelines."""
    if name.startswith("rank ") and name[5:].isdigit():
        return (0, "", int(name[5:]), "")
    if name.startswith("/job:"):
        job, _, task = name[5:].partition("/task:")
        index = re.match(r"\d*", task).group()
        return (1, job, int(index or 0), name)      # a task's pipelines right after the task
    if name.startswith("pipeline"):
        return (3, "", 0, name)
    return (2, "", 0, name)


# -- messages --------------------------------------------------------------------------------------
def _me(e, peer):
    """Who ``e`` is, in the terms its peer attribute uses: a task name where peers are task names
    (a cluster's sends and receives), else the rank (a collective's)."""
    if isinstance(peer, str) or e.rank is None:
        return e.task
    return e.rank


def _message_key(e, sender, receiver):
    a = e.attrs or {}
    chunk = a.get("chunk")
    chunk = tuple(chunk) if isinstance(chunk, list) else chunk
    return (a.get("seq"), a.get("run"), e.name, sender, receiver, a.get("step"), chunk, a.get("part"))


def messages(events) -> list:
    """``(send, recv)`` pairs: each send event with the receive event that took its message
    (matched on call, sender, receiver, step, chunk and part; for a cluster's transfers, on the
    run, the node and the two tasks). Sends nobody received are left out."""
    recvs: dict = {}
    for e in events:
        if e.kind == "recv" and e.attrs and "peer" in e.attrs:
            peer = e.attrs["peer"]
            recvs.setdefault(_message_key(e, peer, _me(e, peer)), []).append(e)
    pairs = []
    for e in sorted((e for e in events if e.kind == "send" and e.attrs and "peer" in e.attrs),
                    key=lambda e: e.start):
        peer = e.attrs["peer"]
        waiting = recvs.get(_message_key(e, _me(e, peer), peer))
        if waiting:
            pairs.append((e, waiting.pop(0)))
    return pairs


# -- layout ----------------------------------------------------------------------------------------
class Placed(NamedTuple):
    """An event and where it is drawn: ``process`` (rank, task or pipeline), ``lane`` (the lane's
    label within the process: ``''`` for its own work, a pipeline stage), ``thread`` (which of
    that lane's nesting-proper threads, 0 first) and ``depth`` (how many slices it lies in)."""
    event: object
    process: str
    lane: str
    thread: int
    depth: int


def _lane_order(lane: str):
    """A process's own lane first, then pipeline stages from the source up (``map#1 worker 0``,
    ``map#1 wait``, ``batch#2``...), then other named lanes."""
    match = re.search(r"#(\d+)", lane)
    return (int(match.group(1)) if match else (-1 if not lane else 1 << 30), lane.endswith(" wait"), lane)


def _ns(t: float, base: float) -> int:
    return round((t - base) * 1e9)


def layout(events, base: float | None = None) -> list:
    """Every event with the lane, thread and depth that make each thread's slices properly nested
    (see the module's doc), ordered by process, lane, thread, start. Nesting is decided on whole
    nanoseconds from ``base`` (the first start when None), the resolution of the exported trace."""
    events = list(events)
    if base is None:
        base = min((e.start for e in events), default=0.0)
    groups: dict = {}
    for e in events:
        proc = process_of(e)
        lane = _pipeline_lane(e) if e.kind in PIPELINE_KINDS else str((e.attrs or {}).get("thread", ""))
        groups.setdefault((proc, lane), []).append(e)
    placed = []
    for (proc, lane) in sorted(groups, key=lambda k: (process_order(k[0]), _lane_order(k[1]))):
        evs = sorted(groups[(proc, lane)], key=lambda e: (_ns(e.start, base), -_ns(e.end, base)))
        stacks: list = []       # per thread: the ends (ns) of the slices open at the current start
        for e in evs:
            s, t = _ns(e.start, base), _ns(max(e.end, e.start), base)
            for i, stack in enumerate(stacks):
                while stack and stack[-1] <= s:
                    stack.pop()
                if not stack or t <= stack[-1]:
                    break
            else:
                stacks.append([])
                i = len(stacks) - 1
            placed.append(Placed(e, proc, lane, i, len(stacks[i])))
            if t > s:
                stacks[i].append(t)
    return placed


# -- the trace -------------------------------------------------------------------------------------
class TraceInfo(NamedTuple):
    """What :func:`export_trace` wrote."""
    path: Path
    slices: int
    instants: int
    flows: int
    processes: int
    threads: int

    def __repr__(self):
        return (f"wrote {self.path.name}: {self.slices} slices, {self.flows} send→recv flows, {self.instants} "
                f"instants in {self.processes} processes, {self.threads} threads. Open it in "
                f"https://ui.perfetto.dev (Open trace file) or chrome://tracing")


def _args(e) -> dict:
    out = {"kind": e.kind}
    if e.bytes:
        out["bytes"] = e.bytes
    if e.rank is not None:
        out["rank"] = e.rank
    for k, v in (e.attrs or {}).items():
        out[str(k)] = v if isinstance(v, (str, int, float, bool, type(None))) else str(v)
    return out


def trace_events(events, base: float | None = None) -> dict:
    """The trace as a dict (``{"traceEvents": [...], "displayTimeUnit": "ms", "metadata": {...}}``);
    :func:`export_trace` writes this. ``base``: the ``perf_counter`` time that is 0 (the first
    event's start when None)."""
    events = events_of(events)
    if base is None:
        base = min((e.start for e in events), default=0.0)
    placed = layout(events, base)
    procs = sorted({p.process for p in placed}, key=process_order)
    pid = {name: i for i, name in enumerate(procs)}
    lanes: dict = {}
    for p in placed:
        lanes.setdefault(p.process, {}).setdefault((p.lane, p.thread), None)
    tid = {}
    out = []
    for name in procs:
        out.append({"ph": "M", "name": "process_name", "pid": pid[name], "tid": 0, "args": {"name": name}})
        out.append({"ph": "M", "name": "process_sort_index", "pid": pid[name], "tid": 0,
                    "args": {"sort_index": pid[name]}})
        for i, (lane, thread) in enumerate(lanes[name]):
            tid[(name, lane, thread)] = i
            label = lane or "main"
            if thread:
                label += f" (overlap {thread})"
            out.append({"ph": "M", "name": "thread_name", "pid": pid[name], "tid": i, "args": {"name": label}})
            out.append({"ph": "M", "name": "thread_sort_index", "pid": pid[name], "tid": i, "args": {"sort_index": i}})
    where = {}
    slices = instants = 0
    for p in placed:
        e = p.event
        s, t = _ns(e.start, base), _ns(max(e.end, e.start), base)
        ids = pid[p.process], tid[(p.process, p.lane, p.thread)]
        where[id(e)] = ids
        if t > s:
            out.append({"ph": "X", "name": e.name, "cat": e.kind, "pid": ids[0], "tid": ids[1], "ts": s / 1e3,
                        "dur": (t - s) / 1e3, "args": _args(e)})
            slices += 1
        else:
            out.append({"ph": "i", "s": "t", "name": e.name, "cat": e.kind, "pid": ids[0], "tid": ids[1],
                        "ts": s / 1e3, "args": _args(e)})
            instants += 1
    flows = 0
    for n, (snd, rcv) in enumerate(messages(events), 1):
        if snd.end <= snd.start or rcv.end <= rcv.start:
            continue
        (sp, st), (rp, rt) = where[id(snd)], where[id(rcv)]
        common = {"name": "message", "cat": "message", "id": n}
        out.append({"ph": "s", **common, "pid": sp, "tid": st, "ts": _ns(snd.start, base) / 1e3})
        out.append({"ph": "f", "bp": "e", **common, "pid": rp, "tid": rt, "ts": _ns(rcv.start, base) / 1e3})
        flows += 1
    meta = {"base_perf_counter": base, "clock": "time.perf_counter (CLOCK_MONOTONIC), seconds",
            "timestamps": "µs from base_perf_counter", "events": len(events), "slices": slices,
            "instants": instants, "flows": flows, "processes": len(procs),
            "threads": sum(len(v) for v in lanes.values()), "producer": "flowlab"}
    # "metadata" as Chrome's own traces carry it; "otherData" (the format's name for it) holds strings
    return {"traceEvents": out, "displayTimeUnit": "ms", "metadata": meta,
            "otherData": {k: repr(v) if isinstance(v, float) else str(v) for k, v in meta.items()}}


def export_trace(events, path, base: float | None = None) -> TraceInfo:
    """Write ``events`` (a list, an EventLog, a LocalGroup, a LocalCluster, a dataset's stats) to
    ``path`` as Chrome trace JSON; open it in https://ui.perfetto.dev or chrome://tracing.
    Returns a :class:`TraceInfo` (what was written; its repr says where to open it)."""
    trace = trace_events(events, base)
    path = Path(path)
    path.write_text(json.dumps(trace, separators=(",", ":"), default=str), encoding="utf-8")
    m = trace["metadata"]
    return TraceInfo(path, m["slices"], m["instants"], m["flows"], m["processes"], m["threads"])
