import subprocess
import sys

import numpy as np
import pytest

from flowlab.cluster.collectives import LocalGroup, allreduce
from flowlab.cluster.events import Event
from flowlab.widgets import timeline

matplotlib = pytest.importorskip("matplotlib")


def _allreduce_events(algorithm, n=4, size=1024):
    with LocalGroup(n) as group:
        group.run(lambda comm: allreduce(np.full(size, comm.rank + 1.0, np.float32), algorithm=algorithm))
        return group.events.events()


def _figure():
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    fig = Figure(figsize=(6, 3))
    FigureCanvasAgg(fig)
    return fig, fig.add_subplot()


def _bars_per_row(ax):
    from matplotlib.patches import Rectangle
    out = {}
    for p in ax.patches:
        if isinstance(p, Rectangle):
            row = round(p.get_y() + p.get_height() / 2)
            out[row] = out.get(row, 0) + 1
    return out


@pytest.mark.parametrize("algorithm", ["ring", "tree", "naive"])
def test_one_bar_per_event_per_rank(algorithm):
    events = _allreduce_events(algorithm)
    fig, ax = _figure()
    assert timeline.plot_timeline(events, ax=ax, title=algorithm) is ax
    fig.canvas.draw()          # renders on the Agg canvas without error
    expected = {r: sum(1 for e in events if e.rank == r and e.kind in timeline.KINDS) for r in range(4)}
    assert _bars_per_row(ax) == expected
    assert [t.get_text() for t in ax.get_yticklabels()] == ["rank 0", "rank 1", "rank 2", "rank 3"]
    assert ax.get_title() == algorithm
    if algorithm == "ring":    # 2(N-1) sends and receives and N-1 reductions on every rank
        assert expected == {r: 6 + 6 + 3 for r in range(4)}
    if algorithm == "naive":   # rank 0 receives 3, reduces 3 and sends 3; the others send 1 and receive 1
        assert expected == {0: 9, 1: 2, 2: 2, 3: 2}


def test_every_message_gets_an_arrow():
    events = _allreduce_events("ring")
    pairs = timeline.messages(events)
    assert len(pairs) == 4 * 6                      # every send was received
    for snd, rcv in pairs:
        assert rcv.rank == snd.attrs["peer"] and rcv.attrs["peer"] == snd.rank
        assert snd.bytes == rcv.bytes == 1024          # a quarter of 1024 float32s
    fig, ax = _figure()
    timeline.plot_timeline(events, ax=ax)
    assert len(ax.texts) == 24                      # one annotation (arrow) per message
    fig, ax = _figure()
    timeline.plot_timeline(events, ax=ax, arrows=False)
    assert len(ax.texts) == 0


def test_rows_filters_kinds_and_calls():
    with LocalGroup(2) as group:
        group.run(lambda comm: [allreduce([1.0, 2.0], algorithm="naive") for _ in range(2)])
        events = group.events.events()
    assert {r: [e.kind for e in evs] for r, evs in timeline.rows(events, kinds=("send",), seq=2).items()} == \
        {0: ["send"], 1: ["send"]}
    assert list(timeline.rows(events)) == [0, 1]
    assert all(e.kind in timeline.KINDS for evs in timeline.rows(events).values() for e in evs)


def test_events_without_rank_go_in_rows_per_task_and_empty_is_fine():
    evs = [Event("send", "x", 1.0, 1.5, task="/job:worker/task:1"),
           Event("reduce", "x", 1.2, 1.4, task="/job:worker/task:0"),
           Event("op", "matmul", 0.0, 3.0, task="/job:worker/task:0")]
    fig, ax = _figure()
    timeline.plot_timeline(evs, ax=ax, unit="s")
    assert [t.get_text() for t in ax.get_yticklabels()] == ["/job:worker/task:0", "/job:worker/task:1"]
    bars = sorted((p.get_x(), p.get_width()) for p in ax.patches)
    assert bars == [pytest.approx((0.0, 0.5)), pytest.approx((0.2, 0.2))]   # time from the first bar
    fig, ax = _figure()
    timeline.plot_timeline([], ax=ax)
    assert len(ax.patches) == 0
    with pytest.raises(ValueError, match="unit"):
        timeline.plot_timeline(evs, ax=ax, unit="hours")


def test_importing_flowlab_and_the_module_does_not_import_matplotlib():
    code = ("import sys, flowlab, flowlab.widgets.timeline\n"
            "assert not [m for m in sys.modules if m.startswith('matplotlib')], 'matplotlib imported'\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
