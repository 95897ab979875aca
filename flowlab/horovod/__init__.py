"""``import flowlab.horovod as hvd``: the Horovod-style API (see :mod:`flowlab.distribute.horovod`).

``import flowlab.horovod.keras as hvd`` (as ``horovod.keras``) and
``import flowlab.horovod.tensorflow.keras as hvd`` (as ``horovod.tensorflow.keras``) give the same
names; ``hvd.callbacks`` holds the Keras callbacks.
"""
from ..distribute.horovod import *  # noqa: F401,F403
from ..distribute.horovod import __all__ as _names
from . import callbacks

__all__ = list(_names) + ["callbacks"]
