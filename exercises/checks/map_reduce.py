"""08 · Map and reduce: a word count over the workers of a cluster.

The answer is ``word_count(cluster, paths)``: ``paths`` are text files, the shards of one corpus;
it returns a dict ``{word: count}`` over all of them, a word being what ``str.split()`` cuts
(case and punctuation kept). Map: worker ``r`` of ``n`` opens and counts its own files,
``paths[r::n]``, and sends back only its counts; reduce: the notebook adds the counts up.

The check writes the shards into a fresh folder, starts a ``LocalCluster`` of 2 or 3 real worker
processes (both removed when the case ends, also when the answer raises or hangs), runs the answer,
and reads:

- the merged counts, exactly, against ``collections.Counter`` over every shard;
- that every worker that has a file ran the map: the ``op`` events each task records when it runs a
  function (``cluster.run`` and ``cluster.call`` leave one, named after the function);
- what crossed between the notebook and each worker, from the cluster's traffic counters
  (``cluster.snapshot()``: ``bytes_out`` to a task, ``bytes_in`` from it): a function and a few file
  names go out (at most 16 KiB), counts come back (at most 4 KiB). A worker's files hold 32 KB of
  text or more (none in the cases of an empty shard or of no shard), over a vocabulary of at most 60
  words: sending the text out, or the words or the text back, goes over those bounds by far, while
  the counts of 60 words pickle to about 600 bytes. The function is about 1.5 KB from a script but
  about 8 KB from a notebook (IPython puts its own ``open`` in the notebook's namespace, and a
  function that calls ``open`` carries it along), hence 16 KiB. Byte counts do not depend on timing
  or load."""
import collections
import os
import tempfile
import threading

import numpy as np

from flowlab.cluster import LocalCluster
from flowlab.grading import Case

POINTS = 2
HINTS = [
    "The map must run on the workers: write a function that counts the words of some files and run it with "
    "cluster.run(fn, paths) (every worker at once). Inside, fl.cluster.rank() and fl.cluster.world_size() say "
    "which worker it is.",
    "Worker r counts paths[r::n] (n = fl.cluster.world_size()): it opens each file itself (the notebook sends "
    "only the paths) and returns a dict of counts, e.g. collections.Counter(f.read().split()); never the words "
    "or the text.",
    "Reduce in the notebook: total = collections.Counter(); for counts in cluster.run(your_map, paths): "
    "total.update(counts); then return dict(total). Split with .split(), not .split(' '): the files have newlines.",
]
TOLERANCE = {"rtol": 0.0, "atol": 0.0}
TIME_LIMIT = 30.0          # per case: starting 2-3 worker processes on a loaded machine takes a few seconds
WATCHDOG_S = 20.0          # an answer still running then has its cluster closed, so its calls fail at once
MAX_OUT = 16384            # bytes to one worker: a pickled function and a few paths (see the docstring)
MAX_BACK = 4096            # bytes from one worker: counts of at most 60 words

_WORDS = ("the a of to and in is on worker ps task op tensor graph shard map reduce send recv sum mean "
          "gradient step batch model weight loss cluster device rank ring chief process thread queue "
          "value handle event log notebook cell kernel fetch place split merge count word file read "
          "byte message port host job replica variable server client timeout").split()


def _text(n_words, seed, vocab=40, words_per_line=12, seps=(" ",)):
    """``n_words`` words drawn (Zipf-like) from the first ``vocab`` words, in lines; ``seps`` are
    the separators between words (drawn at random too)."""
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, vocab + 1)
    words = [str(w) for w in rng.choice(np.array(_WORDS[:vocab]), size=n_words, p=weights / weights.sum())]
    gaps = [seps[k] for k in rng.integers(0, len(seps), size=n_words)]
    lines = []
    for start in range(0, n_words, words_per_line):
        line = words[start:start + words_per_line]
        lines.append(line[0] + "".join(g + w for g, w in zip(gaps[start:], line[1:])))
    return "\n".join(lines) + ("\n" if lines else "")


