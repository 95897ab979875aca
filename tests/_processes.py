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


def free_ports(n: int) -> list:
    """``n`` distinct ports free on 127.0.0.1 right now (bound together, then released)."""
    import socket
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def run_script_ranks(script, *args, ranks: int = 2, timeout: float = 180.0, cwd=None) -> str:
    """``flowlab run -np ranks script args...`` to the end: its output (stdout and stderr). Fails
    the test, the launcher's whole process group killed, if it runs past ``timeout``; asserts the
    launcher exited 0 and is gone."""
    import subprocess
    import sys
    import pytest
    proc = subprocess.Popen([sys.executable, "-m", "flowlab", "run", "-np", str(ranks), str(script),
                             *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=cwd,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"flowlab run did not finish within {timeout:.0f} s:\n{out.decode()}")
    out = out.decode()
    assert proc.returncode == 0, out
    assert not wait_gone([proc.pid], 5)
    return out


_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def start_flowlab_run(tmp_path, body, n, *args):
    """``flowlab run -np n`` on a script made of ``body`` (dedented), in a session of its own (so
    :func:`finish_flowlab_run` can end the whole group); stdout and stderr together."""
    import subprocess
    import sys
    import textwrap
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(body))
    return subprocess.Popen([sys.executable, "-m", "flowlab", "run", "-np", str(n), str(script), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=_ROOT, start_new_session=True)


def finish_flowlab_run(proc, timeout=90):
    """``(exit code, output)`` of a :func:`start_flowlab_run`; its whole process group is killed,
    and the test failed, when it runs past ``timeout`` seconds."""
    import subprocess

    import pytest
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"flowlab run did not finish within {timeout} s:\n{out.decode()}")
    return proc.returncode, out.decode()
