"""fl.debugging's numerics checks stop at the first op that makes NaN or Inf and explain it.

Each error must name the op that made the value (not a later one), count the NaN/+Inf/-Inf among
the output's elements, give every input's statistics, and point at this file's own line. While
checking is off, nothing may remain of it: no hook, and ``ACTIVE.count`` as before (fast paths on).
"""
from __future__ import annotations

import inspect
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

import flowlab as fl
from flowlab.core import numerics
from flowlab.core._context import ACTIVE, state
from flowlab.core import execute as execute_module
from flowlab.core.execute import get_op

NumericsError = fl.errors.NumericsError
THIS_FILE = os.path.basename(__file__)

# numpy warns about the very NaN/Inf these tests make on purpose
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def here() -> int:
    """The caller's current line number."""
    return inspect.currentframe().f_back.f_lineno


@pytest.fixture(autouse=True)
def checking_off_after():
    before = ACTIVE.count
    yield
    fl.debugging.disable_check_numerics()
    assert ACTIVE.count == before, "a test left check_numerics (or something else) pushed"


@pytest.fixture
def checking():
    fl.debugging.enable_check_numerics()
    yield
    fl.debugging.disable_check_numerics()


def f32(values):
    return fl.constant(np.asarray(values, np.float32))


# -- the eager check: the right op, the right counts, this line --------------------------------
def test_numerics_error_is_an_invalid_argument_error():
    assert issubclass(NumericsError, fl.errors.InvalidArgumentError)   # as TensorFlow raises
    assert issubclass(NumericsError, fl.errors.OpError)


def test_finite_ops_pass_unchanged(checking):
    x = fl.Variable([1.0, 2.0, 3.0])
    with fl.GradientTape() as tape:
        y = fl.reduce_mean(fl.log(x) * fl.exp(-x) + fl.sqrt(x))
    g = tape.gradient(y, x)
    expected = (1 / x.numpy() * np.exp(-x.numpy()) - np.log(x.numpy()) * np.exp(-x.numpy())
                + 0.5 / np.sqrt(x.numpy())) / 3
    np.testing.assert_allclose(g.numpy(), expected, rtol=1e-5)


# (op, the call, (NaN, +Inf, -Inf), number of elements)
CAUGHT = [
    ("log", lambda: fl.log(f32([1.0, -1.0, 2.0])), (1, 0, 0), 3),
    ("log", lambda: fl.log(f32([[0.0, 1.0], [0.0, 3.0]])), (0, 0, 2), 4),
    ("divide", lambda: f32([0.0, 1.0]) / f32([0.0, 2.0]), (1, 0, 0), 2),
    ("divide", lambda: f32([1.0, -1.0, 0.0]) / 0.0, (1, 1, 1), 3),
    ("sqrt", lambda: fl.sqrt(f32([4.0, -1.0])), (1, 0, 0), 2),
    ("exp", lambda: fl.exp(f32([1000.0, 1.0, 2.0])), (0, 1, 0), 3),
    ("multiply", lambda: f32([3e38]) * 10.0, (0, 1, 0), 1),
]


@pytest.mark.parametrize("op,call,counts,size", CAUGHT, ids=[f"{c[0]}-{c[2]}" for c in CAUGHT])
def test_caught_at_the_op_with_counts_and_line(checking, op, call, counts, size):
    with pytest.raises(NumericsError) as info:
        call()
    line = call.__code__.co_firstlineno   # the user's line is the lambda's, in CAUGHT above
    err = info.value
    message = str(err)
    assert err.op == op
    assert err.counts == counts
    nan, pos, neg = counts
    assert message.startswith(f"{op} produced {nan} NaN, {pos} +Inf and {neg} -Inf among the {size} elements"), message
    assert f"{THIS_FILE}:{line}" in message and f"{THIS_FILE}:{line}" in err.source
    assert "input 0: float32[" in message


def test_log_of_zero_shows_the_input_min():
    x = f32([0.0, 0.5, 2.0])
    with fl.debugging.check_numerics_enabled():
        with pytest.raises(NumericsError) as info:
            fl.log(x)
    message = str(info.value)
    lines = message.splitlines()
    assert lines[0] == "log produced 0 NaN, 0 +Inf and 1 -Inf among the 3 elements of its float32[3] output"
    assert lines[1] == "  input 0: float32[3]  min 0.0  max 2.0  mean 0.8333"   # 4 significant digits
    assert lines[2].startswith(f"  at ") and THIS_FILE in lines[2] and "fl.log(x)" in lines[2]
    assert len(lines) == 3


def test_stops_at_the_first_op_not_a_later_one(checking):
    x = f32([1.0, -2.0])
    with pytest.raises(NumericsError) as info:
        fl.reduce_sum(fl.exp(fl.log(x) * 2.0) + 1.0)   # log makes the NaN; four later ops carry it
    assert info.value.op == "log"


