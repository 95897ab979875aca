#!/usr/bin/env python
"""flowlab on a GPU (CuPy) beside PyTorch on the same GPU, in one run, printed as ratios
flowlab / peer with the issue's targets beside them:

- small-op latency: a 4x4 add (200 of them per timed run)             target <= 2x torch
- a 50-op elementwise chain on 2048x2048, eager (vs torch eager) and
  traced (@fl.function vs torch.compile)                              target traced <= 1.1x
- the tiled shared-memory matmul kernel (``matmul_tiled``, a teaching
  kernel) vs cuBLAS through CuPy's ``@`` and torch.matmul, 1024 and 4096
- an MLP training step 1024x784-2048-2048-10 with SGD, eager and
  traced, vs torch's eager step                                       target <= 1.2x

    python bench/gpu.py            # on a machine with a CUDA GPU, CuPy and PyTorch (under 4 minutes)
    python bench/gpu.py --quick    # fewer repeats, the matmul at 1024 only (about a minute)

Each row is the minimum of ``--repeat`` timed runs, the device synchronised after each. Every
row first checks that flowlab and its peer computed the same values (CHECK FAILED and exit 1
otherwise); a timing or a missed target never changes the exit status. Without CuPy, a visible
GPU or torch, it says which is missing and exits 0 (``tests/unit/test_bench_gpu_smoke.py``).
"""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np


def _missing() -> str | None:
    from flowlab.core.backends import cupy_backend
    if not cupy_backend.available():
        return cupy_backend.why_unavailable()
    try:
        import torch
    except ImportError:
        return "PyTorch is not installed (the peer this benchmark compares with)"
    if not torch.cuda.is_available():
        return "PyTorch sees no CUDA device"
    return None


def _best(fn, sync, repeat):
    fn()
    sync()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return min(times) * 1e3


