"""Distributed properties as checks: what a grader asserts about a distributed answer beyond its value.

Each function returns a :class:`Verdict` ``(ok, why, details)`` of plain data (``details`` is
JSON-safe), so a checks file (``exercises/checks/<id>.py``), the batch grader or a test can record it.
None of them trusts the student's objects: results go through :func:`~flowlab.grading.plain.to_plain`
(exact types, numpy copies) before anything is compared, and no ``__eq__`` of theirs is called.

- :func:`same_weights`: training with 1 replica and with N gives the same weights (within ``rtol``);
- :func:`collective_cost` (with :func:`ring_optimum`): no rank sent more messages or bytes than a
  limit, counted from the event log (:mod:`flowlab.cluster.events`), not from anything printed;
- :func:`every_rank_holds`: every rank, not only rank 0, holds the right result;
- :func:`no_process_left` (with :func:`process_snapshot`): nothing that was started still runs;
- :func:`under_orderings`: the answer is the same under several message delivery orders (a
  :class:`~flowlab.cluster.collectives.LocalGroup` with ``reorder_seed``), and nothing deadlocks.

>>> import numpy as np
>>> from flowlab.cluster.collectives import LocalGroup, allreduce
>>> with LocalGroup(4) as group:
...     results = group.run(lambda comm: allreduce(np.arange(8.0)))
>>> every_rank_holds(results, np.arange(8.0) * 4).ok
True
>>> collective_cost(group.events, **ring_optimum(4, 64)).ok
True
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

import numpy as np

from .plain import _as_array, compare, render, to_plain

__all__ = ["Verdict", "same_weights", "collective_cost", "ring_optimum", "every_rank_holds",
           "process_snapshot", "no_process_left", "under_orderings"]

_MAX_LISTED = 50     # ranks, calls, processes or seeds listed in details; more are counted only


@dataclass(frozen=True)
class Verdict:
    """Whether a property holds (``ok``), why or why not in one sentence (``why``), and what was
    measured (``details``: plain JSON-safe data, its ``"property"`` names the check)."""

    ok: bool
    why: str
    details: dict = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.ok)

    def to_dict(self) -> dict:
        """``{"ok", "why", "details"}``: what a grader records."""
        return {"ok": bool(self.ok), "why": self.why, "details": self.details}

    def __repr__(self) -> str:
        name = self.details.get("property", "property")
        return f"{'✓' if self.ok else '✗'} {name}: {self.why}"


def _verdict(prop: str, ok: bool, why: str, **details) -> Verdict:
    return Verdict(bool(ok), why, {"property": prop, **details})


def _fmt(x: float) -> str:
    return format(float(x), ".4g")


def _exc(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text and text[0] else type(e).__name__


# -- 1. one replica equals N ----------------------------------------------------------------------
def same_weights(train_fn, replicas=(1, 2), rtol: float = 1e-5, atol: float = 1e-6, strategy=None) -> Verdict:
    """Train with each number of ``replicas`` and compare the final weights with the first count's.

    ``train_fn(n)`` trains with ``n`` replicas and returns the weights: a list (or tuple, or dict
    name -> weight) of numpy arrays or flowlab tensors/variables, e.g. ``model.get_weights()`` or
    ``[v.numpy() for v in variables]``. While it runs this process has ``n`` logical CPU devices and
    no GPU, so ``fl.distribute.MirroredStrategy()`` inside it has ``n`` replicas; with ``strategy``
    (a callable ``n -> strategy``), ``train_fn`` gets ``strategy(n)`` instead of ``n``. The device
    settings are restored afterwards. ``why`` names the first weight that differs and its largest
    difference."""
    counts = list(replicas) if isinstance(replicas, (list, tuple)) else None
    if not counts or len(counts) < 2 or any(type(n) is not int or n < 1 for n in counts):
        raise ValueError(f"same_weights: replicas must be two or more whole numbers >= 1, like (1, 2); "
                         f"got {replicas!r}")
    if not callable(train_fn):
        raise TypeError(f"same_weights: train_fn must be a function n -> weights, got {type(train_fn).__name__}")
    from ..core import config
    cpus, gpus = config.logical_device_count("CPU"), config.logical_device_count("GPU")
    runs = []
    try:
        config.set_logical_devices("GPU", 0)
        for n in counts:
            config.set_logical_devices("CPU", n)
            try:
                out = train_fn(strategy(n) if strategy is not None else n)
            except Exception as e:   # noqa: BLE001 - the student's training failed: that is the verdict
                return _verdict("same_weights", False, f"training with {_replicas(n)} raised {_exc(e)}",
                                replicas=counts, failed=n)
            weights, problem = _weights(out)
            if problem:
                return _verdict("same_weights", False, f"training with {_replicas(n)}: {problem}",
                                replicas=counts, failed=n)
            runs.append(weights)
    finally:
        config.set_logical_devices("CPU", cpus)
        config.set_logical_devices("GPU", gpus)
    ref, base = runs[0], counts[0]
    largest = {}                                  # n -> largest absolute difference over all weights
    for n, got in zip(counts[1:], runs[1:]):
        if [name for name, _ in got] != [name for name, _ in ref]:
            return _verdict("same_weights", False,
                            f"training with {_replicas(n)} returned {len(got)} weights "
                            f"({', '.join(nm for nm, _ in got[:8])}), with {_replicas(base)} {len(ref)} "
                            f"({', '.join(nm for nm, _ in ref[:8])})", replicas=counts)
        worst = 0.0
        for (name, a), (_, b) in zip(ref, got):
            if a.shape != b.shape or a.dtype != b.dtype:
                return _verdict("same_weights", False,
                                f"{name}: {a.dtype}{list(a.shape)} with {_replicas(base)}, "
                                f"{b.dtype}{list(b.shape)} with {_replicas(n)}", replicas=counts)
            fa, fb = a.astype(np.float64), b.astype(np.float64)
            with np.errstate(invalid="ignore", over="ignore"):
                diff = np.abs(fa - fb)
                bad = ~((diff <= atol + rtol * np.abs(fa)) | (np.isnan(fa) & np.isnan(fb)) | (fa == fb))
            finite = diff[np.isfinite(diff)]
            worst = max(worst, float(finite.max()) if finite.size else 0.0)
            if bad.any():
                nbad = int(bad.sum())
                score = np.where(bad, np.nan_to_num(diff, nan=np.inf, posinf=np.inf), -1.0)
                idx = np.unravel_index(int(np.argmax(score)), score.shape) if score.ndim else ()
                at = f" at [{', '.join(str(int(i)) for i in idx)}]" if idx else ""
                return _verdict(
                    "same_weights", False,
                    f"{name} differs between {_replicas(base)} and {_replicas(n)}: largest difference "
                    f"{_fmt(diff[idx])}{at} ({_fmt(fa[idx])} vs {_fmt(fb[idx])}); {nbad} of {bad.size} "
                    f"values beyond rtol {rtol:g}, atol {atol:g}",
                    replicas=counts, weight=name, largest_difference=float(np.nan_to_num(diff[idx], posinf=1e308)),
                    values_beyond=nbad)
        largest[n] = worst
    summary = ", ".join(f"{_fmt(v)} with {_replicas(n)}" for n, v in largest.items())
    return _verdict("same_weights", True,
                    f"{len(ref)} weights agree with {_replicas(base)} (largest difference: {summary})",
                    replicas=counts, weights=len(ref),
                    largest_difference={str(n): v for n, v in largest.items()})


def _replicas(n: int) -> str:
    return f"{n} replica{'s' if n != 1 else ''}"


def _weights(out):
    """[(name, numpy copy)] from what a training function returned, through plain data; or a problem."""
    p = to_plain(out)
    t = p.get("t")
    if t in ("list", "tuple"):
        items = [(f"weight {i}", v) for i, v in enumerate(p["v"])]
    elif t == "dict":
        items = [(f"weight {render(k, 30)}", v) for k, v in p["v"]]
    elif t in ("ndarray", "tensor"):
        items = [("the weights", p)]
    elif t == "refused":
        return None, f"the weights cannot be checked: {p.get('why')}"
    else:
        what = p.get("type", t)
        return None, (f"train_fn returned {what}; return the weights: a list of arrays, e.g. "
                      f"model.get_weights() or [v.numpy() for v in variables]")
    if not items:
        return None, "train_fn returned no weights (an empty list)"
    weights = []
    for name, v in items:
        vt = v.get("t")
        if vt in ("ndarray", "tensor"):
            arr = _as_array(v)
        elif vt == "float":
            arr = np.array(float(v["v"]))         # float("nan") / float("inf") read the plain tags too
        elif vt == "int":
            arr = np.array(int(v["v"]))
        else:
            return None, f"{name} is {v.get('type', vt)}, not an array of numbers"
        if arr.dtype.kind not in "biuf":
            return None, f"{name} has dtype {arr.dtype}, not numbers"
        weights.append((name, arr))
    return weights, None


# -- 2. messages and bytes, from the event log ----------------------------------------------------
def ring_optimum(n: int, nbytes: int, itemsize: int = 1) -> dict:
    """The least a ring all-reduce of ``nbytes`` on ``n`` ranks sends per rank, as limits for
    :func:`collective_cost` (``collective_cost(events, **ring_optimum(4, x.nbytes))``):
    ``max_messages`` = 2(n-1) and ``max_bytes`` = 2(n-1)/n * nbytes
    (:mod:`flowlab.cluster.collectives.cost`). When the ``nbytes // itemsize`` elements do not
    split evenly into n chunks, a rank may send chunks one element larger: the byte limit allows
    for that (2 * (nbytes - itemsize * (elements // n)))."""
    from ..cluster.collectives import cost
    if type(nbytes) is not int and not isinstance(nbytes, np.integer) or nbytes < 0:
        raise ValueError(f"ring_optimum: nbytes must be a whole number >= 0, got {nbytes!r}")
    if type(itemsize) is not int or itemsize < 1:
        raise ValueError(f"ring_optimum: itemsize must be a whole number >= 1, got {itemsize!r}")
    messages = cost.steps("ring", n)
    limit = cost.bytes_on_busiest_link("ring", n, int(nbytes))
    if n > 1:
        elements = int(nbytes) // itemsize
        limit = max(limit, 2 * (int(nbytes) - itemsize * (elements // n)))
    return {"max_messages": messages, "max_bytes": limit}


def _events_of(events):
    if hasattr(events, "events") and callable(events.events):
        return list(events.events()), int(getattr(events, "dropped", 0) or 0)
    from ..cluster.events import Event
    out = []
    for e in events:
        out.append(e if isinstance(e, Event) else Event.from_dict(e))
    return out, 0


def collective_cost(events, max_messages: int | None = None, max_bytes: int | None = None,
                    per_rank: bool = True, name: str | None = None) -> Verdict:
    """Count what was sent, from an event log (an ``EventLog`` such as a LocalGroup's ``group.events``,
    or a list of events or their dicts), and compare it with the limits.

    What counts: the transport's ``message`` events when the log has any (a ``LocalGroup(n,
    message_events=True)`` records every message, so raw ``comm.send`` calls count too), else the
    collectives' ``send`` events (optionally only collective ``name``, e.g. ``"allreduce"``). With
    ``per_rank`` each rank's totals must stay within the limits, else the whole group's. ``details``
    holds the counts per rank and per collective call. A log that dropped events, or that holds no
    events at all, fails: the counts could be too low."""
    evs, dropped = _events_of(events)
    if dropped:
        return _verdict("collective_cost", False,
                        f"the event log dropped {dropped} events (it holds at most its maxlen): the counts "
                        f"would be too low; record less, or give the log a larger maxlen", dropped=dropped)
    level = "message" if any(e.kind == "message" for e in evs) else "send"
    sends = [e for e in evs if e.kind == level and (name is None or level == "message" or e.name == name)]
    calls_seen = [e for e in evs if e.kind == "collective" and (name is None or e.name == name)]
    if not sends and not calls_seen:
        return _verdict("collective_cost", False,
                        "the event log holds no sends and no collective calls: was the code run in a "
                        "LocalGroup (message_events=True to count raw comm.send calls), with recording on?",
                        level=level)
    ranks: dict = {}
    calls: dict = {}
    for e in sends:
        r = -1 if e.rank is None else int(e.rank)
        m, b = ranks.get(r, (0, 0))
        ranks[r] = (m + 1, b + int(e.bytes))
        attrs = e.attrs or {}
        key = ("p2p", 0) if level == "message" else (e.name, int(attrs.get("seq", 0)))
        per = calls.setdefault(key, {})
        m, b = per.get(r, (0, 0))
        per[r] = (m + 1, b + int(e.bytes))
    per_rank_list = [{"rank": r, "messages": m, "bytes": b} for r, (m, b) in sorted(ranks.items())]
    call_list = [{"name": k[0], "seq": k[1], "ranks": [{"rank": r, "messages": m, "bytes": b}
                                                      for r, (m, b) in sorted(v.items())]}
                 for k, v in list(calls.items())[:_MAX_LISTED]]
    details = {"level": level, "limits": {"max_messages": max_messages, "max_bytes": max_bytes},
               "per_rank": per_rank_list[:_MAX_LISTED], "calls": call_list,
               "calls_left_out": max(0, len(calls) - _MAX_LISTED),
               "total": {"messages": len(sends), "bytes": sum(b for _, b in ranks.values())}}
    what = "messages"
    if per_rank:
        rows = [(f"rank {r}", m, b) for r, (m, b) in sorted(ranks.items())] or [("every rank", 0, 0)]
    else:
        rows = [("the group", details["total"]["messages"], details["total"]["bytes"])]
    over = []
    for who, m, b in rows:
        excess = []
        if max_messages is not None and m > max_messages:
            excess.append(f"{m} {what} (limit {max_messages})")
        if max_bytes is not None and b > max_bytes:
            excess.append(f"{b:,} bytes (limit {max_bytes:,})")
        if excess:
            over.append((who, m, b, excess))
    if over:
        # the worst offender first: the largest overshoot relative to its limit
        def ratio(row):
            _, m, b, _ = row
            return max(m / max_messages if max_messages else 0, b / max_bytes if max_bytes else 0,
                       float("inf") if (max_messages == 0 and m) or (max_bytes == 0 and b) else 0)
        over.sort(key=ratio, reverse=True)
        who, _, _, excess = over[0]
        others = f"; {len(over) - 1} other rank{'s' if len(over) != 2 else ''} too" if len(over) > 1 else ""
        details["over"] = [row[0] for row in over[:_MAX_LISTED]]
        return Verdict(False, f"{who} sent {' and '.join(excess)}: more than the limit{others}",
                       {"property": "collective_cost", **details})
    most_m = max(m for _, m, _ in rows)
    most_b = max(b for _, _, b in rows)
    scope = "every rank" if per_rank else "the group"
    lim = []
    if max_messages is not None:
        lim.append(f"{most_m} {what} (limit {max_messages})")
    if max_bytes is not None:
        lim.append(f"{most_b:,} bytes (limit {max_bytes:,})")
    text = (f"{scope} sent at most " + " and ".join(lim)) if lim else \
        f"{scope} sent at most {most_m} {what} and {most_b:,} bytes (no limits given)"
    return Verdict(True, text, {"property": "collective_cost", **details})


# -- 3. every rank, not only rank 0 ---------------------------------------------------------------
def every_rank_holds(results, expected, rtol: float = 1e-6, atol: float = 0.0, loose_types: bool = False) -> Verdict:
    """Every rank's result (``results``: a list in rank order, as ``LocalGroup.run`` returns it, with
    exceptions where ranks raised) matches ``expected``: one value for every rank, or a callable
    ``rank -> value`` when ranks should hold different things (a reduce-scatter's chunks). Values
    are compared as plain data (:func:`~flowlab.grading.plain.compare`)."""
    if type(results) not in (list, tuple):
        return _verdict("every_rank_holds", False,
                        f"expected a list with one result per rank, got {render(to_plain(results))}")
    n = len(results)
    if n == 0:
        return _verdict("every_rank_holds", False, "no rank returned a result (an empty list)", ranks=0)
    rows, wrong = [], []
    for r, got in enumerate(results):
        want = expected(r) if callable(expected) else expected
        if isinstance(got, BaseException):
            ok, why = False, f"raised {_exc(got)}"
        else:
            ok, why = compare(to_plain(want), to_plain(got), rtol=rtol, atol=atol, loose_types=loose_types)
        if not ok:
            wrong.append(r)
        if len(rows) < _MAX_LISTED:
            rows.append({"rank": r, "ok": ok, "why": why})
    if not wrong:
        return _verdict("every_rank_holds", True, f"all {n} ranks hold the right result", ranks=n, per_rank=rows)
    first = next(row for row in rows if not row["ok"]) if wrong[0] < _MAX_LISTED else {"rank": wrong[0], "why": ""}
    right = [r for r in range(n) if r not in set(wrong)]
    who = _ranks(wrong)
    tail = ""
    if right:
        tail = f" ({_ranks(right)} {'does' if len(right) == 1 else 'do'}"
        tail += ": checking rank 0 alone would have missed this)" if right == [0] or 0 in right else ")"
    return _verdict("every_rank_holds", False,
                    f"{who} of {n} {'does' if len(wrong) == 1 else 'do'} not hold the right result{tail}; "
                    f"rank {first['rank']}: {first['why']}", ranks=n, wrong=wrong[:_MAX_LISTED], per_rank=rows)


def _ranks(rs) -> str:
    rs = list(rs)
    shown = ", ".join(map(str, rs[:12])) + (", …" if len(rs) > 12 else "")
    return f"rank{'s' if len(rs) != 1 else ''} {shown}"


# -- 4. no process left behind --------------------------------------------------------------------
def _descendants(pid: int):
    import psutil
    try:
        return psutil.Process(pid).children(recursive=True)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return []


def process_snapshot(root: int | None = None) -> dict:
    """The processes below ``root`` (default: this process) and the others of its session, as plain
    data, to pass later as ``no_process_left(before=...)``:
    ``{"root", "sid", "procs": [[pid, create_time, name], ...], "session": [[pid, create_time], ...]}``."""
    import psutil
    root = os.getpid() if root is None else int(root)
    procs = []
    for p in _descendants(root):
        try:
            procs.append([p.pid, p.create_time(), p.name()])
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    try:
        sid = os.getsid(root)
    except OSError:
        sid = None
    session = []
    if sid is not None:
        for p in psutil.process_iter(["pid", "create_time"]):
            try:
                if os.getsid(p.info["pid"]) == sid:
                    session.append([p.info["pid"], p.info["create_time"]])
            except OSError:
                pass
    return {"root": root, "sid": sid, "procs": procs, "session": session}


def _key(pid, create_time):
    return pid, round(float(create_time or 0.0), 2)


def _started_since(before: dict):
    """Processes started since ``before`` that belong to it: the root's new descendants, and orphans
    (parent gone, adopted by init) in the root's session that were not there before. (Process
    start times are not compared with the clock: psutil's may lag ``time.time()`` by a second.)"""
    import psutil
    old = {_key(pid, ct) for pid, ct, *_ in [*before.get("procs", []), *before.get("session", [])]}
    found = {}
    for p in _descendants(before["root"]):
        try:
            if _key(p.pid, p.create_time()) not in old:
                found[p.pid] = p
        except psutil.NoSuchProcess:
            pass
    sid = before.get("sid")
    if sid is not None:
        for p in psutil.process_iter(["pid", "ppid", "create_time"]):
            info = p.info
            if info["pid"] in found or info["ppid"] not in (0, 1) or _key(info["pid"], info["create_time"]) in old:
                continue
            try:
                if os.getsid(info["pid"]) == sid:
                    found[info["pid"]] = p
            except OSError:
                pass
    return list(found.values())


def _running(p) -> bool:
    import psutil
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True


def no_process_left(pids=None, *, before: dict | None = None, grace: float = 2.0) -> Verdict:
    """Nothing that was started is still running (zombies count as ended), after waiting up to
    ``grace`` seconds for processes on their way out. Give ``pids`` (the processes started, e.g. a
    LocalCluster's worker pids), or ``before`` (a :func:`process_snapshot` taken before): then every
    process started since below the same root, and every orphan of its session started since, must
    be gone. (A process that left the session on purpose, with ``setsid``, is not seen.)"""
    import psutil
    if (pids is None) == (before is None):
        raise ValueError("no_process_left: give either pids (the processes started) or before "
                         "(a process_snapshot() taken before they were started)")
    if pids is not None:
        pids, watched = list(pids), []
        for pid in pids:
            if type(pid) is not int and not isinstance(pid, np.integer):
                raise TypeError(f"no_process_left: pids must be whole numbers, got {pid!r}")
            try:
                watched.append(psutil.Process(int(pid)))
            except psutil.NoSuchProcess:
                pass
        checked = len(pids)
    else:
        watched = _started_since(before)
        checked = len(watched)
    end = time.monotonic() + max(0.0, grace)
    left = [p for p in watched if _running(p)]
    while left and time.monotonic() < end:
        time.sleep(0.05)
        left = [p for p in left if _running(p)]
    rows = []
    for p in left[:_MAX_LISTED]:
        try:
            rows.append({"pid": p.pid, "name": p.name(), "cmdline": " ".join(p.cmdline())[:200]})
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            rows.append({"pid": p.pid, "name": "?", "cmdline": ""})
    if left:
        names = ", ".join(f"{r['pid']} ({r['name']})" for r in rows[:6]) + (", …" if len(left) > 6 else "")
        return _verdict("no_process_left", False,
                        f"{len(left)} process{'es' if len(left) != 1 else ''} still running {grace:g} s "
                        f"later: {names}", left=rows, checked=checked)
    what = "process" if checked == 1 else "processes"
    return _verdict("no_process_left", True,
                    f"no process left: the {checked} {what} started {'has' if checked == 1 else 'have'} ended"
                    if checked else "no process left (none was started)", left=[], checked=checked)


# -- 5. the same answer under several message orders ----------------------------------------------
def under_orderings(fn, world_size: int, seeds=(0, 1, 2, 3, 4), args=(), rtol: float = 0.0, atol: float = 0.0,
                    timeout: float = 30.0, window: float = 0.003) -> Verdict:
    """Run ``fn(comm, *args)`` on the ranks of a ``LocalGroup(world_size, reorder_seed=seed)`` once
    per seed (each seed delivers messages from different senders in another order; see
    :mod:`flowlab.cluster.collectives.local`) and check that every rank's answer is the same each
    time (exactly, unless ``rtol``/``atol``), and that no ordering made a rank fail or hang past
    ``timeout`` seconds. ``details["orderings"]`` counts the distinct delivery orders that came up
    (1 when each rank only ever hears from one sender at a time: then there is nothing to reorder)."""
    from ..cluster.collectives import LocalGroup
    if type(world_size) is not int or world_size < 1:
        raise ValueError(f"under_orderings: world_size must be a whole number >= 1, got {world_size!r}")
    seeds = list(seeds)
    if not seeds:
        raise ValueError("under_orderings: give at least one seed")
    if not callable(fn):
        raise TypeError(f"under_orderings: fn must be a function fn(comm, *args), got {type(fn).__name__}")
    answers, orders = [], set()
    ref = None
    for seed in seeds:
        group = LocalGroup(world_size, reorder_seed=seed, reorder_window=window)
        try:
            with group:
                results = group.run(fn, *args, return_exceptions=True, join_timeout=timeout)
        except RuntimeError as e:     # ranks still running at the deadline: the group was closed
            return _verdict("under_orderings", False,
                            f"under ordering {seed} the ranks did not finish within {timeout:g} s ({e}): a "
                            f"deadlock when messages arrive in another order?", seeds=seeds[:_MAX_LISTED],
                            failed_seed=seed)
        orders.add(tuple(tuple(d) for d in group.deliveries))
        for r, res in enumerate(results):
            if isinstance(res, BaseException):
                return _verdict("under_orderings", False,
                                f"under ordering {seed} rank {r} raised {_exc(res)}", seeds=seeds[:_MAX_LISTED],
                                failed_seed=seed, rank=r)
        plain = [to_plain(res) for res in results]
        if len(answers) < _MAX_LISTED:
            answers.append({"seed": seed, "rank0": render(plain[0])})
        if ref is None:
            ref = (seed, plain)
            continue
        for r, (want, got) in enumerate(zip(ref[1], plain)):
            ok, why = compare(want, got, rtol=rtol, atol=atol)
            if not ok:
                why = (why.replace("expected ", f"under ordering {ref[0]}: ", 1)
                       .replace(", got ", f", under ordering {seed}: ", 1))
                return _verdict("under_orderings", False,
                                f"the answer depends on the message order: rank {r} {why}",
                                seeds=seeds[:_MAX_LISTED], answers=answers, orderings=len(orders),
                                failed_seed=seed, rank=r)
    k = len(orders)
    note = "" if k > 1 else " (only one delivery order came up: no rank heard from two senders at once)"
    return _verdict("under_orderings", True,
                    f"the same answer on all {world_size} ranks under {len(seeds)} seeded message orderings, "
                    f"{k} distinct delivery order{'s' if k != 1 else ''}{note}",
                    seeds=seeds[:_MAX_LISTED], answers=answers, orderings=k)
