"""Local multi-process clusters: ClusterSpec, Server, LocalCluster, transport, collectives, events.

Importing this package is light: it never imports pyzmq (the transport is loaded when a server or
cluster starts), so ``flowlab.data`` and others can use the event log freely.
"""
from .events import Event, EventLog, default_log  # noqa: F401