def _expected(args):
    workers, texts = args
    total = collections.Counter()
    for t in texts:
        total.update(t.split())
    own = {f"/job:worker/task:{r}": texts[r::workers] for r in range(workers)}
    return {"counts": dict(sorted(total.items())),
            "the map ran on": {t: ("its files" if mine else "no file") for t, mine in own.items()},
            "bytes sent to each worker": {t: f"at most {MAX_OUT}" for t in own},
            "bytes each worker sent back": {t: f"at most {MAX_BACK}" for t in own}}


def _case(name, workers, sizes, seed, **kw):
    texts = tuple(_text(n, seed * 100 + i, **kw) for i, n in enumerate(sizes))
    return Case(name, args=(workers, texts), expected=_expected)


def cases():
    yield _case("2 workers, 2 shards", 2, [8000, 10000], 0)
    yield _case("3 workers, 3 shards of different sizes", 3, [8000, 18000, 12000], 1)
    yield _case("2 workers, 5 shards (3 on worker 0, 2 on worker 1)", 2, [4000, 4000, 5000, 4000, 6000], 2)


### BEGIN HIDDEN TESTS
def hidden_cases():
    yield _case("3 workers, 2 shards (worker 2 has none)", 3, [8000, 9000], 3)
    yield _case("3 workers, 4 shards, tabs and runs of spaces, 60 words", 3, [8000, 8000, 9000, 7000], 4,
                vocab=60, seps=(" ", "\t", "   "))
    yield _case("2 workers, 3 shards, one of them empty", 2, [8000, 0, 8000], 5)
### END HIDDEN TESTS


class _Watchdog:
    """Closes the cluster if the answer still runs after WATCHDOG_S seconds, so that its pending
    calls fail at once instead of hanging (then ``check()`` says why)."""

    def __init__(self, cluster):
        self.cluster, self.fired = cluster, False
        self.timer = threading.Timer(WATCHDOG_S, self._fire)
        self.timer.daemon = True

    def _fire(self):
        self.fired = True
        self.cluster.close()

    def check(self):
        if self.fired:
            raise TimeoutError(f"the answer ran longer than {WATCHDOG_S:g} s, so the check closed its cluster")

    def __enter__(self):
        self.timer.start()
        return self

    def __exit__(self, *exc):
        self.timer.cancel()
        return False


def _traffic(cluster):
    return {t["task"]: (t["bytes_out"], t["bytes_in"]) for t in cluster.snapshot()["tasks"]}


def _at_most(n, bound):
    return f"at most {bound}" if n <= bound else str(n)


def run(answer, case):
    workers, texts = case.args
    with tempfile.TemporaryDirectory(prefix="flowlab-word-count-") as folder:
        paths = []
        for i, text in enumerate(texts):
            paths.append(os.path.join(folder, f"shard-{i:02d}.txt"))
            with open(paths[-1], "w", encoding="utf-8") as f:
                f.write(text)
        with LocalCluster(workers=workers) as cluster, _Watchdog(cluster) as watchdog:
            cluster.events(clear=True)
            before = _traffic(cluster)
            try:
                result = answer(cluster, list(paths))
            finally:
                watchdog.check()
            after = _traffic(cluster)
            events = cluster.events()
    ran = {e.task for e in events if e.kind == "op"}
    out = {}
    for r in range(workers):
        task = f"/job:worker/task:{r}"
        sent, back = (after[task][k] - before[task][k] for k in (0, 1))
        mine = texts[r::workers]
        out[task] = ("its files" if task in ran else "nothing: the map did not run there") if mine else "no file"
        out[task] = (out[task], _at_most(sent, MAX_OUT), _at_most(back, MAX_BACK))
    return {"counts": result,
            "the map ran on": {t: v[0] for t, v in out.items()},
            "bytes sent to each worker": {t: v[1] for t, v in out.items()},
            "bytes each worker sent back": {t: v[2] for t, v in out.items()}}
