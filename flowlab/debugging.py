"""Debugging tools (``fl.debugging``, as ``tf.debugging``): see DESIGN.md, "core"."""
# Numerics: stop at the first op that makes NaN or Inf (flowlab/core/numerics.py).
from .core.numerics import (check_numerics, check_numerics_enabled, disable_check_numerics,  # noqa: F401
                            enable_check_numerics)
# Devices: log where each op runs (flowlab/core/device.py).
from .core.device import get_log_device_placement, set_log_device_placement  # noqa: F401,E402
