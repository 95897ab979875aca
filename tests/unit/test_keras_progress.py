"""fit's progress: nothing with verbose=0, one text line per epoch in a shell (epoch times in ms
below a second, never 0.0s); the ProgressBar's snapshot is JSON-safe. The live widget (the training
monitor) is tested in test_progress_view.py."""
from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest

import flowlab as fl
from flowlab.nn.keras.progress import ProgressBar, format_seconds

L = fl.keras.layers
(X, Y), _ = fl.datasets.digits()
X, Y = X[:200], Y[:200]
LINE = re.compile(r"^Epoch (\d+)/(\d+) \[=+\] (\d+)/(\d+) - (?!0\.0m?s)[\d.]+m?s - loss: \d+\.\d{4} - accuracy: \d\.\d{4}$")


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
    assert re.fullmatch(r"\[=+\] 4/4 - [\d.]+m?s - loss: \d\.\d{4} - accuracy: \d\.\d{4}", out), out
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


def test_epoch_times_below_a_second_print_in_milliseconds():
    assert [format_seconds(t) for t in (0.0004, 0.013, 0.4, 2.34, 42.0, 185.0)] == \
        ["0.4ms", "13ms", "400ms", "2.3s", "42s", "3m 05s"]


def test_a_fit_that_raises_leaves_its_monitor_failed_not_running():
    import io

    from flowlab.nn.keras.callbacks import Callback, ProgbarLogger

    class Boom(Callback):
        def on_epoch_end(self, epoch, logs=None):
            if epoch == 1:
                raise RuntimeError("boom")

    model = fl.keras.Sequential([fl.keras.Input(shape=(2,)), fl.keras.layers.Dense(1)])
    model.compile(fl.optimizers.SGD(0.1), "mse")
    progress = ProgbarLogger(mode="text", stream=io.StringIO())
    with pytest.raises(RuntimeError, match="boom"):
        model.fit(np.ones((8, 2), np.float32), np.ones((8, 1), np.float32), epochs=4, verbose=0,
                  callbacks=[progress, Boom()])
    assert progress.bar.status == "failed"
    assert "failed" in progress.bar.text()
