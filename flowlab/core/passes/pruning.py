"""Dead-node pruning: drop what no fetch and no side effect needs."""
from __future__ import annotations


def prune_dead_nodes(nodes, fetches, feeds):
    """Drop every node that no fetch depends on, except stateful nodes and what they depend on.
    A kept node's control inputs are kept too (and what they depend on).
    Safe because a non-stateful node only makes a value, and a value that no fetch, no side
    effect and no other kept node reads changes nothing. Stateful nodes (variable reads and
    assignments, optimizer updates, random draws) always stay, in their order. The plan already
    leaves out nodes its fetches do not need; this pass removes what folding and merging left
    unused (the constants a folded node read, a merged node's inputs)."""
    live = set()
    stack = [t.node for t in fetches] + [n for n in nodes if n.op.stateful]
    while stack:
        n = stack.pop()
        if n not in live:
            live.add(n)
            stack.extend(t.node for t in n.inputs)
            stack.extend(n.control_inputs)
    return [n for n in nodes if n in live], list(fetches)
