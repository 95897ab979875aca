"""Graph passes: rewrite the nodes of a plan before the executor turns them into code.

``Plan`` (core/executor.py) picks the nodes its fetches need, in program order, and hands them to
``optimize``, which runs each pass in turn. The default pipeline, in order:

==========================================  ===============================================
``fold_constants`` (constant_folding.py)    nodes of constants only become constants
``eliminate_common_subexpressions`` (cse)   equal nodes on equal inputs become one
``prune_dead_nodes`` (pruning.py)           what no fetch or side effect needs goes
``fuse_elementwise`` (fusion.py)            chains of elementwise ops become one kernel
``reuse_buffers`` (buffer_reuse.py)         elementwise ops write into a dying input
==========================================  ===============================================

The contract every pass keeps. A pass is a function ``(nodes, fetches, feeds) -> (nodes,
fetches)``:

- ``nodes``: the list of nodes to run, in program order. Every input of a node is the output of an
  earlier node in the list, or a fed tensor. A pass returns a new list and never changes a node
  (they belong to the user's ``Graph``): to change one it makes a new ``Node`` with the fields
  copied (``_rewrite.copy_node``), which has a new output tensor, and every node that read the old
  one is copied to read the new one (``_rewrite.rewire``). A replacement takes the ``index`` of the
  node it replaces, so indices stay unique (the executor names variables by them).
- ``fetches``: the tensors to return, in order. A pass that replaces a node returns the fetches
  mapped to the tensor that now computes the same value (a merged node's fetch becomes the
  survivor's output, a folded one a constant's). The executor returns the values of the mapped
  fetches, so callers see the same results in the same positions.
- ``feeds``: the tensors given values when the plan runs. Their nodes are not in ``nodes``, and a
  pass treats them as opaque inputs: never constants, never written into.
- Stateful nodes (``OpDef.stateful``: reads, assignments, optimizer updates, random draws) are
  never folded, merged, dropped or reordered among themselves.
- What a pass needs to know of an op is a field of its ``OpDef`` (``elementwise``, ``c_expr``,
  ``fresh``, ``shape_only``...), never its name: a new op is one ``defop`` for the passes too
  (tests/unit/test_op_entries.py).

>>> import flowlab as fl
>>> from flowlab.core.executor import compile_plan
>>> g = fl.Graph()
>>> with g.as_default():
...     x = g.placeholder(fl.float32, [3])
...     y = fl.tanh(x * (fl.constant(2.0) * 3.0) + 1.0)
>>> [n.op.name for n in compile_plan(g, [y], [x]).nodes]
['const', 'const', 'fused(multiply,add,tanh)']
"""
from __future__ import annotations

from .buffer_reuse import reuse_buffers
from .constant_folding import fold_constants
from .cse import eliminate_common_subexpressions
from .fusion import fuse_elementwise
from .pruning import prune_dead_nodes

__all__ = ["optimize", "DEFAULT_PASSES", "fold_constants", "eliminate_common_subexpressions",
           "prune_dead_nodes", "fuse_elementwise", "reuse_buffers"]

DEFAULT_PASSES = (fold_constants, eliminate_common_subexpressions, prune_dead_nodes, fuse_elementwise,
                  reuse_buffers)


def optimize(nodes, fetches, feeds=(), passes=DEFAULT_PASSES):
    """Run ``passes`` in order over a plan's ``nodes``; returns ``(nodes, fetches)`` (see above)."""
    nodes, fetches, feeds = list(nodes), list(fetches), list(feeds)
    for run_pass in passes:
        nodes, fetches = run_pass(nodes, fetches, feeds)
    return nodes, fetches
