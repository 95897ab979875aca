"""The loops behind ``Model.fit``, ``evaluate`` and ``predict``.

The step (``model.train_step`` and friends) is traced once into an ``@fl.function`` graph whose
inputs have an unknown batch size, so the last, smaller batch runs the same graph. Each batch then
costs one call of the compiled plan: variables are captured by reference, the optimizer updates
and metric totals are nodes of the graph, and nothing is converted to Python numbers per batch
unless a callback asks for a batch's logs (``callbacks.BatchLogs`` reads them on demand).

Steps: by default an epoch is one pass over the data. With ``steps_per_epoch`` (``evaluate``'s and
``predict``'s ``steps``, fit's ``validation_steps``) it is that many batches, read as Keras reads
them (:class:`_Feed`): from one stream that goes on across epochs, so a repeating dataset
(``dataset.repeat()``) gives new batches each epoch; data of exactly that many batches is read anew
each epoch; data that runs out ends the loop early with a warning that says how many batches it
gave. A dataset that repeats forever needs a number of steps: without one, a clear error.

A model compiled in a distribution strategy's scope trains and evaluates with the step that
strategy gives (``strategy.fit_step``: one ``@fl.function`` per step around ``strategy.run``, eager
steps around it, or steps scheduled on workers), and asks it for the chief, the shared seed and the
logs over the workers: the protocol in :mod:`.distribution`, which the strategies implement.
"""
from __future__ import annotations

import itertools
import warnings

import numpy as np

from ...core import dtypes
from ...core import random as _random
from ...core.function import ConcreteFunction, TensorSpec, function
from ...core.ops import array_ops
from ...core.tensor import convert_to_tensor
from ...data import INFINITE_CARDINALITY
from . import _data
from .distribution import FitStep, is_chief, strategy_of
from ...core.interpreters import init_scope
from .callbacks import BatchLogs, Callback, CallbackList, History, ModelCheckpoint, ProgbarLogger
from .progress import ProgressBar

__all__ = ["fit", "evaluate", "predict", "train_on_batch", "batch_size_of"]


def batch_size_of(t):
    """The batch size of ``t``: a float, or a float32 graph node when it is unknown while tracing."""
    shape = tuple(t.shape)
    if not shape:
        return 1.0
    if shape[0] is not None:
        return float(shape[0])
    return array_ops.shape(t, out_type=dtypes.float32)[0]


# -- step functions ------------------------------------------------------------------------------
def _step_function(model, kind, specs):
    """The traced (or eager) function running one ``kind`` step ("train", "test", "predict") on a
    batch of arrays shaped as ``specs``. Cached on the model until it is recompiled."""
    key = (kind, tuple((tuple(s), np.dtype(d).str) for s, d in specs))
    found = model._functions.get(key)
    if found is not None:
        return found
    method = {"train": model.train_step, "test": model.test_step, "predict": model.predict_step}[kind]

    def step(*batch):
        return method(batch if len(batch) > 1 else batch[0])

    if model.run_eagerly:
        def run(*arrays):
            return step(*[convert_to_tensor(a) for a in arrays])
    else:
        signature = [TensorSpec(shape, dtypes.as_dtype(dtype)) for shape, dtype in specs]
        traced = function(step, input_signature=signature, name=f"{model.name}_{kind}_step")
        run = traced.get_concrete_function()
    model._functions[key] = run
    return run


def _unchecked(run):
    """For batches cut from arrays checked once up front (dtype and shape fit the trace): a step that
    returns nothing runs through ``ConcreteFunction.unchecked_call``, without the per-call argument
    checks and output wrapping (about 10 us a step)."""
    if not isinstance(run, ConcreteFunction) or run.outputs or not isinstance(run.structured_outputs, dict):
        return run
    return run.unchecked_call


