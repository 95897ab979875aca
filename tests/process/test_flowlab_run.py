"""``flowlab run -np N script.py``: ranks joined as one group, output prefixed by rank, a failing
rank or Ctrl-C ends every rank, nothing is left behind."""
import os
import re
import signal
import time

import pytest
from _processes import finish_flowlab_run, gone, start_flowlab_run, wait_gone

pytestmark = pytest.mark.process


start = start_flowlab_run
finish = finish_flowlab_run


def pids_in(out):      # each pid once: the launcher's root-cause lines name them again
    return sorted({int(p) for p in re.findall(r"pid (\d+)", out)})


SCRIPT = """\
    import os, sys
    import numpy as np
    import flowlab as fl
    import flowlab.horovod as hvd
    hvd.init()
    print(f"rank {fl.cluster.rank()} of {fl.cluster.world_size()} pid {os.getpid()} args {sys.argv[1:]}")
    total = hvd.allreduce(np.array([hvd.rank() + 1.0]), op=hvd.Sum)
    print(f"total {total[0]:.0f}")
"""


@pytest.mark.parametrize("n", [2, 3])
def test_ranks_join_one_group_and_output_is_prefixed(tmp_path, n):
    code, out = finish(start(tmp_path, SCRIPT, n, "--lr", "0.1"))
    assert code == 0, out
    for r in range(n):
        assert f"[{r}] rank {r} of {n} pid" in out, out
        assert f"[{r}] total {n * (n + 1) // 2}" in out, out
    assert "args ['--lr', '0.1']" in out
    assert not wait_gone(pids_in(out))


def test_a_failing_rank_ends_the_others(tmp_path):
    body = """\
        import os, time
        import flowlab as fl
        import flowlab.horovod as hvd
        hvd.init()
        print(f"rank {hvd.rank()} pid {os.getpid()}", flush=True)
        if hvd.rank() == 1:
            time.sleep(0.5)
            raise SystemExit(7)
        time.sleep(600)
    """
    code, out = finish(start(tmp_path, body, 3))
    assert code == 7, out
    assert "rank 1 exited with status 7" in out
    pids = pids_in(out)
    assert len(pids) == 3, out
    assert not wait_gone(pids)


def test_ctrl_c_ends_every_rank(tmp_path):
    body = """\
        import os, time
        print(f"pid {os.getpid()}", flush=True)
        time.sleep(600)
    """
    proc = start(tmp_path, body, 2)
    seen, buf = [], b""
    end = time.monotonic() + 60
    try:
        os.set_blocking(proc.stdout.fileno(), False)
        while len(seen) < 2 and time.monotonic() < end:
            chunk = proc.stdout.read() or b""
            buf += chunk
            seen = pids_in(buf.decode())
            time.sleep(0.05)
        assert len(seen) == 2, buf.decode()
        os.kill(proc.pid, signal.SIGINT)
        proc.wait(30)
        assert proc.returncode == 130
        assert not wait_gone(seen)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for p in seen:
            if not gone(p):
                os.kill(p, signal.SIGKILL)
