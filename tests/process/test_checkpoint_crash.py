"""A process killed (SIGKILL) in the middle of a checkpoint save never damages the last good
checkpoint: a new process finds a complete, consistent checkpoint and can save again.

The child saves a ~16 MB variable whose every element equals the save's number. To kill it at a
known point of the atomic write, it announces each ``os.fsync`` and can be told to stop at the
k-th one of its third save (temp file written / renamed into place / state file written / state
file renamed); the parent then kills it there. A second test kills at arbitrary moments.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import flowlab as fl

pytestmark = pytest.mark.process

CHILD = r"""
import os, sys, time
import numpy as np
import flowlab as fl

directory, stop_at = sys.argv[1], int(sys.argv[2])   # stop at this fsync of save 3 (0: never)
real_fsync, calls = os.fsync, {"save": 0, "fsync": 0}

def announced_fsync(fd):
    real_fsync(fd)
    if calls["save"] == 3:
        calls["fsync"] += 1
        if calls["fsync"] == stop_at:
            print("blocked", flush=True)
            time.sleep(600)

os.fsync = announced_fsync
big = fl.Variable(np.zeros(4_000_000, np.float32))
step = fl.Variable(0)
manager = fl.train.CheckpointManager(fl.train.Checkpoint(big=big, step=step), directory, max_to_keep=2)
for i in range(1, 10_000):
    big.assign(np.full(4_000_000, i, np.float32))
    step.assign(i)
    calls["save"] = i
    print(f"saving {i}", flush=True)
    manager.save()
    print(f"saved {i}", flush=True)
"""


def _child(directory, stop_at):
    return subprocess.Popen([sys.executable, "-c", CHILD, str(directory), str(stop_at)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _read_until(proc, wanted, limit=120):
    deadline = time.monotonic() + limit
    lines = []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line.strip())
        if line.strip() == wanted:
            return lines
    proc.kill()
    raise AssertionError(f"child never printed {wanted!r}; it printed {lines[-5:]}, stderr: {proc.stderr.read()[-2000:]}")


def _check_consistent(directory):
    """The newest checkpoint restores, its two variables agree, and a new manager can save again."""
    latest = fl.train.latest_checkpoint(directory)
    assert latest is not None, os.listdir(directory)
    big, step = fl.Variable(np.zeros(4_000_000, np.float32)), fl.Variable(0)
    manager = fl.train.CheckpointManager(fl.train.Checkpoint(big=big, step=step), directory, max_to_keep=2)
    assert not [n for n in os.listdir(directory) if n.startswith(".tmp-")], "the new manager removed stray temp files"
    manager._checkpoint.restore(latest).assert_consumed()
    value = int(step)
    assert np.all(big.numpy() == value), "a checkpoint holds the values of one save only"
    manager.save()
    assert fl.train.latest_checkpoint(directory).endswith(f"ckpt-{value + 1}")
    return value


@pytest.mark.parametrize("stop_at,latest,stray", [
    (1, 2, True),     # new checkpoint written to its temp file, not renamed yet
    (2, 2, False),    # renamed into place, but the state file still names save 2
    (3, 2, True),     # the new state file written to its temp file, not renamed yet
    (4, 3, False),    # state file renamed: save 3 is the latest
])
def test_a_save_killed_at_each_step_of_the_atomic_write(tmp_path, stop_at, latest, stray):
    proc = _child(tmp_path, stop_at)
    try:
        _read_until(proc, "blocked")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    leftovers = [n for n in os.listdir(tmp_path) if n.startswith(".tmp-")]
    assert bool(leftovers) == stray, os.listdir(tmp_path)
    assert fl.train.latest_checkpoint(tmp_path).endswith(f"ckpt-{latest}")
    assert _check_consistent(tmp_path) == latest


def test_kills_at_arbitrary_moments_of_a_stream_of_saves(tmp_path):
    rng = np.random.default_rng(0)
    for attempt in range(4):
        directory = tmp_path / f"run{attempt}"
        proc = _child(directory, 0)
        try:
            _read_until(proc, "saved 2")
            time.sleep(float(rng.uniform(0.0, 0.3)))     # somewhere in the saves that follow
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert _check_consistent(directory) >= 2