def _ensure_built(model, data):
    """Build the model's weights before training starts (callbacks may restore them): from the
    arrays' shapes, or, for a dataset and a model with no input shape, from its element_spec."""
    if model.built and model._weights_ready():
        return
    if isinstance(data, _data.ArrayData):
        shape, dtype = (None, *data.arrays[0].shape[1:]), data.arrays[0].dtype
    else:
        spec = data.dataset.element_spec
        spec = spec[0] if isinstance(spec, tuple) else spec
        shape, dtype = (None, *tuple(spec.shape)[1:]), spec.dtype.as_numpy_dtype
    model._ensure_built(shape, np.dtype(dtype).name)


def _runner(model, kind, batch, what, data=None):
    """The step function for batches like ``batch`` (made on the first batch of a loop)."""
    if kind != "predict" and len(batch) < 2:
        raise _data._error(what, "no targets: give y, or a dataset whose elements are (x, y)")
    specs = _data.specs_of(batch[:1] if kind == "predict" else batch)
    shape, dtype = specs[0]
    strategy = model.distribute_strategy if kind != "predict" else None
    if strategy is not None:       # the strategy's own step (see .distribution), or None: the model's
        key = ("distributed", kind, tuple((tuple(s), np.dtype(d).str) for s, d in specs))
        step = model._functions.get(key)
        if step is None:
            step = strategy.fit_step(model, kind, specs)
        if step is not None:
            with strategy.scope():
                model._ensure_built(shape, np.dtype(dtype).name)
            model._functions[key] = step
            return step
    model._ensure_built(shape, np.dtype(dtype).name)
    run = _step_function(model, kind, specs)
    return _unchecked(run) if isinstance(data, _data.ArrayData) and not model.run_eagerly else run


def _sources(model, out, metric_sources=None):
    """name -> function reading the current value: the metrics, then what the step returned."""
    sources = metric_sources if metric_sources is not None else {m.name: m.result for m in model.metrics}
    if isinstance(out, dict) and out:
        sources = dict(sources)
        for name, value in out.items():
            sources[name] = (lambda v=value: v)
    return sources


def _logs(sources) -> dict:
    return {name: float(fn()) for name, fn in sources.items()}


def _rows(batch):
    """The leading dimension of a batch's first array (its examples), or None."""
    first = batch[0] if isinstance(batch, (tuple, list)) and batch else batch
    if isinstance(first, dict):
        first = next(iter(first.values()), None)
    shape = getattr(first, "shape", None)
    return int(shape[0]) if shape else None


def _worker_logs(strategy, logs) -> dict:
    """{name: [each worker's value]} of this epoch's logs before they are averaged over the workers
    (every worker calls this at the same point: it is a collective)."""
    names = list(logs)
    rows = strategy.gather_rows([logs[k] for k in names])
    return {k: [float(v) for v in rows[:, i]] for i, k in enumerate(names)}


def _progress_mode(verbose):
    if verbose == "auto":
        verbose = 1
    if verbose not in (0, 1, 2, True, False):
        raise ValueError(f"verbose must be 'auto', 0, 1 or 2, got {verbose!r}")
    return {0: None, 1: "auto", 2: "text"}[int(verbose)]


def _new_seed() -> int:
    with init_scope():
        return int(_random.uniform([], 0, 2**62, dtype=dtypes.int64).numpy())


# -- steps ---------------------------------------------------------------------------------------
def _whole_steps(value, name, what):
    """``value`` (a number of batches, or None) checked: a whole number >= 1."""
    if value is None:
        return None
    try:
        ok = not isinstance(value, bool) and int(value) == value and value >= 1
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise _data._error(what, f"{name} must be a whole number of batches >= 1 (or None for one pass over "
                                 f"the data), got {value!r}")
    return int(value)


def _known_batches(data):
    """How many batches the data has when that is known without reading it: a number,
    ``INFINITE_CARDINALITY`` (-1) for a dataset that repeats forever, else None."""
    if isinstance(data, _data.ArrayData):
        return data.steps
    n = int(data.dataset.cardinality())
    return n if n >= 0 or n == INFINITE_CARDINALITY else None


