"""fl.train.Checkpoint / CheckpointManager / latest_checkpoint: round trips, the file format, keeping
the last N, one copy per variable, and a failed save that leaves the last good checkpoint alone.
(A save killed mid-write by a real signal: tests/process/test_checkpoint_crash.py.)"""
from __future__ import annotations

import json
import os
import zipfile

import numpy as np
import pytest

import flowlab as fl
from flowlab.nn.checkpoint import read_index

L = fl.keras.layers
(X, Y), _ = fl.datasets.digits()
X, Y = X[:256], Y[:256]


def trained(seed=0, epochs=1, optimizer=None):
    fl.random.set_seed(seed)
    m = fl.keras.Sequential([fl.keras.Input(shape=(64,)), L.Dense(16, activation="relu"), L.Dense(10)])
    m.compile(optimizer or fl.optimizers.Adam(0.01), fl.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    if epochs:
        m.fit(X, Y, epochs=epochs, batch_size=32, verbose=0, shuffle=False)
    return m


def test_round_trip_of_model_and_optimizer_continues_training_exactly(tmp_path):
    a = trained()
    path = fl.train.Checkpoint(model=a, optimizer=a.optimizer).save(tmp_path / "ckpt")
    assert path == str(tmp_path / "ckpt-1") and os.path.exists(path + ".npz")
    b = trained(seed=1, epochs=0)
    b.build((None, 64))
    status = fl.train.Checkpoint(model=b, optimizer=b.optimizer).restore(path)
    status.assert_consumed()
    for wa, wb in zip(a.get_weights(), b.get_weights()):
        np.testing.assert_array_equal(wa, wb)
    assert int(b.optimizer.iterations) == int(a.optimizer.iterations) == 8
    # Adam's slots came back too (made on restore: b's optimizer had not stepped yet), so one more
    # epoch of each ends in the same place
    a.fit(X, Y, epochs=1, batch_size=32, verbose=0, shuffle=False)
    b.fit(X, Y, epochs=1, batch_size=32, verbose=0, shuffle=False)
    for wa, wb in zip(a.get_weights(), b.get_weights()):
        np.testing.assert_array_equal(wa, wb)


def test_the_file_is_an_npz_with_a_json_index_and_no_pickles(tmp_path):
    m = trained()
    path = fl.train.Checkpoint(model=m, optimizer=m.optimizer).write(tmp_path / "one")
    with zipfile.ZipFile(path + ".npz") as z:
        names = sorted(z.namelist())
    assert "__index__.npy" in names
    index = read_index(path)
    assert index["format"] == "flowlab-checkpoint"
    values = index["values"]
    assert values["model/layers/0/kernel"]["shape"] == [64, 16] and values["model/layers/0/kernel"]["dtype"] == "float32"
    assert {"optimizer/iterations", "optimizer/learning_rate", "save_counter",
            "optimizer/slots/model/layers/1/bias/m", "optimizer/slots/model/layers/1/bias/v"} <= set(values)
    with np.load(path + ".npz", allow_pickle=False) as data:      # loads without pickle
        np.testing.assert_array_equal(data[values["model/layers/1/bias"]["key"]], m.layers[1].bias.numpy())


def test_restore_finds_values_by_object_path_not_by_variable_name(tmp_path):
    class Net(fl.keras.Model):
        def __init__(self):
            super().__init__()
            self.first = L.Dense(3)

        def call(self, x):
            return self.first(x)

    a, b = Net(), Net()           # layer names differ (dense_7, dense_8): paths do not
    a(np.ones((1, 2), np.float32))
    b(np.ones((1, 2), np.float32))
    assert a.first.kernel.name != b.first.kernel.name
    path = fl.train.Checkpoint(net=a).write(tmp_path / "net")
    fl.train.Checkpoint(net=b).restore(path).assert_consumed()
    np.testing.assert_array_equal(a.first.kernel.numpy(), b.first.kernel.numpy())


def test_a_shared_variable_is_saved_once(tmp_path):
    shared = L.Dense(4)
    shared(np.ones((1, 3), np.float32))
    path = fl.train.Checkpoint(first=shared, again=shared, extra=[shared.kernel]).write(tmp_path / "s")
    index = read_index(path)
    assert sorted(index["values"]) == ["first/bias", "first/kernel", "save_counter"]
    assert index["aliases"] == {"extra/0": "first/kernel"}


class Mirrored:
    """Stands in for a strategy's mirrored variable: one value kept on several devices. It takes part
    in checkpoints through _checkpoint_read / _checkpoint_write, as checkpoint.py documents."""

    def __init__(self, value, copies=3):
        self.copies = [fl.Variable(value) for _ in range(copies)]

    def _checkpoint_read(self):
        return self.copies[0].numpy()

    def _checkpoint_write(self, value):
        for v in self.copies:
            v.assign(value)


def test_an_object_standing_for_several_copies_is_saved_once_and_restored_into_all(tmp_path):
    w = Mirrored(np.arange(4.0, dtype=np.float32))
    path = fl.train.Checkpoint(model={"w": w}).write(tmp_path / "m")
    with zipfile.ZipFile(path + ".npz") as z:
        assert len(z.namelist()) == 3          # w once, save_counter, the index
    fresh = Mirrored(np.zeros(4, np.float32))
    fl.train.Checkpoint(model={"w": fresh}).restore(path).assert_consumed()
    for v in fresh.copies:
        np.testing.assert_array_equal(v.numpy(), np.arange(4.0))


def test_restore_status_reports_what_did_not_match(tmp_path):
    step, other = fl.Variable(3), fl.Variable(1.0)
    path = fl.train.Checkpoint(step=step, other=other).write(tmp_path / "p")
    status = fl.train.Checkpoint(step=fl.Variable(0), new=fl.Variable(0.0)).restore(path)
    with pytest.raises(AssertionError, match="other.*new"):
        status.assert_consumed()
    with pytest.raises(AssertionError, match="new"):
        status.assert_existing_objects_matched()
    status.expect_partial()


def test_restore_refuses_a_value_of_another_shape_naming_the_path(tmp_path):
    path = fl.train.Checkpoint(w=fl.Variable(np.zeros((2, 3), np.float32))).write(tmp_path / "w")
    with pytest.raises(ValueError, match="'w' has shape \\(3, 2\\) here but \\(2, 3\\) in the checkpoint"):
        fl.train.Checkpoint(w=fl.Variable(np.zeros((3, 2), np.float32))).restore(path)
    with pytest.raises(FileNotFoundError):
        fl.train.Checkpoint(w=fl.Variable(1.0)).restore(tmp_path / "missing")
    assert fl.train.Checkpoint(w=fl.Variable(1.0)).restore(None).restored == []


def test_manager_keeps_the_last_n_and_a_new_manager_picks_them_up(tmp_path):
    step = fl.Variable(0)
    ckpt = fl.train.Checkpoint(step=step)
    manager = fl.train.CheckpointManager(ckpt, tmp_path, max_to_keep=2)
    assert manager.latest_checkpoint is None and fl.train.latest_checkpoint(tmp_path) is None
    for _ in range(4):
        step.assign_add(1)
        manager.save()
    assert sorted(os.listdir(tmp_path)) == ["checkpoint", "ckpt-3.npz", "ckpt-4.npz"]
    assert fl.train.latest_checkpoint(tmp_path) == str(tmp_path / "ckpt-4")
    state = json.loads((tmp_path / "checkpoint").read_text())
    assert state["all"] == ["ckpt-3", "ckpt-4"] and state["latest"] == "ckpt-4"

    step2 = fl.Variable(0)
    again = fl.train.CheckpointManager(fl.train.Checkpoint(step=step2), tmp_path, max_to_keep=2)
    assert again.restore_or_initialize() == str(tmp_path / "ckpt-4")
    assert int(step2) == 4
    again.save()                                      # numbering continues from the restored save_counter
    assert fl.train.latest_checkpoint(tmp_path) == str(tmp_path / "ckpt-5")
    assert sorted(os.listdir(tmp_path)) == ["checkpoint", "ckpt-4.npz", "ckpt-5.npz"]


class Exploding:
    """A value whose read fails half-way through a save (a full disk, a bug, an interrupt)."""

    def _checkpoint_read(self):
        raise OSError("disk full (on purpose)")

    def _checkpoint_write(self, value):
        pass


def test_a_failed_save_leaves_the_last_good_checkpoint_and_no_stray_files(tmp_path):
    w = fl.Variable([1.0, 2.0])
    good = fl.train.CheckpointManager(fl.train.Checkpoint(w=w), tmp_path, max_to_keep=1)
    good.save()
    bad = fl.train.CheckpointManager(fl.train.Checkpoint(w=w, boom=Exploding()), tmp_path, max_to_keep=1)
    with pytest.raises(OSError, match="disk full"):
        bad.save()
    assert sorted(os.listdir(tmp_path)) == ["checkpoint", "ckpt-1.npz"]
    w.assign([0.0, 0.0])
    fl.train.Checkpoint(w=w).restore(fl.train.latest_checkpoint(tmp_path)).assert_consumed()
    assert w.numpy().tolist() == [1.0, 2.0]


def test_checkpoint_needs_objects_and_plain_names():
    with pytest.raises(ValueError, match="keyword arguments"):
        fl.train.Checkpoint()
    with pytest.raises(ValueError, match="'/'"):
        fl.train.Checkpoint(**{"a/b": fl.Variable(1)})
    with pytest.raises(TypeError, match="cannot save 'thing'"):
        fl.train.Checkpoint(thing=object()).write("/tmp/never-written")


def test_list_variables_names_every_saved_value_with_its_shape(tmp_path):
    from flowlab.nn.checkpoint import list_variables
    m = trained(epochs=0)
    path = fl.train.Checkpoint(model=m).write(tmp_path / "m")
    assert list_variables(path) == [("model/layers/0/bias", (16,)), ("model/layers/0/kernel", (64, 16)),
                                    ("model/layers/1/bias", (10,)), ("model/layers/1/kernel", (16, 10)),
                                    ("save_counter", ())]
