"""What ``Model.fit`` and ``evaluate`` ask of a distribution strategy (:class:`FitStrategy`), and how
the layer above tells Keras which strategy's scope is active (:func:`set_scope_hook`).

The strategies live in ``flowlab.distribute``, a layer above ``nn``: Keras never imports them, nor
the collectives. ``compile`` records the strategy whose scope it runs in (``model.distribute_strategy``),
and fit talks to it only through the methods of :class:`FitStrategy`:

- each loop (train or test) asks ``strategy.fit_step(model, kind, specs)`` for the step that runs one
  global batch: a :class:`FitStep` (the strategy's own, e.g. one traced ``strategy.run`` per batch,
  or a step scheduled on a worker), or None for the model's own step (a strategy of one replica);
- with more than one replica (``num_replicas_in_sync > 1``, :func:`strategy_of`) the model is built
  in the scope, only the chief (``extended.should_checkpoint``) prints and writes checkpoints, the
  shuffle seed is the chief's (``chief_int``), and each epoch's logs are averaged over the workers
  (``reduce_logs``) and, for the progress monitor and ``BackupAndRestore``, gathered per worker
  (``gather_rows``).

A strategy's step updates the compiled metrics with :func:`update_metrics`, so the logs are those of
one replica.
"""
from __future__ import annotations

from typing import Protocol

import numpy as np

__all__ = ["FitStrategy", "FitStep", "set_scope_hook", "scope_strategy", "strategy_of", "is_chief",
           "update_metrics", "check_default_step"]

_scope_hook = None


class FitStep:
    """A strategy's step for fit or evaluate: ``step(*global_batch_arrays)`` runs one global batch
    (the metrics' updates included) and returns None; ``finish()``, at the end of each epoch, waits
    for the steps still running elsewhere and brings their results (and the weights) here."""

    def __call__(self, *batch):
        raise NotImplementedError

    def finish(self) -> None:
        """Nothing to wait for when the steps run here."""


class FitStrategy(Protocol):
    """What fit and evaluate call on the strategy a model was compiled under (see the module docstring)."""

    num_replicas_in_sync: int
    num_workers: int          # processes in the strategy
    worker_index: int         # this one's place among them (0: the chief)

    def scope(self):
        """A context in which the model's variables are made (built) as the strategy wants them."""

    def fit_step(self, model, kind: str, specs) -> FitStep | None:
        """The step for ``kind`` ("train" or "test") batches of arrays shaped ``specs`` ([(shape, dtype)]
        of x, y and maybe sample weights), or None for the model's own step."""

    def chief_int(self, value: int) -> int:
        """The chief's ``value`` on every worker (a collective: every worker calls it at the same point)."""

    def gather_rows(self, row) -> np.ndarray:
        """Every worker's float64 ``row``, one per worker in worker order (a collective)."""

    def reduce_logs(self, logs: dict) -> dict:
        """Each log averaged over the workers, in the same order on every worker (a collective)."""


def set_scope_hook(fn) -> None:
    """``fn()``: the strategy whose scope the caller is in, or None. ``flowlab.distribute`` sets it
    when imported (None removes it)."""
    global _scope_hook
    _scope_hook = fn


def scope_strategy():
    """The strategy whose scope this code runs in (what ``compile`` records), or None."""
    return _scope_hook() if _scope_hook is not None else None


def strategy_of(model):
    """The strategy ``model`` was compiled under, when it has more than one replica; else None."""
    s = model.distribute_strategy
    return s if s is not None and s.num_replicas_in_sync > 1 else None


def is_chief(strategy) -> bool:
    """Whether this process prints and writes checkpoints (always, without a strategy)."""
    return strategy is None or bool(strategy.extended.should_checkpoint)


def update_metrics(model, y, sample_weight, loss, y_pred, size) -> None:
    """A piece of ``size`` examples into the logs: the loss tracker weighted by its size, then each
    compiled metric with the piece."""
    model._loss_tracker.update_state(loss, sample_weight=float(size))
    for m in model._compiled_metrics:
        m.update_state(y, y_pred, sample_weight)


def check_default_step(model, kind: str) -> None:
    """fit and evaluate under a strategy run the default ``train_step``/``test_step``: a clear error
    for a model that overrides it."""
    from .model import Model
    name = {"train": "train_step", "test": "test_step"}[kind]
    if getattr(type(model), name) is not getattr(Model, name):
        raise NotImplementedError(f"fit/evaluate under a distribution strategy run the default {name}; a model "
                                  f"that overrides {name} must be trained with a custom loop and strategy.run")