class _Feed:
    """The batches of each epoch of a loop (see the module docstring). ``steps``: batches per epoch
    (None: one pass over the data each epoch); ``passes``: how many passes over arrays the stream
    holds (fit's ``epochs``, as in Keras; then it runs out). ``ran_out`` says the stream ended
    before an epoch had its ``steps`` batches; ``taken`` counts the batches read so far."""

    def __init__(self, data, steps, passes, what, steps_name):
        known = _known_batches(data)
        if steps is None and known == INFINITE_CARDINALITY:
            raise _data._error(what, f"the dataset repeats forever (dataset.repeat()), so one pass over it never "
                                     f"ends: give {steps_name}=<number of batches>")
        self.data, self.limit, self.passes, self.what = data, steps, passes, what
        self.fresh = steps is None or known == steps       # each epoch reads the data anew, as Keras does
        self.steps = steps if steps is not None else data.steps
        self.stream = None
        self.ran_out = False
        self.taken = 0

    def epoch(self, seed, epoch, start):
        """The batches of ``epoch``, from its batch ``start`` (a resumed fit)."""
        if self.fresh:
            it = self.data.batches(seed, epoch, start)
            try:
                for batch in (it if self.limit is None else itertools.islice(it, self.limit - start)):
                    self.taken += 1
                    yield batch
            finally:
                it.close()
            return
        if self.stream is None:        # one stream for every epoch; a resumed fit restarts it at `start`
            self.stream = self._stream(seed)
            for _ in itertools.islice(self.stream, start):
                pass
        for _ in range(start, self.limit):
            batch = next(self.stream, None)
            if batch is None:
                self.ran_out = True
                return
            self.taken += 1
            yield batch

    def _stream(self, seed):
        if isinstance(self.data, _data.ArrayData):      # `passes` passes, each shuffled by its own seed
            for p in range(self.passes):
                yield from self.data.batches(seed, p, 0)
        else:
            yield from self.data.batches()

    def close(self):
        if self.stream is not None:
            self.stream.close()        # the dataset's iterator (its threads, its workers) ends now

    def warn_ran_out(self, detail, stacklevel=4):
        warnings.warn(f"{self.what}: the data ran out after {self.taken} batches {detail}; stopped there. Give "
                      f"data that lasts (a dataset that repeats: dataset.repeat()) or fewer steps",
                      stacklevel=stacklevel)


