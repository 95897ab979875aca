"""Tensor, Variable, conversion rules, fl.random, fl.DType and fl.TensorShape."""
from __future__ import annotations

import numpy as np
import pytest

import flowlab as fl

InvalidArgumentError = fl.errors.InvalidArgumentError
CPU0 = "/job:localhost/replica:0/task:0/device:CPU:0"


# -- what a tensor is ---------------------------------------------------------------------------
def test_dtype_shape_ndim_device():
    x = fl.constant(np.zeros((2, 3), np.float64))
    assert x.dtype == fl.float64 and isinstance(x.dtype, fl.DType)
    assert x.shape == (2, 3) and isinstance(x.shape, fl.TensorShape)
    assert x.get_shape() == (2, 3)
    assert x.ndim == 2
    assert x.device == CPU0
    s = fl.constant(1.0)
    assert (s.shape, s.ndim) == ((), 0)


def test_numpy_is_a_read_only_view_of_the_values():
    x = fl.constant([[1.0, 2.0], [3.0, 4.0]])
    a = x.numpy()
    assert isinstance(a, np.ndarray) and a.dtype == np.float32
    np.testing.assert_array_equal(a, [[1, 2], [3, 4]])
    with pytest.raises(ValueError):
        a[0, 0] = 9.0
    assert x.numpy()[0, 0] == 1.0


@pytest.mark.parametrize("make,expected_type", [
    (lambda: fl.constant(2.5), np.float32),
    (lambda: fl.constant(3), np.int32),
    (lambda: fl.constant(True), np.bool_),
    (lambda: fl.reduce_sum(fl.constant([1.0, 2.0])), np.float32),   # a kernel that returns a numpy scalar
    (lambda: fl.constant([[7.0]])[0, 0], np.float32),
])
def test_numpy_of_a_0d_tensor_is_a_numpy_scalar(make, expected_type):
    value = make().numpy()
    assert isinstance(value, np.generic) and not isinstance(value, np.ndarray)
    assert type(value) is expected_type


def test_np_asarray_gives_the_values():
    x = fl.constant([[1, 2], [3, 4]], dtype=fl.int64)
    a = np.asarray(x)
    assert a.dtype == np.int64 and a.shape == (2, 2)
    np.testing.assert_array_equal(a, [[1, 2], [3, 4]])
    assert np.asarray(x, dtype=np.float32).dtype == np.float32
    b = np.array(x)      # a copy: writable, and writing to it leaves the tensor alone
    b[0, 0] = 99
    assert x.numpy()[0, 0] == 1


def test_np_asarray_cannot_mutate_the_tensor():
    x = fl.constant([1.0, 2.0])
    a = np.asarray(x)
    try:
        a[0] = 99.0
    except ValueError:
        pass   # read-only, like .numpy(): fine
    assert x.numpy()[0] == 1.0


def test_repr():
    x = fl.constant([1.0, 2.0])
    assert repr(x).startswith("<fl.Tensor: shape=(2,), dtype=float32, numpy=")
    scalar = repr(fl.constant(3))
    assert scalar.startswith("<fl.Tensor: shape=(), dtype=int32, numpy=") and "3" in scalar
    assert repr(fl.zeros([3, 3])).startswith("<fl.Tensor: shape=(3, 3), dtype=float32, numpy=\n")


def test_bool_len_iter():
    assert bool(fl.constant(1.0)) is True
    assert bool(fl.constant(0)) is False
    assert bool(fl.constant([True])) is True
    with pytest.raises(ValueError):
        bool(fl.constant([1.0, 2.0]))   # ambiguous, as numpy and TensorFlow say
    x = fl.constant([[1, 2], [3, 4], [5, 6]])
    assert len(x) == 3
    rows = list(x)
    assert len(rows) == 3 and all(isinstance(r, fl.Tensor) for r in rows)
    np.testing.assert_array_equal(rows[2].numpy(), [5, 6])
    with pytest.raises(TypeError):
        len(fl.constant(1.0))
    with pytest.raises(TypeError):
        iter(fl.constant(1.0))


