"""What tests that start processes share: whether a pid is gone, waiting for pids to go, and the
last-resort cleanup (by pid, never by name). Imported by base name (tests/ is on sys.path)."""
import os
import signal
import time


def gone(pid: int) -> bool:
    """True when ``pid`` no longer runs (no such process, or a zombie waiting to be reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (OSError, IndexError):
        return True


def wait_gone(pids, limit: float = 15.0) -> list:
    """Wait up to ``limit`` seconds for every pid to be gone; the pids still running."""
    end = time.monotonic() + limit
    left = list(pids)
    while left and time.monotonic() < end:
        left = [p for p in left if not gone(p)]
        if left:
            time.sleep(0.02)
    return left


def kill_left(pids) -> None:
    """Last-resort cleanup of processes a test started."""
    for p in pids:
        if not gone(p):
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