# -- fit -----------------------------------------------------------------------------------------
def fit(model, x, y, batch_size, epochs, verbose, callbacks, validation_split, validation_data, shuffle,
        initial_epoch, sample_weight, validation_freq, validation_batch_size, steps_per_epoch=None,
        validation_steps=None):
    model._assert_compiled("fit")
    steps_per_epoch = _whole_steps(steps_per_epoch, "steps_per_epoch", "fit")
    validation_steps = _whole_steps(validation_steps, "validation_steps", "fit")
    if validation_split and validation_data is None:
        (x, y, sample_weight), validation_data = _data.split_validation(x, y, sample_weight, validation_split)
    data = _data.adapt(x, y, sample_weight, batch_size, "fit")
    if data.has_y is False:
        raise _data._error("fit", "no targets: give y, or a dataset whose elements are (x, y)")
    val = None
    if validation_data is not None:
        val = _validation(validation_data, validation_batch_size or batch_size)
    epochs, initial_epoch = int(epochs), int(initial_epoch)
    feed = _Feed(data, steps_per_epoch, epochs, "fit", "steps_per_epoch")
    strategy = strategy_of(model)
    if strategy is not None:        # in the scope: with several workers, they all start from worker 0's weights
        with strategy.scope():
            _ensure_built(model, data)
    else:
        _ensure_built(model, data)
    run = None

    chief = is_chief(strategy)
    mode = _progress_mode(verbose) if chief else None
    history = History()
    cbs = list(callbacks or [])
    for cb in cbs:
        if not isinstance(cb, Callback):
            raise TypeError(f"fit: callbacks must be fl.keras.callbacks.Callback objects, got {type(cb).__name__}")
    if not chief:                  # only the chief writes checkpoints
        cbs = [cb for cb in cbs if not isinstance(cb, ModelCheckpoint)]
    cbs.append(history)          # after the user's callbacks: it records what they add to the logs
    if mode is not None and not any(isinstance(cb, ProgbarLogger) for cb in cbs):
        cbs.append(ProgbarLogger(mode))
    params = {"epochs": epochs, "steps": feed.steps, "verbose": verbose,
              "samples": getattr(data, "n", None) if steps_per_epoch is None else None,     # progress: samples/s
              "batch_size": getattr(data, "batch_size", None),
              "replicas": strategy.num_replicas_in_sync if strategy is not None else 1,
              "strategy": type(strategy).__name__ if strategy is not None else None}
    cblist = CallbackList(cbs, model, params)

    state = model._fit_state
    state.resumed = False
    state.epoch.assign(np.int64(initial_epoch))
    state.step.assign(np.int64(0))
    shuffled = shuffle and isinstance(data, _data.ArrayData)
    state.seed.assign(np.int64(_new_seed() if shuffled else 0))
    model.stop_training = False
    cblist.on_train_begin({})
    first_epoch, first_step = int(state.epoch), int(state.step)
    seed = int(state.seed) if shuffled else None
    if strategy is not None and seed is not None:
        seed = strategy.chief_int(seed)     # every worker shuffles alike
        state.seed.assign(np.int64(seed))
    begin_hook, end_hook = cblist.wants("on_train_batch_begin"), cblist.wants("on_train_batch_end")
    metric_sources = {m.name: m.result for m in model.metrics}
    logs = {}
    try:
        for epoch in range(first_epoch, epochs):
            start = first_step if epoch == first_epoch else 0
            if start == 0:
                model.reset_metrics()
            cblist.on_epoch_begin(epoch, {})
            out = None
            step = start
            for batch in feed.epoch(seed, epoch, start):
                if begin_hook:
                    cblist.batch("on_train_batch_begin", step)
                if run is None:
                    run = _runner(model, "train", batch, "fit", data)
                    if params["batch_size"] is None:      # a dataset's batches: the first one's size
                        params["batch_size"] = _rows(batch)
                out = run(*batch)
                if end_hook:
                    cblist.batch("on_train_batch_end", step, BatchLogs(_sources(model, out, metric_sources)))
                step += 1
                if model.stop_training:
                    break
            if isinstance(run, FitStep):
                run.finish()           # e.g. the steps still running on the workers, then their weights here
            if feed.ran_out:
                feed.warn_ran_out(f"(in epoch {epoch + 1} of {epochs}, at step {step} of steps_per_epoch="
                                  f"{steps_per_epoch}; {steps_per_epoch * (epochs - initial_epoch)} batches wanted)")
                if step == start:      # nothing trained this epoch: no epoch end, and the logs stay the last ones
                    break
            if params["steps"] is None:
                params["steps"] = data.steps
            logs = _logs(_sources(model, out))
            if strategy is not None:
                if strategy.num_workers > 1:     # for the progress monitor: one allgather an epoch
                    params["worker_logs"] = _worker_logs(strategy, logs)
                logs = strategy.reduce_logs(logs)
            if val is not None and (epoch + 1) % int(validation_freq) == 0:
                val_logs = _evaluate_data(model, val, what="fit (validation_data)", steps=validation_steps)
                logs.update({f"val_{k}": v for k, v in val_logs.items()})
            cblist.on_epoch_end(epoch, logs)
            if model.stop_training or feed.ran_out:
                break
    except BaseException:
        cblist._on_train_failed()
        raise
    finally:
        feed.close()
    cblist.on_train_end(logs)
    return history


def _validation(validation_data, batch_size):
    from ...data import Dataset
    if isinstance(validation_data, Dataset):
        return _data.adapt(validation_data, what="fit (validation_data)")
    if not isinstance(validation_data, (tuple, list)) or len(validation_data) not in (2, 3):
        raise _data._error("fit", "validation_data must be (x_val, y_val), (x_val, y_val, sample_weight) or a dataset")
    return _data.adapt(*validation_data, batch_size=batch_size, what="fit (validation_data)")