def test_float_int_index_format():
    assert float(fl.constant(2.5)) == 2.5 and type(float(fl.constant(2.5))) is float
    assert int(fl.constant(7)) == 7
    assert int(fl.constant(2.9)) == 2
    assert [10, 20, 30][fl.constant(1)] == 20
    assert range(10)[fl.constant(3, dtype=fl.int64)] == 3
    with pytest.raises(TypeError):
        [1, 2][fl.constant(1.0)]
    with pytest.raises(TypeError):
        [1, 2][fl.constant([1])]
    assert format(fl.constant(3.14159), ".2f") == "3.14"
    assert f"{fl.constant(2.0):.1f}" == "2.0"
    assert f"{fl.constant(1.0)}" == repr(fl.constant(1.0))


def test_tensors_are_unhashable_but_ref_works_as_a_key():
    x, y = fl.constant([1.0]), fl.constant([1.0])
    with pytest.raises(TypeError):
        hash(x)
    with pytest.raises(TypeError):
        {x: 1}
    table = {x.ref(): "x", y.ref(): "y"}
    assert len(table) == 2
    assert table[x.ref()] == "x" and table[y.ref()] == "y"
    assert x.ref().deref() is x
    assert x.ref() == x.ref() and x.ref() != y.ref()


def test_tensors_are_immutable():
    x = fl.constant([1.0, 2.0])
    with pytest.raises(TypeError, match="immutable"):
        x[0] = 5.0
    with pytest.raises(TypeError):
        x[0:1] = fl.constant([5.0])
    np.testing.assert_array_equal(x.numpy(), [1.0, 2.0])


def test_is_tensor():
    assert fl.is_tensor(fl.constant(1.0)) and fl.is_tensor(fl.Variable(1.0))
    assert not fl.is_tensor(np.zeros(2)) and not fl.is_tensor(1.0)


# -- fl.constant --------------------------------------------------------------------------------
def test_constant_copies_numpy_input():
    src = np.array([1.0, 2.0, 3.0], np.float32)
    for x in (fl.constant(src), fl.constant(src, dtype=fl.float32), fl.constant(src, shape=[3])):
        src[0] = 99.0
        assert x.numpy()[0] == 1.0
        src[0] = 1.0


def test_constant_with_dtype_casts():
    x = fl.constant([1, 2], dtype=fl.float64)
    assert x.dtype == fl.float64
    assert fl.constant(np.array([1.5]), dtype="float32").dtype == fl.float32
    y = fl.constant(fl.constant([1.5, 2.5]), dtype=fl.float64)
    assert y.dtype == fl.float64
    np.testing.assert_array_equal(y.numpy(), [1.5, 2.5])


def test_constant_shape_broadcasts_a_scalar_and_reshapes_a_matching_size():
    x = fl.constant(7.0, shape=[2, 3])
    assert x.shape == (2, 3) and x.dtype == fl.float32
    np.testing.assert_array_equal(x.numpy(), np.full((2, 3), 7.0))
    np.testing.assert_array_equal(fl.constant([5], shape=(2,)).numpy(), [5, 5])
    np.testing.assert_array_equal(fl.constant([1, 2, 3, 4], shape=[2, 2]).numpy(), [[1, 2], [3, 4]])


def test_constant_bad_shape_raises():
    with pytest.raises(InvalidArgumentError, match=r"\(2, 2\)"):
        fl.constant([1.0, 2.0, 3.0], shape=[2, 2])


