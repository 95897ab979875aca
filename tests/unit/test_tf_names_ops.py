"""The op-level names a TensorFlow tutorial types: fl.print, fl.math.*, fl.split, top_k, and the
eager-mode switches. Each is checked against numpy, eagerly and traced."""
import io
import warnings

import numpy as np
import pytest

import flowlab as fl


# -- fl.print --------------------------------------------------------------------------------
def test_print_eager_writes_values_with_sep_and_end():
    out = io.StringIO()
    assert fl.print("loss:", fl.constant([1, 2, 3]), 7, output_stream=out, sep="|", end=";\n") is None
    assert out.getvalue() == "loss:|[1 2 3]|7;\n"


def test_print_defaults_to_stderr_looked_up_when_it_runs(capsys):
    fl.print("step", fl.constant(2))
    captured = capsys.readouterr()
    assert captured.err == "step 2\n" and captured.out == ""


def test_print_inside_function_prints_at_every_call_not_at_trace_time():
    out = io.StringIO()

    @fl.function
    def step(x):
        fl.print("x =", x, output_stream=out)
        return x * 2.0

    for v in (1.0, 2.0, 3.0):
        step(fl.constant(v))
    assert out.getvalue() == "x = 1.0\nx = 2.0\nx = 3.0\n"
    assert step.get_concrete_function(fl.constant(1.0)) is step.get_concrete_function(fl.constant(5.0))  # one trace


def test_print_summarizes_long_tensors_and_writes_to_a_file_url(tmp_path):
    out = io.StringIO()
    fl.print(fl.range(100), output_stream=out)
    assert "..." in out.getvalue() and out.getvalue().split()[-1] == "99]"
    full = io.StringIO()
    fl.print(fl.range(10), output_stream=full, summarize=-1)
    assert "..." not in full.getvalue()
    path = tmp_path / "log.txt"
    fl.print("a", fl.constant(1.5), output_stream=f"file://{path}")
    fl.print("b", output_stream=f"file://{path}")
    assert path.read_text() == "a 1.5\nb\n"
    with pytest.raises(ValueError, match="file://"):
        fl.print("x", output_stream="stdout")


# -- eager-mode switches ----------------------------------------------------------------------
def test_executing_eagerly_and_enable_eager_execution():
    assert fl.executing_eagerly()
    seen = []

    @fl.function
    def f(x):
        seen.append(fl.executing_eagerly())
        return x + 1

    f(fl.constant(1))
    assert seen == [False]
    with pytest.warns(UserWarning, match="eager by default"):
        fl.enable_eager_execution()
    assert fl.executing_eagerly()


def test_the_eager_execution_tutorial_program_runs():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fl.enable_eager_execution()
    a = fl.constant([[2.0, 3.0], [4.0, 5.0]])
    assert fl.matmul(a, a).numpy().tolist() == [[16.0, 21.0], [28.0, 37.0]]


# -- fl.split --------------------------------------------------------------------------------
@pytest.mark.parametrize("splits,axis", [(3, 1), ([1, 2, 3], 1), ([1, -1, 2], -1), (2, 0), ([0, 6], 1)])
def test_split_matches_numpy_eager_and_traced(splits, axis):
    x = np.arange(24, dtype=np.float32).reshape(2, 6, 2)[:, :, 0]
    sizes = [x.shape[axis] // splits] * splits if isinstance(splits, int) else list(splits)
    if -1 in sizes:
        sizes[sizes.index(-1)] = x.shape[axis] - sum(s for s in sizes if s != -1)
    want = np.split(x, np.cumsum(sizes)[:-1], axis=axis)
    eager = fl.split(fl.constant(x), splits, axis=axis)
    traced = fl.function(lambda t: fl.split(t, splits, axis=axis))(fl.constant(x))
    for got in (eager, traced):
        assert len(got) == len(want)
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g.numpy(), w)


