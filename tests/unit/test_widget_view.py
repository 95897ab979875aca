"""SnapshotView, the mechanism of every widget, over a recording comm: a changed snapshot is sent
as one trait update (an unchanged one is not), a front-end action calls ``do_<name>`` and gets a
reply, an unknown action or a failing one gets an error reply instead of raising, and the object's
text and static HTML travel in the widget's display bundle."""
import pytest

pytest.importorskip("anywidget")

from flowlab.widgets._view import SnapshotView, esm, json_safe  # noqa: E402

from _widgets import click  # noqa: E402


class Counter:
    def __init__(self):
        self.n = 0

    def snapshot(self):
        return {"n": self.n, "pair": (1, 2)}

    def __repr__(self):
        return f"Counter({self.n})"

    def _repr_html_(self):
        return f"<b>{self.n}</b>"


class CounterView(SnapshotView):
    _esm = esm()
    actions = ("add", "fail")

    def do_add(self, by=1):
        self.obj.n += by
        return self.obj.n

    def do_fail(self):
        raise ValueError("no such worker: 'x'")


def test_a_changed_snapshot_is_sent_once(widget_comm):
    view = CounterView(Counter())
    comm = view.comm
    assert view.snapshot == {"n": 0, "pair": [1, 2]}
    view.refresh()
    assert comm.updates("snapshot") == []          # nothing changed: nothing sent
    view.obj.n = 3
    view.refresh()
    assert comm.updates("snapshot") == [{"n": 3, "pair": [1, 2]}]


def test_an_action_from_the_front_end_calls_the_method_and_replies(widget_comm):
    view = CounterView(Counter())
    reply = click(view, "add", by=5)
    assert reply == {"action": "add", "result": 5, "ok": True, "reply": 7}
    assert view.comm.updates("snapshot")[-1]["n"] == 5     # refreshed after the action


def test_unknown_and_failing_actions_reply_with_an_error(widget_comm):
    view = CounterView(Counter())
    assert "has no action 'kill'; it has add, fail" in click(view, "kill")["error"]
    assert click(view, "fail")["error"] == "ValueError: no such worker: 'x'"
    assert view.act("add")["ok"]


def test_the_display_bundle_carries_the_objects_text_and_html(widget_comm):
    data, _ = CounterView(Counter())._repr_mimebundle_()
    assert data["text/plain"] == "Counter(0)"
    assert data["text/html"] == "<b>0</b>"
    assert "application/vnd.jupyter.widget-view+json" in data


def test_json_safe():
    import numpy as np
    assert json_safe({"a": (np.float32(1.5), float("nan")), 2: np.arange(2)}) == {"a": [1.5, None], "2": [0, 1]}
