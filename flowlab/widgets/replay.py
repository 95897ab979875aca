"""A collective replayed step by step from its recorded events, beside the alpha-beta model.

Every message a collective sends or receives, and every reduction, is an event
(:mod:`flowlab.cluster.events`, attrs ``seq``, ``step``, ``chunk``, ``part``, ``peer``, ``alg``).
:class:`CollectiveReplay` takes the events of one call and cuts them into **frames**, one per
``step`` of the algorithm: the messages of that step (sender, receiver, which chunks of the tensor,
bytes, how many pipelined parts), the ranks that waited and for how long, and what each rank holds
afterwards. "Holds" is followed through the events: the tensor is cut into one block per rank, a
message carries what its sender held of its blocks at the end of the previous step, and the
receiver adds it to its own (when a ``reduce`` event of the same step, peer and chunk follows) or
takes it as it is (a plain copy: the all-gather half). So a block that shows 4/4 on a rank of a
4-rank all-reduce is one whose sum the events show complete there.

Beside the frames: the model's steps, bytes on the busiest link and time
(:mod:`flowlab.cluster.collectives.cost`, alpha and beta fitted once per process on a LocalGroup
unless given), what the events count (steps, busiest link), the measured time (first start to
last end of the call's ``collective`` events), the ratio, and nccl-tests' algbw and busbw.

Drawn as a ring (ring), a binary tree (tree) or a star around rank 0 (naive). In a notebook the
object shows as its live view (``flowlab.widgets.replay_view``: play, pause, step, scrubber, and a
form that re-runs the all-reduce with another algorithm, size, world size or a slowed rank);
elsewhere as a strip of SVG frames and the numbers that do not depend on the clock.

>>> rp = CollectiveReplay.record("ring", nbytes=4096, world_size=3, alpha_beta=(1e-5, 1e-9))
>>> [f["step"] for f in rp.snapshot()["frames"]], rp.snapshot()["frames"][-1]["holds"]
([0, 1, 2, 3], [[3, 3, 3], [3, 3, 3], [3, 3, 3]])
"""
from __future__ import annotations

import html
import math
import threading

from flowlab._display import mimebundle
from flowlab.cluster.collectives import cost
from flowlab.cluster.events import Event, EventLog

__all__ = ["CollectiveReplay", "replay", "record_allreduce", "frames_of", "OPS", "MAX_FRAMES",
           "MAX_MESSAGES", "MAX_BLOCKS", "LIMITS"]

OPS = ("allreduce", "reduce_scatter", "allgather", "broadcast")
KINDS = ("send", "recv", "reduce", "collective")
MAX_FRAMES = 48        # frames kept in a snapshot (more are decimated: evenly spaced, first and last kept)
MAX_MESSAGES = 24      # arrows per frame (the rest are counted in "folded_messages")
MAX_BLOCKS = 16        # blocks drawn per rank (more ranks: neighbouring blocks share a square)
STRIP = 6              # frames in the static picture
LIMITS = {"world_size": (2, 16), "nbytes": (4, 64 << 20), "delay_ms": (0.0, 200.0)}
LAYOUTS = {"ring": "ring", "tree": "tree", "naive": "star"}
_WHOLE = -1


# -- reading events ---------------------------------------------------------------------------------
def _events_of(source) -> list:
    """The events of a LocalGroup, a LocalCluster, an EventLog or a list of events/dicts."""
    if isinstance(source, EventLog):
        return source.events()
    evs = getattr(source, "events", None)
    if isinstance(evs, EventLog):            # a LocalGroup (or anything with a log)
        return evs.events()
    if callable(evs):                        # a LocalCluster: every task's log, merged
        return list(evs())
    try:
        items = list(source)
    except TypeError:
        raise TypeError(f"replay needs a LocalGroup, a LocalCluster, an EventLog or a list of events, "
                        f"got {type(source).__name__}") from None
    return [e if isinstance(e, Event) else Event.from_dict(e) for e in items]


