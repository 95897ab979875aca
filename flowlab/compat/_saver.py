"""``tf.train.Saver``: save a session's variables to a checkpoint file and load them back.

A Saver covers a fixed list of variables (default: every global variable of the graph) under
their names. When it is made it adds, per variable, a placeholder and an ``assign`` of it to the
graph, grouped into one restore operation, so restoring is one ``sess.run`` feeding the saved
values: it works the same for a local session and for a cluster session whose variables live on
a ps task (the assigns run there). Saving fetches all the variables in one ``sess.run``.

The file is flowlab's checkpoint format (``flowlab/nn/checkpoint.py``: one ``<prefix>.npz``,
written atomically, named by the directory's ``checkpoint`` state file), with each value under
its variable's name, so ``tf.train.latest_checkpoint(dir)`` and ``fl.train.list_variables(path)``
read it. It is not TensorFlow's file format: TensorFlow cannot read it, nor flowlab TensorFlow's.
"""
from __future__ import annotations

import numpy as np

from ..core.graph import GraphTensor
from ..core.shape import TensorShape
from ..nn.checkpoint import Checkpoint, latest_checkpoint, record_checkpoint
from ._graphs import building, get_default_graph, group
from ._variables import Variable, global_variables

__all__ = ["Saver", "latest_checkpoint"]