def test_split_with_unknown_size_and_a_rest_part():
    @fl.function(input_signature=[fl.TensorSpec([None], fl.float32)])
    def parts(x):
        head, rest, tail = fl.split(x, [1, -1, 2])
        return head, rest, tail

    head, rest, tail = parts(fl.range(6.0))
    assert (head.numpy().tolist(), rest.numpy().tolist(), tail.numpy().tolist()) == ([0.0], [1.0, 2.0, 3.0], [4.0, 5.0])


def test_split_gradient_flows_back_to_each_part():
    x = fl.constant(np.arange(6.0).reshape(2, 3))
    with fl.GradientTape() as tape:
        tape.watch(x)
        a, b = fl.split(x, [1, 2], axis=1)
        y = 3.0 * fl.reduce_sum(a) + fl.reduce_sum(b * b)
    np.testing.assert_array_equal(tape.gradient(y, x).numpy(), [[3.0, 2.0, 4.0], [3.0, 8.0, 10.0]])


def test_split_errors_name_the_shape_and_what_to_do():
    x = fl.zeros([2, 6])
    with pytest.raises(ValueError, match=r"cannot cut axis 1 of shape \(2, 6\) into 4 equal parts"):
        fl.split(x, 4, axis=1)
    with pytest.raises(ValueError, match="do not add up to 6"):
        fl.split(x, [2, 2], axis=1)
    with pytest.raises(ValueError, match="num=2 but the split makes 3 parts"):
        fl.split(x, 3, axis=1, num=2)
    assert len(fl.split(x, 3, axis=1, num=3)) == 3


# -- fl.math ---------------------------------------------------------------------------------
def test_fl_math_holds_the_same_functions_as_the_top_level():
    for name in ("reduce_sum", "reduce_mean", "square", "sqrt", "exp", "log", "abs", "maximum", "minimum", "add",
                 "multiply", "divide", "subtract", "pow", "sigmoid", "tanh", "argmax", "equal", "greater", "less",
                 "round", "sign", "reduce_max", "reduce_min", "reduce_prod", "top_k"):
        assert getattr(fl.math, name) is getattr(fl, name), name
    assert fl.math.truediv is fl.divide and fl.math.softplus is fl.nn.softplus


X = np.array([[-2.5, -0.5, 0.0, 0.5], [1.5, 2.5, 3.0, 40.0]], dtype=np.float32)


def _softplus(x):
    return np.logaddexp(0, x)


@pytest.mark.parametrize("name,fn,want", [
    ("log1p", lambda x: fl.math.log1p(fl.abs(x)), lambda x: np.log1p(np.abs(x))),
    ("expm1", fl.math.expm1, np.expm1),
    ("softplus", fl.math.softplus, _softplus),
    ("log_sigmoid", fl.math.log_sigmoid, lambda x: -_softplus(-x)),
    ("round", fl.math.round, np.round),
    ("floor", fl.math.floor, np.floor),
    ("ceil", fl.math.ceil, np.ceil),
    ("rsqrt", lambda x: fl.math.rsqrt(fl.abs(x) + 1.0), lambda x: 1 / np.sqrt(np.abs(x) + 1)),
    ("reciprocal", lambda x: fl.math.reciprocal(x + 10.0), lambda x: 1 / (x + 10)),
    ("squared_difference", lambda x: fl.math.squared_difference(x, 1.0), lambda x: (x - 1) ** 2),
    ("reduce_logsumexp", lambda x: fl.math.reduce_logsumexp(x, axis=1),
     lambda x: np.log(np.exp(x.astype(np.float64)).sum(1))),
    ("reduce_std", lambda x: fl.math.reduce_std(x, axis=0), lambda x: x.std(0)),
    ("reduce_variance", fl.math.reduce_variance, lambda x: x.var()),
    ("l2_normalize", lambda x: fl.math.l2_normalize(x, axis=1),
     lambda x: x / np.sqrt((x ** 2).sum(1, keepdims=True))),
    ("count_nonzero", fl.math.count_nonzero, np.count_nonzero),
    ("divide_no_nan", lambda x: fl.math.divide_no_nan(x, fl.round(x)),
     lambda x: np.where(np.round(x) == 0, 0, x / np.where(np.round(x) == 0, 1, np.round(x)))),
    ("is_finite", lambda x: fl.math.is_finite(fl.math.log(x)), lambda x: np.isfinite(np.log(x))),
])
def test_math_functions_match_numpy_eager_and_traced(name, fn, want):
    x = fl.constant(X)
    with np.errstate(all="ignore"):
        expected = want(X)
    for got in (fn(x), fl.function(fn)(x)):
        np.testing.assert_allclose(got.numpy(), expected, rtol=2e-6, atol=1e-6, err_msg=name)