# -- conversion rules (as in TensorFlow) --------------------------------------------------------
@pytest.mark.parametrize("value,dtype", [
    (1.5, fl.float32), ([1.0, 2.0], fl.float32), (3, fl.int32), ([[1, 2]], fl.int32), (True, fl.bool),
    ([True, False], fl.bool), (2**40, fl.int64), (np.float64(1.0), fl.float64), (np.int16(1), fl.int16),
    (np.zeros(2, np.float64), fl.float64), (np.zeros(2, np.int64), fl.int64), (np.zeros(2, np.uint8), fl.uint8),
    (np.zeros(2, np.float16), fl.float16),
])
def test_default_dtypes(value, dtype):
    assert fl.constant(value).dtype == dtype
    assert fl.convert_to_tensor(value).dtype == dtype


def test_convert_to_tensor_passes_tensors_through_and_checks_dtype():
    x = fl.constant([1.0])
    assert fl.convert_to_tensor(x) is x
    assert fl.convert_to_tensor(x, dtype=fl.float32) is x
    with pytest.raises(InvalidArgumentError, match="float32"):
        fl.convert_to_tensor(x, dtype=fl.int32)


def test_convert_to_tensor_dtype_and_dtype_hint():
    assert fl.convert_to_tensor(1, dtype=fl.float64).dtype == fl.float64
    assert fl.convert_to_tensor(2.0, dtype=fl.int32).dtype == fl.int32   # a whole float converts
    assert fl.convert_to_tensor(1, dtype_hint=fl.float32).dtype == fl.float32
    assert fl.convert_to_tensor(np.zeros(1, np.int64), dtype_hint=fl.float32).dtype == fl.int64


def test_a_float_is_never_truncated_to_an_int():
    with pytest.raises(TypeError, match="fractional"):
        fl.convert_to_tensor(1.5, dtype=fl.int32)
    with pytest.raises(TypeError):
        fl.constant([1.0, 2.5], dtype=fl.int64)
    x = fl.constant([1, 2])
    with pytest.raises(InvalidArgumentError):
        x + 0.5
    with pytest.raises(InvalidArgumentError):
        fl.maximum(1.5, x)
    np.testing.assert_array_equal((x + 2.0).numpy(), [3, 4])   # a whole float is exact: allowed
    assert (x + 2.0).dtype == fl.int32


def test_python_numbers_take_the_tensor_dtype():
    assert (fl.constant([1.0], dtype=fl.float64) + 1.5).dtype == fl.float64
    assert (fl.constant([1], dtype=fl.int64) * 3).dtype == fl.int64
    assert (2 * fl.constant([1], dtype=fl.int64)).dtype == fl.int64
    assert (fl.constant([1.0], dtype=fl.float16) + 1).dtype == fl.float16


def test_tensors_of_different_dtypes_do_not_mix():
    with pytest.raises(InvalidArgumentError):
        fl.constant([1.0]) + fl.constant([1.0], dtype=fl.float64)
    with pytest.raises(InvalidArgumentError):
        fl.constant([1.0]) + np.array([1.0])   # numpy float64 next to float32
    assert (fl.constant([1.0]) + np.array([1.0], np.float32)).dtype == fl.float32


@pytest.mark.parametrize("value", ["abc", ["a", "b"], b"bytes", [1.0, "x"], {"a": 1}, [[1, 2], [3]], None])
def test_non_numbers_raise_type_error(value):
    with pytest.raises(TypeError):
        fl.constant(value)
    with pytest.raises(TypeError):
        fl.convert_to_tensor(value)


@pytest.mark.parametrize("array", [np.array(["a", "b"]), np.array([1, None], dtype=object), np.array([1 + 2j]),
                                   np.array(["2020-01-01"], dtype="datetime64[D]")],
                         ids=["str", "object", "complex", "datetime"])
def test_numpy_arrays_of_unsupported_dtypes_raise_type_error_at_conversion(array):
    with pytest.raises(TypeError):
        fl.constant(array)


def test_non_native_byte_order_arrays_convert():
    x = fl.constant(np.array([1.0, 2.0], dtype=">f4"))
    assert x.dtype == fl.float32
    np.testing.assert_array_equal((x + 1.0).numpy(), [2.0, 3.0])


def test_string_as_an_op_input_raises():
    with pytest.raises(InvalidArgumentError):
        fl.add(fl.constant([1.0]), "a")


