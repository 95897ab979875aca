"""Local multi-process clusters: ClusterSpec, Server, LocalCluster, transport, collectives, events.

Not built yet (see the cluster issue); this package exists so the layout of DESIGN.md is visible.
"""
