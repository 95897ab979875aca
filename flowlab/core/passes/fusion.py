"""Elementwise fusion: a chain (or small DAG) of elementwise ops becomes one node whose kernel
runs them one after another, writing each result into a buffer it already has.

Compiled fusion (_cfusion.py; ``fl.config.set_compiled_fusion``): where a C compiler works, a
group of at least 8 float32 or float64 ops whose inputs are full-size arrays or single values
runs as one C loop compiled for this CPU instead (3x and more faster on long chains). Its
arithmetic, comparisons and logical ops give numpy's bits. exp, log, sigmoid and tanh are
flowlab's own float32 code, within 1 ULP (tanh: 2 ULP) of the correctly rounded result: a graph
with them can differ from eager by that much per op, and errors grow along a chain as they do for
any two implementations (``bench/graph.py``'s 100-op tanh chain: about 4e-6 absolute). The
results are deterministic: the same bits in every run and process, whatever the disk cache held.
The fused node's name and shape rule are the same either way; its kernel has ``compiled=True``.

On a GPU (cuda_fusion.py) a group, placed there or unplaced, runs as one generated CUDA kernel:
one launch per fused chain (``OpDef.kernels["cupy"]``); a group placed on a GPU is not compiled for
the CPU, except where no GPU is visible (logical GPUs run numpy kernels)."""
from __future__ import annotations

import numpy as np

from ..execute import OpDef, get_op
from ..backends import visible_gpus
from . import _cfusion, cuda_fusion
from ._rewrite import consumers, copy_node, on_local_cpu, rewire


def fuse_elementwise(nodes, fetches, feeds):
    """Replace each group of connected elementwise nodes (``fusable``: ops with an
    ``OpDef.elementwise`` form, on this process's CPU or one of its GPUs, all on one device) whose
    intermediate results are read only inside the group, and are not fetched, by one node that
    computes the group's last value.
    Its kernel (``elementwise_kernel``) runs the members' ufuncs in program order with ``out=``
    into a buffer it allocated in this call, so a chain of N ops allocates once instead of N times
    and skips N-1 kernel calls of the plan.
    Safe because the members are pure and their values are seen by no one else: moving them to
    the last member's place changes nothing, the same ufuncs run in the same order (the same
    bits), the inputs are never written, and the result is a new array every call. The fused op
    (``fused(add,multiply,tanh)``) has a shape rule but no gradient: passes run after tracing.
    The groups that qualify are compiled together, one C file (one compiler run) per plan."""
    position = {n: i for i, n in enumerate(nodes)}
    users = consumers(nodes)
    fetched = {t.node for t in fetches}
    taken, groups = set(), []
    for root in reversed(nodes):
        if root not in taken and fusable(root):
            group = _grow(root, users, fetched, taken, position)
            taken |= group
            if len(group) > 1:
                groups.append(sorted(group, key=position.__getitem__))
    replaced, fused, dropped = {}, {}, set()
    built = [_fuse(group) for group in groups]
    specs = [[(t._shape, t._dtype) for t in inputs] for _, inputs in built]
    kinds = [_device_type(group[-1]) for group in groups]
    wrappers = _cfusion.compile_groups([(steps, spec) if kind != "GPU" or not visible_gpus() else None
                                        for (steps, _), spec, kind in zip(built, specs, kinds)])
    for k, (group, (steps, inputs), spec, wrap) in enumerate(zip(groups, built, specs, wrappers)):
        root = group[-1]
        gpu = None if kinds[k] == "CPU" else _gpu_kernel_of(f"flowlab_fused{k}", steps, spec, group)
        fused[root] = elementwise_node(root, steps, inputs, compiled=wrap, gpu=gpu)
        replaced[root] = fused[root].output
        dropped.update(group[:-1])
    return rewire([fused.get(n, n) for n in nodes if n not in dropped], fetches, replaced)


def _gpu_kernel_of(fname, steps, specs, group):
    """What turns the group's numpy kernel into the one a GPU runs, whose comments name the user's lines."""
    sources = [m.source for m in group]
    return lambda fallback: cuda_fusion.gpu_kernel(fname, steps, specs, fallback, sources)


def fusable(node) -> bool:
    """Whether ``node`` may join a fused group: its op has an elementwise form (the fused ops this
    pass makes have none) and it has no attributes, on this CPU or a GPU of this process."""
    return node.op.elementwise is not None and not node.attrs and (
        on_local_cpu(node) or (_device_type(node) == "GPU" and getattr(node.device, "job", None) in (None, "localhost")
                               and getattr(node.device, "task", None) in (None, 0)))


def _device_type(node):
    """"CPU", "GPU", or None for a node no scope placed (it runs where its inputs are)."""
    return getattr(node.device, "device_type", None) if node.device else None


def _grow(root, users, fetched, taken, position):
    """The group that ``root``'s result comes from: producers join while all their readers are in it."""
    group, waiting, stack = {root}, set(), [root]
    while stack:
        for t in stack.pop().inputs:
            p = t.node
            if (p in group or p in taken or p not in position or p in fetched or not fusable(p)
                    or p.device != root.device):
                continue
            waiting.add(p)
        for p in [p for p in waiting if all(u in group for u in users[p])]:
            waiting.discard(p)
            group.add(p)
            stack.append(p)
    return group