# -- Variable -----------------------------------------------------------------------------------
def test_variable_basics_and_repr():
    v = fl.Variable([1.0, 2.0], name="w")
    assert isinstance(v, fl.Tensor)
    assert v.dtype == fl.float32 and v.shape == (2,)
    assert v.name == "w:0" and v.trainable is True
    assert repr(v).startswith("<fl.Variable 'w:0' shape=(2,) dtype=float32, numpy=")
    assert fl.Variable(0.0).name == "Variable:0"
    assert fl.Variable(1.0, trainable=False).trainable is False
    assert fl.Variable([1, 2], dtype=fl.float64).dtype == fl.float64
    assert fl.Variable(lambda: fl.zeros([3])).shape == (3,)


def test_variable_copies_its_initial_value():
    src = np.array([1.0, 2.0], np.float32)
    v = fl.Variable(src)
    src[0] = 9.0
    assert v.numpy()[0] == 1.0


def test_assign_assign_add_assign_sub():
    v = fl.Variable([1.0, 2.0])
    assert v.assign([3.0, 4.0]) is v
    np.testing.assert_array_equal(v.numpy(), [3.0, 4.0])
    assert v.assign_add([1.0, 1.0]) is v
    np.testing.assert_array_equal(v.numpy(), [4.0, 5.0])
    assert v.assign_sub(fl.constant([0.5, 0.5])) is v
    np.testing.assert_array_equal(v.numpy(), [3.5, 4.5])
    assert v.assign([0.0, 0.0], read_value=False) is None
    assert v.dtype == fl.float32


def test_assign_keeps_the_dtype():
    v = fl.Variable([1.0, 2.0])
    v.assign([3, 4])
    assert v.dtype == fl.float32
    v.assign(np.array([5, 6], np.int64))
    assert v.dtype == fl.float32
    np.testing.assert_array_equal(v.numpy(), [5.0, 6.0])
    w = fl.Variable(0.0)
    w.assign_add(1.0)
    w.assign_add(2)
    assert w.dtype == fl.float32 and float(w) == 3.0
    with pytest.raises(InvalidArgumentError):
        v.assign(fl.constant([1.0, 2.0], dtype=fl.float64))
    with pytest.raises(TypeError):
        fl.Variable([1, 2]).assign_add([0.5, 0.5])   # would truncate


def test_assign_from_a_numpy_array_copies_it():
    v = fl.Variable([1.0, 2.0])
    src = np.array([3.0, 4.0], np.float32)
    v.assign(src)
    src[0] = 99.0
    assert v.numpy()[0] == 3.0


@pytest.mark.parametrize("method", ["assign", "assign_add", "assign_sub"])
def test_assign_shape_mismatch_names_the_shapes(method):
    v = fl.Variable(fl.zeros([2, 3]))
    with pytest.raises(InvalidArgumentError) as info:
        getattr(v, method)(fl.zeros([3, 2]))
    message = str(info.value)
    assert message.startswith(f"{method}:")
    assert "(2, 3)" in message and "(3, 2)" in message
    assert "test_tensor.py:" in message
    assert v.shape == (2, 3)


def test_read_value_is_a_snapshot():
    v = fl.Variable([1.0, 2.0])
    before = v.read_value()
    also_before = v.value()
    assert type(before) is fl.Tensor
    v.assign([5.0, 6.0])
    v.assign_add([1.0, 1.0])
    np.testing.assert_array_equal(before.numpy(), [1.0, 2.0])
    np.testing.assert_array_equal(also_before.numpy(), [1.0, 2.0])
    np.testing.assert_array_equal(v.read_value().numpy(), [6.0, 7.0])


def test_ops_read_the_current_value():
    v = fl.Variable([1.0, 2.0])
    y = v * 2
    v.assign([10.0, 20.0])
    np.testing.assert_array_equal(y.numpy(), [2.0, 4.0])
    np.testing.assert_array_equal((v * 2).numpy(), [20.0, 40.0])


