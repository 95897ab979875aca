"""MultiWorkerMirroredStrategy from TF_CONFIG in plain processes, as TensorFlow's multi-worker Keras
tutorial runs it: the same script started once per worker, each setting TF_CONFIG with its own task
index. The two processes must form one group of two replicas (each serving its address from the
spec), all-reduce their gradients, and end with the same weights as one process training on the
global batches."""
import os
import runpy
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from _processes import free_ports, kill_left, wait_gone

pytestmark = pytest.mark.process

# What a tutorial reader writes (in flowlab's names): build the dataset of global batches and the
# model in functions, set TF_CONFIG, make the strategy, build and compile in its scope, fit.
SCRIPT = textwrap.dedent('''
    import json
    import os
    import sys

    import numpy as np
    import flowlab as fl


    def make_dataset(global_batch_size):
        rng = np.random.default_rng(0)
        x = rng.normal(size=(48, 5)).astype(np.float32)
        y = (x @ rng.normal(size=(5, 1)) + 0.3).astype(np.float32)
        return fl.data.Dataset.from_tensor_slices((x, y)).shuffle(48, seed=3).batch(global_batch_size)


    def build_and_compile_model():
        model = fl.keras.Sequential([
            fl.keras.Input(shape=(5,)),
            fl.keras.layers.Dense(8, activation="relu"),
            fl.keras.layers.Dense(1),
        ])
        model.compile(optimizer=fl.keras.optimizers.SGD(learning_rate=0.05, momentum=0.5), loss="mse",
                      metrics=["mae"])
        return model


    if __name__ == "__main__":
        ports, index, out = sys.argv[1].split(","), int(sys.argv[2]), sys.argv[3]
        tf_config = {"cluster": {"worker": [f"localhost:{p}" for p in ports]},
                     "task": {"type": "worker", "index": index}}
        if sys.argv[4:] == ["chief"]:          # the first task as TensorFlow's chief, the rest workers
            tf_config = {"cluster": {"chief": [f"localhost:{ports[0]}"],
                                     "worker": [f"localhost:{p}" for p in ports[1:]]},
                         "task": ({"type": "chief", "index": 0} if index == 0
                                  else {"type": "worker", "index": index - 1})}
        os.environ["TF_CONFIG"] = json.dumps(tf_config)

        strategy = fl.distribute.MultiWorkerMirroredStrategy()
        fl.random.set_seed(100 + index)            # different draws: the scope gives every worker worker 0's
        per_worker_batch_size = 6
        global_batch_size = per_worker_batch_size * strategy.num_replicas_in_sync
        with strategy.scope():
            model = build_and_compile_model()
        initial = [v.numpy() for v in model.trainable_variables]
        history = model.fit(make_dataset(global_batch_size), epochs=3, verbose=0)
        resolver = strategy.cluster_resolver
        np.savez(out, replicas=strategy.num_replicas_in_sync, task_type=resolver.task_type,
                 task_id=resolver.task_id, workers=resolver.cluster_spec().num_tasks("worker"),
                 loss=np.array(history.history["loss"]),
                 **{f"init{i}": w for i, w in enumerate(initial)},
                 **{f"w{i}": v.numpy() for i, v in enumerate(model.trainable_variables)})
''')


def _start(script, ports, index, out, log, layout):
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CONFIG", "FLOWLAB_CONFIG", "FLOWLAB_CLUSTER_KEY",
                                                             "FLOWLAB_CLUSTER_KEY_FILE")}
    with open(log, "wb") as f:
        return subprocess.Popen([sys.executable, str(script), ",".join(map(str, ports)), str(index), str(out), layout],
                                stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)


