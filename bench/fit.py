#!/usr/bin/env python
"""Model.fit benchmark: samples per second of ``fit`` for the 64-256-256-10 MLP of bench/eager.py on
the digits data, beside a hand-written numpy training loop and PyTorch (CPU), in one run.

    python bench/fit.py            # full run, about a minute
    python bench/fit.py --quick    # smoke run, a few seconds (numbers are rough)
    python bench/fit.py --profile  # where fit spends its time at batch 32 (pyinstrument)

Every implementation does the same work per epoch: shuffle the 1437 training examples, cut them
into batches of 32 or 128 (the last one smaller), and take one SGD step (lr 0.1, sparse softmax
cross-entropy) per batch, keeping the epoch's mean loss. flowlab runs ``model.fit(...,
verbose=0)`` (its step a traced ``@fl.function``; also with ``run_eagerly=True``); numpy runs
bench/eager.py's hand-written forward/backward/update; torch runs nn.Linear layers with
optim.SGD. Before timing, all of them train 2 epochs without shuffling from the same weights and
must end with the same losses and weights.

Targets are printed with PASS/MISS; the exit status is 0 whatever the timings are, and non-zero
only when the implementations disagree. See bench/README.md for what each number means.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402
import eager as E  # noqa: E402  (the MLP's weights, its numpy step and its torch model are eager.py's)

import flowlab as fl  # noqa: E402
import flowlab.datasets  # noqa: E402,F401

BATCHES = (32, 128)
MODES = {
    # target: seconds of training per timing sample; rounds: samples per implementation (median kept);
    # warmup_epochs: epochs run after the check, before timing; check_epochs: the unshuffled check's
    "full": dict(target=0.6, rounds=7, warmup_epochs=2, check_epochs=2),
    "quick": dict(target=0.03, rounds=2, warmup_epochs=0, check_epochs=1),
}
IMPLS = ["numpy", "torch", "flowlab", "flowlab eager"]
# (text, batch, peer, limit): flowlab fit time / peer time must be <= limit
TARGETS = [
    ("fit batch 128: flowlab at least as fast as torch", 128, "torch", 1.0),
    ("fit batch 32: flowlab within 1.2x of numpy", 32, "numpy", 1.2),
    ("fit batch 128: flowlab within 1.2x of numpy", 128, "numpy", 1.2),
]

say = E.say
CheckFailed = E.CheckFailed


def order_of(seed, epoch, n):
    return np.random.default_rng([seed, epoch]).permutation(n)


# -- the peers --------------------------------------------------------------------------------------
class NumpyLoop:
    """The hand-written loop: shuffle, slice batches, bench/eager.py's NumpyMLP.step, mean loss."""

    def __init__(self, params, x, y, batch):
        self.net, self.x, self.y, self.batch = E.NumpyMLP(params), x, y, batch

    def epochs(self, count, seed=0, shuffle=True):
        n, bs, losses = len(self.y), self.batch, []
        for e in range(count):
            x, y = self.x, self.y
            if shuffle:
                order = order_of(seed, e, n)
                x, y = x[order], y[order]
            total = 0.0
            for i in range(0, n, bs):
                total += float(self.net.step(x[i:i + bs], y[i:i + bs])) * len(y[i:i + bs])
            losses.append(total / n)
        return losses

    def weights(self):
        return self.net.params


class TorchLoop:
    """torch as a user writes it: nn.Linear layers, F.cross_entropy, optim.SGD; the shuffled tensors
    indexed per batch, and ``loss.item()`` kept for the epoch's mean."""

    def __init__(self, torch, params, x, y, batch):
        nn = torch.nn
        self.torch = torch
        self.model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
        self.linears = [m for m in self.model if isinstance(m, nn.Linear)]
        with torch.no_grad():
            for layer, w, b in zip(self.linears, params[0::2], params[1::2]):
                layer.weight.copy_(torch.from_numpy(w.T.copy()))     # nn.Linear keeps [out, in]
                layer.bias.copy_(torch.from_numpy(b))
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=E.LR)
        self.x, self.y = torch.from_numpy(x), torch.from_numpy(y.astype(np.int64))
        self.batch = batch

    def epochs(self, count, seed=0, shuffle=True):
        torch, n, bs, losses = self.torch, len(self.y), self.batch, []
        model, optimizer, cross_entropy = self.model, self.optimizer, torch.nn.functional.cross_entropy
        for e in range(count):
            x, y = self.x, self.y
            if shuffle:
                order = torch.from_numpy(order_of(seed, e, n))
                x, y = x[order], y[order]
            total = 0.0
            for i in range(0, n, bs):
                xb, yb = x[i:i + bs], y[i:i + bs]
                optimizer.zero_grad(set_to_none=True)
                loss = cross_entropy(model(xb), yb)
                loss.backward()
                optimizer.step()
                total += loss.item() * len(yb)
            losses.append(total / n)
        return losses

    def weights(self):
        out = []
        for layer in self.linears:
            out += [layer.weight.detach().numpy().T.copy(), layer.bias.detach().numpy().copy()]
        return out