def _select(events, op=None, seq=None):
    """The events of one call: (op, seq, alg, events). By default the last call of any op in OPS."""
    if op is not None and op not in OPS:
        raise ValueError(f"replay shows one of {', '.join(OPS)}; got op={op!r}")
    cands = [e for e in events if e.kind in KINDS and e.name in OPS and e.attrs and "seq" in e.attrs
             and (op is None or e.name == op) and (seq is None or e.attrs["seq"] == seq)]
    if not cands:
        what = f"{op or 'collective'}{'' if seq is None else f' #{seq}'}"
        raise ValueError(f"no recorded {what} events to replay (kinds send/recv/reduce with a seq attribute; "
                         f"ops {', '.join(OPS)}); got {len(events)} events")
    last = max(cands, key=lambda e: e.end)
    name, s = last.name, last.attrs["seq"]
    chosen = [e for e in cands if e.name == name and e.attrs["seq"] == s]
    alg = next((e.attrs.get("alg") for e in chosen if e.attrs.get("alg")), "?")
    return name, s, alg, chosen


def _ckey(chunk):
    return tuple(chunk) if isinstance(chunk, list) else chunk


def _blocks_of(alg, op, n, step, chunk):
    """The blocks (one per rank of the group) a message of ``chunk`` carries."""
    everything = list(range(n))
    if op == "broadcast" or chunk == _WHOLE:
        return [0] if op == "broadcast" else everything
    if alg == "naive":
        if op == "allreduce" or (op == "reduce_scatter" and step == 0) or (op == "allgather" and step == 1):
            return everything
        return [int(chunk)]
    if isinstance(chunk, (list, tuple)):     # tree: a range of virtual ranks' blocks
        p2 = 1 << (n.bit_length() - 1)
        rem = n - p2
        first = lambda j: 2 * j if j < rem else j + rem   # noqa: E731
        return list(range(first(chunk[0]), first(chunk[1]) if chunk[1] < p2 else n))
    return [int(chunk)]


def _popcount(x: int) -> int:
    return bin(x).count("1")


def _phase(alg, op, n, step):
    if op != "allreduce":
        return op.replace("_", "-")
    if alg == "naive":
        return "gather and add at rank 0" if step == 0 else "rank 0 sends the sum back"
    if alg == "ring":
        return "reduce-scatter" if step < n - 1 else "all-gather"
    if alg == "tree":
        p2 = 1 << (n.bit_length() - 1)
        k = p2.bit_length() - 1
        if step == 0:
            return "fold (extra ranks hand over)"
        if step <= k:
            return "recursive halving (reduce-scatter)"
        if step <= 2 * k:
            return "recursive doubling (all-gather)"
        return "unfold (extra ranks get the sum)"
    return alg


def _group_blocks(row, n):
    """A rank's per-block counts, folded to at most MAX_BLOCKS squares (each the least of its blocks)."""
    if n <= MAX_BLOCKS:
        return row
    size = math.ceil(n / MAX_BLOCKS)
    return [min(row[i:i + size]) for i in range(0, n, size)]


