"""Helpers shared by the benchmarks in bench/: machine description, timing, formatting.

Timing rules (see bench/README.md):
- Micro-benchmarks use ``timeit`` (which switches the garbage collector off while it times),
  with a loop count calibrated so that one sample lasts about ``target`` seconds. The
  implementations take turns, one sample each per round, so slow drift in machine speed
  affects them all alike. The reported figure is the **minimum** over the rounds, which is
  the cost of the call without interference.
- Whole training steps are timed with ``time.perf_counter`` and the collector left **on**, as it
  is in a real training loop. The reported figure is the **median** over the rounds.
"""
from __future__ import annotations

import contextlib
import gc
import os
import platform
import statistics
import sys
import time
import timeit


# -- the machine --------------------------------------------------------------------------------
def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def machine_lines(fl, blas_threads: int, torch=None) -> list[str]:
    """What the numbers depend on: CPU, cores, BLAS and its thread count, library versions."""
    import numpy as np

    blas = ", ".join(f"{lib.get('internal_api')} {lib.get('version')} ({lib.get('architecture')}, "
                     f"{lib.get('num_threads')} threads)" for lib in fl.config.blas_info()) or "unknown"
    lines = [
        f"machine : {cpu_model()}; {usable_cores()} usable cores (os.cpu_count() = {os.cpu_count()})",
        f"python  : {platform.python_implementation()} {platform.python_version()} on {sys.platform}",
        f"numpy   : {np.__version__}; BLAS {blas}",
        f"flowlab : {fl.__version__}; fl.config.get_blas_threads() = {blas_threads}",
    ]
    try:
        load = os.getloadavg()[0]
        busy = load > 0.5 * usable_cores()
        lines.append(f"load    : {load:.2f} (1-minute load average)" +
                     ("; other processes compete for the cores, so timings are noisy" if busy else ""))
    except OSError:
        pass
    if torch is None:
        lines.append("torch   : not installed (`.venv/bin/pip install torch==2.13.0`, or `make bench`); "
                     "torch columns show n/a")
    else:
        lines.append(f"torch   : {torch.__version__}; torch.set_num_threads({torch.get_num_threads()}) "
                     f"to match BLAS")
    return lines


# -- timing ---------------------------------------------------------------------------------------
def calibrate(timer: timeit.Timer, target: float, context=None, cap=None) -> tuple[int, float]:
    """A loop count for which ``timer.timeit(number)`` lasts at least ``target`` seconds (but at
    most ``cap`` calls), and the seconds per call seen while finding it."""
    number = 1
    while True:
        with (context() if context else contextlib.nullcontext()):
            elapsed = timer.timeit(number)
        if elapsed >= target or number >= (cap or 1 << 24):
            return number, elapsed / number
        # aim a little past the target, growing by at most 10x per try
        number = int(number * min(10.0, max(2.0, 1.2 * target / max(elapsed, 1e-9))))
        if cap:
            number = min(number, cap)


def min_time_per_call(cases: dict, repeats: int, target: float) -> dict:
    """``cases``: name -> (timeit.Timer, context factory or None, cap or None). Returns name ->
    seconds per call, the minimum over ``repeats`` rounds in which every case takes one turn.

    Each sample runs inside a fresh context from the factory. ``cap`` limits the calls per sample
    (e.g. how many ops one GradientTape records, since a tape keeps every output alive); such a
    case takes several capped samples per round, until its turn has lasted about ``target``."""
    plan = {}
    for name, (timer, ctx, cap) in cases.items():
        number, per_call = calibrate(timer, target, ctx, cap)
        plan[name] = (number, max(1, min(1000, round(target / max(number * per_call, 1e-9)))))
    best = {name: float("inf") for name in cases}
    for _ in range(repeats):
        for name, (timer, ctx, _cap) in cases.items():
            number, samples = plan[name]
            for _ in range(samples):
                with (ctx() if ctx else contextlib.nullcontext()):
                    elapsed = timer.timeit(number)
                best[name] = min(best[name], elapsed / number)
    return best


def median_time_per_step(steps: dict, repeats: int, steps_per_sample: dict) -> dict:
    """``steps``: name -> a callable that runs one step (no arguments). Garbage collection stays on.
    Returns name -> seconds per step, the median over ``repeats`` rounds of ``steps_per_sample[name]``
    steps each, the names taking turns within each round."""
    samples = {name: [] for name in steps}
    was_enabled = gc.isenabled()
    gc.enable()
    try:
        for _ in range(repeats):
            for name, step in steps.items():
                n = steps_per_sample[name]
                t0 = time.perf_counter()
                for _ in range(n):
                    step()
                samples[name].append((time.perf_counter() - t0) / n)
    finally:
        if not was_enabled:
            gc.disable()
    return {name: statistics.median(s) for name, s in samples.items()}


def steps_for(step, target: float, warmup: int = 3) -> int:
    """Run ``step`` ``warmup`` times, then return how many steps last about ``target`` seconds."""
    for _ in range(warmup):
        step()
    n, elapsed = 1, 0.0
    while True:
        t0 = time.perf_counter()
        for _ in range(n):
            step()
        elapsed = time.perf_counter() - t0
        if elapsed >= target / 4 or n >= 1 << 20:
            break
        n *= 2
    return max(1, round(n * target / max(elapsed, 1e-9)))


# -- formatting ------------------------------------------------------------------------------------
def fmt_us(seconds) -> str:
    if seconds is None:
        return "n/a"
    us = seconds * 1e6
    return f"{us:.2f}" if us < 10 else f"{us:.1f}" if us < 1000 else f"{us:,.0f}"


def fmt_ratio(num, den) -> str:
    """``num / den`` as '1.23x' (how many times longer ``num`` takes); 'n/a' when either is missing."""
    if num is None or den is None or den == 0:
        return "n/a"
    return f"{num / den:.2f}x"


def table(header: list[str], rows: list[list[str]], left=(0,)) -> list[str]:
    """A plain-text table: the columns whose index is in ``left`` left-aligned, the rest right-aligned."""
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]

    def line(cells):
        return "  ".join(str(c).ljust(w) if i in left else str(c).rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return [line(header), rule, *(line(r) for r in rows)]
