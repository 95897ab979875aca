"""Shared by the exercise tests that start processes (a LocalCluster in a checks file's run)."""
import pytest

psutil = pytest.importorskip("psutil")


def _children():
    return {p.pid for p in psutil.Process().children(recursive=True)}


@pytest.fixture
def nothing_left_behind():
    """Every process a test started has ended when it is over, pass or fail (ended here if not)."""
    before = _children()
    yield
    new = []
    for pid in _children() - before:
        try:
            new.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            pass
    gone, alive = psutil.wait_procs(new, timeout=10)
    for p in alive:
        p.kill()
    assert not alive, f"processes left behind: {[p.pid for p in alive]}"
