#!/usr/bin/env python
"""flowlab on a GPU (CuPy) against PyTorch on the same GPU, in one run: eager ops at three sizes,
100 tiny adds (the per-op overhead) and one MLP training step with a tape, each the minimum of
``--repeat`` timed runs (the device synchronised after each), with the ratio flowlab / torch.

    python bench/gpu.py            # on a machine with a CUDA GPU, CuPy and PyTorch
    python bench/gpu.py --quick    # smaller sizes, fewer repeats

Every row first checks that flowlab and torch computed the same values (CHECK FAILED and exit 1
otherwise); a timing never changes the exit status. Without CuPy, a visible GPU or torch, it says
which is missing and exits 0 (``tests/unit/test_bench_gpu_smoke.py`` checks that message here).
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


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="smaller sizes, fewer repeats")
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

    def row(name, f_fn, t_fn, f_val, t_val, rtol=1e-3):
        nonlocal failed
        a, b = np.asarray(f_val), np.asarray(t_val)
        if not np.allclose(a, b, rtol=rtol, atol=rtol):
            print(f"CHECK FAILED: {name}: flowlab and torch differ by up to {np.max(np.abs(a - b)):.3g}")
            failed = True
        rows.append((name, _best(f_fn, sync_fl, repeat), _best(t_fn, sync_torch, repeat)))

    for n in ((256, 1024) if args.quick else (256, 2048, 8192)):
        a = np.random.default_rng(0).standard_normal((n, n)).astype(np.float32) / np.sqrt(n)
        fa, ta = fl.convert_to_tensor(cp.asarray(a)), torch.tensor(a, device="cuda")
        f = lambda: fl.nn.softmax(fl.nn.relu(fa @ fa) + 1.0)        # noqa: E731
        t = lambda: torch.softmax(torch.relu(ta @ ta) + 1.0, -1)     # noqa: E731
        row(f"matmul+relu+softmax {n}", f, t, f().numpy(), t().cpu().numpy())
        f = lambda: fl.reduce_sum(fa * 2.0 + 1.0)                    # noqa: E731
        t = lambda: (ta * 2.0 + 1.0).sum()                           # noqa: E731
        row(f"elementwise+sum {n}", f, t, f().numpy(), t().cpu().numpy(), rtol=1e-2)
    x, tx = fl.convert_to_tensor(cp.ones((16,), cp.float32)), torch.ones(16, device="cuda")
    row("100 tiny adds", lambda: [x + x for _ in range(100)], lambda: [tx + tx for _ in range(100)],
        (x + x).numpy(), (tx + tx).cpu().numpy())

    rng = np.random.default_rng(1)
    batch, d_in, hidden = (256, 128, 256) if args.quick else (1024, 512, 1024)
    X = rng.standard_normal((batch, d_in)).astype(np.float32)
    Y = (np.arange(batch) % 10).astype(np.int32)
    W1 = (rng.standard_normal((d_in, hidden)) * 0.03).astype(np.float32)
    W2 = (rng.standard_normal((hidden, 10)) * 0.03).astype(np.float32)
    fx, fy = fl.convert_to_tensor(cp.asarray(X)), fl.convert_to_tensor(cp.asarray(Y))
    fw1, fw2 = fl.Variable(cp.asarray(W1)), fl.Variable(cp.asarray(W2))
    tx_, ty_ = torch.tensor(X, device="cuda"), torch.tensor(Y, device="cuda").long()
    tw1 = torch.tensor(W1, device="cuda", requires_grad=True)
    tw2 = torch.tensor(W2, device="cuda", requires_grad=True)

    def f_step():
        with fl.GradientTape() as tape:
            logits = fl.nn.relu(fx @ fw1) @ fw2
            loss = fl.reduce_mean(fl.nn.sparse_softmax_cross_entropy_with_logits(fy, logits))
        g1, g2 = tape.gradient(loss, [fw1, fw2])
        fw1.assign_sub(0.01 * g1)
        fw2.assign_sub(0.01 * g2)

    def t_step():
        loss = torch.nn.functional.cross_entropy(torch.relu(tx_ @ tw1) @ tw2, ty_)
        g1, g2 = torch.autograd.grad(loss, [tw1, tw2])
        with torch.no_grad():
            tw1.sub_(0.01 * g1)
            tw2.sub_(0.01 * g2)

    f_step(), t_step()       # one step each from the same weights: the same new weights
    row(f"MLP step {batch}x{d_in}x{hidden}x10", f_step, t_step, fw2.numpy(), tw2.detach().cpu().numpy())

    print(f"{'benchmark':32s} {'flowlab ms':>11s} {'torch ms':>9s} {'ratio':>6s}")
    for name, f, t in rows:
        print(f"{name:32s} {f:11.3f} {t:9.3f} {f / t:6.2f}")
    print("ratio: flowlab / torch, minimum of", repeat, "runs each (< 1: flowlab is faster)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
