"""``import flowlab.horovod as hvd``: the Horovod-style API (see :mod:`flowlab.distribute.horovod`)."""
import sys

from .distribute import horovod as _impl

sys.modules[__name__] = _impl
