"""fl.keras.layers: shapes, weights, numerics against plain numpy, and the errors bad inputs get."""
from __future__ import annotations

import numpy as np
import pytest

import flowlab as fl

L = fl.keras.layers


def rng_array(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


# -- Dense ---------------------------------------------------------------------------------------
def test_dense_computes_activation_of_x_times_kernel_plus_bias():
    layer = L.Dense(3, activation="relu")
    x = rng_array(4, 5)
    y = layer(x)
    assert y.shape == (4, 3) and y.dtype == fl.float32
    kernel, bias = layer.get_weights()
    assert kernel.shape == (5, 3) and bias.shape == (3,)
    np.testing.assert_allclose(y.numpy(), np.maximum(x @ kernel + bias, 0), rtol=1e-6)


def test_dense_weights_are_glorot_uniform_and_zero_bias():
    fl.random.set_seed(0)
    layer = L.Dense(200)
    layer(np.zeros((1, 300), np.float32))
    kernel, bias = layer.get_weights()
    limit = np.sqrt(6 / (300 + 200))
    assert np.all(np.abs(kernel) <= limit) and kernel.max() > 0.9 * limit and kernel.min() < -0.9 * limit
    assert np.all(bias == 0)


def test_set_seed_makes_the_initial_weights_repeat():
    fl.random.set_seed(7)
    a = L.Dense(4)
    a(np.zeros((1, 3), np.float32))
    fl.random.set_seed(7)
    b = L.Dense(4)
    b(np.zeros((1, 3), np.float32))
    np.testing.assert_array_equal(a.get_weights()[0], b.get_weights()[0])


def test_dense_given_a_3d_input_names_the_layer_the_shape_and_the_line():
    layer = L.Dense(10, name="classifier")
    with pytest.raises(fl.errors.InvalidArgumentError) as info:
        layer(np.zeros((2, 8, 8), np.float32))
    message = str(info.value)
    assert "Dense layer 'classifier'" in message and "2-D" in message and "float32[2,8,8]" in message
    assert "Flatten" in message
    assert "test_keras_layers.py" in message and "layer(np.zeros((2, 8, 8), np.float32))" in message


def test_dense_refuses_inputs_with_other_features_than_it_was_built_for():
    layer = L.Dense(2)
    layer(np.zeros((1, 3), np.float32))
    with pytest.raises(fl.errors.InvalidArgumentError, match="built for inputs of 3 features.*float32\\[1,4\\]"):
        layer(np.zeros((1, 4), np.float32))


def test_float64_inputs_are_cast_to_the_layer_dtype():
    y = L.Dense(2)(np.ones((3, 4)))       # numpy float64
    assert y.dtype == fl.float32


def test_unknown_keyword_and_bad_units_are_refused():
    with pytest.raises(TypeError, match="unexpected keyword"):
        L.Dense(3, units_=4)
    with pytest.raises(ValueError, match="units"):
        L.Dense(0)


# -- Conv2D, MaxPool2D ----------------------------------------------------------------------------
def reference_conv(x, w, stride, padding):
    """Direct convolution: a loop over output positions (NHWC, HWIO), TensorFlow's SAME padding."""
    n, h, wd, c = x.shape
    kh, kw, _, o = w.shape
    if padding == "same":
        oh, ow = -(-h // stride), -(-wd // stride)
        ph, pw = max((oh - 1) * stride + kh - h, 0), max((ow - 1) * stride + kw - wd, 0)
        x = np.pad(x, ((0, 0), (ph // 2, ph - ph // 2), (pw // 2, pw - pw // 2), (0, 0)))
    else:
        oh, ow = (h - kh) // stride + 1, (wd - kw) // stride + 1
    out = np.zeros((n, oh, ow, o))
    for i in range(oh):
        for j in range(ow):
            patch = x[:, i * stride:i * stride + kh, j * stride:j * stride + kw, :]
            out[:, i, j, :] = np.tensordot(patch, w, axes=([1, 2, 3], [0, 1, 2]))
    return out


@pytest.mark.parametrize("stride,padding", [(1, "valid"), (1, "same"), (2, "same"), (2, "valid")])
def test_conv2d_matches_a_direct_convolution(stride, padding):
    layer = L.Conv2D(4, 3, strides=stride, padding=padding, bias_initializer="ones")
    x = rng_array(2, 7, 6, 3)
    y = layer(x)
    kernel, bias = layer.get_weights()
    want = reference_conv(x.astype(np.float64), kernel.astype(np.float64), stride, padding) + bias
    assert y.shape == want.shape == layer.compute_output_shape((2, 7, 6, 3))
    np.testing.assert_allclose(y.numpy(), want, rtol=1e-4, atol=1e-5)


def test_conv2d_given_flat_images_says_to_reshape_them():
    with pytest.raises(fl.errors.InvalidArgumentError, match=r"Conv2D layer .*4-D images.*Reshape\(\(8, 8, 1\)\).*float32\[5,64\]"):
        L.Conv2D(2, 3)(np.zeros((5, 64), np.float32))


def test_conv2d_window_larger_than_the_image_is_refused():
    with pytest.raises(fl.errors.InvalidArgumentError, match="5x5 window does not fit images of 3x3"):
        L.Conv2D(2, 5)(np.zeros((1, 3, 3, 1), np.float32))


def test_max_pool_takes_the_largest_of_each_window():
    x = np.arange(2 * 4 * 4 * 3, dtype=np.float32).reshape(2, 4, 4, 3) % 7
    y = L.MaxPool2D(2)(x).numpy()
    want = x.reshape(2, 2, 2, 2, 2, 3).max(axis=(2, 4))
    np.testing.assert_array_equal(y, want)
    assert L.MaxPooling2D is L.MaxPool2D


def test_max_pool_same_padding_keeps_the_ceiling_of_the_size():
    y = L.MaxPool2D(2, padding="same")(rng_array(1, 5, 5, 2))
    assert y.shape == (1, 3, 3, 2)


# -- BatchNormalization, Dropout -----------------------------------------------------------------
def test_batch_norm_normalizes_with_batch_statistics_while_training():
    layer = L.BatchNormalization(momentum=0.5, epsilon=1e-6)
    x = rng_array(64, 3) * np.array([1.0, 5.0, 0.1], np.float32) + np.array([2.0, -1.0, 7.0], np.float32)
    y = layer(x, training=True).numpy()
    np.testing.assert_allclose(y.mean(axis=0), 0, atol=1e-4)
    np.testing.assert_allclose(y.std(axis=0), 1, atol=1e-2)
    gamma, beta, mean, var = layer.get_weights()       # trainable first, then the moving statistics
    np.testing.assert_allclose(mean, 0.5 * x.mean(axis=0), rtol=1e-5)
    np.testing.assert_allclose(var, 0.5 + 0.5 * x.var(axis=0), rtol=1e-4)
    assert [w.trainable for w in layer.weights] == [True, True, False, False]


def test_batch_norm_uses_the_moving_statistics_outside_training():
    layer = L.BatchNormalization(epsilon=0.0)
    layer(np.zeros((2, 2), np.float32))
    layer.set_weights([np.array([2.0, 1.0]), np.array([0.5, 0.0]), np.array([1.0, -1.0]), np.array([4.0, 1.0])])
    y = layer(np.array([[3.0, 0.0]], np.float32)).numpy()
    np.testing.assert_allclose(y, [[2.0 * (3 - 1) / 2 + 0.5, 1.0]])


def test_batch_norm_over_image_channels():
    layer = L.BatchNormalization()
    y = layer(rng_array(4, 3, 3, 5) * 3 + 1, training=True).numpy()
    np.testing.assert_allclose(y.mean(axis=(0, 1, 2)), 0, atol=1e-4)
    assert layer.moving_mean.shape == (5,)


def test_dropout_only_while_training_and_keeps_the_expected_value():
    layer = L.Dropout(0.25, seed=3)
    x = np.ones((200, 50), np.float32)
    np.testing.assert_array_equal(layer(x).numpy(), x)
    y = layer(x, training=True).numpy()
    kept = y != 0
    assert 0.7 < kept.mean() < 0.8
    np.testing.assert_allclose(y[kept], 1 / 0.75, rtol=1e-6)
    assert not np.array_equal(layer(x, training=True).numpy(), y), "a new mask at every call"


def test_dropout_inside_a_traced_function_draws_a_new_mask_at_every_run():
    layer = L.Dropout(0.5)
    step = fl.function(lambda x: layer(x, training=True))
    x = fl.ones([100])
    a, b = step(x).numpy(), step(x).numpy()
    assert not np.array_equal(a, b)
    assert step.experimental_get_tracing_count() == 1


# -- Flatten, Reshape, Activation, Input ----------------------------------------------------------
def test_flatten_reshape_and_activation():
    x = rng_array(3, 2, 4)
    assert L.Flatten()(x).shape == (3, 8)
    assert L.Reshape((4, -1))(x).shape == (3, 4, 2)
    np.testing.assert_allclose(L.Activation("softmax")(x).numpy().sum(axis=-1), 1, rtol=1e-6)
    with pytest.raises(fl.errors.InvalidArgumentError, match="cannot reshape 8 values per example into \\(3, 3\\)"):
        L.Reshape((3, 3))(x)
    with pytest.raises(ValueError, match="unknown activation 'relu6'"):
        L.Activation("relu6")


def test_layers_have_unique_snake_case_names():
    a, b = L.BatchNormalization(), L.BatchNormalization()
    assert a.name.startswith("batch_normalization") and a.name != b.name
    assert L.Conv2D(1, 1).name.startswith("conv2d")


# -- tracking -------------------------------------------------------------------------------------
class Block(fl.keras.layers.Layer):
    def __init__(self):
        super().__init__()
        self.inner = [L.Dense(4), L.Dense(2)]
        self.scale = fl.Variable(2.0, name="scale")

    def call(self, x):
        return self.inner[1](self.inner[0](x)) * self.scale


def test_sublayers_in_attributes_and_lists_are_tracked():
    block = Block()
    block(np.ones((1, 3), np.float32))
    assert len(block.layers) == 2
    assert len(block.weights) == 5 and block.count_params() == 3 * 4 + 4 + 4 * 2 + 2 + 1
    assert {"inner/0", "inner/1", "scale"} <= set(block._checkpoint_children())


def test_a_frozen_layer_has_no_trainable_weights():
    block = Block()
    block(np.ones((1, 3), np.float32))
    block.inner[0].trainable = False
    assert len(block.trainable_weights) == 3 and len(block.non_trainable_weights) == 2


def test_weights_are_created_eagerly_even_when_first_called_while_tracing():
    layer = L.Dense(3)
    f = fl.function(lambda x: layer(x))
    out = f(fl.ones([2, 4]))
    assert out.shape == (2, 3)
    assert all(type(w) is fl.Variable and w.numpy().shape for w in layer.weights)


def test_set_weights_checks_count_and_shapes():
    layer = L.Dense(2)
    layer(np.ones((1, 3), np.float32))
    with pytest.raises(ValueError, match="has 2 weights, got 1"):
        layer.set_weights([np.zeros((3, 2))])
    with pytest.raises(ValueError, match="shape \\(3, 2\\), got \\(2, 2\\)"):
        layer.set_weights([np.zeros((2, 2)), np.zeros(2)])


def test_calling_a_layer_on_an_input_explains_there_is_no_functional_api():
    with pytest.raises(NotImplementedError, match="no functional API"):
        L.Dense(3)(fl.keras.Input(shape=(4,)))
