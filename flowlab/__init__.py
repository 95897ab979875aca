"""flowlab: learn and try out distributed deep learning from a notebook.

>>> import flowlab as fl
>>> x = fl.constant([1.0, 2.0, 3.0])
>>> with fl.GradientTape() as tape:
...     tape.watch(x)
...     y = fl.reduce_sum(x * x)
>>> tape.gradient(y, x).numpy().tolist()
[2.0, 4.0, 6.0]
"""
from . import errors  # noqa: F401
from .core import config, random  # noqa: F401
from .core.dtypes import (DType, as_dtype, bool_, float16, float32, float64, int8, int16,  # noqa: F401
                          int32, int64, uint8)
from .core.device import DeviceSpec, device  # noqa: F401
from .core.errors import InvalidArgumentError  # noqa: F401
from .core.ops import *  # noqa: F401,F403
from .core.function import TensorSpec, function  # noqa: F401
from .core.graph import Graph, control_dependencies, name_scope  # noqa: F401
from .core.shape import TensorShape  # noqa: F401
from .core.tape import GradientTape, UnconnectedGradients, custom_gradient  # noqa: F401
from .core.tensor import Tensor, Variable, constant, convert_to_tensor, is_tensor  # noqa: F401
from .nn import optimizers  # noqa: F401
from . import data, datasets, nn  # noqa: F401
from . import debugging, train  # noqa: F401

bool = bool_  # noqa: A001 - ``fl.bool`` as ``tf.bool``; Python's bool is untouched outside this namespace

__version__ = "0.1.0"


def load_ipython_extension(ipython):
    """``%load_ext flowlab``: the ``%%px`` cell magic (run a cell on every worker of a cluster)."""
    from .cluster.magic import load_ipython_extension as load
    load(ipython)


def __getattr__(name):
    lazy = {"compat": ".compat",        # ``fl.compat.v1``: the TF1 API
            "keras": ".nn.keras",         # ``fl.keras``: layers, models, fit
            "cluster": ".cluster",        # ``fl.cluster``: LocalCluster, transport, events
            "distribute": ".distribute",  # ``fl.distribute``: strategies
            "horovod": ".horovod"}        # ``flowlab.horovod``: the Horovod-style API
    if name in lazy:   # imported on first use
        import importlib
        return importlib.import_module(lazy[name], __name__)
    raise AttributeError(f"module 'flowlab' has no attribute {name!r}")

config._apply_default()
