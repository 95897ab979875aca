"""A cancel never cuts a shared-memory ring read in half.

A worker's cancel is a SIGINT whose handler (``Server._on_sigint``) raises KeyboardInterrupt in the
running job. Raised while ``Inbound.pump`` was taking a message off a ring, it left the ring's
read position out of step with what had been read, and every later collective on that rank failed
with ``IndexError: pop from an empty deque`` until its group was formed again (found by the soak,
tests/process/test_soak.py, seed 44444). Now the handler asks again a moment later when the
interrupted stack is inside ring code (``shm.NO_INTERRUPT``), as it does inside an import.
"""
import signal
import threading
import time

import numpy as np
import pytest

from flowlab.cluster.collectives import shm

pytestmark = pytest.mark.skipif(shm.unavailable() is not None, reason=str(shm.unavailable()))


@pytest.fixture
def running_job():
    """A Server whose (pretend) running job on this, the main, thread has been cancelled, with its
    SIGINT handler installed."""
    from flowlab.cluster.protocol import new_key
    from flowlab.cluster.server import Server

    srv = Server(None, "worker", 0, key=new_key(), port=0)
    srv._exec_thread = threading.main_thread()
    srv._running = srv._cancel_key = ("client", 1)
    old = signal.signal(signal.SIGINT, srv._on_sigint)
    try:
        yield srv
    finally:
        srv._running = srv._cancel_key = None
        signal.signal(signal.SIGINT, old)
        srv.stop()


def test_an_interrupt_waits_until_the_ring_read_is_done(running_job, monkeypatch):
    tx = shm.poke_socket()
    inbound = shm.Inbound(1, tx)
    outbound = shm.Outbound(inbound.name, None, tx)
    try:
        payload = [np.arange(1000, dtype=np.float64), np.arange(7, dtype=np.int32)]
        assert outbound.send({"q": 1}, payload)
        real = shm._dtype
        signalled = []

        def dtype_then_signal(name):    # the SIGINT lands while pump is between two steps
            if not signalled:
                signalled.append(True)
                signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
            return real(name)
        monkeypatch.setattr(shm, "_dtype", dtype_then_signal)
        try:
            got = inbound.pump()
        except KeyboardInterrupt:
            pytest.fail("the interrupt was raised inside Inbound.pump: the ring's read position is now "
                        "out of step with what was read")
        assert signalled
        header, arrays = got
        assert header == {"q": 1}
        np.testing.assert_array_equal(arrays[0], payload[0])
        np.testing.assert_array_equal(arrays[1], payload[1])
        # the interrupt was not lost: it comes once the read is done
        with pytest.raises(KeyboardInterrupt, match="cancelled by the client"):
            end = time.monotonic() + 5
            while time.monotonic() < end:
                time.sleep(0.01)
        # and the ring still carries the next message intact
        assert outbound.send({"q": 2}, [np.ones(3)])
        header, arrays = inbound.pump()
        assert header == {"q": 2} and np.all(arrays[0] == 1.0)
    finally:
        outbound.close()
        inbound.close()
        inbound.unlink()
        tx.close()
