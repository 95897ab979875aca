"""``import flowlab.horovod.tensorflow.keras as hvd``: the spelling of ``horovod.tensorflow.keras``;
the same names as ``flowlab.horovod.keras``."""
from ..keras import *  # noqa: F401,F403
from ..keras import __all__, __getattr__, callbacks, elastic  # noqa: F401
