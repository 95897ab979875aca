"""The training monitor and the pipeline observatory in a real JupyterLab and Chromium.

A notebook written by the test runs a short fit (slowed by a callback, so it is seen while it runs)
and a pipeline whose map starts with fl.data.AUTOTUNE. The monitor shows the running epoch, then
every epoch with a time above zero and a throughput, and the loss per epoch as a chart; the
observatory shows each stage live while the cell iterates, then finished, with AUTOTUNE's decision
and its reason. Screenshots go to .pt/screenshots/ and docs/screenshots/."""
import re

import pytest

from _lab import code_notebook, open_notebook, run_cell, shoot, shut_down_and_reap

pytestmark = [pytest.mark.browser, pytest.mark.timeout(180)]

NAME = "training_monitor.ipynb"
EPOCHS = 6
CELLS = [
    """import time
import flowlab as fl

(x, y), _ = fl.datasets.digits()
fl.random.set_seed(0)
model = fl.keras.Sequential([fl.keras.Input(shape=(64,)), fl.keras.layers.Dense(32, activation="relu"),
                             fl.keras.layers.Dense(10)])
model.compile(fl.optimizers.Adam(0.01), fl.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
              metrics=["accuracy"])

class Slow(fl.keras.callbacks.Callback):        # slow enough to watch it run
    def on_train_batch_end(self, batch, logs=None):
        time.sleep(0.02)

history = model.fit(x, y, epochs=%d, batch_size=64, validation_split=0.2, callbacks=[Slow()])""" % EPOCHS,
    """def decode(n):
    time.sleep(0.002)                  # a stated cost per element
    return n

ds = fl.data.Dataset.range(800).map(decode, num_parallel_calls=fl.data.AUTOTUNE).batch(16).prefetch(2)
it = iter(ds)
display(it.stats())                    # the observatory, live while the loop below runs
for batch in it:
    time.sleep(0.01)                   # a training step
print("batches:", ds.stats()["batch#2"]["elements"])""",
]


def test_the_monitor_and_the_observatory_show_a_fit_and_a_pipeline_as_they_run(lab, page):
    from playwright.sync_api import expect

    status = open_notebook(lab, page, NAME, code_notebook(CELLS))
    started = []
    try:
        expect(status).to_contain_text("| Idle")
        started = lab.processes()

        # -- the training monitor ------------------------------------------------------------------
        run_cell(page, 0)
        monitor = page.locator(".fl-view.fl-progress")
        expect(monitor.locator(".fl-progress-status")).to_have_text("running")
        expect(monitor.locator(".fl-progress-title")).to_contain_text(re.compile(r"Epoch [1-9]/%d" % EPOCHS))
        expect(monitor.locator(".fl-progress-status")).to_have_text("done", timeout=90_000)
        expect(monitor.locator(".fl-progress-title")).to_have_text(f"Epoch {EPOCHS}/{EPOCHS}")
        rows = monitor.locator("tr.fl-epoch-row")
        expect(rows).to_have_count(EPOCHS)
        times = monitor.locator("td.fl-epoch-time").all_inner_texts()
        assert len(times) == EPOCHS
        for text in times:                # 18 steps of >= 20 ms each: hundreds of ms, never 0
            m = re.fullmatch(r"(\d+(?:\.\d+)?) (ms|s)", text)
            assert m, text
            assert float(m.group(1)) * (1e-3 if m.group(2) == "ms" else 1) >= 0.3, times
        for text in monitor.locator("td.fl-epoch-rate").all_inner_texts():
            assert re.fullmatch(r"[\d,.]+", text) and float(text.replace(",", "")) > 0, text
        expect(monitor.locator(".fl-loss-chart polyline.fl-loss-line")).to_have_count(2)   # loss, val_loss
        expect(monitor.locator(".fl-loss-chart circle")).to_have_count(2 * EPOCHS)
        expect(monitor.locator(".fl-throughput .fl-big")).to_have_text(re.compile(r"^[\d,.]+$"))
        expect(monitor.locator(".fl-replicas")).to_have_text("1 replica")
        shoot(monitor, "training_monitor.png", "training_monitor.png")

        # -- the pipeline observatory --------------------------------------------------------------
        expect(status).to_contain_text("| Idle")
        run_cell(page, 1)
        observatory = page.locator(".fl-view.fl-pipeline")
        state = observatory.locator(".fl-pipe-state")
        expect(state).to_have_text("running")
        stages = observatory.locator(".fl-stage")
        expect(stages).to_have_count(4)
        assert [stages.nth(i).get_attribute("data-stage") for i in range(4)] == \
            ["range#0", "map#1", "batch#2", "prefetch#3"]
        map_rate = observatory.locator(".fl-stage[data-stage='map#1'] .fl-stage-rate")
        first = float(map_rate.inner_text().replace(",", "") or 0)
        expect(state).to_have_text("finished", timeout=60_000)
        assert float(map_rate.inner_text().replace(",", "")) > 0 and first >= 0
        out = page.locator(".jp-Notebook .jp-CodeCell").nth(1).locator(".jp-OutputArea")
        expect(out).to_contain_text("batches: 50")
        expect(observatory.locator(".fl-stage[data-stage='batch#2']")).to_contain_text("50 elements")
        expect(observatory.locator(".fl-stage[data-stage='map#1'] .fl-pipe-bars rect").first).to_be_attached()
        expect(observatory.locator(".fl-stage[data-stage='map#1'] .fl-pipe-fill")).to_be_attached()
        expect(observatory.locator(".fl-stage[data-stage='map#1'] .fl-stage-waittext")).to_contain_text("requests")
        decision = observatory.locator(".fl-decision").first
        expect(decision).to_contain_text(re.compile(r"map#1 parallelism 1 \u2192 2: its consumer waited \d+%"))
        shoot(observatory, "pipeline.png", "pipeline.png")
    finally:
        shoot(page, "training_monitor_page.png")
        left = shut_down_and_reap(lab, page, status, started)
    assert not left, f"still running after the kernel shut down (now killed): {left}"
    assert page.errors == []
