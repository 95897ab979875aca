#!/usr/bin/env python
"""Eager-mode benchmark: flowlab against raw numpy and PyTorch (CPU), in one run.

    python bench/eager.py            # full run, well under 90 s
    python bench/eager.py --quick    # smoke run, a few seconds (numbers are rough)
    python bench/eager.py --profile  # where the flowlab MLP step at batch 32 spends its time

Part 1 times single ops (add and matmul on 4x4 and 64x64, and a chain of 100 elementwise ops on
64x64): flowlab with no tape and inside a GradientTape that watches the input, numpy, and torch
(also with requires_grad, the analogue of a tape). Part 2 times one SGD training step of a
64-256-256-10 MLP on the digits data at batch 32 and 128: flowlab (GradientTape + optimizer),
a hand-written numpy forward/backward/update, and torch (nn.Linear + optim.SGD), all from the
same initial weights, after checking that all three compute the same losses.

Targets are printed with PASS/MISS, but the exit status is 0 whatever the timings are; it is
non-zero only when the implementations disagree (the comparison would not be fair).
See bench/README.md for what each number means.
"""
from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import os
import sys
import time
import timeit

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402

import flowlab as fl  # noqa: E402
import flowlab.datasets  # noqa: E402,F401  (makes fl.datasets available)

F32 = np.float32
LR = 0.1
LAYERS = (64, 256, 256, 10)
BATCHES = (32, 128)
CHAIN_LEN = 100
TAPE_OPS = 50    # at most this many ops (or one chain call) recorded on one GradientTape while timing fl+tape

MODES = {
    #           op_target: seconds per timing sample; op_repeats: rounds (min is kept)
    #           mlp_target: seconds per sample of steps; mlp_repeats: rounds (median is kept);
    #           mlp_warmup: steps run before timing (and before calibrating the step count)
    "full": dict(op_target=0.02, op_repeats=15, mlp_target=0.25, mlp_repeats=11, mlp_warmup=5),
    "quick": dict(op_target=0.001, op_repeats=3, mlp_target=0.01, mlp_repeats=3, mlp_warmup=1),
}

# The targets the engine is held to; ratio = flowlab time / peer time.
TARGETS = [
    ("add 4x4, no tape: flowlab within 2.5x of numpy", "op", "add 4x4", "flowlab", "numpy", 2.5),
    ("add 4x4, no tape: flowlab faster than torch", "op", "add 4x4", "flowlab", "torch", 1.0),
    ("MLP step batch 32: flowlab within 1.5x of numpy", "mlp", 32, "flowlab", "numpy", 1.5),
    ("MLP step batch 128: flowlab within 1.5x of numpy", "mlp", 128, "flowlab", "numpy", 1.5),
]


class CheckFailed(SystemExit):
    """The implementations disagree: the timings would compare different computations."""

    def __init__(self, message):
        print(f"\nCHECK FAILED: {message}", file=sys.stderr, flush=True)
        super().__init__(1)


def load_torch(disabled: bool, threads: int):
    if disabled:
        return None
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(threads)
    return torch


def say(*lines):
    for line in lines:
        print(line, flush=True)


# =================================================================================================
# Part 1: single ops
# =================================================================================================
def make_chain(n=CHAIN_LEN):
    """A straight-line function of ``n`` elementwise ops, cycling add, multiply, tanh; the same code
    runs on numpy arrays, flowlab tensors and torch tensors (``tanh`` is passed in)."""
    kinds = ["x = x + c", "x = x * d", "x = tanh(x)"]
    body = "\n".join(f"    {kinds[i % 3]}" for i in range(n))
    namespace = {}
    exec(f"def chain(x, c, d, tanh):\n{body}\n    return x\n", namespace)  # noqa: S102 - our own code
    return namespace["chain"]


OP_BENCHMARKS = [
    # name, shape, statement (a, b: inputs; d: a second constant for the chain)
    ("add 4x4", (4, 4), "a + b"),
    ("add 64x64", (64, 64), "a + b"),
    ("matmul 4x4", (4, 4), "a @ b"),
    ("matmul 64x64", (64, 64), "a @ b"),
    (f"chain{CHAIN_LEN} 64x64", (64, 64), "chain(a, b, d, tanh)"),
]


@contextlib.contextmanager
def taped(x):
    """An active GradientTape that watches ``x`` (a fresh one per timing sample)."""
    with fl.GradientTape() as tape:
        tape.watch(x)
        yield


