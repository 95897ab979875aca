import numpy as np

import flowlab as fl
from flowlab.core import backends
from flowlab.core.backends import cupy_backend, numpy_backend


def test_numpy_backend_contract():
    assert numpy_backend.available()
    arr = numpy_backend.asarray([1, 2], dtype=np.float32)
    assert arr.dtype == np.float32
    assert numpy_backend.to_numpy(arr) is arr
    op = fl.core.get_op("add")
    assert numpy_backend.kernel(op) is op.kernel


def test_device_routing():
    assert backends.backend_for_device(None) is numpy_backend
    assert backends.backend_for_device("/job:localhost/replica:0/task:0/device:CPU:0") is numpy_backend
    # a GPU runs on CuPy where there is a real one; elsewhere GPUs are logical, on numpy
    gpu_backend = backends.gpu_backend() if backends.visible_gpus() else numpy_backend
    assert backends.backend_for_device("/device:GPU:0") is gpu_backend
    assert backends.backend_for_device("/job:gpu/device:CPU:0") is numpy_backend


def test_gpu_backend_says_why_it_cannot_run():
    if cupy_backend.available():
        return
    reason = cupy_backend.why_unavailable()
    assert "CuPy" in reason
    try:
        cupy_backend.kernel(fl.core.get_op("add"))
    except RuntimeError as e:
        assert reason in str(e)
    else:
        raise AssertionError("the GPU backend ran without a GPU")
