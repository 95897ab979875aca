import pytest

import flowlab.cluster as fc
from _processes import kill_left, wait_gone


@pytest.fixture
def make_cluster():
    """``make_cluster(**kw)`` starts a LocalCluster; all are closed, and their pids checked gone."""
    made = []

    def make(**kw):
        c = fc.LocalCluster(**kw)
        made.append((c, [c.pid(t) for t in c.tasks]))
        return c

    yield make
    pids = []
    for c, first in made:
        pids += first + [c.pid(t) for t in c.tasks]
        c.close()
    left = wait_gone([p for p in pids if p], 10)
    kill_left(left)
    assert not left, f"processes left after close: {left}"


@pytest.fixture(scope="module")
def cluster():
    """A LocalCluster of 2 workers shared by the tests of one module (a module may define its own
    ``cluster``); closed after the module, and its pids checked gone, even when a test failed."""
    c = fc.LocalCluster(workers=2)
    pids = [c.pid(t) for t in c.tasks]
    try:
        yield c
    finally:
        pids += [c.pid(t) for t in c.tasks]
        c.close()
        left = wait_gone([p for p in pids if p], 10)
        kill_left(left)
        assert not left, f"processes left after close: {left}"
