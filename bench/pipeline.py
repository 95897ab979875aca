#!/usr/bin/env python
"""Input-pipeline benchmark: does a parallel map with prefetch hide the input pipeline behind training?

    python bench/pipeline.py           # full run: 20,000 elements, 3 rounds (about a minute)
    python bench/pipeline.py --quick   # smoke run: 2,000 elements, 1 round (a few seconds; rough numbers)

Each element costs about 200 us of numpy work in ``map`` (a tanh over a float32 array, which
releases the GIL as real preprocessing does); elements are batched by 64, and the consumer spends
5 ms per batch, as a training step running on an accelerator, during which the host is free (a
sleep). Rows: the consumer alone, the producer alone (the parallel pipeline drained as fast as
possible), the sequential pipeline, and parallel map + prefetch with AUTOTUNE and with a fixed
worker per core, with stats on and off (and, with ``--processes``, the map in worker processes).
The ideal is max(producer alone, consumer alone): what perfect overlap would give. Every figure is
the minimum over the rounds, which take turns. tf.data runs the same work in the same process
when TensorFlow is installed (skipped with a note otherwise).

Targets are printed with PASS/MISS, but the exit status is 0 whatever the timings are; it is 1 only
when the pipelines disagree on the data (CHECK FAILED). See bench/README.md.
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

import flowlab as fl  # noqa: E402

BATCH = 64
STEP_S = 0.005        # the consumer's time per batch
WORK_S = 200e-6       # the map's target cost per element
OUT = 16              # values each element keeps

MODES = {
    "full": dict(elements=20_000, rounds=3),
    "quick": dict(elements=2_000, rounds=1),
}

TARGETS = [
    # (text, row, peer row, limit): ratio = row time / peer time
    ("parallel map + prefetch (AUTOTUNE) within 10% of the ideal", "parallel AUTOTUNE", "ideal", 1.10),
    ("parallel map + prefetch (AUTOTUNE) no slower than tf.data", "parallel AUTOTUNE", "tf.data AUTOTUNE", 1.00),
]


class CheckFailed(SystemExit):
    def __init__(self, message):
        print(f"\nCHECK FAILED: {message}", file=sys.stderr, flush=True)
        super().__init__(1)


# -- the work ----------------------------------------------------------------------------------------
class Work:
    """``work(x)``: a tanh over ``size`` float32 values scaled by x; ``size`` is chosen so that one call
    costs about ``target`` seconds on this machine. Picklable (a module-level class), so the process
    row can use it too."""

    def __init__(self, size: int):
        self.size = size
        self.base = np.linspace(-3.0, 3.0, size, dtype=np.float32)
        self.stride = max(1, size // OUT)

    def __call__(self, x):
        values = np.tanh(self.base * np.float32(1.0 + float(x) * 1e-6))
        return values[:: self.stride][:OUT].copy()

    @classmethod
    def calibrated(cls, target: float = WORK_S) -> tuple["Work", float]:
        probe = cls(16_384)
        per_call = cls._time(probe)
        work = cls(max(1024, int(16_384 * target / per_call)))
        return work, cls._time(work)

    @staticmethod
    def _time(work, calls=300) -> float:
        for i in range(20):
            work(i)
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            for i in range(calls):
                work(i)
            best = min(best, (time.perf_counter() - t0) / calls)
        return best


# -- the pipelines -----------------------------------------------------------------------------------
def options(stats: bool = True):
    o = fl.data.Options()
    o.stats.enabled = stats
    return o


def flowlab_pipelines(work, n, cores, processes):
    D, A = fl.data.Dataset, fl.data.AUTOTUNE
    rows = {
        "sequential": lambda: D.range(n).map(work).batch(BATCH),
        "parallel AUTOTUNE": lambda: D.range(n).map(work, num_parallel_calls=A).batch(BATCH).prefetch(A),
        f"parallel k={cores}": lambda: D.range(n).map(work, num_parallel_calls=cores).batch(BATCH).prefetch(2),
        f"parallel k={cores}, stats off": lambda: D.range(n).map(work, num_parallel_calls=cores).batch(BATCH)
        .prefetch(2).with_options(options(stats=False)),
    }
    if processes:
        rows[f"processes k={cores}"] = lambda: D.range(n).map(work, num_parallel_calls=cores, use_processes=True) \
            .batch(BATCH).prefetch(2)
    return rows


def consume(batches, step_s, collect=None):
    """Iterate, spending ``step_s`` per batch; returns the seconds it took."""
    t0 = time.perf_counter()
    for batch in batches:
        if collect is not None:
            collect.append(np.asarray(batch))
        if step_s:
            time.sleep(step_s)
    return time.perf_counter() - t0


def consumer_alone(n_batches) -> float:
    t0 = time.perf_counter()
    for _ in range(n_batches):
        time.sleep(STEP_S)
    return time.perf_counter() - t0


def load_tf(disabled: bool):
    if disabled:
        return None, "skipped (--no-tf)"
    try:
        import tensorflow as tf
    except ImportError:
        return None, "not installed: the tf.data row and target are skipped (pip install tensorflow to compare)"
    return tf, f"{tf.__version__}"


def tf_pipeline(tf, work, n):
    def np_work(x):
        return work(x)

    def step(x):
        y = tf.numpy_function(np_work, [x], tf.float32)
        return tf.ensure_shape(y, [OUT])
    return lambda: tf.data.Dataset.range(n).map(step, num_parallel_calls=tf.data.AUTOTUNE).batch(BATCH) \
        .prefetch(tf.data.AUTOTUNE)


# -- running -------------------------------------------------------------------------------------------
def check_same(reference, other, name):
    if len(reference) != len(other) or any(not np.array_equal(a, b) for a, b in zip(reference, other)):
        raise CheckFailed(f"{name} produced different batches from the sequential pipeline")


def measure(mode, work, tf):
    n, rounds = mode["elements"], mode["rounds"]
    cores = C.usable_cores()
    n_batches = -(-n // BATCH)
    pipelines = flowlab_pipelines(work, n, cores, mode.get("processes", False))
    if tf is not None:
        pipelines["tf.data AUTOTUNE"] = tf_pipeline(tf, work, n)
    reference = []
    consume(fl.data.Dataset.range(n).map(work).batch(BATCH), 0, reference)     # the data every row must give
    samples = {name: [] for name in ["consumer alone", "producer alone", *pipelines]}
    stats = {}
    for r in range(rounds):
        samples["consumer alone"].append(consumer_alone(n_batches))
        got = []
        samples["producer alone"].append(consume(pipelines[f"parallel k={cores}"](), 0, got))
        check_same(reference, got, "the producer-alone pipeline")
        for name, make in pipelines.items():
            ds, got = make(), []
            samples[name].append(consume(ds, STEP_S, got if r == 0 else None))
            if r == 0:
                check_same(reference, got, name)
            if name == "parallel AUTOTUNE":
                stats = ds.stats().snapshot()
    times = {name: min(s) for name, s in samples.items()}     # other load only ever slows a round down
    times["ideal"] = max(times["producer alone"], times["consumer alone"])
    return times, stats, cores, n_batches


def print_results(times, work_s, n, cores, n_batches, tf_note):
    bound = max(n * work_s / cores, n_batches * STEP_S)
    print(f"\n{n:,} elements, map ~{work_s * 1e6:.0f} us each, batch {BATCH}, consumer {STEP_S * 1e3:.0f} ms per "
          f"batch ({n_batches} batches)")
    print(f"ideal = max(producer alone, consumer alone) = {times['ideal']:.3f} s; arithmetic bound "
          f"max(elements x work / {cores} cores, batches x step) = {bound:.3f} s\n")
    order = ["consumer alone", "producer alone", *[k for k in times if k not in
                                                   ("consumer alone", "producer alone", "ideal")]]
    rows = []
    for name in order:
        t = times.get(name)
        rows.append([name, f"{t:.3f}" if t is not None else "n/a", f"{n / t:,.0f}" if t else "n/a",
                     C.fmt_ratio(t, times["ideal"]), C.fmt_ratio(times.get("sequential"), t)])
    if "tf.data AUTOTUNE" not in times:
        rows.append(["tf.data AUTOTUNE", "n/a", "n/a", "n/a", "n/a"])
    for line in C.table(["pipeline", "seconds", "elements/s", "/ideal", "speed-up"], rows):
        print(line)
    print("\n(/ideal: time over the ideal, 1.00x is perfect overlap; speed-up: sequential time over this row's)")
    print(f"tf.data : {tf_note}")
    on, off = times.get(f"parallel k={cores}"), times.get(f"parallel k={cores}, stats off")
    print(f"recording: stats and events on cost {C.fmt_ratio(on, off)} of the time with Options.stats.enabled = False")


def print_targets(times):
    print("\ntargets")
    for text, row, peer, limit in TARGETS:
        t, p = times.get(row), times.get(peer)
        if t is None or p is None:
            print(f"  {text:62s} n/a (TensorFlow not installed)")
            continue
        ratio = t / p
        print(f"  {text:62s} {ratio:.2f}x  <= {limit:.2f}x  {'PASS' if ratio <= limit else 'MISS'}")


def print_autotune(stats):
    decisions = stats.get("autotune", [])
    print(f"\nAUTOTUNE (parallel AUTOTUNE row, last round): {len(decisions)} decisions")
    for d in decisions:
        print(f"  {d['time']:7.3f}s  {d['stage']} {d['parameter']} {d['old']} -> {d['new']}: {d['reason']}")
    for s in stats.get("stages", []):
        if s["parallelism"] is not None or s["buffer_size"] is not None:
            print(f"  {s['name']}: workers {s['parallelism']}, buffer {s['buffer_size']}, consumer waited "
                  f"{s['wait_s']:.3f} s")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short smoke run (rough numbers)")
    parser.add_argument("--elements", type=int, help="elements per pipeline (default 20,000; 2,000 with --quick)")
    parser.add_argument("--no-tf", action="store_true", help="skip tf.data even if TensorFlow is installed")
    parser.add_argument("--processes", action="store_true",
                        help="also time map(use_processes=True): the cost of shipping elements to worker processes")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    args = parser.parse_args(argv)
    mode = dict(MODES["quick" if args.quick else "full"])
    if args.elements:
        mode["elements"] = args.elements
    mode["processes"] = args.processes
    tf, tf_note = load_tf(args.no_tf)
    for line in C.machine_lines(fl, fl.config.get_blas_threads())[:-1]:    # the torch line is not ours
        print(line)
    work, work_s = Work.calibrated()
    print(f"work    : tanh over {work.size:,} float32 values, {work_s * 1e6:.0f} us per call (target "
          f"{WORK_S * 1e6:.0f} us)")
    times, stats, cores, n_batches = measure(mode, work, tf)
    print_results(times, work_s, mode["elements"], cores, n_batches, tf_note)
    print_targets(times)
    print_autotune(stats)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"mode": mode, "work_s": work_s, "times": times, "autotune": stats}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
