"""``import flowlab.horovod.keras as hvd``: Horovod's Keras API (``horovod.keras``,
``horovod.tensorflow.keras``) over flowlab: ``hvd.init()``, ``hvd.rank()``, ``hvd.size()``,
``hvd.DistributedOptimizer(opt)`` for ``Model.compile``, and ``hvd.callbacks``. The same names
as ``flowlab.horovod``."""
from . import *  # noqa: F401,F403
from . import __all__, __getattr__, callbacks, elastic  # noqa: F401
