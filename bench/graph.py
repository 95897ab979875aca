#!/usr/bin/env python
"""Graph-mode benchmark: ``@fl.function`` and its graph passes against eager flowlab, in one run.

    python bench/graph.py            # full run, about a minute (plus torch.compile's own compiling)
    python bench/graph.py --quick    # smoke run, a few seconds (numbers are rough; no torch.compile)

Part 1 times chains of 100 elementwise ops on 64x64 float32: the chain of bench/eager.py (``x + c``,
``x * d``, ``tanh(x)``, repeated) and a chain of cheap ops (``x + c``, ``x * d``, ``maximum(x, c)``),
as numpy, flowlab eager, ``@fl.function`` compiled without passes, ``@fl.function`` (passes on: the
chain becomes one fused node), torch eager and ``torch.compile``. Part 2 times one SGD step of the
64-256-256-10 MLP of bench/eager.py at batch 32 the same ways (after checking that all of them
train to the same weights). Part 3 shows what each pass does to the MLP step and to the chain:
nodes left after each pass, and the time per call of the plan compiled with the passes up to it.
Part 4 prints the targets with PASS or MISS. Where a C compiler works, fused groups of 8 ops or
more run compiled to C (flowlab/core/passes/_cfusion.py); ``--no-compiled-fusion`` runs them with
numpy kernels, as before compiled fusion existed.

``torch.compile`` runs in a child process: it is skipped, with the reason printed, when torch is
missing, when compiling fails (it needs a C++ compiler), or when it takes over 60 seconds.
The exit status is 0 whatever the timings are; it is non-zero only when the implementations
disagree (the comparison would not be fair). See bench/README.md for what each number means.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import time
import timeit

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402
import eager as E  # noqa: E402  (the MLP, the chain and the numpy peer are the eager benchmark's)

import flowlab as fl  # noqa: E402
import flowlab.datasets  # noqa: E402,F401  (makes fl.datasets available)
from flowlab.core import passes as P  # noqa: E402
from flowlab.core.executor import compile_plan  # noqa: E402

F32 = np.float32
BATCH = 32
CHAIN_SHAPE = (64, 64)
COMPILE_LIMIT_S = 60
PASS_STEPS = [("traced", ()), ("+ constant folding", (P.fold_constants,)),
              ("+ common subexpressions", (P.eliminate_common_subexpressions,)),
              ("+ dead-node pruning", (P.prune_dead_nodes,)), ("+ elementwise fusion", (P.fuse_elementwise,)),
              ("+ buffer reuse", (P.reuse_buffers,))]
CHAINS = {
    # row name: the chain's three statements, cycled; ``fn`` is tanh or maximum
    "chain100 tanh 64x64": ["x = x + c", "x = x * d", "x = fn(x)"],
    "chain100 cheap 64x64": ["x = x + c", "x = x * d", "x = fn(x, c)"],
}

MODES = {
    "full": dict(op_target=0.02, op_repeats=9, mlp_target=0.25, mlp_repeats=9, mlp_warmup=5, torch_compile=True),
    "quick": dict(op_target=0.001, op_repeats=2, mlp_target=0.01, mlp_repeats=2, mlp_warmup=1, torch_compile=False),
}

# ratio = eager time / graph time: how many times faster the traced function is
TARGETS = [
    ("MLP step batch 32: @fl.function at least 1.5x faster than eager", "mlp", "mlp step batch 32", 1.5),
    ("chain100 tanh 64x64: fused graph at least 3x faster than eager", "chain", "chain100 tanh 64x64", 3.0),
]

say = E.say
CheckFailed = E.CheckFailed


def make_chain(statements, n=100):
    """``chain(x, c, d, fn)``: ``n`` elementwise statements in a row (bench/eager.py's make_chain)."""
    body = "\n".join(f"    {statements[i % len(statements)]}" for i in range(n))
    namespace = {}
    exec(f"def chain(x, c, d, fn):\n{body}\n    return x\n", namespace)  # noqa: S102 - our own code
    return namespace["chain"]


def traced(fn, args, passes=P.DEFAULT_PASSES):
    """``fn`` as an ``@fl.function``, traced for ``args`` and compiled with ``passes``."""
    f = fl.function(fn)
    concrete = f.get_concrete_function(*args)
    if passes is not P.DEFAULT_PASSES:   # swap in a plan compiled with other passes: same call path
        concrete._plan = compile_plan(concrete.graph, concrete.outputs, concrete.inputs, passes=passes)
    return f


def chain_inputs():
    rng = np.random.default_rng(0)
    return (rng.uniform(-1, 1, CHAIN_SHAPE).astype(F32), rng.uniform(-0.5, 0.5, CHAIN_SHAPE).astype(F32),
            rng.uniform(0.5, 1.5, CHAIN_SHAPE).astype(F32))


# =================================================================================================
# Part 1: chains of elementwise ops
# =================================================================================================
def chain_benchmarks(torch, mode):
    a, b, d = chain_inputs()
    results, counts = {}, {}
    for name, statements in CHAINS.items():
        chain = make_chain(statements)
        fn_np, fn_fl = (np.tanh, fl.tanh) if "tanh" in name else (np.maximum, fl.maximum)
        fa, fb, fd = fl.constant(a), fl.constant(b), fl.constant(d)
        graph = traced(lambda x, c, e: chain(x, c, e, fn_fl), (fa, fb, fd))
        plain = traced(lambda x, c, e: chain(x, c, e, fn_fl), (fa, fb, fd), passes=())
        envs = {
            "numpy": dict(f=lambda: chain(a, b, d, fn_np)),
            "eager": dict(f=lambda: chain(fa, fb, fd, fn_fl)),
            "no passes": dict(f=lambda: plain(fa, fb, fd)),
            "graph": dict(f=lambda: graph(fa, fb, fd)),
        }
        if torch is not None:
            ta, tb, td = (torch.from_numpy(v) for v in (a, b, d))
            fn_t = torch.tanh if "tanh" in name else torch.maximum
            envs["torch"] = dict(f=lambda: chain(ta, tb, td, fn_t))
        want = chain(a, b, d, fn_np)
        values = {}
        for impl, env in envs.items():
            got = env["f"]()
            values[impl] = got = got.numpy() if hasattr(got, "numpy") else np.asarray(got)
            if not np.allclose(got, want, rtol=1e-4, atol=1e-5):
                raise CheckFailed(f"{name}: {impl} gives a different result than numpy")
        compiled = any(getattr(n.op.kernel, "compiled", False)
                       for n in graph.get_concrete_function(fa, fb, fd)._plan.nodes)
        if "tanh" not in name and not np.array_equal(values["graph"], values["no passes"]):
            raise CheckFailed(f"{name}: the graph with passes differs from the one without (arithmetic only: "
                              "compiled or not, the bits must be the same)")
        cases = {impl: (timeit.Timer("f()", globals=env), None, None) for impl, env in envs.items()}
        results[name] = C.min_time_per_call(cases, mode["op_repeats"], mode["op_target"])
        counts[name] = tuple(len(f.get_concrete_function(fa, fb, fd)._plan.nodes) for f in (plain, graph)) + (
            compiled, float(np.max(np.abs(values["graph"] - want))))
    return results, counts


# =================================================================================================
# Part 2: one SGD step of the MLP
# =================================================================================================
def mlp_setup():
    (x_train, y_train), _ = fl.datasets.digits()
    return E.init_params(seed=0), E.batches_of(x_train, y_train, BATCH)


def mlp_steps(params, batches):
    """name -> (step function, its batches, its model): numpy, eager, and the eager model's step
    under ``@fl.function`` compiled without passes and with them."""
    fl_batches = [(fl.constant(x), fl.constant(y)) for x, y in batches]
    numpy_model = E.NumpyMLP(params)
    impls = {"numpy": (numpy_model.step, batches, numpy_model)}
    eager_model = E.FlowlabMLP(params)
    impls["eager"] = (eager_model.step, fl_batches, eager_model)
    for name, passes in (("no passes", ()), ("graph", P.DEFAULT_PASSES)):
        model = E.FlowlabMLP(params)
        impls[name] = (traced(model.step, fl_batches[0], passes), fl_batches, model)
    return impls


def check_mlp(impls, steps=3):
    """Every implementation trains to the same weights in ``steps`` steps from the same start; the
    traced step with passes and without agree bit for bit."""
    weights = {}
    for name, (step, batches, model) in impls.items():
        for x, y in batches[:steps]:
            step(x, y)
        weights[name] = model.params if name == "numpy" else [v.numpy() for v in model.variables]
    worst = 0.0
    for name, ws in weights.items():
        for got, want in zip(ws, weights["eager"]):
            diff = float(np.max(np.abs(got - want)))
            worst = max(worst, diff)
            if not diff <= 1e-5:   # also catches NaN
                raise CheckFailed(f"MLP: {name} weights after {steps} steps differ from eager's by {diff:.2e}")
    for got, want in zip(weights["graph"], weights["no passes"]):
        if not np.array_equal(got, want):
            raise CheckFailed("MLP: the traced step trains differently with passes than without")
    return (f"   check: after {steps} steps from the same weights, numpy, eager, graph without passes and graph "
            f"agree (max abs difference {worst:.1e} <= 1e-5; graph == no passes bit for bit): OK")


def mlp_benchmark(mode):
    params, batches = mlp_setup()
    check = check_mlp(mlp_steps(params, batches))
    runners = {}
    for name, (step, bs, _) in mlp_steps(params, batches).items():
        nxt = itertools.cycle(bs).__next__
        runners[name] = (lambda step=step, nxt=nxt: step(*nxt()))
    counts = {name: C.steps_for(run, mode["mlp_target"], mode["mlp_warmup"]) for name, run in runners.items()}
    return C.median_time_per_step(runners, mode["mlp_repeats"], counts), check


# =================================================================================================
# torch.compile, in a child process (it may need minutes, or a compiler this machine lacks)
# =================================================================================================
def torch_compile_child():
    """Compile the chains and the MLP step with torch.compile, time them, print one JSON line."""
    import torch
    torch.set_num_threads(fl.config.get_blas_threads())
    out, t0 = {}, time.perf_counter()
    a, b, d = (torch.from_numpy(v) for v in chain_inputs())
    for name, statements in CHAINS.items():
        chain = make_chain(statements)
        fn_t = torch.tanh if "tanh" in name else torch.maximum
        compiled = torch.compile(lambda x, c, e, chain=chain, fn_t=fn_t: chain(x, c, e, fn_t))
        compiled(a, b, d)
        n, _ = C.calibrate(timeit.Timer(lambda: compiled(a, b, d)), 0.02)
        out[name] = min(timeit.Timer(lambda: compiled(a, b, d)).repeat(5, n)) / n
    params, batches = mlp_setup()
    nn = torch.nn
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
    with torch.no_grad():
        for layer, w, bias in zip([m for m in model if isinstance(m, nn.Linear)], params[0::2], params[1::2]):
            layer.weight.copy_(torch.from_numpy(w.T.copy()))
            layer.bias.copy_(torch.from_numpy(bias))
    optimizer = torch.optim.SGD(model.parameters(), lr=E.LR)
    loss_of = torch.compile(lambda x, y: torch.nn.functional.cross_entropy(model(x), y))
    tb = [(torch.from_numpy(x), torch.from_numpy(y.astype(np.int64))) for x, y in batches]

    def step(x, y):
        optimizer.zero_grad(set_to_none=True)
        loss = loss_of(x, y)
        loss.backward()
        optimizer.step()
        return loss
    nxt = itertools.cycle(tb).__next__
    run = lambda: step(*nxt())  # noqa: E731
    n = C.steps_for(run, 0.25, 5)
    out["mlp step batch 32"] = C.median_time_per_step({"c": run}, 5, {"c": n})["c"]
    out["compile_s"] = time.perf_counter() - t0
    print(json.dumps(out), flush=True)


def torch_compile_results(torch, mode):
    """name -> seconds per call, or a string saying why torch.compile was skipped."""
    if torch is None:
        return "skipped: torch is not installed"
    if not mode["torch_compile"]:
        return "skipped in --quick mode (compiling takes tens of seconds)"
    try:
        done = subprocess.run([sys.executable, os.path.abspath(__file__), "--torch-compile-child"],
                              capture_output=True, text=True, timeout=COMPILE_LIMIT_S + 30)
    except subprocess.TimeoutExpired:
        return f"skipped: compiling and timing took over {COMPILE_LIMIT_S + 30} s"
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return f"skipped: torch.compile failed on this machine ({last[:160]})"
    result = json.loads(done.stdout.strip().splitlines()[-1])
    if result["compile_s"] > COMPILE_LIMIT_S:
        return f"skipped: torch.compile took {result['compile_s']:.0f} s (over {COMPILE_LIMIT_S} s)"
    return result


# =================================================================================================
# Part 3: what each pass does
# =================================================================================================
def pass_report(mode):
    """For the MLP step and the tanh chain: nodes after each pass, and the plan's time per call
    compiled with the passes up to it (the plan alone, called with arrays)."""
    params, batches = mlp_setup()
    model = E.FlowlabMLP(params)
    x, y = batches[0]
    mlp = fl.function(model.step).get_concrete_function(fl.constant(x), fl.constant(y))
    a, b, d = chain_inputs()
    chain = make_chain(CHAINS["chain100 tanh 64x64"])
    chained = fl.function(lambda x, c, e: chain(x, c, e, fl.tanh)).get_concrete_function(
        fl.constant(a), fl.constant(b), fl.constant(d))
    report = {}
    for name, concrete, args in (("mlp step batch 32", mlp, (x, y)), ("chain100 tanh 64x64", chained, (a, b, d))):
        rows, passes = [], ()
        for label, more in PASS_STEPS:
            passes += more
            t0 = time.perf_counter()
            plan = compile_plan(concrete.graph, concrete.outputs, concrete.inputs, passes=passes)
            compile_s = time.perf_counter() - t0
            timer = timeit.Timer(lambda plan=plan: plan(*args))
            n, _ = C.calibrate(timer, mode["op_target"] * 5)
            per_call = min(timer.repeat(max(2, mode["op_repeats"] // 2), n)) / n
            rows.append((label, len(plan.nodes), compile_s, per_call))
        report[name] = rows
    return report


# =================================================================================================
def print_chain_table(results, counts, compiled, mode):
    say("", f"1. Chains of 100 elementwise ops on {CHAIN_SHAPE[0]}x{CHAIN_SHAPE[1]} float32, microseconds per "
        f"call (min of {mode['op_repeats']} rounds; timeit, gc off)")
    header = ["benchmark", "numpy", "torch", "torch.compile", "eager", "no passes", "graph",
              "eager/graph", "no-passes/graph"]
    rows = []
    for name, r in results.items():
        tc = compiled.get(name) if isinstance(compiled, dict) else None
        rows.append([name, C.fmt_us(r["numpy"]), C.fmt_us(r.get("torch")), C.fmt_us(tc), C.fmt_us(r["eager"]),
                     C.fmt_us(r["no passes"]), C.fmt_us(r["graph"]), C.fmt_ratio(r["eager"], r["graph"]),
                     C.fmt_ratio(r["no passes"], r["graph"])])
    say(*C.table(header, rows))
    say("   eager: fl tensors, no tape; no passes: @fl.function compiled with passes=(); graph: @fl.function "
        "(default passes).",
        "   eager/graph and no-passes/graph: how many times faster the graph is. " +
        "; ".join(f"{name}: {traced_n} nodes, {plan_n} after the passes ({'compiled to C' if comp else 'numpy kernel'})"
                  for name, (traced_n, plan_n, comp, _) in counts.items()) + ".",
        "   check: every implementation within 1e-5 + 1e-4*|x| of numpy; the cheap chain (arithmetic only) "
        "graph == no passes bit for bit; the tanh chain's graph differs from numpy by at most " +
        f"{counts['chain100 tanh 64x64'][3]:.1e}" + (" (compiled tanh: within 2 ULP per op, compounded over 33 tanh)."
                                                     if counts["chain100 tanh 64x64"][2] else "."))


def print_mlp_table(results, check, compiled, mode):
    say("", f"2. One SGD step of the {'-'.join(map(str, E.LAYERS))} MLP of bench/eager.py at batch {BATCH}, "
        f"microseconds per step (median of {mode['mlp_repeats']} rounds, gc on)", check)
    tc = compiled.get("mlp step batch 32") if isinstance(compiled, dict) else None
    r = results
    header = ["benchmark", "numpy", "torch.compile", "eager", "no passes", "graph", "eager/graph",
              "no-passes/graph", "graph/numpy"]
    say(*C.table(header, [["mlp step batch 32", C.fmt_us(r["numpy"]), C.fmt_us(tc), C.fmt_us(r["eager"]),
                           C.fmt_us(r["no passes"]), C.fmt_us(r["graph"]), C.fmt_ratio(r["eager"], r["graph"]),
                           C.fmt_ratio(r["no passes"], r["graph"]), C.fmt_ratio(r["graph"], r["numpy"])]]))
    say("   eager: FlowlabMLP.step of bench/eager.py (GradientTape + SGD); graph: the same method under "
        "@fl.function; numpy: bench/eager.py's hand-written step.")


def print_pass_report(report):
    say("", "3. What each pass does: nodes in the plan and microseconds per call of the plan alone, compiled "
        "with the passes up to that row (cumulative)")
    for name, rows in report.items():
        base = rows[0][3]
        table = [[label, str(nodes), f"{compile_s * 1e3:.1f}", C.fmt_us(t), C.fmt_ratio(base, t)]
                 for label, nodes, compile_s, t in rows]
        say("", f"   {name}")
        say(*("   " + line for line in C.table(["passes", "nodes", "compile ms", "us/call", "traced/this"],
                                                 table)))


def print_targets(chain_results, mlp_results):
    say("", "4. Targets (timings never fail the run; PASS/MISS is for the engine author)")
    rows = []
    for text, kind, key, limit in TARGETS:
        r = mlp_results if kind == "mlp" else chain_results[key]
        ratio = r["eager"] / r["graph"]
        rows.append([text, f"{ratio:.2f}x", f">= {limit:.2f}x", "PASS" if ratio >= limit else "MISS"])
    say(*C.table(["target", "eager/graph", "needed", "result"], rows, left=(0, 3)))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short smoke run (rough numbers, no torch.compile)")
    parser.add_argument("--no-torch", action="store_true", help="skip torch even if it is installed")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    parser.add_argument("--no-compiled-fusion", action="store_true",
                        help="run fused groups with numpy kernels (fl.config.set_compiled_fusion(False)): the 'before'")
    parser.add_argument("--torch-compile-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.no_compiled_fusion:
        fl.config.set_compiled_fusion(False)
    if args.torch_compile_child:
        torch_compile_child()
        return 0

    t_start = time.perf_counter()
    mode_name = "quick" if args.quick else "full"
    mode = MODES[mode_name]
    blas_threads = fl.config.get_blas_threads()
    torch = E.load_torch(args.no_torch, blas_threads)
    say(f"flowlab graph benchmark ({mode_name} run{'; numbers are rough' if args.quick else ''})",
        *C.machine_lines(fl, blas_threads, torch))
    info = fl.config.compiled_fusion_info()
    say("compiled fusion: " + ("off" if not info["enabled"] else "no C compiler found (numpy kernels)"
                               if not info["available"] else f"on ({info['compiler_version']}; {info['flags']}; "
                               f"cache {info['cache_dir']})"))
    compiled = torch_compile_results(torch, mode)
    say("torch.compile: " + (f"compiled and timed in {compiled['compile_s']:.0f} s in a child process"
                             if isinstance(compiled, dict) else compiled))

    chain_results, counts = chain_benchmarks(torch, mode)
    print_chain_table(chain_results, counts, compiled, mode)
    mlp_results, check = mlp_benchmark(mode)
    print_mlp_table(mlp_results, check, compiled, mode)
    report = pass_report(mode)
    print_pass_report(report)
    print_targets(chain_results, mlp_results)
    say("", f"done in {time.perf_counter() - t_start:.1f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"mode": mode_name, "blas_threads": blas_threads, "compiled_fusion": info,
                       "chains_seconds_per_call": chain_results,
                       "mlp_seconds_per_step": mlp_results, "torch_compile": compiled,
                       "passes": {k: [list(r) for r in v] for k, v in report.items()}}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
