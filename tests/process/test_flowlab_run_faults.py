"""``flowlab run`` when something dies: ranks end with a SIGKILLed launcher, and a rank that exits
mid-collective makes the others fail at once (naming it, its pid and exit code), the launcher exit
non-zero with a root-cause line, and nothing stay behind."""
import os
import re
import signal
import textwrap
import time

import pytest
from _processes import finish_flowlab_run, kill_left, start_flowlab_run, wait_gone

pytestmark = pytest.mark.process


start = start_flowlab_run
finish = finish_flowlab_run


def read_until(proc, pattern, count, limit=60.0):
    """Read the launcher's output until ``pattern`` matched ``count`` times; the text so far."""
    buf, end = b"", time.monotonic() + limit
    os.set_blocking(proc.stdout.fileno(), False)
    while time.monotonic() < end:
        buf += proc.stdout.read() or b""
        if len(re.findall(pattern, buf.decode(errors="replace"))) >= count:
            return buf.decode(errors="replace")
        time.sleep(0.05)
    pytest.fail(f"never saw {count} x {pattern!r}:\n{buf.decode(errors='replace')}")


def shm_of(pids):
    """Shared segments in /dev/shm whose names carry one of ``pids`` as owner."""
    return [n for n in os.listdir("/dev/shm") for p in pids if n.startswith(f"flowlab-{p}-")]


def test_ranks_end_when_the_launcher_is_killed(tmp_path):
    body = """\
        import os, time
        import numpy as np
        import flowlab as fl
        from flowlab.cluster import collectives as C
        C.allreduce(np.ones(4))                       # the group is formed: rings are mapped
        print(f"ready pid {os.getpid()} dir {os.environ['FLOWLAB_RUN_DIR']}", flush=True)
        if fl.cluster.rank() == 0:
            C.allreduce(np.ones(4), timeout=120)      # blocked: rank 1 never calls it
        time.sleep(600)
    """
    proc = start(tmp_path, body, 2)
    pids = []
    try:
        text = read_until(proc, r"ready pid \d+", 2)
        pids = [int(p) for p in re.findall(r"ready pid (\d+)", text)]
        folder = re.search(r"dir (\S+)", text).group(1)
        from flowlab.cluster import leftovers, unix
        lanes = []
        for r in range(2):
            with open(os.path.join(folder, f"rank-{r}.addr")) as f:
                host, port = f.read().strip().rsplit(":", 1)
            lanes.append(unix.lane_path(host, int(port)))
        os.kill(pids[1], signal.SIGSTOP)          # a stopped rank runs no watchdog: the kernel's signal ends it
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        t0 = time.monotonic()
        left = wait_gone(pids, 10)
        took = time.monotonic() - t0
        assert not left, f"ranks {left} outlived their launcher"
        assert took < 5, f"the ranks took {took:.1f} s to end"
        # the launcher could not clean up: its folder is named so that the next sweep removes it
        assert os.path.basename(folder).startswith(leftovers.FOLDER_PREFIX), folder
        leftovers.sweep_folders(os.path.dirname(folder))
        assert not os.path.exists(folder)
        time.sleep(leftovers.LANE_MIN_AGE_S)
        leftovers.sweep_lanes()                       # ... and the lane sockets the killed ranks left
        assert not [p for p in lanes if p and os.path.exists(p)]
        assert not shm_of(pids)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        kill_left(pids)


FAIL_MID_ALLREDUCE = """\
    import os, sys, time
    import numpy as np
    import flowlab as fl
    from flowlab.cluster import collectives as C
    rank = fl.cluster.rank()
    print(f"rank {rank} pid {os.getpid()} dir {os.environ['FLOWLAB_RUN_DIR']}", flush=True)
    if FORM:
        C.allreduce(np.ones(4))
    if rank == 1:
        time.sleep(1.0)
        print(f"rank 1 exits at {time.time():.3f}", flush=True)
        EXIT(3)
    try:
        C.allreduce(np.ones(1 << 16, np.float32), timeout=30)
    except Exception as e:
        print(f"rank {rank} failed at {time.time():.3f}: {type(e).__name__}: {e}", flush=True)
        raise SystemExit(1)
    print(f"rank {rank} finished?!", flush=True)
"""


@pytest.mark.parametrize("form,how", [(True, "sys.exit"), (False, "os._exit")])
def test_a_rank_that_exits_mid_allreduce_fails_the_others_at_once(tmp_path, form, how):
    body = FAIL_MID_ALLREDUCE.replace("FORM", str(form)).replace("EXIT", how)
    code, out = finish(start(tmp_path, textwrap.dedent(body), 3))
    pids = {int(r): int(p) for r, p in re.findall(r"rank (\d) pid (\d+)", out)}
    assert len(pids) == 3, out
    assert code == 3, out
    died = float(re.search(r"rank 1 exits at ([\d.]+)", out).group(1))
    for r in (0, 2):
        m = re.search(rf"\[{r}\] rank {r} failed at ([\d.]+): PeerLostError: (.*)", out)
        assert m, out
        assert float(m.group(1)) - died < 2.0, out      # at once, not at the 30 s deadline
        assert "rank 1" in m.group(2) and f"pid {pids[1]}" in m.group(2) and "exit code 3" in m.group(2), out
    assert f"root cause: rank 1 (pid {pids[1]}) failed first: exit code 3" in out, out
    assert "finished?!" not in out
    assert not wait_gone(list(pids.values()))
    folder = re.search(r"dir (\S+)", out).group(1)
    assert not os.path.exists(folder)
    assert not shm_of(pids.values())
