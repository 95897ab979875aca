"""Running a graph: a compiled plan of kernel calls, with no per-op Python bookkeeping.

``compile_plan`` turns the nodes needed for some fetches into a Python function of straight-line
kernel calls (``v7 = k7(v3, v5)``), generated once and cached: no Tensor wrapping, no dtype or
tape checks, no dispatch. That is why a traced function runs faster than the same ops eagerly.
Before generating code, the plan runs the graph passes over its nodes (core/passes: constant
folding, common subexpressions, dead nodes, elementwise fusion, buffer reuse). When a kernel fails,
an interpreter runs the optimized nodes one by one so that errors name the node and the line that
created it. When a debug hook is active (numerics checks), it interprets the nodes as traced, so
that hooks see every op the user wrote, by name, and tensors that no later op writes into.
``around(node, kernel) -> kernel``: every node (constants too) calls what it returns, errors pass
unchanged (a cluster task's partition: an event per op, errors naming the task; no debug hooks).
"""
from __future__ import annotations

import keyword

import numpy as np

from ._context import state
from .errors import OpError
from .execute import Tensor, explain
from .graph import CONST, READ
from .passes import DEFAULT_PASSES, optimize

__all__ = ["compile_plan", "Plan"]


class Plan:
    """The nodes to run, in order, to compute ``fetches`` from ``feeds``."""

    def __init__(self, graph, fetches, feeds, run_stateful, passes=DEFAULT_PASSES, around=None):
        self.graph, self.fetches, self.feeds, self._around = graph, list(fetches), list(feeds), around
        stateful = [n for n in graph.nodes if n.op.stateful] if run_stateful else ()
        # a traced function runs every side effect it made, in program order
        self.nodes = graph.nodes_for(self.fetches, self.feeds, also=stateful)
        # traced_nodes: as traced; nodes and outputs (the fetches' values): after the passes
        self.traced_nodes = self.nodes
        self.nodes, self.outputs = optimize(self.nodes, self.fetches, self.feeds, passes)
        self._run = self._generate()

    def _generate(self):
        ns = {}
        feed_names = [f"f{i}" for i in range(len(self.feeds))]
        name = {id(t.node): feed_names[i] for i, t in enumerate(self.feeds)}
        # the last node that reads each value: after it, `del` lets numpy free the buffer
        last_use = {}
        for n in self.nodes:
            for t in n.inputs:
                last_use[id(t.node)] = n
        returned = {id(t.node) for t in self.outputs}
        lines = [f"def run({', '.join(feed_names)}):"]
        self._line_node = {}
        for n in self.nodes:
            var = f"v{n.index}"
            name[id(n)] = var
            if n.op is CONST and self._around is None:
                ns[f"c{n.index}"] = _const_value(n)
                name[id(n)] = f"c{n.index}"
                continue
            if n.op is READ and self._around is None:
                ns[f"V{n.index}"] = n.attrs["variable"]
                lines.append(f"    {var} = V{n.index}._value")
                continue
            ns[f"k{n.index}"] = _kernel(n) if self._around is None else self._around(n, _kernel(n))
            args = ", ".join(name[id(t.node)] for t in n.inputs)
            if n.attrs:   # keyword arguments bound to names: no dict to unpack on each call
                keywords = []
                for k, (key, value) in enumerate(n.attrs.items()):
                    if key.isidentifier() and not keyword.iskeyword(key):
                        ns[f"a{n.index}_{k}"] = value
                        keywords.append(f"{key}=a{n.index}_{k}")
                    else:
                        ns[f"a{n.index}"] = n.attrs
                        keywords = [f"**a{n.index}"]
                        break
                args = ", ".join(([args] if args else []) + keywords)
            lines.append(f"    {var} = k{n.index}({args})")
            self._line_node[len(lines)] = n
            dead = sorted({name[id(t.node)] for t in n.inputs if last_use.get(id(t.node)) is n
                           and id(t.node) not in returned and name[id(t.node)].startswith("v")})
            if dead:
                lines.append(f"    del {', '.join(dead)}")
        outs = ", ".join(name[id(t.node)] for t in self.outputs)
        lines.append(f"    return ({outs}{',' if len(self.outputs) == 1 else ''})")
        self.source = "\n".join(lines) + "\n"
        self._filename = f"<flowlab plan {id(self)} of {self.graph.name}>"
        exec(compile(self.source, self._filename, "exec"), ns)  # noqa: S102 - our own generated code
        return ns["run"]

    def __call__(self, *arrays):
        st = state()
        if st.hooks:
            return self.interpret(arrays, traced=True)
        try:
            return self._run(*arrays)
        except OpError as e:
            raise self._name_node(e)
        except Exception as e:  # noqa: BLE001 - name the node that failed (without running anything again)
            raise self._explain_failure(e) from None

    def _failed_at(self, error):
        """(frame, line, node) of the generated code where ``error`` was raised (None if not there)."""
        tb, frame, line = error.__traceback__, None, None
        while tb is not None:
            if tb.tb_frame.f_code.co_filename == self._filename:
                frame, line = tb.tb_frame, tb.tb_lineno
            tb = tb.tb_next
        return frame, line, self._line_node.get(line)

    def _name_node(self, error):
        """An OpError a kernel raised itself (check_numerics) inside the generated code knows no graph
        node: its message gets the node's name (which carries name scopes such as ``replica_1``)."""
        _, line, node = self._failed_at(error)
        msg = str(error)
        if node is None or node.name in msg or not error.args:
            return error
        where = f"{node.source} (graph node {node.name})" if node.source else f"graph node {node.name}"
        here = f"{self._filename}:{line}"
        error.args = (msg.replace(here, where) if here in msg else f"{msg}\n  in {where}",) + error.args[1:]
        error.source = where if getattr(error, "source", None) in (None, here) else error.source
        return error

    def _explain_failure(self, error):
        """The error for a kernel that failed inside the generated code: the node is found from the
        traceback's line in that code, its inputs from the frame's variables."""
        frame, _, node = self._failed_at(error)
        if node is None:
            return error
        feeds = {id(t.node): f"f{i}" for i, t in enumerate(self.feeds)}
        values = frame.f_locals
        ins = []
        for t in node.inputs:
            key = feeds.get(id(t.node)) or f"v{t.node.index}"
            value = values.get(key, t.node.attrs.get("value") if t.node.op is CONST else None)
            ins.append(_wrap(value) if value is not None else t)
        st = state()
        outer, st.node = st.node, node
        try:
            return explain(node.op, ins, node.attrs, error)
        finally:
            st.node = outer

    def interpret(self, arrays, traced=False):
        """Run node by node (the optimized nodes, or with ``traced`` the nodes as traced): calls
        debug hooks and names the failing node and its source line."""
        st = state()
        env = {id(t.node): a for t, a in zip(self.feeds, arrays)}
        outer = st.node
        try:
            for n in self.traced_nodes if traced else self.nodes:
                st.node = n
                ins = [env[id(t.node)] for t in n.inputs]
                try:
                    value = _kernel(n)(*ins, **n.attrs)
                except OpError:
                    raise
                except Exception as e:  # noqa: BLE001 - becomes an error naming the node
                    raise explain(n.op, [_wrap(a) for a in ins], n.attrs, e) from None
                env[id(n)] = value
                if st.hooks:
                    out = _wrap(value)
                    for hook in list(st.hooks):
                        hook(n.op, [_wrap(a) for a in ins], n.attrs, out)
        finally:
            st.node = outer
        return tuple(env[id(t.node)] for t in (self.fetches if traced else self.outputs))