def frames_of(events, n, op, alg):
    """(frames, initial holds, nbytes estimate, recorded busiest-link bytes) of one call's events."""
    sends = sorted((e for e in events if e.kind == "send"), key=lambda e: e.start)
    recvs = {}
    for e in events:
        if e.kind == "recv":
            a = e.attrs
            recvs.setdefault((e.rank, a["peer"], a["step"], _ckey(a.get("chunk")), a.get("part")), []).append(e)
    reduced = {(e.rank, e.attrs["peer"], e.attrs["step"], _ckey(e.attrs.get("chunk")), e.attrs.get("part"))
               for e in events if e.kind == "reduce"}
    t0 = min((e.start for e in events), default=0.0)
    nblocks = 1 if op == "broadcast" else n
    # what each rank holds at the start: a bit per rank whose contribution is in the block
    receivers = {e.rank for e in events if e.kind == "recv"}
    if op in ("allreduce", "reduce_scatter"):
        holds = [[1 << r] * nblocks for r in range(n)]
    elif op == "allgather":
        holds = [[(1 << r) if b == r else 0 for b in range(nblocks)] for r in range(n)]
    else:
        holds = [[(1 << r) if r not in receivers else 0] for r in range(n)]
    initial = [[_popcount(x) for x in row] for row in holds]

    # messages of a step, parts of one chunk merged into one arrow
    by_step: dict = {}
    for e in sends:
        a = e.attrs
        key = (e.rank, a["peer"], _ckey(a.get("chunk")))
        msgs = by_step.setdefault(a["step"], {})
        m = msgs.get(key)
        got = recvs.get((a["peer"], e.rank, a["step"], _ckey(a.get("chunk")), a.get("part")))
        rcv = got.pop(0) if got else None
        red = (a["peer"], e.rank, a["step"], _ckey(a.get("chunk")), a.get("part")) in reduced
        if m is None:
            m = msgs[key] = {"src": e.rank, "dst": a["peer"], "chunk": a.get("chunk"), "bytes": 0, "parts": 0,
                             "reduce": False, "start": e.start, "end": e.end, "arrived": False}
        m["bytes"] += e.bytes
        m["parts"] += 1
        m["reduce"] = m["reduce"] or red
        m["start"] = min(m["start"], e.start)
        if rcv is not None:
            m["arrived"] = True
            m["end"] = max(m["end"], rcv.end)
    waits: dict = {}
    for e in events:
        if e.kind == "recv":
            k = (e.attrs["step"], e.rank)
            waits[k] = waits.get(k, 0.0) + e.duration

    frames, whole, singles, link = [], [], {}, {}
    for step in sorted(by_step):
        before = [row[:] for row in holds]
        out = []
        for m in by_step[step].values():
            blocks = _blocks_of(alg, op, n, step, m["chunk"])
            if m["arrived"]:
                for b in blocks:
                    got = before[m["src"]][b]
                    holds[m["dst"]][b] = holds[m["dst"]][b] | got if m["reduce"] else got
            if len(blocks) == nblocks:
                whole.append(m["bytes"])
            elif len(blocks) == 1:
                singles[blocks[0]] = max(singles.get(blocks[0], 0), m["bytes"])
            for who, kind in ((m["src"], 0), (m["dst"], 1)):
                pair = link.setdefault((who, step), [0, 0])
                pair[kind] += m["bytes"]
            msg = {"src": m["src"], "dst": m["dst"], "chunks": blocks, "bytes": m["bytes"], "parts": m["parts"],
                   "reduce": m["reduce"], "start": round(m["start"] - t0, 6), "end": round(m["end"] - t0, 6)}
            if not m["arrived"]:
                msg["lost"] = True          # sent, never received (the call failed)
            out.append(msg)
        out.sort(key=lambda m: (m["src"], m["dst"], m["chunks"]))
        start = min(m["start"] for m in out)
        end = max(m["end"] for m in out)
        frames.append({"step": step, "phase": _phase(alg, op, n, step), "start": start, "end": end,
                       "messages": out[:MAX_MESSAGES], "folded_messages": max(0, len(out) - MAX_MESSAGES),
                       "bytes": sum(m["bytes"] for m in out),
                       "wait": [round(waits.get((step, r), 0.0), 6) for r in range(n)],
                       "holds": [_group_blocks([_popcount(x) for x in row], n) for row in holds]})
    nbytes = max(whole, default=0)
    if len(singles) == nblocks:
        nbytes = max(nbytes, sum(singles.values()))
    busiest = {}
    for (who, _), (sent, got) in link.items():
        busiest[who] = busiest.get(who, 0) + max(sent, got)
    return frames, [_group_blocks(row, n) for row in initial], nbytes, max(busiest.values(), default=0)


