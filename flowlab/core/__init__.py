"""The tensor engine: tensors, the op table, eager execution, autodiff, backends."""
import warnings as _warnings

# Ops make inf and NaN silently, as TensorFlow's do (log(0) is -inf): numpy's "divide by zero"
# warnings would point into flowlab's kernels, not at the user's line. To find where a NaN
# starts, use fl.debugging.enable_check_numerics(). Only warnings raised from flowlab.core are
# silenced; numpy code of the user's own still warns.
_warnings.filterwarnings("ignore", category=RuntimeWarning, module=r"flowlab\.core(\.|$)")
from . import config, dtypes, random  # noqa: F401
from .dtypes import DType, as_dtype  # noqa: F401
from .errors import InvalidArgumentError, OpError  # noqa: F401
from .execute import get_op, list_ops  # noqa: F401
from .function import ConcreteFunction, Function, TensorSpec, function  # noqa: F401
from .graph import Graph, GraphTensor, control_dependencies, name_scope  # noqa: F401
from .interpreters import current_graph, init_scope  # noqa: F401
from .ops import *  # noqa: F401,F403
from .shape import TensorShape  # noqa: F401
from .tape import GradientTape, UnconnectedGradients  # noqa: F401
from .tensor import Tensor, Variable, constant, convert_to_tensor, is_tensor  # noqa: F401