class _Value:
    """A value in a checkpoint's object graph: what a save fetched, or what a restore found."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value

    def _checkpoint_read(self):
        return self.value

    def _checkpoint_write(self, array):
        self.value = array


def _tree(leaves: dict) -> dict:
    """{"scope/w": leaf} as nested dicts {"scope": {"w": leaf}}, the paths a Checkpoint walks."""
    root: dict = {}
    for name, leaf in leaves.items():
        *scopes, last = name.split("/")
        node = root
        for part in scopes:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ValueError(f"tf.train.Saver: the variable names {part!r} and {name!r} clash in a checkpoint; "
                                 "give the Saver a dict {name: variable} with names that are not each other's scopes")
        if last in node or last == "save_counter" and not scopes:
            raise ValueError(f"tf.train.Saver: cannot save a variable named {name!r} next to "
                             f"{'the save counter' if last == 'save_counter' else 'a scope of that name'}; "
                             "give the Saver a dict {name: variable} to save it under another name")
        node[last] = leaf
    return root


class Saver:
    """Saves and restores a session's variables: ``saver.save(sess, path, global_step=step)``
    writes ``path-<step>``, ``saver.restore(sess, path)`` sets every variable to the saved value.

    ``var_list``: the variables (a list, or a dict from the name to save each under to the
    variable); default every global variable of the default graph. ``max_to_keep``: how many of
    this directory's newest checkpoints to keep (None or 0: all). Make the Saver after the model
    and before the session (it adds its restore operation to the graph).

    >>> import os, tempfile
    >>> import flowlab.compat.v1 as tf
    >>> with tf.Graph().as_default():
    ...     w = tf.Variable([1.0, 2.0], name="w")
    ...     saver = tf.train.Saver()
    ...     with tf.Session() as sess:
    ...         sess.run(w.initializer)
    ...         path = saver.save(sess, os.path.join(tempfile.mkdtemp(), "model.ckpt"), global_step=7)
    ...     with tf.Session() as sess:          # a new session: no values until restored
    ...         saver.restore(sess, tf.train.latest_checkpoint(os.path.dirname(path)))
    ...         print(os.path.basename(path), sess.run(w))
    model.ckpt-7 [1. 2.]
    """

    def __init__(self, var_list=None, reshape=False, sharded=False, max_to_keep=5,
                 keep_checkpoint_every_n_hours=10000.0, name=None, restore_sequentially=False, saver_def=None,
                 builder=None, defer_build=False, allow_empty=False, write_version=2, pad_step_number=False,
                 save_relative_paths=False, filename=None, **_unused):
        graph = get_default_graph()
        if var_list is None:
            with graph.as_default():
                var_list = global_variables()
        named = dict(var_list) if isinstance(var_list, dict) else {_name_of(v): v for v in var_list}
        for key, v in named.items():
            if not isinstance(v, Variable):
                raise TypeError(f"tf.train.Saver saves TF1 variables (tf.Variable, tf.get_variable); {key!r} is "
                                f"{type(v).__name__}")
        if not named and not allow_empty:
            raise ValueError("tf.train.Saver: there are no variables to save: make the Saver after the model, "
                             "or pass allow_empty=True")
        graphs = {v.graph for v in named.values()}
        if len(graphs) > 1:
            raise ValueError("tf.train.Saver: the variables belong to different graphs; make one Saver per graph")
        self._graph = graphs.pop() if graphs else graph
        self._vars = named
        self._paths = _tree({k: None for k in named})   # checks the names once
        self.max_to_keep = max_to_keep
        self._last: list = []
        self._feeds, self._restore_op = {}, None
        if named:
            with building(self._graph) as g, g.control_dependencies(None):
                assigns = []
                for key, v in named.items():
                    ph = g.placeholder(v.dtype, TensorShape(tuple(v.shape)), name=f"save/{key}")
                    self._feeds[key] = ph
                    assigns.append(v.assign(ph))
                self._restore_op = group(*assigns, name=name and f"{name}/restore_all" or "save/restore_all")

    # -- saving ------------------------------------------------------------------------------------
    def save(self, sess, save_path, global_step=None, latest_filename=None, meta_graph_suffix="meta",
             write_meta_graph=True, write_state=True, **_unused):
        """Write the variables' values in ``sess`` to ``save_path`` (``save_path-<global_step>`` when
        a step is given: a number, or the global step variable, read in ``sess``); the directory's
        ``checkpoint`` file then names it as the newest (unless ``write_state=False``), and the
        oldest beyond ``max_to_keep`` are deleted. Returns the path written (a prefix)."""
        if global_step is not None:
            if isinstance(global_step, (Variable, GraphTensor)):
                global_step = sess.run(global_step)
            save_path = f"{save_path}-{int(global_step)}"
        names = list(self._vars)
        values = sess.run([self._vars[k] for k in names]) if names else []
        leaves = {k: _Value(np.array(value)) for k, value in zip(names, values)}
        path = Checkpoint(**_tree(leaves)).write(save_path)
        if write_state:
            record_checkpoint(path, self.max_to_keep or None)
            self._last = [p for p in self._last if p != path] + [path]
            if self.max_to_keep:
                self._last = self._last[-self.max_to_keep:]
        return path

    @property
    def last_checkpoints(self) -> list:
        """The checkpoints this Saver wrote and still keeps, oldest first."""
        return list(self._last)

    # -- restoring ---------------------------------------------------------------------------------
    def restore(self, sess, save_path):
        """Set every variable of this Saver, in ``sess``, to its value in the checkpoint at
        ``save_path`` (a prefix as ``save`` returned it, or ``tf.train.latest_checkpoint(dir)``).
        This initializes them: no initializer needs to run for them."""
        if save_path is None:
            raise ValueError("Saver.restore: save_path is None, i.e. there is no checkpoint yet (latest_checkpoint "
                             "returned None?): run the initializer instead when there is nothing to restore")
        if not self._vars:
            return
        leaves = {k: _Value(v._stand_in) for k, v in self._vars.items()}   # right shape and dtype, no memory
        try:
            status = Checkpoint(**_tree(leaves)).restore(save_path)
        except FileNotFoundError:
            raise ValueError(f"Saver.restore: no checkpoint at {save_path!r} (a Saver writes <path>.npz; pass the path "
                             "save() returned, or tf.train.latest_checkpoint(directory))") from None
        missing = [m for m in status.missing_objects if m != "save_counter"]
        if missing:
            raise ValueError(f"Saver.restore: the checkpoint {save_path} has no value for {', '.join(missing)}: was it "
                             "saved from another model? Restore only what it has with tf.train.Saver(var_list=[...])")
        sess.run(self._restore_op, feed_dict={self._feeds[k]: leaf.value for k, leaf in leaves.items()})

    def __repr__(self):
        return f"<tf.train.Saver of {len(self._vars)} variables, max_to_keep={self.max_to_keep}>"


def _name_of(v):
    if not isinstance(v, Variable):
        raise TypeError(f"tf.train.Saver saves TF1 variables (tf.Variable, tf.get_variable), not {type(v).__name__}")
    return v._name
