"""``import flowlab.horovod.tensorflow as hvd``: the spelling of ``horovod.tensorflow``; the same
names as ``flowlab.horovod``."""
from .. import *  # noqa: F401,F403
from .. import __all__, callbacks  # noqa: F401
