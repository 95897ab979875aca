"""``import flowlab.horovod.tensorflow as hvd``: the spelling of ``horovod.tensorflow``; the same
names as ``flowlab.horovod`` (with TF1's ``BroadcastGlobalVariablesHook`` and
``broadcast_global_variables``)."""
from .. import *  # noqa: F401,F403
from .. import __all__, __getattr__, callbacks, elastic  # noqa: F401
