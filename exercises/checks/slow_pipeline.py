"""06 · Input pipelines: speed up a slow input pipeline.

The answer is ``fast_pipeline(source, load, augment, batch_size)``: given ``source``, a
``fl.data.Dataset`` of element ids (int64 scalars), ``load(id) -> (image, id)`` and
``augment(image, id) -> (image, id)``, it returns a ``fl.data.Dataset`` that yields the same batches,
in the same order, as the slow pipeline ``source.map(load).map(augment).batch(batch_size)``, and does
it several times faster. The check's ``load`` spends its time waiting (``time.sleep``, standing in
for a disk or a network), a different time for different ids (1.6, 0.4, 1.2 and 0.8 times the case's
load time, in turn), so that a map that does not keep order shows it.

The check reads, per case:

- every id once: the ids of all batches, sorted (an element lost or made twice shows here);
- the ids in each batch, in order (batch sizes, the last short batch, and the order);
- the images, all batches' images in order, exact (computed here in numpy);
- the speed-up over the slow pipeline, measured in the same run: the slow pipeline (built here) and
  the answer's, alternately (slow, answer, slow, answer, answer), each epoch from a fresh
  ``fast_pipeline(...)`` call (so a ``cache()`` cannot replay a previous epoch), the building
  included; the speed-up is min(slow epochs) / min(answer epochs), reported as ``"at least 3x"``
  when it reaches 3, else as measured (``"1.9x"``).

Why the bar holds under load: a load is a ``time.sleep`` of 9-20 ms (on average), which other
programs on the machine barely stretch, and the CPU work per element (a few tensor conversions, a
4x4 array, about 1-2 ms on a loaded machine, one element at a time under the GIL) is small next to
it; eight loads in flight make an ideal 8x, and 5-7.5x was measured on a 2-core machine with a load
average of 6 (the deterministic map also waits on the slowest load of its window), so 3x leaves a
margin of about two; taking the minimum of several epochs drops the ones a burst of load hit. The
loads are kept at 9 ms or more on purpose: with 5 ms loads the per-element CPU work, which does not
overlap, already limits eight workers to about 3-5x on a loaded machine.

The answer's pipeline runs with ``Options.autotune.cpu_budget = 2``: AUTOTUNE gives a stage at most
one worker per core, so its result would depend on the machine that grades it. Pinned, an AUTOTUNE
map gets at most 2 workers everywhere (about 2x: too slow, on any machine, with the same message);
an explicit ``num_parallel_calls=k`` is not affected."""
import time

import numpy as np

import flowlab as fl
from flowlab.grading import Case

POINTS = 2
HINTS = [
    "Where does the slow pipeline spend its time? One load at a time, each mostly waiting. Waiting needs no "
    "CPU, so several loads can wait at once: give the map that calls load a num_parallel_calls.",
    "fl.data.AUTOTUNE stops at one worker per core (the check counts 2, as the grader's machine has), and "
    "prefetch alone still loads one element at a time. A load that waits needs more calls in flight than "
    "there are cores: ask for a number, such as num_parallel_calls=8.",
    "source.map(load, num_parallel_calls=8).map(augment).batch(batch_size).prefetch(2): keep the map "
    "deterministic (the default), so the batches come out in the slow pipeline's order, and keep the last, "
    "shorter batch (no drop_remainder).",
]
TOLERANCE = {"rtol": 0.0, "atol": 0.0}
TIME_LIMIT = 15.0
BAR = 3                       # the speed-up the answer must reach
FACTORS = (1.6, 0.4, 1.2, 0.8)   # id i waits FACTORS[i % 4] times the case's load time (mean 1.0)
SIZE = 4                      # images are SIZE x SIZE


def _raw_image(seed, i):
    return np.random.default_rng([seed, i]).integers(0, 256, (SIZE, SIZE)).astype(np.uint8)


