"""A fit killed (SIGKILL) in the middle of an epoch, then run again in a new process with
BackupAndRestore, ends with exactly the weights of a fit that was never interrupted."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

pytestmark = pytest.mark.process

CHILD = r"""
import sys, time
import numpy as np
import flowlab as fl

backup, out, stop_at = sys.argv[1], sys.argv[2], int(sys.argv[3])
(x, y), _ = fl.datasets.digits()
x, y = x[:400], y[:400]
fl.random.set_seed(0)
model = fl.keras.Sequential([fl.keras.Input(shape=(64,)), fl.keras.layers.Dense(32, activation="relu"),
                             fl.keras.layers.Dropout(0.0), fl.keras.layers.Dense(10)])
model.compile(fl.optimizers.Adam(0.01), fl.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
              metrics=["accuracy"])
seen = {"n": 0}

def on_batch(batch, logs):
    seen["n"] += 1
    if seen["n"] == stop_at:
        print("blocked", flush=True)
        time.sleep(600)

callbacks = [fl.keras.callbacks.LambdaCallback(on_train_batch_end=on_batch)]
if backup != "-":
    callbacks.insert(0, fl.keras.callbacks.BackupAndRestore(backup, save_freq=5))
history = model.fit(x, y, batch_size=32, epochs=3, verbose=0, callbacks=callbacks)
np.savez(out, *model.get_weights(), loss=np.array(history.history["loss"]))
print("done", flush=True)
"""


def _run(backup, out, stop_at=0):
    return subprocess.Popen([sys.executable, "-c", CHILD, str(backup), str(out), str(stop_at)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(proc, wanted, limit=180):
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        if line.strip() == wanted:
            return
    proc.kill()
    raise AssertionError(f"child never printed {wanted!r}: {proc.stderr.read()[-2000:]}")


def test_a_killed_fit_resumes_to_the_same_weights(tmp_path):
    reference = _run("-", tmp_path / "reference.npz")
    _wait_for(reference, "done")
    reference.wait(timeout=60)

    backup = tmp_path / "backup"
    crashed = _run(backup, tmp_path / "never.npz", stop_at=22)      # 13 batches an epoch: mid-epoch 2
    try:
        _wait_for(crashed, "blocked")
        os.kill(crashed.pid, signal.SIGKILL)
        crashed.wait(timeout=30)
    finally:
        if crashed.poll() is None:
            crashed.kill()
    assert os.path.exists(backup / "checkpoint") and not (tmp_path / "never.npz").exists()

    resumed = _run(backup, tmp_path / "resumed.npz")
    _wait_for(resumed, "done")
    resumed.wait(timeout=60)

    with np.load(tmp_path / "reference.npz") as want, np.load(tmp_path / "resumed.npz") as got:
        weights = [k for k in want.files if k.startswith("arr_")]
        assert len(weights) == 4
        for k in weights:
            np.testing.assert_array_equal(got[k], want[k])
        np.testing.assert_allclose(got["loss"], want["loss"][-len(got["loss"]):], rtol=1e-6)
    assert not backup.exists(), "the completed fit deleted its backup"