def _label(blocks, nblocks):
    if len(blocks) == nblocks and nblocks > 1:
        return "all chunks"
    if len(blocks) == 1:
        return f"chunk {blocks[0]}"
    if blocks == list(range(blocks[0], blocks[-1] + 1)):
        return f"chunks {blocks[0]}-{blocks[-1]}"
    return "chunks " + ",".join(map(str, blocks))


def _decimate(frames):
    if len(frames) <= MAX_FRAMES:
        return frames, 0
    keep = sorted({round(i * (len(frames) - 1) / (MAX_FRAMES - 1)) for i in range(MAX_FRAMES)})
    return [frames[i] for i in keep], len(frames) - len(keep)


# -- recording a fresh all-reduce --------------------------------------------------------------------
def _check_int(name, value, lo, hi):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
        raise ValueError(f"{name} must be a whole number, got {value!r}")
    value = int(value)
    if not lo <= value <= hi:
        raise ValueError(f"{name} must be between {lo} and {hi}, got {value}")
    return value


def record_allreduce(algorithm: str = "ring", nbytes: int = 1 << 20, world_size: int = 4, slow_rank=None,
                     delay_ms: float = 0.0, segment_bytes: int | None = None) -> list:
    """Run one float32 all-reduce of ``nbytes`` on a fresh in-process ``LocalGroup(world_size)``
    and return its events. A warm-up call comes first (unrecorded), and every rank starts the
    recorded one at a barrier. ``slow_rank`` / ``delay_ms``: every message that rank sends leaves
    ``delay_ms`` late (``LocalGroup.delay``, the group's slow-link fault), so the others wait."""
    import numpy as np

    from flowlab.cluster.collectives import LocalGroup, allreduce, barrier

    if algorithm not in cost.MODEL_ALGORITHMS:
        raise ValueError(f"algorithm must be one of {', '.join(cost.MODEL_ALGORITHMS)}, got {algorithm!r}")
    world_size = _check_int("world_size", world_size, *LIMITS["world_size"])
    nbytes = _check_int("nbytes", nbytes, *LIMITS["nbytes"])
    if slow_rank in (None, "", -1, "none"):
        slow_rank = None
    else:
        slow_rank = _check_int("slow_rank", slow_rank, 0, world_size - 1)
    lo, hi = LIMITS["delay_ms"]
    try:
        delay_ms = float(delay_ms or 0.0)
    except (TypeError, ValueError):
        raise ValueError(f"delay_ms must be a number of milliseconds, got {delay_ms!r}") from None
    if not lo <= delay_ms <= hi:
        raise ValueError(f"delay_ms must be between {lo:g} and {hi:g}, got {delay_ms:g}")
    x = np.ones(max(1, nbytes // 4), np.float32)

    def body(comm):
        barrier()
        allreduce(x, algorithm=algorithm)

    with LocalGroup(world_size, segment_bytes=segment_bytes) as group:
        group.run(body, join_timeout=30.0)        # warm-up: the first call also sets things up
        group.events.clear()
        if slow_rank is not None and delay_ms:
            group.delay(slow_rank, delay_ms / 1e3)
        group.run(body, join_timeout=30.0)
        return group.events.events()


_FIT: list = []
_FIT_LOCK = threading.Lock()


def _fitted() -> cost.AlphaBeta:
    """alpha and beta of this machine, fitted once per process (about 0.1 s)."""
    with _FIT_LOCK:
        if not _FIT:
            _FIT.append(cost.fit_alpha_beta())
        return _FIT[0]


# -- the object -------------------------------------------------------------------------------------
class CollectiveReplay:
    """One recorded collective call, frame by frame, with the model and the measurement.

    Made from a LocalGroup, a LocalCluster, an EventLog or a list of events (``replay(source)``;
    ``op``/``seq`` pick the call, by default the last one), or recorded afresh
    (:meth:`record`). ``alpha_beta``: ``(alpha, beta)`` for the model (default: fitted on this
    machine once per process). :meth:`rerun` replaces the recording with a fresh all-reduce."""

    _view = "flowlab.widgets.replay_view:ReplayView"

    def __init__(self, events, op: str | None = None, seq: int | None = None, alpha_beta=None, slow=None):
        self._lock = threading.Lock()
        self._alpha_beta = None if alpha_beta is None else cost.AlphaBeta(*alpha_beta)
        self._load(_events_of(events), op, seq, slow)

    @classmethod
    def record(cls, algorithm: str = "ring", nbytes: int = 1 << 20, world_size: int = 4, slow_rank=None,
               delay_ms: float = 0.0, alpha_beta=None, segment_bytes: int | None = None) -> "CollectiveReplay":
        """Record a fresh all-reduce (:func:`record_allreduce`) and replay it."""
        events = record_allreduce(algorithm, nbytes, world_size, slow_rank, delay_ms, segment_bytes)
        return cls(events, "allreduce", alpha_beta=alpha_beta, slow=_slow(slow_rank, delay_ms))

    def rerun(self, algorithm: str = "ring", nbytes: int = 1 << 20, world_size: int = 4, slow_rank=None,
              delay_ms: float = 0.0) -> dict:
        """Record a fresh all-reduce with these settings and show it instead; returns its summary."""
        events = record_allreduce(algorithm, nbytes, world_size, slow_rank, delay_ms)
        self._load(events, "allreduce", None, _slow(slow_rank, delay_ms))
        snap = self.snapshot()
        return {"alg": snap["alg"], "ranks": snap["ranks"], "nbytes": snap["nbytes"], "frames": snap["total_frames"]}

    # -- reading -----------------------------------------------------------------------------------
    def _load(self, events, op, seq, slow):
        name, s, alg, chosen = _select(events, op, seq)
        n = max(e.rank for e in chosen if e.rank is not None) + 1
        calls = [e for e in chosen if e.kind == "collective"]
        moved = [e for e in chosen if e.kind != "collective"]
        frames, initial, estimate, busiest = frames_of(moved, n, name, alg)
        nbytes = max((e.bytes for e in calls), default=0) or estimate
        span = calls or moved
        seconds = max(e.end for e in span) - min(e.start for e in span)
        t0 = min(e.start for e in span)
        kept, folded = _decimate(frames)
        per_rank = []
        for r in range(n):
            mine = [e for e in moved if e.rank == r]
            ends = [e.end for e in (calls or moved) if e.rank == r]
            per_rank.append({"rank": r,
                             "wait": round(sum(e.duration for e in mine if e.kind == "recv"), 6),
                             "busy": round(sum(e.duration for e in mine if e.kind != "recv"), 6),
                             "end": round(max(ends) - t0, 6) if ends else None})
        snap = {"kind": "replay", "op": name, "alg": alg, "seq": s, "ranks": n, "nbytes": nbytes,
                "layout": LAYOUTS.get(alg, "ring"), "blocks": len(initial[0]) if initial else 0,
                "full": 1 if name in ("allgather", "broadcast") else n,
                "block_ranks": 1 if n <= MAX_BLOCKS else math.ceil(n / MAX_BLOCKS),
                "events": len(moved), "initial": initial, "frames": kept, "total_frames": len(frames),
                "folded_frames": folded, "per_rank": per_rank, "slow": slow,
                "recorded": {"steps": len(frames), "bytes": busiest},
                "measured": self._measured(name, n, nbytes, seconds),
                "model": None, "limits": {k: list(v) for k, v in LIMITS.items()},
                "algorithms": list(cost.MODEL_ALGORITHMS)}
        if name == "allreduce" and alg in cost.MODEL_ALGORITHMS:
            snap["model"] = {"steps": cost.steps(alg, n), "bytes": cost.bytes_on_busiest_link(alg, n, nbytes)}
        with self._lock:
            self._events = chosen
            self._snap = snap

    @staticmethod
    def _measured(op, n, nbytes, seconds):
        out = {"seconds": round(seconds, 6), "factor": cost.busbw_factor(op, n),
               "factor_formula": cost.busbw_factor.formulas[op], "algbw": None, "busbw": None}
        if seconds > 0:
            out["algbw"] = cost.algbw(nbytes, seconds)
            out["busbw"] = cost.busbw(op, n, nbytes, seconds)
        return out

    @property
    def events(self) -> list:
        """The recorded events of the call replayed (send, recv, reduce and collective)."""
        with self._lock:
            return list(self._events)

    def snapshot(self) -> dict:
        """Frames, the model's numbers (with this process's alpha and beta) and the measured ones."""
        with self._lock:
            snap = dict(self._snap)
        if snap["model"] is not None:
            ab = self._alpha_beta or _fitted()
            model = dict(snap["model"], alpha=ab.alpha, beta=ab.beta,
                         seconds=ab.predict(snap["alg"], snap["ranks"], snap["nbytes"]))
            measured = snap["measured"]["seconds"]
            model["ratio"] = measured / model["seconds"] if model["seconds"] > 0 else None
            snap["model"] = model
        return snap

    # -- display -----------------------------------------------------------------------------------
    def __repr__(self):
        s = self._snap
        return (f"CollectiveReplay({s['alg']} {s['op']}, {s['ranks']} ranks, {_fmt_bytes(s['nbytes'])}, "
                f"{s['total_frames']} steps)")

    def _repr_mimebundle_(self, include=None, exclude=None):
        return mimebundle(self, include, exclude)

    def _repr_html_(self) -> str:
        """A strip of frames (static SVG) and the numbers that do not depend on the clock."""
        s = self._snap
        frames = s["frames"]
        if len(frames) > STRIP:
            idx = sorted({round(i * (len(frames) - 1) / (STRIP - 1)) for i in range(STRIP)})
            frames = [frames[i] for i in idx]
        panels = "".join(_svg_frame(s, f) for f in frames)
        model = s["model"]
        rows = [("steps", s["recorded"]["steps"], model["steps"] if model else "-"),
                ("bytes on the busiest link", _fmt_bytes(s["recorded"]["bytes"]),
                 _fmt_bytes(model["bytes"]) if model else "-")]
        table = "".join(f"<tr><td>{html.escape(a)}</td><td>{b}</td><td>{c}</td></tr>" for a, b, c in rows)
        slow = f", rank {s['slow']['rank']} slowed by {s['slow']['delay_ms']:g} ms per message" if s["slow"] else ""
        folded = f" ({s['folded_frames']} frames folded)" if s["folded_frames"] else ""
        return (f"<div class='fl-replay-static'><b>{html.escape(s['alg'])} {html.escape(s['op'])}</b>: "
                f"{s['ranks']} ranks, {_fmt_bytes(s['nbytes'])}{html.escape(slow)}, {s['total_frames']} steps "
                f"from {s['events']} recorded events{folded}"
                f"<div style='display:flex;flex-wrap:wrap;gap:4px'>{panels}</div>"
                f"<table><tr><th></th><th>recorded</th><th>model</th></tr>{table}</table>"
                f"<div>bus bandwidth = algbw &times; {html.escape(s['measured']['factor_formula'])} "
                f"= algbw &times; {s['measured']['factor']:.3g} (nccl-tests); times: in the live view</div></div>")


def _slow(rank, delay_ms):
    if rank in (None, "", -1, "none") or not delay_ms:
        return None
    return {"rank": int(rank), "delay_ms": float(delay_ms)}


def replay(source, seq: int | None = None, op: str | None = None, alpha_beta=None) -> CollectiveReplay:
    """The replay of one collective call recorded in ``source`` (a LocalGroup, a LocalCluster, an
    EventLog or a list of events): by default its last call."""
    return CollectiveReplay(source, op=op, seq=seq, alpha_beta=alpha_beta)


# -- the static picture -----------------------------------------------------------------------------
_COLOURS = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7",
            "#9c755f", "#bab0ac"]


def positions(layout: str, n: int, size: float):
    """Where each rank is drawn in a ``size`` square (the same rule as replay.js)."""
    c, r = size / 2, size * 0.36
    if layout == "star":
        pts = [(c, c)]
        for i in range(1, n):
            a = -math.pi / 2 + 2 * math.pi * (i - 1) / max(1, n - 1)
            pts.append((c + r * math.cos(a), c + r * math.sin(a)))
        return pts[:n]
    if layout == "tree":
        levels = max(1, (n).bit_length())
        pts = []
        for i in range(n):
            lvl = (i + 1).bit_length() - 1
            first = (1 << lvl) - 1
            count = min(1 << lvl, n - first)
            x = size * (i - first + 1) / (count + 1)
            y = size * (0.14 + 0.72 * (lvl / max(1, levels - 1)))
            pts.append((x, y))
        return pts
    return [(c + r * math.cos(-math.pi / 2 + 2 * math.pi * i / n), c + r * math.sin(-math.pi / 2 + 2 * math.pi * i / n))
            for i in range(n)]


def _svg_frame(s, f, size=170):
    n = s["ranks"]
    pts = positions(s["layout"], n, size)
    node = max(5.0, min(14.0, size / (3 * max(n, 1))))
    parts = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{size}' height='{size + 16}' "
             f"viewBox='0 0 {size} {size + 16}' style='border:1px solid #ddd'>"
             "<defs><marker id='flra' viewBox='0 0 6 6' refX='5' refY='3' markerWidth='5' markerHeight='5' "
             "orient='auto'><path d='M0,0L6,3L0,6z' fill='#555'/></marker></defs>"]
    for m in f["messages"]:
        (x1, y1), (x2, y2) = pts[m["src"]], pts[m["dst"]]
        dx, dy = x2 - x1, y2 - y1
        d = math.hypot(dx, dy) or 1
        ux, uy = dx / d, dy / d
        mx, my = (x1 + x2) / 2 - uy * d * 0.12, (y1 + y2) / 2 + ux * d * 0.12
        sx, sy, ex, ey = x1 + ux * node, y1 + uy * node, x2 - ux * (node + 1), y2 - uy * (node + 1)
        colour = "#e15759" if m["reduce"] else "#4e79a7"
        parts.append(f"<path d='M{sx:.1f},{sy:.1f} Q{mx:.1f},{my:.1f} {ex:.1f},{ey:.1f}' fill='none' "
                     f"stroke='{colour}' stroke-width='1.2' marker-end='url(#flra)'><title>rank {m['src']} &#8594; "
                     f"rank {m['dst']}: {_label(m['chunks'], 1 if s['op'] == 'broadcast' else s['ranks'])}, {_fmt_bytes(m['bytes'])}</title></path>")
    full = s["full"]
    for r, (x, y) in enumerate(pts):
        row = f["holds"][r]
        done = all(v >= full for v in row)
        parts.append(f"<circle cx='{x:.1f}' cy='{y:.1f}' r='{node:.1f}' fill='{'#59a14f' if done else '#fff'}' "
                     f"stroke='{_COLOURS[r % len(_COLOURS)]}' stroke-width='2'/>")
        parts.append(f"<text x='{x:.1f}' y='{y + 3:.1f}' font-size='8' text-anchor='middle'>{r}</text>")
    phase = html.escape(f['phase'])
    parts.append(f"<text x='4' y='{size + 12}' font-size='9'>step {f['step']}: {phase}</text></svg>")
    return "".join(parts)


def _fmt_bytes(n) -> str:
    n = float(n or 0)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{int(n)} {unit}" if unit == "B" else f"{n:.3g} {unit}"
        n /= 1024
    return f"{n:.3g} GiB"
