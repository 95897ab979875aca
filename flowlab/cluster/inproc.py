"""The in-process transport: the interface of :mod:`.transport` over queues inside one process.

Servers and clients then run the very same protocol (signed headers, replay checks, handlers) on
threads, with no sockets and no pyzmq, so tests of the protocol and of the server's behaviour are
fast and deterministic. Addresses look like ``inproc:1``; every frame is copied to bytes on the
way, as the network would, so no endpoint ever shares memory with another.
"""
from __future__ import annotations

import collections
import itertools
import threading
import time

from .errors import ClusterError

__all__ = ["InprocTransport"]

_registry: dict[str, "_Listener"] = {}
_registry_lock = threading.Lock()
_ports = itertools.count(1)


class _Box:
    """A deque with a condition: put from any thread, get with a timeout."""

    def __init__(self):
        self._items = collections.deque()
        self._cond = threading.Condition()
        self.closed = False

    def put(self, item):
        with self._cond:
            if not self.closed:
                self._items.append(item)
                self._cond.notify()

    def get(self, timeout):
        with self._cond:
            if not self._items and timeout != 0:
                end = None if timeout is None else time.monotonic() + timeout
                while not self._items and not self.closed:
                    left = None if end is None else end - time.monotonic()
                    if left is not None and left <= 0:
                        break
                    self._cond.wait(left)
            return self._items.popleft() if self._items else None

    def close(self):
        with self._cond:
            self.closed = True
            self._cond.notify_all()


def _copy(frames):
    return [bytes(f) for f in frames]


class _Listener:
    lane = "inproc"
    lane_path = None

    def __init__(self, port):
        self.host, self.port = "inproc", port
        self.address = f"inproc:{port}"
        self._inbox = _Box()
        self._peers: dict[bytes, "_Connection"] = {}

    def recv(self, timeout):
        return self._inbox.get(timeout)   # None: timeout or wake()

    def send(self, peer, frames):
        conn = self._peers.get(peer)
        if conn is not None:
            conn._inbox.put(_copy(frames))

    post = send   # queues are thread-safe already

    def check_with(self, admit):
        """Nothing to check early: frames arrive whole, from this process."""

    def wake(self):
        self._inbox.put(None)

    def _deliver(self, conn, frames):
        self._peers[conn.ident] = conn
        self._inbox.put((conn.ident, _copy(frames)))

    def close(self):
        with _registry_lock:
            _registry.pop(self.address, None)
        self._inbox.close()


class _Connection:
    _ids = itertools.count(1)
    lane = "inproc"

    def __init__(self, address):
        self.address = address
        self.ident = b"c%d" % next(self._ids)
        self._inbox = _Box()

    def send(self, frames):
        with _registry_lock:
            listener = _registry.get(self.address)
        if listener is not None:   # like TCP to a closed port: the message is lost
            listener._deliver(self, frames)

    def recv(self, timeout):
        return self._inbox.get(timeout)

    def close(self):
        self._inbox.close()


class InprocTransport:
    """Listeners and connections inside this process (addresses ``inproc:N``, the scheme ``inproc``
    of :mod:`.schemes`)."""
    scheme = name = "inproc"

    def listen(self, host: str = "inproc", port: int = 0, tries: int = 1):
        with _registry_lock:
            if not port:
                port = next(_ports)
                while f"inproc:{port}" in _registry:
                    port = next(_ports)
            else:
                for p in range(port, port + max(1, tries)):
                    if f"inproc:{p}" not in _registry:
                        port = p
                        break
                else:
                    raise ClusterError(f"cannot listen: inproc ports {port}..{port + tries - 1} are all in use")
            listener = _Listener(port)
            _registry[listener.address] = listener
        return listener

    def connect(self, address: str):
        return _Connection(address)