def _wrap(array):
    t = object.__new__(Tensor)
    t._value, t._device = array, None
    if array.__class__ is not np.ndarray and not isinstance(array, np.generic):
        from .backends import device_of_array
        t._device = device_of_array(array)
    return t


def _const_value(node):
    """A constant's value where it was placed: copied once, when the plan is made, to a GPU that
    a scope put it on (so that it is not copied at every run, and a returned one is on the GPU)."""
    from .backends import to_device, visible_gpus
    from .device import is_local, resolve
    value = node.attrs["value"]
    if not (node.device and visible_gpus()):
        return value
    where = resolve(node.device, allow_remote=True)
    return to_device(value, where) if is_local(where) else value


def _kernel(node):
    """The kernel for a node: where it was placed (``fl.device`` scopes while tracing, colocation)
    decides the backend. A device that does not exist, or one on another task, is an error here,
    when the plan is compiled, not a silent run on the local CPU. Where a GPU is visible, every
    kernel copies its inputs to its device first (backends' copy rule), host-placed ones included,
    and an unplaced node runs where its inputs are; where none is, kernels run as they are."""
    from .backends import kernel_for_device, visible_gpus
    from .device import DEFAULT_DEVICE, resolve
    if node.op is CONST and node.device and visible_gpus():
        value = _const_value(node)
        return lambda **attrs: value
    if not node.device:
        if not visible_gpus():
            return node.op.kernel
        variable = node.attrs.get("variable")   # an update runs where its variable lives
        return kernel_for_device(node.op, None if variable is None else (variable._device or DEFAULT_DEVICE))
    variable = node.attrs.get("variable")   # its value is here, whatever task its device names
    where = resolve(node.device, allow_remote=variable is not None)
    if not where.startswith(DEFAULT_DEVICE.rpartition("device:")[0]):
        where = DEFAULT_DEVICE
    if where == DEFAULT_DEVICE and not visible_gpus():
        return node.op.kernel
    return kernel_for_device(node.op, where)


class _AroundPlan(Plan):
    def __call__(self, *arrays):   # no debug hooks, no error rewriting: ``around`` does its own
        return self._run(*arrays)


def compile_plan(graph, fetches, feeds=(), run_stateful=True, passes=DEFAULT_PASSES, around=None) -> Plan:
    """A runnable plan for ``fetches`` given values for ``feeds`` (placeholders or any tensor),
    optimized by ``passes`` (``passes=()``: run the nodes as traced); ``around``: see above."""
    return (Plan if around is None else _AroundPlan)(graph, fetches, feeds, run_stateful, passes, around)