def _chain(tanh):
    """A 50-op elementwise chain (the same ops for flowlab and torch): 10 rounds of
    ``x * 0.9 + 0.05``, ``tanh``, ``x * 1.1 - 0.02`` (5 ops each), values kept in range."""
    def chain(x):
        for _ in range(10):
            x = x * 0.9 + 0.05
            x = tanh(x)
            x = x * 1.1 - 0.02
        return x
    return chain


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer repeats, the matmul at 1024 only (about a minute)")
    p.add_argument("--repeat", type=int, default=None, help="timed runs per row (default 20, --quick 5)")
    args = p.parse_args(argv)
    import flowlab as fl

    why = _missing()
    if why is not None:
        print(f"bench/gpu.py: skipped: {why}")
        return 0
    import cupy as cp
    import torch

    repeat = args.repeat or (5 if args.quick else 20)
    sync_fl, sync_torch = cp.cuda.Device().synchronize, torch.cuda.synchronize
    print(f"gpu     : {torch.cuda.get_device_name(0)}; CuPy {cp.__version__}, PyTorch {torch.__version__}")
    rows, failed = [], False

    def row(name, f_fn, p_fn, f_val, p_val, rtol=1e-3, peer="torch eager", target=None, sync_peer=None):
        """Check flowlab's values against the peer's first (CHECK FAILED: exit 1), then time both."""
        nonlocal failed
        a, b = np.asarray(f_val, np.float64), np.asarray(p_val, np.float64)
        scale = max(1.0, float(np.max(np.abs(b)))) if b.size else 1.0
        if a.shape != b.shape or not np.allclose(a, b, rtol=rtol, atol=rtol * scale):
            diff = np.max(np.abs(a - b)) if a.shape == b.shape else f"shapes {a.shape} and {b.shape}"
            print(f"CHECK FAILED: {name}: flowlab and {peer} differ (by up to {diff})")
            failed = True
            return
        rows.append((name, peer, _best(f_fn, sync_fl, repeat), _best(p_fn, sync_peer or sync_torch, repeat),
                     target))

    # 1. small-op latency: a 4x4 add is all per-op overhead; 200 of them per timed run
    x4 = np.arange(16, dtype=np.float32).reshape(4, 4)
    fx4, tx4 = fl.convert_to_tensor(cp.asarray(x4)), torch.tensor(x4, device="cuda")
    row("4x4 add (x200)", lambda: [fx4 + fx4 for _ in range(200)], lambda: [tx4 + tx4 for _ in range(200)],
        (fx4 + fx4).numpy(), (tx4 + tx4).cpu().numpy(), target=("small op", 2.0))

    # 2. a 50-op elementwise chain on 2048x2048: eager, then traced (@fl.function) vs torch.compile
    big = np.random.default_rng(0).standard_normal((2048, 2048)).astype(np.float32)
    fbig, tbig = fl.convert_to_tensor(cp.asarray(big)), torch.tensor(big, device="cuda")
    f_chain, t_chain = _chain(fl.tanh), _chain(torch.tanh)
    row("50-op chain 2048^2 eager", lambda: f_chain(fbig), lambda: t_chain(tbig),
        f_chain(fbig).numpy(), t_chain(tbig).cpu().numpy(), rtol=1e-4)
    f_traced = fl.function(f_chain)
    try:
        t_compiled = torch.compile(t_chain)
        t_val = t_compiled(tbig).cpu().numpy()
    except Exception as e:  # noqa: BLE001 - no Triton or no compiler: say so, keep the rest
        print(f"skipped: torch.compile failed ({type(e).__name__}: {str(e)[:200]})")
    else:
        row("50-op chain 2048^2 traced", lambda: f_traced(fbig), lambda: t_compiled(tbig),
            f_traced(fbig).numpy(), t_val, rtol=1e-4, peer="torch.compile", target=("traced fused chain", 1.1))

    # 3. the tiled shared-memory matmul (a teaching kernel) against cuBLAS (CuPy's @ and torch.matmul)
    try:
        from flowlab.core.backends.cuda_kernels import launch
    except Exception as e:  # noqa: BLE001 - the kernel library is not there yet
        print(f"skipped: tiled matmul: flowlab.core.backends.cuda_kernels.launch is missing ({e})")
    else:
        for n in ((1024,) if args.quick else (1024, 4096)):
            m = np.random.default_rng(n).standard_normal((n, n)).astype(np.float32) / np.sqrt(n)
            A, B, C = cp.asarray(m), cp.asarray(m.T.copy()), cp.empty((n, n), cp.float32)
            tA, tB = torch.tensor(m, device="cuda"), torch.tensor(m.T.copy(), device="cuda")
            grid = ((n + 15) // 16, (n + 15) // 16)
            tiled = lambda: launch("matmul_tiled", grid, (16, 16), (A, B, C, n, n, n))   # noqa: E731
            tiled()
            want = (A @ B).get()
            row(f"tiled matmul {n} vs cupy @", tiled, lambda: A @ B, C.get(), want, peer="cuBLAS (CuPy)",
                sync_peer=sync_fl)
            row(f"tiled matmul {n} vs torch", tiled, lambda: tA @ tB, C.get(), (tA @ tB).cpu().numpy())

    # 4. an MLP training step, 1024x784-2048-2048-10 with SGD: eager and traced vs torch's eager step
    rng = np.random.default_rng(1)
    batch, sizes = 1024, (784, 2048, 2048, 10)
    X = rng.standard_normal((batch, sizes[0])).astype(np.float32)
    Y = (np.arange(batch) % 10).astype(np.int32)
    Ws = [(rng.standard_normal((a, b)) / np.sqrt(a)).astype(np.float32) for a, b in zip(sizes, sizes[1:])]
    fx, fy = fl.convert_to_tensor(cp.asarray(X)), fl.convert_to_tensor(cp.asarray(Y))
    tx_, ty_ = torch.tensor(X, device="cuda"), torch.tensor(Y, device="cuda").long()

    def f_step_for(ws):
        def step():
            with fl.GradientTape() as tape:
                h = fx
                for w in ws[:-1]:
                    h = fl.nn.relu(h @ w)
                loss = fl.reduce_mean(fl.nn.sparse_softmax_cross_entropy_with_logits(fy, h @ ws[-1]))
            for w, g in zip(ws, tape.gradient(loss, ws)):
                w.assign_sub(0.01 * g)
        return step

    tws = [torch.tensor(w, device="cuda", requires_grad=True) for w in Ws]

    def t_step():
        h = tx_
        for w in tws[:-1]:
            h = torch.relu(h @ w)
        loss = torch.nn.functional.cross_entropy(h @ tws[-1], ty_)
        with torch.no_grad():
            for w, g in zip(tws, torch.autograd.grad(loss, tws)):
                w.sub_(0.01 * g)

    eager_ws = [fl.Variable(cp.asarray(w)) for w in Ws]
    traced_ws = [fl.Variable(cp.asarray(w)) for w in Ws]
    f_eager = f_step_for(eager_ws)
    f_traced_step = fl.function(f_step_for(traced_ws))
    f_eager(), f_traced_step(), t_step()      # one step each from the same weights: the same new weights
    t_after = tws[-1].detach().cpu().numpy()
    name = "MLP step 1024x784-2048-2048-10"
    row(name + " eager", f_eager, t_step, eager_ws[-1].numpy(), t_after, target=("MLP step", 1.2))
    row(name + " traced", f_traced_step, t_step, traced_ws[-1].numpy(), t_after, target=("MLP step", 1.2))

    print(f"{'benchmark':34s} {'against':14s} {'flowlab ms':>11s} {'peer ms':>9s} {'ratio':>6s}  target")
    for name, peer, f, t, target in rows:
        goal = "" if target is None else (f"{target[0]} <= {target[1]}x: "
                                          f"{'met' if f / t <= target[1] else 'NOT MET'}")
        print(f"{name:34s} {peer:14s} {f:11.3f} {t:9.3f} {f / t:6.2f}  {goal}")
    print(f"ratio: flowlab / peer, the minimum of {repeat} timed runs each (< 1: flowlab is faster); "
          f"the issue's targets are printed beside their rows")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
