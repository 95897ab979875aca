"""Timelines drawn from the event log: one row per rank (or task), one bar per send, receive and
reduction, and an arrow from each send to the receive that took its message.

Everything drawn is a real event (``flowlab.cluster.events``): a LocalGroup's ``group.events``,
a LocalCluster's ``cluster.events()`` or any list of :class:`~flowlab.cluster.events.Event`.

>>> from flowlab.cluster.collectives import LocalGroup, allreduce
>>> from flowlab.widgets.timeline import rows, plot_timeline
>>> with LocalGroup(2) as group:
...     _ = group.run(lambda comm: allreduce([1.0, 2.0]))
>>> {rank: [e.kind for e in evs] for rank, evs in rows(group.events.events(), kinds=("send",)).items()}
{0: ['send', 'send'], 1: ['send', 'send']}

matplotlib is imported inside :func:`plot_timeline` only, so importing this module (or flowlab)
never imports it.
"""
from __future__ import annotations

__all__ = ["KINDS", "COLORS", "rows", "messages", "plot_timeline"]

KINDS = ("send", "recv", "reduce")
COLORS = {"send": "tab:blue", "recv": "tab:orange", "reduce": "tab:green"}
_LABELS = {"send": "send", "recv": "recv (waiting included)", "reduce": "reduce"}
_UNITS = {"s": 1.0, "ms": 1e3, "us": 1e6}


def _row_key(e):
    return e.rank if e.rank is not None else e.task


def _sort_key(key):
    return (0, key, "") if isinstance(key, int) else (1, 0, str(key))


def rows(events, kinds=KINDS, seq=None) -> dict:
    """The events of the given ``kinds`` grouped by rank (or by task for events without a rank),
    rows in rank order, each row in start order. ``seq``: keep only that collective call
    (the ``seq`` attribute that every collective event carries)."""
    out: dict = {}
    for e in events:
        if e.kind not in kinds:
            continue
        if seq is not None and (e.attrs or {}).get("seq") != seq:
            continue
        out.setdefault(_row_key(e), []).append(e)
    return {k: sorted(out[k], key=lambda e: e.start) for k in sorted(out, key=_sort_key)}


def _message_key(e, sender, receiver):
    a = e.attrs or {}
    chunk = a.get("chunk")
    chunk = tuple(chunk) if isinstance(chunk, list) else chunk
    return (a.get("seq"), e.name, sender, receiver, a.get("step"), chunk, a.get("part"))


def messages(events) -> list:
    """``(send, recv)`` pairs: each send event with the receive event that took its message
    (matched on call, sender, receiver, step, chunk and part). Sends nobody received are left out."""
    recvs: dict = {}
    for e in events:
        if e.kind == "recv" and e.attrs and "peer" in e.attrs:
            recvs.setdefault(_message_key(e, e.attrs["peer"], _row_key(e)), []).append(e)
    pairs = []
    for e in sorted((e for e in events if e.kind == "send" and e.attrs and "peer" in e.attrs),
                    key=lambda e: e.start):
        waiting = recvs.get(_message_key(e, _row_key(e), e.attrs["peer"]))
        if waiting:
            pairs.append((e, waiting.pop(0)))
    return pairs


def plot_timeline(events, ax=None, kinds=KINDS, seq=None, arrows: bool = True, unit: str = "ms",
                  title: str | None = None):
    """Draw ``events`` on ``ax`` (a new figure when None): a row per rank, rank 0 on top, a bar per
    event of ``kinds`` (send blue, recv orange, reduce green), and with ``arrows`` a grey arrow
    from each send to the receive that took its message. Time runs from the first bar, in
    ``unit`` ("s", "ms" or "us"). Returns the Axes.

    A recv bar starts when the rank began waiting for the message, so it shows waiting time too.
    """
    if unit not in _UNITS:
        raise ValueError(f"unit must be one of {sorted(_UNITS)}, got {unit!r}")
    events = list(events)
    by_row = rows(events, kinds, seq)
    if ax is None:
        import matplotlib.pyplot as plt
        _, ax = plt.subplots(figsize=(9, 0.5 + 0.55 * max(1, len(by_row))))
    scale = _UNITS[unit]
    shown = [e for evs in by_row.values() for e in evs]
    t0 = min((e.start for e in shown), default=0.0)
    y = {key: i for i, key in enumerate(by_row)}
    for kind in kinds:
        ys, lefts, widths = [], [], []
        for key, evs in by_row.items():
            for e in evs:
                if e.kind == kind:
                    ys.append(y[key])
                    lefts.append((e.start - t0) * scale)
                    widths.append(max(e.end - e.start, 0.0) * scale)
        if ys:
            ax.barh(ys, widths, left=lefts, height=0.6, color=COLORS.get(kind, "tab:gray"),
                    alpha=0.55 if kind == "recv" else 0.9, label=_LABELS.get(kind, kind),
                    edgecolor="none")
    if arrows and "send" in kinds and "recv" in kinds:
        for snd, rcv in messages(shown):
            ax.annotate("", xy=((rcv.end - t0) * scale, y[_row_key(rcv)]),
                        xytext=((snd.start - t0) * scale, y[_row_key(snd)]),
                        arrowprops=dict(arrowstyle="->", color="0.35", lw=0.6, shrinkA=0, shrinkB=0))
    ax.set_yticks(range(len(by_row)))
    ax.set_yticklabels([f"rank {k}" if isinstance(k, int) else str(k) for k in by_row])
    ax.set_ylim(max(len(by_row), 1) - 0.5, -0.5)      # rank 0 on top
    ax.set_xlabel(f"time ({'µs' if unit == 'us' else unit})")
    if title:
        ax.set_title(title)
    if shown:
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small", frameon=False)
    return ax
