"""The tensor engine: tensors, the op table, eager execution, autodiff, backends."""
from . import config, dtypes, random  # noqa: F401
from .dtypes import DType, as_dtype  # noqa: F401
from .errors import InvalidArgumentError, OpError  # noqa: F401
from .execute import get_op, list_ops  # noqa: F401
from .function import ConcreteFunction, Function, TensorSpec, function  # noqa: F401
from .graph import Graph, GraphTensor  # noqa: F401
from .ops import *  # noqa: F401,F403
from .shape import TensorShape  # noqa: F401
from .tape import GradientTape, UnconnectedGradients  # noqa: F401
from .tensor import Tensor, Variable, constant, convert_to_tensor, is_tensor  # noqa: F401
