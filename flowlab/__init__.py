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
from .core.interpreters import init_scope  # noqa: F401
from .core.shape import TensorShape  # noqa: F401
from .core.tape import GradientTape, UnconnectedGradients, custom_gradient  # noqa: F401
from .core.tensor import Tensor, Variable, constant, convert_to_tensor, is_tensor  # noqa: F401
from .nn import optimizers  # noqa: F401
from . import data, datasets, io, nn  # noqa: F401
from .io import string  # noqa: F401 - ``fl.string`` as ``tf.string``: names byte-string features (flowlab/io/strings.py)
from . import debugging, math, train  # noqa: F401
from ._names import enable_eager_execution, executing_eagerly  # noqa: F401

bool = bool_  # noqa: A001 - ``fl.bool`` as ``tf.bool``; Python's bool is untouched outside this namespace

__version__ = "0.1.0"


def load_ipython_extension(ipython):
    """``%load_ext flowlab``: the ``%%px`` cell magic (run a cell on every worker of a cluster)."""
    from .cluster.magic import load_ipython_extension as load
    load(ipython)


def __getattr__(name):
    lazy = {"compat": ".compat",        # ``fl.compat.v1``: the TF1 API
            "keras": ".keras",            # ``fl.keras``: layers, models, fit (flowlab.nn.keras)
            "cluster": ".cluster",        # ``fl.cluster``: LocalCluster, transport, events
            "distribute": ".distribute",  # ``fl.distribute``: strategies
            "horovod": ".horovod",        # ``flowlab.horovod``: the Horovod-style API
            "widgets": ".widgets",        # ``fl.widgets``: placement graph, collective replay, timeline
            "gpu": ".gpu",                # ``fl.gpu``: CUDA kernels to read, compile-check, simulate and launch
            "grading": ".grading",        # ``fl.grading``: check(id, answer) in place, manifests, ``flowlab grade``
            "losses": ".nn.keras.losses"}  # ``fl.losses`` as ``tf.losses``: the same as ``fl.keras.losses``
    if name in lazy:   # imported on first use
        import importlib
        return importlib.import_module(lazy[name], __name__)
    from ._names import missing_attribute   # left out on purpose, TF1 (compat.v1), or a misspelling
    raise missing_attribute(__name__, name, [*globals(), *lazy])

config.apply_environment()
from ._traceback import install as _install_traceback_filter  # noqa: E402
_install_traceback_filter()   # inside a running IPython shell only: hide flowlab's frames from tracebacks
