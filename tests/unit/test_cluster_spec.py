"""ClusterSpec, task names and FLOWLAB_CONFIG: TensorFlow's cluster model, checked without processes."""
import json
import subprocess
import sys

import pytest

import flowlab as fl
from flowlab.cluster.spec import ClusterSpec, config_from_env, parse_task, split_address, task_name


def test_dense_spec_reads_like_tensorflow():
    spec = ClusterSpec({"worker": ["localhost:2222", "localhost:2223"], "ps": ["localhost:2224"]})
    assert spec.jobs == ["worker", "ps"]
    assert spec.num_tasks("worker") == 2 and spec.num_tasks("ps") == 1
    assert spec.task_address("worker", 1) == "localhost:2223"
    assert spec.task_indices("worker") == [0, 1]
    assert spec.as_dict() == {"worker": ["localhost:2222", "localhost:2223"], "ps": ["localhost:2224"]}
    assert spec.tasks() == ["/job:worker/task:0", "/job:worker/task:1", "/job:ps/task:0"]
    assert spec.address_of("/job:ps/task:0") == "localhost:2224"
    assert ClusterSpec(spec) == spec and bool(spec) and not ClusterSpec({})
    assert "localhost:2224" in repr(spec)


def test_sparse_spec_keeps_its_indices():
    spec = ClusterSpec({"worker": {1: "h1:2222", 3: "h3:2222"}})
    assert spec.as_dict() == {"worker": {1: "h1:2222", 3: "h3:2222"}}
    assert spec.num_tasks("worker") == 2 and spec.task_indices("worker") == [1, 3]
    assert spec.job_tasks("worker") == [None, "h1:2222", None, "h3:2222"]
    with pytest.raises(ValueError, match="has no task 0"):
        spec.task_address("worker", 0)


@pytest.mark.parametrize("bad, match", [
    ({"worker": ["localhost"]}, "host:port"),
    ({"worker": ["localhost:notaport"]}, "host:port"),
    ({"bad job!": ["localhost:1"]}, "job name"),
    ({"worker": "localhost:1"}, "list of"),
])
def test_bad_specs_say_what_is_wrong(bad, match):
    with pytest.raises((ValueError, TypeError), match=match):
        ClusterSpec(bad)


def test_unknown_job_names_the_jobs_there_are():
    with pytest.raises(ValueError, match=r"no job 'chief' \(it has \['worker'\]\)"):
        ClusterSpec({"worker": ["a:1"]}).num_tasks("chief")


@pytest.mark.parametrize("text, expected", [
    ("/job:worker/task:1", ("worker", 1)),
    ("/job:ps/replica:0/task:2/device:CPU:0", ("ps", 2)),
    ("worker:3", ("worker", 3)),
    (("ps", 0), ("ps", 0)),
    (2, ("worker", 2)),
])
def test_parse_task_forms(text, expected):
    assert parse_task(text) == expected
    assert task_name(*expected) == f"/job:{expected[0]}/task:{expected[1]}"


def test_parse_task_rejects_nonsense_and_split_address_reads_ipv6():
    with pytest.raises(ValueError, match="cannot read"):
        parse_task("nonsense")
    assert split_address("[::1]:2222") == ("::1", 2222)
    assert split_address("localhost:80") == ("localhost", 80)


def test_flowlab_config_like_tf_config():
    env = {"FLOWLAB_CONFIG": json.dumps({"cluster": {"worker": ["a:1", "b:2"], "ps": ["c:3"]},
                                         "task": {"type": "worker", "index": 1}})}
    cfg = config_from_env(env)
    assert cfg.spec.task_address("worker", 1) == "b:2" and (cfg.job, cfg.index) == ("worker", 1)
    assert config_from_env({}) is None and config_from_env({"FLOWLAB_CONFIG": " "}) is None


@pytest.mark.parametrize("text", ["{not json", json.dumps({"cluster": {"worker": ["a:1"]}, "task": {"type": "ps"}})])
def test_bad_flowlab_config_names_the_variable(text):
    with pytest.raises(ValueError, match="FLOWLAB_CONFIG"):
        config_from_env({"FLOWLAB_CONFIG": text})


def test_train_names_resolve_to_the_cluster_package():
    import flowlab.cluster as fc
    assert fl.train.ClusterSpec is fc.ClusterSpec is ClusterSpec
    assert fl.train.Server is fc.Server
    assert fl.cluster is fc


def test_importing_the_cluster_package_and_its_spec_loads_no_zmq_or_numpy():
    code = ("import sys, flowlab.cluster as c; c.ClusterSpec({'worker': ['a:1']}); c.rank; c.LocalCluster; "
            "print(','.join(m for m in ('zmq', 'numpy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    # `import flowlab.cluster` runs flowlab/__init__ (numpy); zmq must still be absent
    assert "zmq" not in out.stdout.split(","), out.stdout