class FlowlabFit:
    """``model.fit`` of a Sequential of Dense layers with the same weights."""

    def __init__(self, params, x, y, batch, eager=False):
        L = fl.keras.layers
        self.model = fl.keras.Sequential([fl.keras.Input(shape=(64,)), L.Dense(256, activation="relu"),
                                          L.Dense(256, activation="relu"), L.Dense(10)])
        self.model.set_weights(params)
        self.model.compile(fl.optimizers.SGD(E.LR), fl.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                           run_eagerly=eager)
        self.x, self.y, self.batch = x, y, batch

    def epochs(self, count, seed=0, shuffle=True):
        h = self.model.fit(self.x, self.y, batch_size=self.batch, epochs=count, verbose=0, shuffle=shuffle)
        return h.history["loss"]

    def weights(self):
        return self.model.get_weights()


def make(name, torch, params, x, y, batch):
    if name == "numpy":
        return NumpyLoop(params, x, y, batch)
    if name == "torch":
        return TorchLoop(torch, params, x, y, batch) if torch is not None else None
    return FlowlabFit(params, x, y, batch, eager=name == "flowlab eager")


# -- checking and timing ----------------------------------------------------------------------------
def check(impls, batch, epochs):
    """Unshuffled epochs from the same weights: the same epoch losses and final weights everywhere."""
    results = {name: (impl.epochs(epochs, shuffle=False), impl.weights()) for name, impl in impls.items()}
    ref_losses, ref_weights = results["numpy"]
    worst = 0.0
    for name, (losses, weights) in results.items():
        for e, (got, want) in enumerate(zip(losses, ref_losses)):
            rel = abs(got - want) / abs(want)
            worst = max(worst, rel)
            if not rel <= 1e-4:
                raise CheckFailed(f"fit batch {batch}: {name} epoch {e} loss {got!r}, numpy's {want!r}")
        for i, (got, want) in enumerate(zip(weights, ref_weights)):
            diff = float(np.max(np.abs(np.asarray(got) - want)))
            if not diff <= 1e-3:
                raise CheckFailed(f"fit batch {batch}: {name} weight {i} differs from numpy's by {diff:.3g}")
    losses = ", ".join(f"{name} {r[0][-1]:.6f}" for name, r in results.items())
    return (f"   check batch {batch}: {epochs} unshuffled epoch(s) from the same weights, last epoch's loss "
            f"{losses}; max relative difference {worst:.1e} <= 1e-4, weights within 1e-3: OK")


def time_fit(impls, n, mode):
    """samples per second of each implementation: the median of ``rounds`` samples, taking turns."""
    for impl in impls.values():
        if mode["warmup_epochs"]:
            impl.epochs(mode["warmup_epochs"], seed=1)
    per_epoch = {}
    for name, impl in impls.items():
        t0 = time.perf_counter()
        impl.epochs(1, seed=2)
        per_epoch[name] = time.perf_counter() - t0
    counts = {name: max(1, round(mode["target"] / max(t, 1e-9))) for name, t in per_epoch.items()}
    samples = {name: [] for name in impls}
    seed = 3
    for _ in range(mode["rounds"]):
        for name, impl in impls.items():
            t0 = time.perf_counter()
            impl.epochs(counts[name], seed=seed)
            samples[name].append(counts[name] * n / (time.perf_counter() - t0))
            seed += 1
    return {name: float(np.median(s)) for name, s in samples.items()}


