"""Top-level names that are not ops: the eager-mode switches, and what ``fl.<name>`` says when
``<name>`` is not there: a pointer to the flowlab way for the parts of TensorFlow flowlab leaves out
on purpose (Estimator, contrib...), to ``flowlab.compat.v1`` for TF1 names, and "did you mean"
from difflib for a misspelling."""
from __future__ import annotations

import difflib
import warnings

from .core.graph import get_default_graph

__all__ = ["executing_eagerly", "enable_eager_execution", "NotInFlowlabError", "missing_attribute"]


def executing_eagerly() -> bool:
    """True when ops run at once (flowlab's default), False while ``@fl.function`` traces a graph
    (or inside ``with graph.as_default():``).

    >>> import flowlab as fl
    >>> fl.executing_eagerly()
    True
    """
    return get_default_graph() is None


def enable_eager_execution(config=None, device_policy=None, execution_mode=None):
    """Nothing to do: flowlab runs eagerly from the start (as TensorFlow 2 does). TF1.x material calls
    ``tf.enable_eager_execution()`` first; here it only warns that the call can go."""
    warnings.warn("fl.enable_eager_execution(): flowlab is eager by default, nothing changed; you can remove "
                  "this call", stacklevel=2)


class NotInFlowlabError(AttributeError):
    """A part of TensorFlow that flowlab leaves out on purpose; the message says what to use instead.
    (An AttributeError, so ``hasattr(fl, "estimator")`` is simply False.)"""


LEFT_OUT = {
    "estimator": "flowlab has no Estimator API (TensorFlow 2 deprecated it too). Build a fl.keras Model and train "
                 "it with model.fit, or write a custom loop with fl.GradientTape. Instead of "
                 "RunConfig(train_distribute=strategy), build and compile the model inside `with strategy.scope():`",
    "contrib": "flowlab has no tf.contrib (TensorFlow 2 removed it). Its parts moved: contrib.distribute -> "
               "fl.distribute (MirroredStrategy...), contrib.eager -> nothing to do (flowlab is eager), "
               "contrib.layers -> fl.keras.layers, contrib.summary -> the History that model.fit returns",
    "lite": "flowlab has no TensorFlow Lite converter: it is for learning how training is distributed, not for "
            "deploying models. Keep trained weights with fl.train.Checkpoint or model.save_weights",
    "saved_model": "flowlab has no SavedModel format: keep a model's weights with fl.train.Checkpoint(model=...) "
                   "or model.save_weights(path), and rebuild the model in code before restoring them",
    "summary": "flowlab writes no TensorBoard summaries: model.fit returns a History whose .history holds each "
               "metric per epoch (plot it with matplotlib), and a custom loop can collect values in a list",
    "tpu": "flowlab has no TPUs: use fl.distribute.MirroredStrategy (devices of one process) or "
           "MultiWorkerMirroredStrategy (several processes), which run the same code",
}

# TF1 names that TensorFlow 2 moved to tf.compat.v1 (flowlab does the same)
_TF1 = ("Session", "InteractiveSession", "placeholder", "placeholder_with_default", "get_variable",
        "variable_scope", "global_variables_initializer", "local_variables_initializer",
        "initialize_all_variables", "ConfigProto", "GPUOptions", "RunOptions", "get_default_session",
        "reset_default_graph", "trainable_variables", "global_variables", "random_normal", "random_uniform",
        "truncated_normal", "set_random_seed", "to_float", "to_int32", "disable_eager_execution",
        "disable_v2_behavior", "get_collection", "add_to_collection", "assign", "assign_add")


def missing_attribute(module: str, name: str, present) -> AttributeError:
    """The error for ``<module>.<name>`` that does not exist: a pointer if flowlab leaves it out on
    purpose or has it in compat.v1, else the closest names in ``present``."""
    if module == "flowlab" and name in LEFT_OUT:
        return NotInFlowlabError(f"flowlab.{name} does not exist on purpose: {LEFT_OUT[name]}")
    if module == "flowlab" and name in _TF1:
        import importlib
        v1 = importlib.import_module("flowlab.compat.v1")
        if hasattr(v1, name):
            return AttributeError(f"module 'flowlab' has no attribute {name!r}: it is TF1 API, which flowlab keeps "
                                  f"where TensorFlow 2 does: use flowlab.compat.v1.{name} "
                                  f"(`import flowlab.compat.v1 as tf` runs TF1 code as written)")
    close = difflib.get_close_matches(name, [n for n in present if not n.startswith("_")], n=3, cutoff=0.75)
    others = f" (or {', '.join(repr(c) for c in close[1:])})" if close[1:] else ""
    hint = f"; did you mean {close[0]!r}{others}?" if close else ""
    return AttributeError(f"module {module!r} has no attribute {name!r}{hint}")