def op_benchmarks(torch, mode):
    rng = np.random.default_rng(0)
    chain = make_chain()
    results = {}
    for name, shape, stmt in OP_BENCHMARKS:
        a = rng.uniform(-1, 1, shape).astype(F32)
        b = rng.uniform(-0.5, 0.5, shape).astype(F32)
        d = rng.uniform(0.5, 1.5, shape).astype(F32)
        envs = {
            "numpy": dict(a=a, b=b, d=d, tanh=np.tanh, chain=chain),
            "flowlab": dict(a=fl.constant(a), b=fl.constant(b), d=fl.constant(d), tanh=fl.tanh, chain=chain),
        }
        envs["flowlab+tape"] = envs["flowlab"]
        if torch is not None:
            t = dict(a=torch.tensor(a), b=torch.tensor(b), d=torch.tensor(d), tanh=torch.tanh, chain=chain)
            envs["torch"] = t
            envs["torch+grad"] = dict(t, a=torch.tensor(a, requires_grad=True))
        # the same computation everywhere, or the timings mean nothing
        want = eval(stmt, dict(envs["numpy"]))  # noqa: S307 - our own statement
        for impl, env in envs.items():
            if impl == "flowlab+tape":
                with fl.GradientTape() as tape:
                    tape.watch(env["a"])
                    got = eval(stmt, dict(env))  # noqa: S307
                if tape.gradient(got, env["a"]) is None:
                    raise CheckFailed(f"{name}: the GradientTape recorded nothing, so fl+tape would time the "
                                      "no-tape path")
            else:
                got = eval(stmt, dict(env))  # noqa: S307
            got = got.detach().numpy() if impl.startswith("torch") else np.asarray(got)
            if not np.allclose(got, want, rtol=1e-4, atol=1e-5):
                raise CheckFailed(f"{name}: {impl} gives a different result than numpy "
                                  f"(max abs diff {np.max(np.abs(got - want)):.3g})")
        ops_per_call = CHAIN_LEN if stmt.startswith("chain") else 1
        cases = {}
        for impl, env in envs.items():
            if impl == "flowlab+tape":
                # A tape keeps every recorded output alive: let one tape see at most TAPE_OPS ops, about
                # a training step's worth, so the timing is not of memory growth.
                cases[impl] = (timeit.Timer(stmt, globals=env), lambda env=env: taped(env["a"]),
                               max(1, TAPE_OPS // ops_per_call))
            else:
                cases[impl] = (timeit.Timer(stmt, globals=env), None, None)
        results[name] = C.min_time_per_call(cases, mode["op_repeats"], mode["op_target"])
    return results


def print_op_table(results, mode):
    say("", f"1. Per-op time, microseconds per call (min of {mode['op_repeats']} rounds; timeit, gc off). "
        "Ratios are flowlab time / peer time: below 1.00x flowlab is faster.")
    header = ["benchmark", "numpy", "torch", "flowlab", "fl/numpy", "fl/torch",
              "fl+tape", "tape/numpy", "tape/torch", "torch+grad", "tape/torch+grad"]
    rows = []
    for name, r in results.items():
        np_t, th, fl_t, tp, tg = (r.get(k) for k in ("numpy", "torch", "flowlab", "flowlab+tape", "torch+grad"))
        rows.append([name, C.fmt_us(np_t), C.fmt_us(th), C.fmt_us(fl_t), C.fmt_ratio(fl_t, np_t),
                     C.fmt_ratio(fl_t, th), C.fmt_us(tp), C.fmt_ratio(tp, np_t), C.fmt_ratio(tp, th),
                     C.fmt_us(tg), C.fmt_ratio(tp, tg)])
    say(*C.table(header, rows))
    say(f"   fl+tape: inside a GradientTape watching the input (a fresh tape every {TAPE_OPS} ops, or every "
        "chain call); torch+grad: the input has requires_grad.",
        f"   chain{CHAIN_LEN}: {CHAIN_LEN} ops (x+c, x*d, tanh(x), repeated) per call; divide by "
        f"{CHAIN_LEN} for the time per op.")


# =================================================================================================
# Part 2: one training step of an MLP
# =================================================================================================
def init_params(seed=0):
    """Glorot-uniform weights [fan_in, fan_out] and zero biases, float32: (W1, b1, W2, b2, W3, b3)."""
    rng = np.random.default_rng(seed)
    params = []
    for fan_in, fan_out in zip(LAYERS[:-1], LAYERS[1:]):
        limit = math.sqrt(6.0 / (fan_in + fan_out))
        params += [rng.uniform(-limit, limit, (fan_in, fan_out)).astype(F32), np.zeros(fan_out, F32)]
    return params


class NumpyMLP:
    """The hand-written peer: what a careful numpy programmer writes for this network.

    Forward in place where possible (bias add and relu reuse the matmul's output); the loss
    gradient is softmax minus one-hot, computed in the logits' buffer; the learning rate and the
    1/batch of the mean are folded into that gradient once, so every weight update is a single
    in-place ``W -= a.T @ delta``; biases update in place from column sums."""

    def __init__(self, params, lr=LR):
        self.params = [p.copy() for p in params]
        self.lr = lr
        self._rows = {}

    def step(self, x, y):
        W1, b1, W2, b2, W3, b3 = self.params
        n = x.shape[0]
        rows = self._rows.get(n)
        if rows is None:
            rows = self._rows[n] = np.arange(n)
        # forward
        h1 = x @ W1
        h1 += b1
        np.maximum(h1, 0, out=h1)
        h2 = h1 @ W2
        h2 += b2
        np.maximum(h2, 0, out=h2)
        z = h2 @ W3
        z += b3
        # loss: mean over the batch of logsumexp(z) - z[label], with the max subtracted first
        z -= z.max(axis=1, keepdims=True)
        picked = z[rows, y]
        np.exp(z, out=z)
        total = z.sum(axis=1, keepdims=True)
        loss = np.log(total).mean() - picked.mean()
        # backward: d loss / d z = (softmax - onehot) / n, scaled by lr so updates need no extra pass
        z /= total
        z[rows, y] -= 1
        z *= self.lr / n
        dh2 = z @ W3.T
        dh2 *= h2 > 0
        W3 -= h2.T @ z
        b3 -= z.sum(axis=0)
        dh1 = dh2 @ W2.T
        dh1 *= h1 > 0
        W2 -= h1.T @ dh2
        b2 -= dh2.sum(axis=0)
        W1 -= x.T @ dh1
        b1 -= dh1.sum(axis=0)
        return loss


class FlowlabMLP:
    """flowlab as a user writes it: Variables, a GradientTape, and an SGD optimizer."""

    def __init__(self, params, lr=LR):
        self.variables = [fl.Variable(p) for p in params]
        self.optimizer = fl.optimizers.SGD(lr)

    def step(self, x, y):
        variables = self.variables
        W1, b1, W2, b2, W3, b3 = variables
        with fl.GradientTape() as tape:
            h = fl.nn.relu(x @ W1 + b1)
            h = fl.nn.relu(h @ W2 + b2)
            logits = h @ W3 + b3
            loss = fl.reduce_mean(fl.nn.sparse_softmax_cross_entropy_with_logits(y, logits))
        grads = tape.gradient(loss, variables)
        self.optimizer.apply_gradients(zip(grads, variables))
        return loss


def make_torch_mlp(torch, params, lr=LR):
    """torch as a user writes it: nn.Linear layers, F.cross_entropy, optim.SGD."""
    nn = torch.nn
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
    linears = [m for m in model if isinstance(m, nn.Linear)]
    with torch.no_grad():
        for layer, W, b in zip(linears, params[0::2], params[1::2]):
            layer.weight.copy_(torch.from_numpy(W.T.copy()))   # nn.Linear keeps [out, in]
            layer.bias.copy_(torch.from_numpy(b))
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    cross_entropy = torch.nn.functional.cross_entropy

    def step(x, y):
        optimizer.zero_grad(set_to_none=True)
        loss = cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        return loss

    return step


def batches_of(x, y, size, seed=0):
    """The training set shuffled once (seeded) and cut into full batches."""
    order = np.random.default_rng(seed).permutation(len(y))
    x, y = x[order], y[order]
    n = len(y) // size
    return [(np.ascontiguousarray(x[i * size:(i + 1) * size]), y[i * size:(i + 1) * size].copy())
            for i in range(n)]


def make_steps(torch, params, batches):
    """name -> (step function, that implementation's batches)."""
    impls = {
        "numpy": (NumpyMLP(params).step, batches),
        "flowlab": (FlowlabMLP(params).step, [(fl.constant(x), fl.constant(y)) for x, y in batches]),
    }
    if torch is not None:
        impls["torch"] = (make_torch_mlp(torch, params),
                          [(torch.from_numpy(x), torch.from_numpy(y.astype(np.int64))) for x, y in batches])
    return impls


def _scalar(loss) -> float:
    return float(loss.item() if hasattr(loss, "item") else loss)


def check_losses(impls, size):
    """Every implementation, from the same initial weights, computes the same loss on the first
    batch, and the same loss on the second batch after one SGD step (so the gradient and the
    update agree too). Returns the line to print; raises CheckFailed when they disagree."""
    losses = {}
    for name, (step, batches) in impls.items():
        losses[name] = [_scalar(step(*batches[0])), _scalar(step(*batches[1]))]
    ref = losses["numpy"]
    worst = 0.0
    for name, (first, second) in losses.items():
        for got, want, when in ((first, ref[0], "first batch"), (second, ref[1], "second batch after one step")):
            rel = abs(got - want) / max(abs(want), 1e-12)
            worst = max(worst, rel)
            if not rel <= 1e-4:   # also catches NaN
                raise CheckFailed(f"MLP batch {size}: {name} loss on the {when} is {got!r}, numpy's is "
                                  f"{want!r} (relative difference {rel:.2e} > 1e-4)")
    shown = ", ".join(f"{name} {first:.6f}" for name, (first, _) in losses.items())
    shown2 = ", ".join(f"{name} {second:.6f}" for name, (_, second) in losses.items())
    return (f"   check batch {size}: first-batch loss {shown}; after one step {shown2}; "
            f"max relative difference {worst:.1e} <= 1e-4: OK")


def mlp_benchmarks(torch, mode):
    (x_train, y_train), _ = fl.datasets.digits()
    params = init_params(seed=0)
    results, checks = {}, []
    for size in BATCHES:
        batches = batches_of(x_train, y_train, size)
        checks.append(check_losses(make_steps(torch, params, batches), size))
        impls = make_steps(torch, params, batches)   # fresh models from the same initial weights
        runners = {}
        for name, (step, bs) in impls.items():
            nxt = itertools.cycle(bs).__next__
            runners[name] = (lambda step=step, nxt=nxt: step(*nxt()))
        counts = {name: C.steps_for(run, mode["mlp_target"], mode["mlp_warmup"]) for name, run in runners.items()}
        results[size] = C.median_time_per_step(runners, mode["mlp_repeats"], counts)
    return results, checks


def print_mlp_table(results, checks, mode):
    say("", f"2. One SGD training step of a {'-'.join(map(str, LAYERS))} MLP (relu, sparse softmax "
        f"cross-entropy, lr {LR}) on fl.datasets.digits()",
        f"   samples per second (higher is better) and microseconds per step; median of "
        f"{mode['mlp_repeats']} rounds, gc on. Ratios are flowlab time / peer time.")
    say(*checks)
    header = ["benchmark", "numpy/s", "torch/s", "flowlab/s", "numpy us", "torch us", "flowlab us",
              "fl/numpy", "fl/torch"]
    rows = []
    for size, r in results.items():
        np_t, th, fl_t = r.get("numpy"), r.get("torch"), r.get("flowlab")
        sps = [f"{size / t:,.0f}" if t else "n/a" for t in (np_t, th, fl_t)]
        rows.append([f"mlp step batch {size}", *sps, C.fmt_us(np_t), C.fmt_us(th), C.fmt_us(fl_t),
                     C.fmt_ratio(fl_t, np_t), C.fmt_ratio(fl_t, th)])
    say(*C.table(header, rows))


# =================================================================================================
def print_targets(op_results, mlp_results):
    say("", "3. Targets (timings never fail the run; PASS/MISS is for the engine author)")
    rows = []
    for text, kind, key, mine, peer, limit in TARGETS:
        r = (op_results if kind == "op" else mlp_results)[key]
        strict = limit == 1.0            # "faster than": strictly below 1.00x
        needed = f"{'<' if strict else '<='} {limit:.2f}x"
        if r.get(peer) is None:
            rows.append([text, "n/a", needed, "n/a (torch not installed)"])
            continue
        ratio = r[mine] / r[peer]
        ok = ratio < limit if strict else ratio <= limit
        rows.append([text, f"{ratio:.2f}x", needed, "PASS" if ok else "MISS"])
    say(*C.table(["target", "flowlab/peer", "needed", "result"], rows, left=(0, 3)))


def profile_mlp(steps: int):
    """Profile the flowlab MLP step at batch 32 with pyinstrument: the call tree, then flowlab's
    functions by self time."""
    try:
        import pyinstrument
    except ImportError:
        sys.exit("--profile needs pyinstrument: .venv/bin/pip install pyinstrument (or `make bench`)")
    (x_train, y_train), _ = fl.datasets.digits()
    model = FlowlabMLP(init_params(seed=0))
    batches = [(fl.constant(x), fl.constant(y)) for x, y in batches_of(x_train, y_train, 32)]
    nxt = itertools.cycle(batches).__next__
    for _ in range(20):
        model.step(*nxt())
    profiler = pyinstrument.Profiler(interval=0.0001)
    t0 = time.perf_counter()
    profiler.start()
    for _ in range(steps):
        model.step(*nxt())
    profiler.stop()
    per_step = (time.perf_counter() - t0) / steps
    say(f"flowlab MLP step, batch 32: {steps} steps profiled, {per_step * 1e6:.0f} us per step "
        f"(with the profiler running)", "")
    say(profiler.output_text(unicode=False, color=False, show_all=False))
    # Functions that are op kernels (the numpy work of an op) are marked, so the rest reads as
    # flowlab's own overhead. A kernel that is a bare ufunc (add's np.add) has no Python frame:
    # its time shows as self time of the function that called it (execute, or a fast-path fn).
    from flowlab.core import execute as _execute
    kernels = {(os.path.realpath(op.kernel.__code__.co_filename), op.kernel.__code__.co_firstlineno)
               for op in _execute._OPS.values() if hasattr(op.kernel, "__code__")}
    totals = {}

    def walk(frame):
        if not frame.is_synthetic:
            key = (frame.function, frame.file_path or "", frame.line_no or 0)
            totals[key] = totals.get(key, 0.0) + frame.total_self_time
        for child in frame.children:
            walk(child)

    walk(profiler.last_session.root_frame(trim_stem=False))
    total = sum(totals.values()) or 1e-12
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    rows = []
    for (fn, path, line), t in sorted(totals.items(), key=lambda kv: -kv[1])[:30]:
        where = os.path.relpath(path, root) if path.startswith(root) else os.path.basename(path)
        tag = "kernel" if (os.path.realpath(path), line) in kernels else (
            "flowlab" if "flowlab" in where.split(os.sep)[0] else "")
        rows.append([f"{fn}  ({where}:{line})", tag, f"{t / steps * 1e6:.1f}", f"{100 * t / total:.1f}%"])
    say("Self time by function, top 30 (per step; 'kernel' = an op's kernel function, i.e. numpy work;"
        " a bare-ufunc kernel such as add's counts in its caller):")
    say(*C.table(["function", "kind", "us/step", "share"], rows, left=(0, 1)))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short smoke run (rough numbers)")
    parser.add_argument("--no-torch", action="store_true", help="skip torch even if it is installed")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    parser.add_argument("--profile", action="store_true",
                        help="instead of the benchmark, profile the flowlab MLP step at batch 32 (pyinstrument)")
    parser.add_argument("--profile-steps", type=int, default=2000, help="steps to profile (default 2000)")
    args = parser.parse_args(argv)

    if args.profile:
        profile_mlp(args.profile_steps)
        return 0

    t_start = time.perf_counter()
    mode_name = "quick" if args.quick else "full"
    mode = MODES[mode_name]
    blas_threads = fl.config.get_blas_threads()   # read before torch loads libraries of its own
    torch = load_torch(args.no_torch, blas_threads)
    say(f"flowlab eager benchmark ({mode_name} run{'; numbers are rough' if args.quick else ''})",
        *C.machine_lines(fl, blas_threads, torch))

    op_results = op_benchmarks(torch, mode)
    print_op_table(op_results, mode)
    mlp_results, checks = mlp_benchmarks(torch, mode)
    print_mlp_table(mlp_results, checks, mode)
    print_targets(op_results, mlp_results)
    elapsed = time.perf_counter() - t_start
    say("", f"done in {elapsed:.1f} s")

    if args.json:
        with open(args.json, "w") as f:
            json.dump({"mode": mode_name, "blas_threads": blas_threads, "cores": C.usable_cores(),
                       "numpy": np.__version__, "torch": getattr(torch, "__version__", None),
                       "ops_seconds_per_call": op_results,
                       "mlp_seconds_per_step": {str(k): v for k, v in mlp_results.items()}}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
