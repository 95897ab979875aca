"""Importing flowlab pins BLAS threads in a fresh process (what every cluster worker will do)."""
import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.process

PROBE = """
import json, numpy, threadpoolctl
before = [lib["num_threads"] for lib in threadpoolctl.threadpool_info() if lib["user_api"] == "blas"]
import flowlab as fl
after = [lib["num_threads"] for lib in threadpoolctl.threadpool_info() if lib["user_api"] == "blas"]
fl.config.set_blas_threads(2)
later = fl.config.get_blas_threads()
print(json.dumps({"before": before, "after": after, "later": later}))
"""


def _run(env_value=None):
    env = {k: v for k, v in os.environ.items() if k != "FLOWLAB_BLAS_THREADS"}
    # let BLAS start with several threads, so the test shows flowlab changed it
    env.update(OPENBLAS_NUM_THREADS="2", OMP_NUM_THREADS="2", MKL_NUM_THREADS="2")
    if env_value is not None:
        env["FLOWLAB_BLAS_THREADS"] = env_value
    return subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120)


def test_import_sets_one_blas_thread():
    r = _run()
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["before"] and max(out["before"]) == 2, "numpy's BLAS was expected to start with 2 threads"
    assert max(out["after"]) == 1
    assert out["later"] == 2


def test_environment_variable_overrides_default():
    r = _run("2")
    assert r.returncode == 0, r.stderr
    assert max(json.loads(r.stdout)["after"]) == 2


def test_bad_environment_value_is_a_clear_error():
    r = _run("many")
    assert r.returncode != 0
    assert "FLOWLAB_BLAS_THREADS must be a whole number" in r.stderr
