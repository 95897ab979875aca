"""Bad input raises fl.errors.InvalidArgumentError naming the op, the inputs and the caller's line.

Each case runs twice from the same source line: once in plain eager mode (where ``add``,
``matmul`` and the other unary/binary ops take the fast path that skips ``execute``) and once
inside a GradientTape watching the inputs (every op goes through ``execute`` and is recorded).
Both must raise the same message, and it must point at this file and the line of the call.
"""
from __future__ import annotations

import contextlib
import inspect
import os

import numpy as np
import pytest

import flowlab as fl
from flowlab.core._context import ACTIVE

InvalidArgumentError = fl.errors.InvalidArgumentError
MODES = ("eager", "tape")
THIS_FILE = os.path.basename(__file__)


def here() -> int:
    """The caller's current line number."""
    return inspect.currentframe().f_back.f_lineno


@contextlib.contextmanager
def running(mode, *inputs):
    if mode == "eager":
        assert ACTIVE.count == 0, "something left a tape or hook open: the fast path would not run"
        yield
    else:
        with fl.GradientTape() as tape:
            tape.watch([x for x in inputs if isinstance(x, fl.Tensor)])
            yield


def check_error(info, line, op, inputs, reason):
    """The message names ``op``, every input as 'dtype[shape]', the ``reason``, and this file:line."""
    err = info.value
    message = str(err)
    assert isinstance(err, ValueError)
    assert message.startswith(f"{op}:"), message
    assert err.op == op
    for described in inputs:
        assert described in message, f"{described!r} not in {message!r}"
    assert reason in message, message
    assert f"{THIS_FILE}:{line}" in message, message
    return message


def test_invalid_argument_error_is_a_value_error():
    assert issubclass(fl.errors.InvalidArgumentError, ValueError)
    assert fl.errors.InvalidArgumentError is fl.InvalidArgumentError


def test_add_broadcast_mismatch():
    a, b = fl.ones([2, 3]), fl.ones([4])
    messages = []
    for mode in MODES:
        with running(mode, a, b), pytest.raises(InvalidArgumentError) as info:
            line = here() + 1
            fl.add(a, b)
        messages.append(check_error(info, line, "add", ["float32[2,3]", "float32[4]"], "incompatible shapes"))
    assert messages[0] == messages[1]


def test_add_operator_broadcast_mismatch():
    a, b = fl.ones([2, 3]), fl.ones([2])
    messages = []
    for mode in MODES:
        with running(mode, a, b), pytest.raises(InvalidArgumentError) as info:
            line = here() + 1
            a + b
        messages.append(check_error(info, line, "add", ["float32[2,3]", "float32[2]"], "incompatible shapes"))
    assert messages[0] == messages[1]


def test_matmul_inner_dimension_mismatch():
    a, b = fl.ones([2, 3]), fl.ones([4, 5])
    messages = []
    for mode in MODES:
        with running(mode, a, b), pytest.raises(InvalidArgumentError) as info:
            line = here() + 1
            fl.matmul(a, b)
        messages.append(check_error(info, line, "matmul", ["float32[2,3]", "float32[4,5]"], "3 != 4"))
    assert messages[0] == messages[1]


def test_matmul_operator_inner_dimension_mismatch():
    a = fl.ones([2, 3])
    messages = []
    for mode in MODES:
        with running(mode, a), pytest.raises(InvalidArgumentError) as info:
            line = here() + 1
            a @ a
        messages.append(check_error(info, line, "matmul", ["float32[2,3], float32[2,3]"], "3 != 2"))
    assert messages[0] == messages[1]


def test_matmul_transposed_inner_dimension_mismatch():
    a, b = fl.ones([2, 3]), fl.ones([3, 2])
    messages = []
    for mode in MODES:
        with running(mode, a, b), pytest.raises(InvalidArgumentError) as info:
            line = here() + 1
            fl.matmul(a, b, transpose_a=True)
        messages.append(check_error(info, line, "matmul", ["float32[2,3]", "float32[3,2]"], "(transposed)"))
    assert messages[0] == messages[1]


def test_dtype_mismatch():
    a, b = fl.ones([2]), fl.ones([2], dtype=fl.int32)
    messages = []
    for mode in MODES:
        with running(mode, a, b), pytest.raises(InvalidArgumentError) as info:
            line = here() + 1
            fl.add(a, b)
        messages.append(check_error(info, line, "add", ["float32[2]", "int32[2]"], "same dtype"))
    assert messages[0] == messages[1]


def test_dtype_mismatch_with_a_numpy_array():
    a, b = fl.ones([2]), np.ones(2)
    messages = []
    for mode in MODES:
        with running(mode, a), pytest.raises(InvalidArgumentError) as info:
            line = here() + 1
            fl.add(a, b)
        messages.append(check_error(info, line, "add", ["float32[2]", "float64"], "same dtype"))
    assert messages[0] == messages[1]