# -- evaluate, predict ---------------------------------------------------------------------------
def _evaluate_data(model, data, callbacks=None, what="evaluate", steps=None, feed=None):
    _ensure_built(model, data)
    model.reset_metrics()
    out = run = None
    hook = callbacks is not None and callbacks.wants("on_test_batch_end")
    if feed is None:
        feed = _Feed(data, steps, 1, what, "validation_steps" if what.startswith("fit") else "steps")
    try:
        for step, batch in enumerate(feed.epoch(None, 0, 0)):
            if run is None:
                run = _runner(model, "test", batch, what, data)
            out = run(*batch)
            if hook:
                callbacks.batch("on_test_batch_end", step, BatchLogs(_sources(model, out)))
    finally:
        feed.close()
    if feed.ran_out:
        feed.warn_ran_out(f"({'validation_steps' if what.startswith('fit') else 'steps'}={steps})", stacklevel=5)
    logs = _logs(_sources(model, out))
    strategy = strategy_of(model)
    return strategy.reduce_logs(logs) if strategy is not None else logs


def evaluate(model, x, y, batch_size, verbose, sample_weight, callbacks, steps=None):
    model._assert_compiled("evaluate")
    steps = _whole_steps(steps, "steps", "evaluate")
    data = _data.adapt(x, y, sample_weight, batch_size, "evaluate")
    if data.has_y is False:
        raise _data._error("evaluate", "no targets: give y, or a dataset whose elements are (x, y)")
    feed = _Feed(data, steps, 1, "evaluate", "steps")
    cblist = CallbackList(callbacks or [], model, {"steps": feed.steps, "verbose": verbose})
    cblist.on_test_begin({})
    chief = is_chief(strategy_of(model))     # only the chief prints
    bar = ProgressBar(1, feed.steps, title="") if _progress_mode(verbose) and chief else None
    if bar is not None:
        bar.start().start_epoch(0)
    logs = _evaluate_data(model, data, cblist, steps=steps, feed=feed)
    if bar is not None:
        bar.step = feed.taken
        print(bar.epoch_line({"epoch": 1, "seconds": bar.elapsed(), "values": logs}), flush=True)
    cblist.on_test_end(logs)
    return logs


def predict(model, x, batch_size, verbose, callbacks, steps=None):
    steps = _whole_steps(steps, "steps", "predict")
    data = _data.adapt(x, None, None, batch_size, "predict")
    _ensure_built(model, data)
    feed = _Feed(data, steps, 1, "predict", "steps")
    cblist = CallbackList(callbacks or [], model, {"steps": feed.steps, "verbose": verbose})
    cblist.on_predict_begin({})
    outputs = []
    run = None
    try:
        for step, batch in enumerate(feed.epoch(None, 0, 0)):
            if run is None:
                run = _runner(model, "predict", batch, "predict")
            out = run(batch[0])
            outputs.append(np.asarray(out))
            cblist.batch("on_predict_batch_end", step, {"outputs": outputs[-1]})
    finally:
        feed.close()
    if feed.ran_out:
        feed.warn_ran_out(f"(steps={steps})", stacklevel=4)
    cblist.on_predict_end({})
    if _progress_mode(verbose):
        print(f"{len(outputs)}/{len(outputs)} batches predicted", flush=True)
    return np.concatenate(outputs) if outputs else np.zeros((0,), np.float32)


def train_on_batch(model, x, y, sample_weight):
    model._assert_compiled("train_on_batch")
    data = _data.adapt(x, y, sample_weight, len(x), "train_on_batch")
    _ensure_built(model, data)
    model.reset_metrics()
    out = run = None
    for batch in data.batches():
        run = _runner(model, "train", batch, "train_on_batch")
        out = run(*batch)
    if isinstance(run, FitStep):
        run.finish()               # e.g. the step ran on a worker: its loss, and the new weights here
    logs = _logs(_sources(model, out))
    values = list(logs.values())
    return values[0] if len(values) == 1 else values