@pytest.mark.parametrize("layout", ["workers", "chief"])
def test_two_tf_config_processes_train_as_one_group(tmp_path, layout):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    ports = free_ports(2)
    outs = [tmp_path / f"worker{i}.npz" for i in range(2)]
    logs = [tmp_path / f"worker{i}.log" for i in range(2)]
    procs = []
    try:
        procs = [_start(script, ports, i, outs[i], logs[i], layout) for i in range(2)]
        for p in procs:
            p.wait(timeout=150)
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        left = wait_gone([p.pid for p in procs], 10)
        kill_left(left)
        for p in procs:
            p.wait(timeout=10)
    for p, log in zip(procs, logs):
        assert p.returncode == 0, f"worker exited with {p.returncode}:\n{log.read_text()[-3000:]}"
    r0, r1 = (np.load(o) for o in outs)
    assert int(r0["replicas"]) == int(r1["replicas"]) == 2            # one group, not two groups of one
    if layout == "workers":
        assert (str(r0["task_type"]), int(r0["task_id"]), int(r0["workers"])) == ("worker", 0, 2)
        assert (str(r1["task_type"]), int(r1["task_id"])) == ("worker", 1)
    else:
        assert (str(r0["task_type"]), int(r0["task_id"]), int(r0["workers"])) == ("chief", 0, 1)
        assert (str(r1["task_type"]), int(r1["task_id"])) == ("worker", 0)
    n = len([k for k in r0.files if k.startswith("init")])
    for i in range(n):
        np.testing.assert_array_equal(r0[f"init{i}"], r1[f"init{i}"])   # worker 0's initial weights everywhere
        np.testing.assert_array_equal(r0[f"w{i}"], r1[f"w{i}"])         # equal weights at the end
    np.testing.assert_array_equal(r0["loss"], r1["loss"])

    # one replica, this process, no TF_CONFIG: the same model from worker 0's initial weights, on the
    # same global batches of 12
    tutorial = runpy.run_path(str(script), run_name="reference")
    import flowlab as fl
    assert "TF_CONFIG" not in os.environ and fl.distribute.MultiWorkerMirroredStrategy().num_replicas_in_sync == 1
    model = tutorial["build_and_compile_model"]()
    for i, v in enumerate(model.trainable_variables):
        v.assign(r0[f"init{i}"])
    history = model.fit(tutorial["make_dataset"](12), epochs=3, verbose=0)
    for i, v in enumerate(model.trainable_variables):
        np.testing.assert_allclose(r0[f"w{i}"], v.numpy(), rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(r0["loss"], history.history["loss"], rtol=2e-5, atol=1e-6)
    assert history.history["loss"][-1] < history.history["loss"][0]


def _resolver_in_worker():
    import flowlab as fl
    strategy = fl.distribute.MultiWorkerMirroredStrategy()
    r = strategy.cluster_resolver
    return strategy.num_replicas_in_sync, r.task_type, r.task_id, r.cluster_spec().num_tasks("worker")


def test_cluster_resolver_in_local_cluster_workers(make_cluster):
    cluster = make_cluster(workers=2)
    assert cluster.run(_resolver_in_worker, timeout=60) == [(2, "worker", 0, 2), (2, "worker", 1, 2)]


def test_flowlab_run_ranks_form_the_strategy_with_a_resolver(tmp_path):
    script = tmp_path / "mwms.py"
    script.write_text(textwrap.dedent('''
        import flowlab as fl
        strategy = fl.distribute.MultiWorkerMirroredStrategy()
        r = strategy.cluster_resolver
        total = strategy.reduce("sum", fl.constant([float(r.task_id + 1)]))
        print(f"replicas {strategy.num_replicas_in_sync} task {r.task_type}:{r.task_id} total {total.numpy()[0]:.0f}")
    '''))
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CONFIG", "FLOWLAB_CONFIG")}
    proc = subprocess.Popen([sys.executable, "-m", "flowlab", "run", "-np", "2", str(script)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)     # its ranks die with it (PR_SET_PDEATHSIG)
            proc.communicate()
    out = out.decode()
    assert proc.returncode == 0, out
    for r in range(2):
        assert f"[{r}] replicas 2 task worker:{r} total 3" in out, out
