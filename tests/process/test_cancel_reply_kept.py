"""A cancelled ``run`` always answers, so its task is free for the next call.

A cancel that arrives while the job imports is deferred and asked again every 50 ms
(``Server._on_sigint``). When the job ended meanwhile and was still making its reply (here: an
error whose text takes a while to write), the retried interrupt landed there, the reply was never
sent, and the client kept the task busy for good: every later call raised ``WorkerBusyError``
("still running the 'run' request that was interrupted 19 s ago") although the worker sat idle
(found by the soak, tests/process/test_soak.py, seed 44444). Now a job counts as running only
until its function returns, so the interrupt cannot reach the reply.
"""
import secrets
import time

import pytest

from flowlab.cluster.errors import RemoteError

pytestmark = pytest.mark.process


def _import_then_fail_slowly(name):
    import importlib
    import time as t

    import flowlab.cluster as cl

    class SlowToSay(Exception):
        said = 0

        def __str__(self):   # said once as it is raised, then again, slowly, for the reply (as a
            SlowToSay.said += 1      # traceback that reads source files or imports would be)
            if SlowToSay.said > 1:
                t.sleep(0.6)
            return "rank 0's error, said slowly"

    if cl.rank() == 1:
        t.sleep(0.4)
        raise ValueError("rank 1 fails on purpose")
    importlib.import_module(name)      # the cancel arrives here: deferred until the import is done
    raise SlowToSay()


def _pid():
    import os
    return os.getpid()


def test_a_cancelled_run_answers_and_its_task_is_free(make_cluster, tmp_path, monkeypatch):
    name = f"flowlab_slow_import_{secrets.token_hex(4)}"
    (tmp_path / f"{name}.py").write_text("import time\ntime.sleep(1.2)\n")
    monkeypatch.syspath_prepend(str(tmp_path))       # the workers get this process's sys.path
    c = make_cluster(workers=2)
    with pytest.raises(RemoteError) as info:
        c.run(_import_then_fail_slowly, name, timeout=20)
    assert "rank 1 fails on purpose" in str(info.value)
    assert "STILL RUNNING" not in str(info.value), f"task 0's reply was lost:\n{info.value}"
    t0 = time.monotonic()
    assert c.call(0, _pid, timeout=10) == c.pid(0)     # not WorkerBusyError
    assert time.monotonic() - t0 < 5