def make_load(load_s, seed):
    """The case's ``load(id) -> (image, id)``: waits, then returns the id's uint8 image."""
    def load(index):
        i = int(index)
        time.sleep(load_s * FACTORS[i % len(FACTORS)])
        return _raw_image(seed, i), np.int64(i)
    return load


def augment(image, index):
    """The case's cheap transform: scale to [0, 1] and flip left to right."""
    x = image.numpy().astype(np.float32) / np.float32(255.0)
    return x[:, ::-1], index


def slow_pipeline(source, load, augment, batch_size):
    return source.map(load).map(augment).batch(batch_size)


def _expected(args):
    n, batch_size, _load_s, seed = args
    ids = list(range(n))
    images = np.stack([(_raw_image(seed, i).astype(np.float32) / np.float32(255.0))[:, ::-1] for i in ids])
    return {"every id once (sorted)": ids,
            "ids in each batch, in order": [ids[k:k + batch_size] for k in range(0, n, batch_size)],
            "images, in order": images.astype(np.float32),
            "speed-up over the slow pipeline": f"at least {BAR}x"}


def _case(n, batch_size, load_ms, seed, note=""):
    name = f"{n} elements, batches of {batch_size}{note}, loads of {load_ms} ms"
    return Case(name, args=(n, batch_size, load_ms / 1000.0, seed), expected=_expected)


def cases():
    yield _case(24, 8, 12, 1)
    yield _case(30, 10, 10, 2)
    yield _case(16, 4, 20, 3)


### BEGIN HIDDEN TESTS
def hidden_cases():
    yield _case(26, 8, 12, 4, note=" (a last batch of 2)")
    yield _case(40, 20, 9, 5)
    yield _case(20, 6, 15, 6, note=" (a last batch of 2)")
### END HIDDEN TESTS


def _options():
    options = fl.data.Options()
    options.autotune.cpu_budget = 2
    return options


def _epoch(build, n, batch_size, load, pin=False):
    """Build a pipeline and iterate it once: (seconds, list of (images, ids) as numpy)."""
    start = time.perf_counter()
    dataset = build(fl.data.Dataset.range(n), load, augment, batch_size)
    if not isinstance(dataset, fl.data.Dataset):
        raise TypeError(f"fast_pipeline must return a fl.data.Dataset, got {type(dataset).__name__}")
    if pin:
        dataset = dataset.with_options(_options())
    batches = []
    iterator = iter(dataset)
    try:
        for batch in iterator:
            if not isinstance(batch, (tuple, list)) or len(batch) != 2:
                raise TypeError("each batch must be (images, ids), as the slow pipeline's are; got "
                                f"{type(batch).__name__}")
            images, ids = batch
            batches.append((np.asarray(images.numpy() if hasattr(images, "numpy") else images),
                            np.asarray(ids.numpy() if hasattr(ids, "numpy") else ids)))
    finally:
        iterator.close()
    return time.perf_counter() - start, batches


def run(answer, case):
    n, batch_size, load_s, seed = case.args
    load = make_load(load_s, seed)
    slow, fast, batches = [], [], None
    for build, times in ((slow_pipeline, slow), (answer, fast), (slow_pipeline, slow), (answer, fast), (answer, fast)):
        seconds, got = _epoch(build, n, batch_size, load, pin=build is answer)
        times.append(seconds)
        if build is answer and batches is None:
            batches = got
    ids = [[int(i) for i in b_ids.reshape(-1)] for _, b_ids in batches]
    images = [b_images for b_images, _ in batches]
    speedup = min(slow) / max(min(fast), 1e-9)
    return {"every id once (sorted)": sorted(i for b in ids for i in b),
            "ids in each batch, in order": ids,
            "images, in order": np.concatenate(images) if images else np.zeros((0, SIZE, SIZE), np.float32),
            "speed-up over the slow pipeline": f"at least {BAR}x" if speedup >= BAR else f"{speedup:.1f}x"}
