"""A cancel never cuts an import in half on a worker.

When one worker of a ``cluster.run`` fails, the others' share of the call is cancelled (a SIGINT
to the worker's main thread). Arriving in the middle of an import, that KeyboardInterrupt used to
leave the process's modules half made for good: a fresh worker's lazy ``flowlab`` package (whose
``__init__`` runs on first attribute use) then answered ``module 'flowlab' has no attribute
'constant'`` to every later call, and numpy ``no attribute 'void'`` (found by the soak test,
tests/process/test_soak.py). Now the cancel waits until the import is done, then stops the call.
"""
import secrets
import time

import pytest

from flowlab.cluster.errors import RemoteError

pytestmark = pytest.mark.process


def _import_or_fail(name):
    import importlib
    import time as t

    import flowlab.cluster as cl
    if cl.rank() == 1:
        t.sleep(0.4)
        raise ValueError("rank 1 fails on purpose")
    importlib.import_module(name)
    t.sleep(30)       # a cancel that waited for the import still stops the call here
    return "not cancelled"


def _module_state(name):
    import sys
    m = sys.modules.get(name)
    return None if m is None else (getattr(m, "STARTED", False), getattr(m, "DONE", False))


def test_a_cancel_waits_for_the_import_to_finish(make_cluster, tmp_path, monkeypatch):
    name = f"flowlab_slow_import_{secrets.token_hex(4)}"
    (tmp_path / f"{name}.py").write_text("import time\nSTARTED = True\ntime.sleep(1.5)\nDONE = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))       # the workers get this process's sys.path
    c = make_cluster(workers=2)
    t0 = time.monotonic()
    with pytest.raises(RemoteError) as info:
        c.run(_import_or_fail, name, timeout=20)
    assert time.monotonic() - t0 < 15, "the cancelled call did not stop soon after its import"
    assert "rank 1 fails on purpose" in str(info.value)
    assert c.call(0, _module_state, name, timeout=10) == (True, True), \
        "the cancel cut the import in half (the module is missing or half made)"
    assert c.call(0, _module_state, "sys", timeout=10) is not None     # worker 0 still serves