def test_python_float_next_to_an_int_tensor():
    a = fl.constant([1, 2])
    messages = []
    for mode in MODES:
        with running(mode, a), pytest.raises(InvalidArgumentError) as info:
            line = here() + 1
            a * 2.5
        messages.append(check_error(info, line, "multiply", [], "fractional part"))
    assert messages[0] == messages[1]


def test_python_int_out_of_range_for_an_int32_tensor():
    a = fl.constant([1, 2])
    with pytest.raises(InvalidArgumentError) as info:
        line = here() + 1
        a + 2**40
    check_error(info, line, "add", ["int32[2]"], "1099511627776")


def test_reshape_to_an_incompatible_shape():
    x = fl.ones([2, 3])
    messages = []
    for mode in MODES:
        with running(mode, x), pytest.raises(InvalidArgumentError) as info:
            line = here() + 1
            fl.reshape(x, [4, 2])
        messages.append(check_error(info, line, "reshape", ["float32[2,3]"], "cannot reshape"))
    assert messages[0] == messages[1]


def test_gather_index_out_of_range():
    params, indices = fl.ones([3, 2]), fl.constant([0, 5])
    messages = []
    for mode in MODES:
        with running(mode, params), pytest.raises(InvalidArgumentError) as info:
            line = here() + 1
            fl.gather(params, indices)
        messages.append(check_error(info, line, "gather", ["float32[3,2]", "int32[2]"], "index 5"))
    assert messages[0] == messages[1]


def test_sparse_label_out_of_range():
    labels, logits = fl.constant([0, 3]), fl.zeros([2, 3])
    messages = []
    for mode in MODES:
        with running(mode, logits), pytest.raises(InvalidArgumentError) as info:
            line = here() + 1
            fl.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
        messages.append(check_error(info, line, "sparse_softmax_cross_entropy_with_logits",
                                    ["int32[2]", "float32[2,3]"], "label 3"))
    assert messages[0] == messages[1]


def test_concat_shape_mismatch():
    a, b = fl.ones([2, 3]), fl.ones([3, 3])
    messages = []
    for mode in MODES:
        with running(mode, a, b), pytest.raises(InvalidArgumentError) as info:
            line = here() + 1
            fl.concat([a, b], axis=1)
        messages.append(check_error(info, line, "concat", ["float32[2,3]", "float32[3,3]"], "must match"))
    assert messages[0] == messages[1]


@pytest.mark.parametrize("perm", [[0, 0], [1], [0, 2]])
def test_transpose_bad_perm(perm):
    x = fl.ones([2, 3])
    messages = []
    for mode in MODES:
        with running(mode, x), pytest.raises(InvalidArgumentError) as info:
            line = here() + 1
            fl.transpose(x, perm)
        messages.append(check_error(info, line, "transpose", ["float32[2,3]"], f"perm {perm}"))
    assert messages[0] == messages[1]


def test_squeeze_of_an_axis_that_is_not_1():
    x = fl.ones([1, 3])
    messages = []
    for mode in MODES:
        with running(mode, x), pytest.raises(InvalidArgumentError) as info:
            line = here() + 1
            fl.squeeze(x, axis=1)
        messages.append(check_error(info, line, "squeeze", ["float32[1,3]"], "cannot squeeze axis 1"))
    assert messages[0] == messages[1]


def test_softmax_on_ints():
    x = fl.constant([[1, 2, 3]])
    messages = []
    for mode in MODES:
        with running(mode, x), pytest.raises(InvalidArgumentError) as info:
            line = here() + 1
            fl.softmax(x)
        messages.append(check_error(info, line, "softmax", ["int32[1,3]"], "floating-point"))
    assert messages[0] == messages[1]


def test_one_hot_on_float_indices():
    indices = fl.constant([0.0, 1.0, 2.0])
    messages = []
    for mode in MODES:
        with running(mode, indices), pytest.raises(InvalidArgumentError) as info:
            line = here() + 1
            fl.one_hot(indices, 3)
        messages.append(check_error(info, line, "one_hot", ["float32[3]"], "integers"))
    assert messages[0] == messages[1]


def test_reduce_axis_out_of_range():
    x = fl.ones([2, 3])
    messages = []
    for mode in MODES:
        with running(mode, x), pytest.raises(InvalidArgumentError) as info:
            line = here() + 1
            fl.reduce_sum(x, axis=2)
        messages.append(check_error(info, line, "reduce_sum", ["float32[2,3]"], "axis 2"))
    assert messages[0] == messages[1]


def test_the_error_points_at_the_innermost_user_frame():
    """A helper in the user's file is where the op was called: its line is the one reported."""
    def helper(a, b):
        return fl.matmul(a, b)
    helper_line = here() - 1
    with pytest.raises(InvalidArgumentError) as info:
        helper(fl.ones([2, 3]), fl.ones([2, 3]))
    assert f"{THIS_FILE}:{helper_line}: return fl.matmul(a, b)" in str(info.value)
    assert info.value.source.startswith(__file__)