def test_only_trainable_variables_are_watched_automatically():
    w = fl.Variable(3.0)
    frozen = fl.Variable(3.0, trainable=False)
    with fl.GradientTape() as tape:
        y = w * frozen
    gw, gf = tape.gradient(y, [w, frozen])
    assert float(gw) == 3.0
    assert gf is None


# -- fl.random ----------------------------------------------------------------------------------
@pytest.mark.parametrize("sample", [
    lambda: fl.random.normal([3, 4]),
    lambda: fl.random.uniform([5]),
    lambda: fl.random.uniform([5], 0, 10, dtype=fl.int32),
    lambda: fl.random.truncated_normal([6], stddev=2.0),
])
def test_set_seed_makes_samples_repeatable(sample):
    fl.random.set_seed(123)
    first = [sample().numpy() for _ in range(2)]
    fl.random.set_seed(123)
    second = [sample().numpy() for _ in range(2)]
    np.testing.assert_array_equal(first[0], second[0])
    np.testing.assert_array_equal(first[1], second[1])
    assert not np.array_equal(first[0], first[1])   # the sequence moves on
    fl.random.set_seed(124)
    assert not np.array_equal(sample().numpy(), first[0])


def test_random_dtypes_and_shapes():
    assert fl.random.normal([2, 3]).dtype == fl.float32
    assert fl.random.normal(4, dtype=fl.float64).shape == (4,)
    assert fl.random.uniform(fl.constant([2, 2])).shape == (2, 2)
    assert fl.random.uniform([3], maxval=5, dtype=fl.int64).dtype == fl.int64
    assert fl.random.truncated_normal([3], dtype="float64").dtype == fl.float64
    with pytest.raises(TypeError):
        fl.random.normal([2], dtype=fl.int32)
    with pytest.raises(TypeError):
        fl.random.truncated_normal([2], dtype=fl.int32)
    with pytest.raises(TypeError):
        fl.random.uniform([2], dtype=fl.bool)


def test_uniform_int_needs_maxval_and_stays_in_range():
    with pytest.raises(ValueError, match="maxval"):
        fl.random.uniform([3], dtype=fl.int32)
    x = fl.random.uniform([1000], minval=-2, maxval=3, dtype=fl.int32, seed=0).numpy()
    assert x.min() >= -2 and x.max() <= 2 and set(np.unique(x)) == {-2, -1, 0, 1, 2}
    f = fl.random.uniform([1000], minval=2.0, maxval=4.0, seed=0).numpy()
    assert f.min() >= 2.0 and f.max() < 4.0


def test_truncated_normal_within_two_stddev():
    x = fl.random.truncated_normal([5000], mean=1.0, stddev=0.5, seed=1).numpy()
    assert np.all(np.abs(x - 1.0) <= 2 * 0.5 + 1e-6)
    assert abs(x.mean() - 1.0) < 0.05
    assert x.std() > 0.3   # truncation at 2 sigma keeps about 88% of the spread


def test_normal_moments_and_per_call_seed():
    x = fl.random.normal([20000], mean=3.0, stddev=2.0, seed=5).numpy()
    assert abs(x.mean() - 3.0) < 0.1 and abs(x.std() - 2.0) < 0.1
    np.testing.assert_array_equal(fl.random.normal([4], seed=7).numpy(), fl.random.normal([4], seed=7).numpy())


def test_shuffle_permutes_the_first_axis():
    x = np.arange(20).reshape(10, 2)
    out = fl.random.shuffle(fl.constant(x), seed=3).numpy()
    assert sorted(map(tuple, out.tolist())) == sorted(map(tuple, x.tolist()))
    assert not np.array_equal(out, x)