def _fuse(group):
    members, var, inputs, index, steps = set(group), {}, [], {}, []
    for j, m in enumerate(group):
        args = []
        for t in m.inputs:
            if t.node in members:
                args.append(var[t.node])
            else:
                if t.node not in index:
                    index[t.node] = len(inputs)
                    inputs.append(t)
                args.append(f"x{index[t.node]}")
        var[m] = f"t{j}"
        steps.append((m.op.name, tuple(args), m.output._shape, m.output._dtype))
    return steps, inputs


def elementwise_steps(node):
    """``(steps, inputs)`` of a fused node, or of a single elementwise node (see elementwise_kernel)."""
    kernel = node.op.kernel
    if hasattr(kernel, "steps"):
        return kernel.steps, list(node.inputs)
    inputs = list({t.node: t for t in node.inputs}.values())
    index = {t.node: k for k, t in enumerate(inputs)}
    args = tuple(f"x{index[t.node]}" for t in node.inputs)
    return [(node.op.name, args, node.output._shape, node.output._dtype)], inputs


def elementwise_node(root, steps, inputs, donated=(), compiled=None, gpu=None):
    """A node computing ``steps`` from the tensors ``inputs``, in place of ``root`` (whose output
    it computes); None when ``donated`` is given but no step can write into a donated input, or
    ``root`` runs a compiled kernel (it keeps it: one allocation is cheap beside what it saves).
    ``compiled``: what turns the numpy kernel into a compiled one (_cfusion.compile_groups); ``gpu``:
    what turns it into the kernel a GPU runs (cuda_fusion.gpu_kernel). A donating copy keeps the
    GPU kernel of ``root`` (which may allocate: a donated buffer is a permission)."""
    if donated and getattr(root.op.kernel, "compiled", False):
        return None
    kernel, wrote = elementwise_kernel(steps, [(t._shape, t._dtype) for t in inputs], donated)
    if donated and not wrote:
        return None
    on_gpu = gpu(kernel) if gpu is not None else root.op.kernels.get("cupy") if donated else None
    if compiled is not None:
        kernel = compiled(kernel)
    names = [s[0] for s in steps]
    name = names[0] if len(names) == 1 else "fused({})".format(
        ",".join(names if len(names) <= 8 else names[:6] + [f"...{len(names)} ops"]))
    op = OpDef(name + ("[in-place]" if donated else ""), kernel, _shape_rule(steps),
               doc="Elementwise ops run as one kernel (made by flowlab.core.passes)"
               + ("; compiled to C for this CPU." if compiled is not None else "."))
    if on_gpu is not None:
        op.kernels["cupy"] = on_gpu
    return copy_node(root, op=op, inputs=list(inputs), attrs={}, name=root.name if len(steps) == 1 else name)


def elementwise_kernel(steps, inputs, donated=()):
    """Generate ``kernel(x0, x1, ...)``, which runs ``steps`` in order and returns the last one's
    value; and whether it writes into a donated input.

    ``steps``: (op name, argument names, shape, dtype) per op; an argument is an input (``x0``...)
    or an earlier step's result (``t0``...). ``inputs``: (shape, dtype) of each input. A step
    writes its result into an argument's buffer (``out=``) when the kernel owns that buffer (an
    earlier step's result, or an input whose position is in ``donated``: the caller gave it up),
    no later step reads it, and it has the result's dtype and shape (every argument broadcasts
    into it, judged from static shapes). Otherwise the step allocates."""
    specs = {f"x{k}": spec for k, spec in enumerate(inputs)}
    owned = {f"x{k}" for k in donated}
    last = {a: j for j, (_, args, _, _) in enumerate(steps) for a in args}
    lines, wrote = [], False
    for j, (name, args, shape, dtype) in enumerate(steps):
        out = next((a for a in args if a in owned and last[a] == j and specs[a][1] == dtype and specs[a][0]
                    and all(_fits(specs[a][0], specs[b][0]) for b in args)), None)
        wrote |= out is not None and out[0] == "x"
        lines.append(f"    t{j} = {name}({', '.join(args)}{f', out={out}' if out else ''})")
        specs[f"t{j}"] = (shape, dtype)
        if shape:   # a result of rank 0 is a numpy scalar: no buffer to write into
            owned.add(f"t{j}")
    source = (f"def kernel({', '.join(f'x{k}' for k in range(len(inputs)))}):\n"
              + "\n".join(lines) + f"\n    return t{len(steps) - 1}\n")
    namespace = {name: get_op(name).elementwise for name, *_ in steps}
    exec(compile(source, "<flowlab fused kernel>", "exec"), namespace)  # noqa: S102 - our own generated code
    kernel = namespace["kernel"]
    kernel.steps, kernel.source = list(steps), source
    return kernel, wrote


def _fits(buffer, other) -> bool:
    """Whether broadcasting a value of static shape ``other`` against ``buffer`` keeps ``buffer``'s
    shape (None is an unknown dimension: it fits only against 1)."""
    return other is not None and len(other) <= len(buffer) and all(
        o == 1 or (o is not None and o == b) for b, o in zip(reversed(buffer), reversed(other)))


class _Spec:
    __slots__ = ("shape", "dtype")

    def __init__(self, shape, dtype):
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)


def _shape_rule(steps):
    """The fused op's shape rule: the members' rules, applied in order."""
    def rule(*inputs):
        values = {f"x{k}": x for k, x in enumerate(inputs)}
        for j, (name, args, _, _) in enumerate(steps):
            shape, dtype = get_op(name).shape_rule(*[values[a] for a in args])
            values[f"t{j}"] = _Spec(shape, dtype)
        return shape, dtype
    return rule