def test_gradients_of_the_new_math_ops_match_central_differences():
    x = np.array([0.3, 1.2, 2.0])
    for fn in (fl.math.log1p, fl.math.softplus, fl.math.log_sigmoid, fl.math.rsqrt, fl.math.reciprocal,
               lambda t: fl.math.reduce_logsumexp(t * t)):
        t = fl.constant(x)
        with fl.GradientTape() as tape:
            tape.watch(t)
            y = fl.reduce_sum(fn(t))
        h = 1e-6
        numeric = [(float(fl.reduce_sum(fn(fl.constant(x + h * e)))) - float(fl.reduce_sum(fn(fl.constant(x - h * e)))))
                   / (2 * h) for e in np.eye(3)]
        np.testing.assert_allclose(tape.gradient(y, t).numpy(), numeric, rtol=1e-5)


def test_divide_no_nan_has_no_nan_in_its_gradient():
    x, y = fl.constant([1.0, 2.0]), fl.constant([0.0, 4.0])
    with fl.GradientTape() as tape:
        tape.watch([x, y])
        z = fl.reduce_sum(fl.math.divide_no_nan(x, y))
    gx, gy = tape.gradient(z, [x, y])
    assert gx.numpy().tolist() == [0.0, 0.25] and gy.numpy().tolist() == [0.0, -0.125]


def test_top_k_values_indices_and_ties():
    x = fl.constant([[1.0, 3.0, 2.0, 3.0], [4.0, 0.0, 5.0, -1.0]])
    values, indices = fl.math.top_k(x, k=2)
    assert values.numpy().tolist() == [[3.0, 3.0], [5.0, 4.0]]
    assert indices.numpy().tolist() == [[1, 3], [2, 0]]    # of equal values, the lower index first
    assert fl.math.top_k(x, 2).indices.dtype == fl.int32
    traced = fl.function(lambda t: fl.math.top_k(t, 2).values)(x)
    assert traced.numpy().tolist() == values.numpy().tolist()
    with pytest.raises(fl.InvalidArgumentError, match="k=5 needs a last axis of at least 5"):
        fl.math.top_k(x, 5)
    assert fl.math.in_top_k([2, 1], x, 2).numpy().tolist() == [False, False]
    assert fl.math.in_top_k([3, 2], x, 2).numpy().tolist() == [True, True]


def test_unknown_math_name_says_so_with_a_suggestion():
    with pytest.raises(AttributeError, match=r"'flowlab.math' has no attribute 'reduce_summ'; did you mean 'reduce_sum'"):
        fl.math.reduce_summ
    assert not hasattr(fl.math, "bessel_i0")


def test_clip_by_value_and_reduce_any_all():
    x = fl.constant([-1.0, 0.5, 3.0])
    assert fl.clip_by_value(x, 0.0, 1.0).numpy().tolist() == [0.0, 0.5, 1.0]
    b = fl.constant([[True, False], [True, True]])
    assert fl.reduce_any(b, axis=1).numpy().tolist() == [True, True]
    assert fl.math.reduce_all(b, axis=1).numpy().tolist() == [False, True]
