"""The transport registry: which transport serves an address, looked up by the address's scheme,
as dask/distributed's comm layer does (``distributed/comm/registry.py``: backends keyed by scheme).

Every place that needs a transport asks here: a Server for its listener (by its task's address in
the ClusterSpec), a Client for each task it connects to (by that task's address), LocalCluster,
the liveness monitor and the collectives' launcher. Built in:

- ``"tcp"``: ZeroMQ over TCP (:mod:`.transport`), which takes the local lane (Unix sockets,
  :mod:`.unix`) by itself between processes of one machine; the lane is part of this transport,
  not a scheme. Its addresses are ``host:port`` (an address without a scheme is TCP's) or
  ``tcp://host:port``. Its older name ``"zmq"`` still works.
- ``"inproc"``: queues inside one process (:mod:`.inproc`), addresses ``inproc:N``.

A factory takes the cluster key (``None``: no keyed handshake) and makes a transport, an object
with ``scheme``, ``name``, ``listen(host, port, tries)`` and ``connect(address)`` (``keyed(key)``
if the key changes what it does). Factories import their module only when called, so
``import flowlab.cluster`` never loads pyzmq.
"""
from __future__ import annotations

__all__ = ["register", "known", "scheme_of", "get", "for_address", "resolve", "keyed"]

_backends: dict = {}            # scheme -> factory(key) -> transport
_names: dict = {}               # another name a user may pass (transport="zmq") -> its scheme


def register(scheme: str, factory, *names: str) -> None:
    """Serve addresses of ``scheme`` with ``factory(key)``; ``names``: other names for it."""
    _backends[scheme] = factory
    for name in names:
        _names[name] = scheme


def known() -> list:
    """The registered schemes, then the other names they answer to."""
    return [*_backends, *_names]


def scheme_of(address: str) -> str:
    """The scheme of ``address``: ``"tcp"`` for ``tcp://h:p`` and for a bare ``host:port``,
    ``"inproc"`` for ``inproc:3``: a registered scheme and a colon."""
    head, sep, _ = str(address).partition(":")
    return head if sep and head in _backends else "tcp"


def get(scheme: str, key=None):
    """A transport of ``scheme`` (or of one of its names), keyed with the cluster ``key``."""
    factory = _backends.get(_names.get(scheme, scheme))
    if factory is None:
        raise ValueError(f"no transport for the scheme {scheme!r}; known: {', '.join(known())}")
    return factory(key)


def for_address(address: str, key=None):
    """The transport that reaches ``address``, keyed with ``key``."""
    return get(scheme_of(address), key)


def keyed(transport, key):
    """``transport`` with the cluster ``key`` (its TCP handshake uses credentials derived from it)."""
    return transport.keyed(key) if key is not None and hasattr(transport, "keyed") else transport


def resolve(transport, key=None, address: str | None = None):
    """The transport object for what a user passed: None (the one ``address``'s scheme names,
    TCP without an address), a scheme or a name of one (``"inproc"``, ``"zmq"``), or a transport
    object (keyed with ``key``)."""
    if transport is None:
        return get(scheme_of(address) if address is not None else "tcp", key)
    if isinstance(transport, str):
        return get(transport, key)
    return keyed(transport, key)


def _tcp(key):
    from .transport import ZmqTransport
    return ZmqTransport(key)


def _inproc(key):
    from .inproc import InprocTransport
    return InprocTransport()


register("tcp", _tcp, "zmq")
register("inproc", _inproc)