def test_an_input_that_already_had_nan_is_named_as_the_cause(checking):
    x = fl.constant([1.0, float("nan"), 2.0])   # made with NaN: no op produced it
    with pytest.raises(NumericsError) as info:
        line = here(); x + 1.0   # noqa: E702
    message = str(info.value)
    assert info.value.op == "add"
    assert "input 0: float32[3]  min 1.0  max 2.0  mean 1.5  (of the finite elements); it already contained 1 NaN" \
        in message
    assert "input 1: float32[]  value 1.0" in message
    assert "input 0 already contained NaN/Inf, so add passed it on rather than causing it" in message
    assert f"{THIS_FILE}:{line}" in message


def test_an_op_that_causes_nan_says_nothing_about_its_inputs_having_it(checking):
    with pytest.raises(NumericsError) as info:
        fl.sqrt(f32([-1.0]))
    assert "already contained" not in str(info.value)


def test_integer_and_bool_outputs_are_not_checked(checking):
    i = fl.constant([1, 2, 3])
    assert (i // 0).numpy().tolist() == [0, 0, 0]   # numpy's integer division by zero: no NaN possible
    assert fl.equal(i, 2).numpy().tolist() == [False, True, False]
    assert fl.cast(fl.constant([float("nan")]), fl.int32).dtype == fl.int32   # float input, int output


# -- backward passes ---------------------------------------------------------------------------
def test_backward_pass_is_checked(checking):
    x = fl.Variable([0.0, 4.0])
    with fl.GradientTape() as tape:
        y = fl.reduce_sum(fl.sqrt(x))   # sqrt(0) = 0 is finite; its gradient 1 / (2 * 0) is not
    with pytest.raises(NumericsError) as info:
        line = here(); tape.gradient(y, x)   # noqa: E702
    message = str(info.value)
    assert info.value.op == "divide"
    assert info.value.counts == (0, 1, 0)
    assert "in the backward pass, computing the gradient of sqrt" in message
    assert "min 0.0" in message   # the denominator
    assert f"{THIS_FILE}:{line}" in message


# -- check_numerics, the op --------------------------------------------------------------------
def test_check_numerics_is_an_op_with_shape_rule_and_gradient():
    op = get_op("check_numerics")
    x = f32([[1.0, 2.0, 3.0]])
    shape, dtype = op.shape_rule(x, message="m")
    assert tuple(shape) == (1, 3) and np.dtype(dtype) == np.float32
    assert op.grad is not None


def test_check_numerics_returns_finite_tensors_unchanged():
    x = f32([1.0, -2.0, 3.5])
    y = fl.debugging.check_numerics(x, "x")
    assert y.dtype == fl.float32
    assert y.numpy().tolist() == [1.0, -2.0, 3.5]


def test_check_numerics_raises_with_the_message():
    x = fl.constant(np.array([[1.0, np.inf], [-np.inf, np.nan]]))
    with pytest.raises(NumericsError) as info:
        line = here(); fl.debugging.check_numerics(x, "logits after layer 2")   # noqa: E702
    err = info.value
    lines = str(err).splitlines()
    assert err.op == "check_numerics"
    assert err.counts == (1, 1, 1)
    assert lines[0] == ("logits after layer 2: check_numerics found 1 NaN, 1 +Inf and 1 -Inf among the "
                        "4 elements of a float64[2,2] tensor")
    assert lines[1] == "  tensor: float64[2,2]  min 1.0  max 1.0  mean 1.0  (of the finite elements)"
    assert f"{THIS_FILE}:{line}" in lines[-1]


def test_check_numerics_lets_integers_through():
    i = fl.constant([1, 2, 3])
    assert fl.debugging.check_numerics(i, "ints").numpy().tolist() == [1, 2, 3]


def test_check_numerics_gradient_passes_through():
    x = f32([1.0, 2.0, 3.0])
    with fl.GradientTape() as tape:
        tape.watch(x)
        y = fl.reduce_sum(fl.debugging.check_numerics(x * x, "square") * f32([1.0, 10.0, 100.0]))
    assert tape.gradient(y, x).numpy().tolist() == [2.0, 40.0, 600.0]


def test_check_numerics_checks_the_gradient_too():
    x = fl.Variable([0.0, 1.0])
    with fl.GradientTape() as tape:
        y = fl.reduce_sum(fl.sqrt(fl.debugging.check_numerics(x, "x")))   # forward: finite
    with pytest.raises(NumericsError) as info:
        tape.gradient(y, x)   # d sqrt / dx at 0 is inf: it reaches check_numerics' gradient
    err = info.value
    assert err.op == "check_numerics"
    assert str(err).startswith("x (gradient): check_numerics found 0 NaN, 1 +Inf and 0 -Inf")
    assert "computing the gradient of check_numerics" in str(err)


# -- switching: idempotent, exact, and gone when off -------------------------------------------
def test_enable_is_idempotent_and_restores_active_count():
    before = ACTIVE.count
    fl.debugging.enable_check_numerics()
    fl.debugging.enable_check_numerics()
    assert ACTIVE.count == before + 1
    assert state().hooks.count(numerics._check_output) == 1
    fl.debugging.disable_check_numerics()
    assert ACTIVE.count == before
    assert state().hooks == []
    fl.log(f32([-1.0]))   # off: no error
    fl.debugging.disable_check_numerics()   # disabling again is a no-op
    assert ACTIVE.count == before


def test_disabled_leaves_no_hook_and_the_fast_path_back(monkeypatch):
    before = ACTIVE.count
    with fl.debugging.check_numerics_enabled():
        assert ACTIVE.count == before + 1
        assert numerics.enabled()
    assert not numerics.enabled()
    assert state().hooks == []          # nothing runs per op
    assert ACTIVE.count == before       # so eager ops take the fast path again
    dispatched = []
    monkeypatch.setattr(execute_module, "execute", lambda op, *a: dispatched.append(op.name))
    assert fl.add(f32([1.0]), f32([2.0])).numpy().tolist() == [3.0]   # the fast path: no execute()
    assert fl.sqrt(f32([4.0])).numpy().tolist() == [2.0]
    assert dispatched == []


def test_context_manager_nests_and_survives_errors():
    before = ACTIVE.count
    with fl.debugging.check_numerics_enabled():
        with fl.debugging.check_numerics_enabled():
            pass
        assert numerics.enabled()   # the inner block found it on, so leaves it on
        with pytest.raises(NumericsError):
            fl.log(f32([-1.0]))
    assert not numerics.enabled() and ACTIVE.count == before
    fl.debugging.enable_check_numerics()
    with fl.debugging.check_numerics_enabled():
        pass
    assert numerics.enabled()   # enabled before the block: still enabled after it
    fl.debugging.disable_check_numerics()
    with pytest.raises(ZeroDivisionError):
        with fl.debugging.check_numerics_enabled():
            1 / 0
    assert not numerics.enabled() and ACTIVE.count == before


def test_enabling_applies_to_every_thread():
    # one thread that existed before enabling, one started after: both are checked
    ready, go = threading.Event(), threading.Event()
    results = {}

    def worker(key, wait):
        state()   # this thread's state exists from here on
        ready.set()
        if wait:
            go.wait(10)
        try:
            fl.log(f32([-1.0]))
            results[key] = "no error"
        except NumericsError as e:
            results[key] = e.op
        results[key + " hooks"] = len(state().hooks)

    early = threading.Thread(target=worker, args=("early", True))
    early.start()
    ready.wait(10)
    with fl.debugging.check_numerics_enabled():
        late = threading.Thread(target=worker, args=("late", False))
        late.start()
        late.join(10)
        go.set()
        early.join(10)
    assert results == {"early": "log", "late": "log", "early hooks": 1, "late hooks": 1}
    # and switching off reaches them too: a thread still alive has no hook left
    stop, done = threading.Event(), {}
    fl.debugging.enable_check_numerics()

    def waiter():
        st = state()
        ready.set()
        stop.wait(10)
        done["hooks"] = list(st.hooks)

    ready.clear()
    t = threading.Thread(target=waiter)
    t.start()
    ready.wait(10)
    fl.debugging.disable_check_numerics()
    stop.set()
    t.join(10)
    assert done["hooks"] == []


# -- the finiteness test itself ----------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("size", [1, 100, 4096, 100_003])
def test_all_finite_finds_every_nan_and_inf(dtype, size):
    rng = np.random.default_rng(size)
    a = rng.standard_normal(size).astype(dtype)
    assert numerics.all_finite(a)
    for bad in (np.nan, np.inf, -np.inf):
        for where in (0, size // 2, size - 1):
            b = a.copy()
            b[where] = bad
            assert not numerics.all_finite(b)
            assert not numerics.all_finite(b.reshape(-1, 1)[::-1])   # not contiguous: the exact check


def test_all_finite_is_not_fooled_by_overflow_in_its_fast_path():
    a = np.full(10_000, 3e38, np.float32)   # finite, but a·a overflows to inf
    assert numerics.all_finite(a)
    b = np.full((100, 100), 1e200)          # float64 likewise
    assert numerics.all_finite(b)


def test_in_a_notebook_the_error_names_the_cell(tmp_path):
    # a real IPython shell, in a child process so that this one's get_ipython() stays None
    script = (
        "from IPython.core.interactiveshell import InteractiveShell\n"
        "shell = InteractiveShell.instance()\n"
        "shell.run_cell('import warnings; warnings.simplefilter(\"ignore\")', store_history=True)\n"
        "shell.run_cell('import flowlab as fl', store_history=True)\n"
        "shell.run_cell('fl.debugging.enable_check_numerics()', store_history=True)\n"
        "r = shell.run_cell('x = fl.constant([0.0, 1.0])\\ny = fl.log(x)', store_history=True)\n"
        "print('MESSAGE', str(r.error_in_exec).splitlines()[-1])\n")
    env = dict(os.environ, IPYTHONDIR=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    assert "MESSAGE   at Cell In[4], line 2: y = fl.log(x)" in out.stdout, out.stdout
