"""The training monitor (``ProgressView`` over a fit's ``ProgressBar``) over a recording comm: the
snapshot travels as trait updates, refreshes that come too fast are skipped, every epoch has a time
above zero and a throughput, the batch-loss curve and the epoch list stay bounded, a strategy's
replica count is shown, and the display is updated to the final state when training ends."""
from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("anywidget")

import flowlab as fl  # noqa: E402
from flowlab.nn.keras import progress  # noqa: E402
from flowlab.nn.keras.progress import ProgressBar  # noqa: E402
from flowlab.widgets.progress import ProgressView  # noqa: E402
from _widgets import display_in_kernel  # noqa: E402

L = fl.keras.layers
(X, Y), _ = fl.datasets.digits()
X, Y = X[:200], Y[:200]


def model():
    fl.random.set_seed(0)
    m = fl.keras.Sequential([fl.keras.Input(shape=(64,)), L.Dense(16, activation="relu"), L.Dense(10)])
    m.compile("adam", fl.keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    return m


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


@pytest.fixture
def in_kernel(monkeypatch, widget_comm):
    """fit believes it runs in a kernel: ``_display.show`` displays the monitor (over a recording
    comm) through IPython's ``display``, stood in for here; returns the displays made (handles)."""
    return display_in_kernel(monkeypatch)


def test_the_view_sends_the_bars_snapshot_and_skips_refreshes_that_come_too_fast(widget_comm):
    bar = ProgressBar(epochs=2, steps=10, samples=100, batch_size=10).start()
    clock = FakeClock()
    view = ProgressView(bar, clock=clock)
    comm = view.comm
    assert view.draws == 1 and view.snapshot["line"] == "Epoch 0/2 (not started)"
    bar.view = view
    bar.start_epoch(0)
    assert view.draws == 1 and comm.updates("snapshot") == []   # within min_interval of the last read
    bar.update(4, {"loss": 0.25})
    assert view.refresh() is False and view.draws == 1
    clock.now += ProgressView.min_interval * 1.01
    assert view.refresh() is True and view.draws == 2
    sent = comm.updates("snapshot")[-1]
    assert sent["step"] == 4 and sent["values"] == {"loss": 0.25}
    assert sent["batch"]["points"] == [[4, 0.25]]            # the loss read at this redraw, kept
    json.dumps(sent, allow_nan=False)
    bar.end_epoch({"loss": 0.2})
    assert view.draws == 2                                   # the epoch's end is throttled too...
    bar.finish()
    assert view.draws == 3                                   # ...the end of training is not
    row = comm.updates("snapshot")[-1]["finished"][0]
    assert row["epoch"] == 1 and row["samples"] == 40 and row["values"] == {"loss": 0.2}


def test_a_fit_in_a_notebook_draws_a_few_times_and_every_epoch_has_a_time_and_a_rate(in_kernel, capsys):
    logger = fl.keras.callbacks.ProgbarLogger()
    model().fit(X, Y, epochs=4, batch_size=8, validation_split=0.2, callbacks=[logger])   # 20 steps an epoch
    assert "Epoch 1/4 [" not in capsys.readouterr().out, "no text lines in a notebook"
    view = logger.bar.view
    assert isinstance(view, ProgressView)
    forced = 1 + 1                         # built, the end of training
    assert view.draws <= forced + 1 + logger.bar.elapsed() / view.min_interval, "refreshes are throttled"
    snap = view.comm.updates("snapshot")[-1]
    assert snap["status"] == "done" and snap["step"] == 20
    assert [r["epoch"] for r in snap["finished"]] == [1, 2, 3, 4]
    for r in snap["finished"]:
        assert r["seconds"] > 0 and r["samples"] == 160 and r["samples_per_s"] > 0
        assert set(r["values"]) == {"loss", "accuracy", "val_loss", "val_accuracy"}
    assert " - 0.0s - " not in repr(logger.bar) and " - 0.0ms - " not in repr(logger.bar)


def test_the_display_is_updated_to_the_final_state_with_a_loss_chart(in_kernel):
    logger = fl.keras.callbacks.ProgbarLogger()
    model().fit(X, Y, epochs=3, batch_size=50, validation_split=0.2, callbacks=[logger])
    (handle,) = in_kernel
    assert handle.shown["text/plain"] == "Epoch 0/3 (not started)"             # when fit began
    assert "application/vnd.jupyter.widget-view+json" in handle.shown
    final = handle.updates[-1]
    assert final["text/plain"] == repr(logger.bar) and final["text/plain"].count("\n") == 2
    assert final["text/plain"].startswith("Epoch 1/3 [") and "(not started)" not in final["text/plain"]
    html = final["text/html"]
    assert html.count("<polyline") == 2 and ">loss</text>" in html and ">val_loss</text>" in html
    assert "application/vnd.jupyter.widget-view+json" in final            # still the live widget
    assert len(handle.updates) == 1


def test_the_batch_loss_curve_and_the_epoch_list_stay_bounded(monkeypatch):
    monkeypatch.setattr(progress, "SHOWN_EPOCHS", 5)
    bar = ProgressBar(epochs=9, steps=10_000).start()
    for epoch in range(7):
        bar.start_epoch(epoch)
        bar.end_epoch({"loss": 1.0 / (epoch + 1)})
    snap = bar.snapshot()
    assert [r["epoch"] for r in snap["finished"]] == [3, 4, 5, 6, 7] and snap["finished_left_out"] == 2
    bar.start_epoch(7)
    for step in range(1, 10_001):
        bar.update(step, {"loss": 1.0 / step})
        bar.snapshot()                       # a view that redraws after every step (worst case)
    points = bar.snapshot()["batch"]["points"]
    assert len(points) < progress.BATCH_POINTS
    steps = [p[0] for p in points]
    assert steps == sorted(steps) and steps[-1] > 9_000          # spread over the whole epoch
    bar.start_epoch(8)
    assert bar.snapshot()["batch"] == {"epoch": 9, "every": 1, "points": []}     # a new epoch: a new curve


def test_under_a_mirrored_strategy_the_monitor_shows_the_replicas(cpus, in_kernel):
    cpus(2)
    strategy = fl.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        m = model()
    logger = fl.keras.callbacks.ProgbarLogger()
    m.fit(X, Y, epochs=2, batch_size=40, callbacks=[logger])
    snap = logger.bar.view.snapshot
    assert snap["replicas"] == 2 and snap["strategy"] == "MirroredStrategy"
    assert all(r["samples"] == 200 and r["seconds"] > 0 for r in snap["finished"])
    assert "2 replicas in sync (MirroredStrategy)" in logger.bar._repr_html_()


def test_a_dataset_fit_counts_samples_from_its_first_batch(in_kernel):
    ds = fl.data.Dataset.from_tensor_slices((X, Y.astype(np.int64))).batch(25)
    logger = fl.keras.callbacks.ProgbarLogger()
    model().fit(ds, epochs=2, callbacks=[logger])
    rows = logger.bar.view.snapshot["finished"]
    assert [r["samples"] for r in rows] == [200, 200] and all(r["samples_per_s"] > 0 for r in rows)


def test_between_redraws_the_view_samples_the_loss_for_the_epochs_curve(widget_comm):
    bar = ProgressBar(epochs=1, steps=100).start()
    clock = FakeClock()
    view = ProgressView(bar, clock=clock)
    bar.view = view
    bar.start_epoch(0)
    for step in (1, 2, 3):                  # 0.06 s apart: samples, but no redraw before 0.2 s
        clock.now += 0.06
        bar.update(step, {"loss": 1.0 / step})
    assert view.draws == 1 and widget_comm[0].updates("snapshot") == []
    assert bar._batch == [(1, 1.0), (2, 0.5), (3, 1.0 / 3)]          # read between redraws
    clock.now += ProgressView.min_interval
    bar.update(4, {"loss": 0.1})
    assert view.draws == 2
    assert [p[0] for p in view.snapshot["batch"]["points"]] == [1, 2, 3, 4]


def test_the_bar_as_a_cells_value_is_its_live_view(in_kernel):
    logger = fl.keras.callbacks.ProgbarLogger()
    model().fit(X, Y, epochs=2, batch_size=100, callbacks=[logger])
    data, _ = logger.bar._repr_mimebundle_()
    assert data["application/vnd.jupyter.widget-view+json"]["model_id"] == logger.bar.view.model_id   # one view
    assert data["text/plain"] == repr(logger.bar) and "fl-loss-chart" in data["text/html"]


def _fit_on_a_worker():
    import io

    import flowlab as fl
    from flowlab import distribute as ds
    strategy = ds.MultiWorkerMirroredStrategy()
    fl.random.set_seed(0)
    (x, y), _ = fl.datasets.digits()
    x, y = x[:96], y[:96]
    with strategy.scope():
        m = fl.keras.Sequential([fl.keras.Input(shape=(64,)), fl.keras.layers.Dense(10)])
        m.compile("sgd", fl.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    logger = fl.keras.callbacks.ProgbarLogger(mode="text", stream=io.StringIO())
    history = m.fit(x, y, epochs=2, batch_size=32, verbose=0, callbacks=[logger])
    return logger.bar.snapshot(), history.history["loss"]


@pytest.mark.process
@pytest.mark.timeout(120)
def test_under_multi_worker_mirrored_the_monitor_has_each_workers_loss():
    with fl.cluster.LocalCluster(workers=2) as cluster:
        (snap0, loss0), (snap1, loss1) = cluster.run(_fit_on_a_worker, timeout=90)
    assert loss0 == loss1 and snap0["replicas"] == 2 and snap0["strategy"] == "MultiWorkerMirroredStrategy"
    for epoch, row in enumerate(snap0["finished"]):
        per_worker = row["workers"]["loss"]
        assert len(per_worker) == 2 and per_worker[0] != per_worker[1]       # each worker's own batches
        assert np.mean(per_worker) == pytest.approx(loss0[epoch], rel=1e-5)  # the fit logs their mean
        assert row["workers"] == snap1["finished"][epoch]["workers"]          # gathered everywhere