def print_table(results, checks, mode):
    say("", "1. Model.fit of the 64-256-256-10 MLP on fl.datasets.digits() (1437 examples; SGD lr 0.1, sparse "
        "softmax cross-entropy; shuffled every epoch)",
        f"   samples per second (higher is better), median of {mode['rounds']} samples of about {mode['target']} s. "
        "Ratios are flowlab fit time / peer time: below 1.00x flowlab is faster.")
    say(*checks)
    header = ["benchmark", "numpy/s", "torch/s", "flowlab/s", "eager/s", "fl/numpy", "fl/torch", "eager/graph"]
    rows = []
    for batch, r in results.items():
        def rate(name):
            return f"{r[name]:,.0f}" if r.get(name) else "n/a"

        def ratio(peer):                      # time ratio = inverse of the rate ratio
            return C.fmt_ratio(r.get(peer), r.get("flowlab"))

        rows.append([f"fit batch {batch}", rate("numpy"), rate("torch"), rate("flowlab"), rate("flowlab eager"),
                     ratio("numpy"), ratio("torch"), C.fmt_ratio(r.get("flowlab"), r.get("flowlab eager"))])
    say(*C.table(header, rows))
    say("   flowlab: model.fit(verbose=0), the step a traced @fl.function; eager: the same with run_eagerly=True;"
        " eager/graph: how many times longer eager takes.")


def print_targets(results):
    say("", "2. Targets (timings never fail the run; PASS/MISS is for the engine author)")
    rows = []
    for text, batch, peer, limit in TARGETS:
        r = results[batch]
        needed = f"<= {limit:.2f}x"
        if r.get(peer) is None:
            rows.append([text, "n/a", needed, "n/a (torch not installed)"])
            continue
        ratio = r[peer] / r["flowlab"]          # flowlab time / peer time
        rows.append([text, f"{ratio:.2f}x", needed, "PASS" if ratio <= limit else "MISS"])
    say(*C.table(["target", "flowlab/peer", "needed", "result"], rows, left=(0, 3)))


def profile(batch=32, epochs=30):
    try:
        import pyinstrument
    except ImportError:
        sys.exit("--profile needs pyinstrument: .venv/bin/pip install pyinstrument (or `make bench`)")
    (x, y), _ = fl.datasets.digits()
    impl = FlowlabFit(E.init_params(0), x, y, batch)
    impl.epochs(2)
    profiler = pyinstrument.Profiler(interval=0.0002)
    t0 = time.perf_counter()
    profiler.start()
    impl.epochs(epochs)
    profiler.stop()
    say(f"flowlab fit, batch {batch}: {epochs} epochs profiled, {epochs * len(y) / (time.perf_counter() - t0):,.0f} "
        "samples/s (with the profiler running)", "")
    say(profiler.output_text(unicode=False, color=False, show_all=False))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short smoke run (rough numbers)")
    parser.add_argument("--no-torch", action="store_true", help="skip torch even if it is installed")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    parser.add_argument("--profile", action="store_true", help="instead, profile fit at batch 32 (pyinstrument)")
    args = parser.parse_args(argv)
    if args.profile:
        profile()
        return 0

    t_start = time.perf_counter()
    mode_name = "quick" if args.quick else "full"
    mode = MODES[mode_name]
    blas_threads = fl.config.get_blas_threads()
    torch = E.load_torch(args.no_torch, blas_threads)
    say(f"flowlab fit benchmark ({mode_name} run{'; numbers are rough' if args.quick else ''})",
        *C.machine_lines(fl, blas_threads, torch),
        "blas    : warmed by `import flowlab` (one 128x256x512 matmul; see flowlab/core/config.py)")
    (x, y), _ = fl.datasets.digits()
    params = E.init_params(seed=0)
    results, checks = {}, []
    for batch in BATCHES:
        impls = {name: make(name, torch, params, x, y, batch) for name in IMPLS}
        impls = {k: v for k, v in impls.items() if v is not None}
        checks.append(check(impls, batch, mode["check_epochs"]))       # also the first, untimed epochs
        results[batch] = time_fit(impls, len(y), mode)
    print_table(results, checks, mode)
    print_targets(results)
    say("", f"done in {time.perf_counter() - t_start:.1f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"mode": mode_name, "blas_threads": blas_threads, "cores": C.usable_cores(),
                       "torch": getattr(torch, "__version__", None),
                       "samples_per_second": {str(k): v for k, v in results.items()}}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
