"""fit's progress: nothing with verbose=0, one text line per epoch in a shell, a throttled live
widget in a notebook; the ProgressBar's snapshot is JSON-safe."""
from __future__ import annotations

import json
import math
import re
import time

import numpy as np
import pytest

import flowlab as fl
import flowlab._display as display
from flowlab.nn.keras.progress import ProgressBar

L = fl.keras.layers
(X, Y), _ = fl.datasets.digits()
X, Y = X[:200], Y[:200]
LINE = re.compile(r"^Epoch (\d+)/(\d+) \[=+\] (\d+)/(\d+) - [\d.]+s - loss: \d+\.\d{4} - accuracy: \d\.\d{4}$")


def model():
    fl.random.set_seed(0)
    m = fl.keras.Sequential([fl.keras.Input(shape=(64,)), L.Dense(16, activation="relu"), L.Dense(10)])
    m.compile("adam", fl.keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    return m


def test_verbose_0_prints_nothing(capsys):
    m = model()
    m.fit(X, Y, epochs=2, verbose=0)
    m.evaluate(X, Y, verbose=0)
    m.predict(X, verbose=0)
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize("verbose", ["auto", 1, 2])
def test_in_a_shell_fit_prints_one_line_per_epoch(capsys, verbose):
    history = model().fit(X, Y, epochs=3, batch_size=50, verbose=verbose)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3, lines
    for epoch, line in enumerate(lines, start=1):
        m = LINE.match(line)
        assert m, line
        assert m.groups() == (str(epoch), "3", "4", "4")
        assert f"loss: {history.history['loss'][epoch - 1]:.4f}" in line


def test_evaluate_prints_one_line(capsys):
    m = model()
    logs = m.evaluate(X, Y, batch_size=64, return_dict=True)
    out = capsys.readouterr().out.strip()
    assert re.fullmatch(r"\[=+\] 4/4 - [\d.]+s - loss: \d\.\d{4} - accuracy: \d\.\d{4}", out), out
    assert f"{logs['loss']:.4f}" in out


def test_snapshot_is_json_safe_even_when_the_loss_is_nan():
    bar = ProgressBar(epochs=2, steps=3).start()
    bar.start_epoch(0)
    bar.update(2, {"loss": math.nan, "accuracy": np.float32(0.5)})
    snap = bar.snapshot()
    assert snap["values"] == {"loss": "nan", "accuracy": 0.5}
    json.dumps(snap, allow_nan=False)
    bar.end_epoch({"loss": math.inf, "accuracy": 0.75})
    bar.finish()
    snap = bar.snapshot()
    json.dumps(snap, allow_nan=False)
    assert snap["status"] == "done" and snap["finished"][0]["values"] == {"loss": "inf", "accuracy": 0.75}
    assert "loss: inf" in repr(bar) and "<code>" in bar._repr_html_()


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_the_widget_draws_the_snapshot_and_skips_refreshes_that_come_too_fast():
    bar = ProgressBar(epochs=2, steps=10).start()
    clock = FakeClock()
    from flowlab.widgets.progress import ProgressView
    view = ProgressView(bar, clock=clock)
    assert view.draws == 1
    bar.start_epoch(0)
    bar.update(4, {"loss": 0.25})
    assert view.refresh() is False and view.draws == 1       # within min_interval of the last draw
    clock.now += ProgressView.min_interval
    assert view.refresh() is True and view.draws == 2
    assert view._progress.value == 4 and view._progress.max == 10
    assert "loss: <code>0.2500</code>" in view._values.value
    assert view.refresh(force=True) is True and view.draws == 3
    bar.view = view
    bar.end_epoch({"loss": 0.2})
    assert ">1</td>" in view._table.value and ">0.2000</td>" in view._table.value


def test_show_builds_the_view_the_bar_names():
    bar = ProgressBar(epochs=1, steps=5)
    view = display.show(bar, force=True)
    from flowlab.widgets.progress import ProgressView
    assert isinstance(view, ProgressView) and ProgressBar._view == "flowlab.widgets.progress:ProgressView"


def test_in_a_notebook_fit_shows_a_live_widget_instead_of_text(monkeypatch, capsys):
    monkeypatch.setattr(display, "in_kernel", lambda: True)
    logger = fl.keras.callbacks.ProgbarLogger()       # the one fit would make; passed in to look at it after
    start = time.perf_counter()
    model().fit(X, Y, epochs=4, batch_size=8, callbacks=[logger])          # 100 batches
    elapsed = time.perf_counter() - start
    out = capsys.readouterr().out
    assert "Epoch 1/4 [" not in out, "no text lines in a notebook"
    view = logger.bar.view
    assert type(view).__name__ == "ProgressView"
    forced = 1 + 4 * 2 + 1          # built, each epoch's start and end, the end of training
    assert view.draws <= forced + 1 + elapsed / view.min_interval, "batch refreshes are throttled"
    assert view._progress.value == 25 and view._progress.bar_style == "success"
    assert logger.bar.snapshot()["finished"][-1]["epoch"] == 4