# -- fl.DType -----------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype,name,np_dtype", [
    (fl.float32, "float32", np.float32), (fl.float64, "float64", np.float64), (fl.float16, "float16", np.float16),
    (fl.int32, "int32", np.int32), (fl.int64, "int64", np.int64), (fl.int8, "int8", np.int8),
    (fl.int16, "int16", np.int16), (fl.uint8, "uint8", np.uint8), (fl.bool, "bool", np.bool_),
])
def test_dtype_equality(dtype, name, np_dtype):
    assert dtype.name == name
    assert dtype == name and dtype == np_dtype and dtype == np.dtype(np_dtype) and dtype == dtype
    assert fl.as_dtype(name) is dtype and fl.as_dtype(np_dtype) is dtype
    assert hash(dtype) == hash(fl.as_dtype(np.dtype(np_dtype)))
    assert repr(dtype) == f"fl.{name}"
    assert dtype.as_numpy_dtype == np.dtype(np_dtype)


def test_dtype_inequality_and_properties():
    assert fl.float32 != fl.float64 and fl.float32 != "float64" and fl.int32 != np.int64
    assert fl.float32 != "no_such_dtype"
    assert fl.bool == bool and fl.bool_ is fl.bool
    assert fl.float32.is_floating and not fl.float32.is_integer
    assert fl.int8.is_integer and fl.uint8.is_integer and not fl.int8.is_floating
    assert fl.bool.is_bool and not fl.bool.is_integer
    assert (fl.float64.size, fl.int16.size, fl.bool.size) == (8, 2, 1)
    assert (fl.int8.min, fl.int8.max) == (-128, 127)
    assert fl.float32.max == np.finfo(np.float32).max
    with pytest.raises(TypeError):
        fl.as_dtype("complex128")
    with pytest.raises(TypeError):
        fl.as_dtype("no_such_dtype")


def test_dtype_is_not_equal_to_none():
    assert fl.float64 != None  # noqa: E711 - this is the comparison under test
    with pytest.raises(TypeError):
        fl.as_dtype(None)


# -- fl.TensorShape -----------------------------------------------------------------------------
def test_tensor_shape_methods():
    s = fl.TensorShape([2, None, 3])
    assert s == (2, None, 3) and isinstance(s, tuple)
    assert s.rank == 3 and len(s) == 3
    assert s.as_list() == [2, None, 3]
    assert s.num_elements() is None
    assert not s.is_fully_defined()
    assert s[0] == 2 and s[1] is None
    assert isinstance(s[1:], fl.TensorShape) and s[1:] == (None, 3)
    assert repr(s) == "TensorShape([2, None, 3])"
    full = fl.TensorShape((4, 5))
    assert full.num_elements() == 20 and full.is_fully_defined()
    assert fl.TensorShape([]).num_elements() == 1 and fl.TensorShape([]).rank == 0
    assert fl.TensorShape([np.int64(2), 3.0]) == (2, 3) and type(fl.TensorShape([np.int64(2)])[0]) is int


def test_tensor_shape_compatibility():
    s = fl.TensorShape([2, None, 3])
    assert s.is_compatible_with([2, 7, 3])
    assert s.is_compatible_with((None, None, None))
    assert not s.is_compatible_with([2, 7, 4])
    assert not s.is_compatible_with([2, 7])
    assert fl.TensorShape([]).is_compatible_with([])


def test_tensor_shape_none_is_unknown_rank():
    s = fl.TensorShape(None)           # as in TensorFlow: rank unknown, not a scalar
    assert s.rank is None and str(s) == "<unknown>"
    assert s.is_compatible_with([2, 3]) and s.is_compatible_with([])
    with pytest.raises(ValueError, match="rank"):
        s.as_list()


def test_variable_creator_scope_sees_each_new_variable_innermost_only():
    from flowlab.core.tensor import variable_creator_scope
    outer, inner = [], []
    with variable_creator_scope(outer.append):
        a = fl.Variable(1.0)
        with variable_creator_scope(inner.append):
            b = fl.Variable(2.0)
        c = fl.Variable(3.0)
    fl.Variable(4.0)
    assert outer == [a, c] and inner == [b]
