"""Plain data, the only thing that crosses from a student's code to the grader: every type is tagged
exactly, anything else (a float subclass, an ndarray subclass, an object whose ``__eq__`` is always
True) is an "object" that fails, sizes are bounded, and ``compare`` checks types, shapes, dtypes,
tolerances and NaN, naming the first difference; the comparing process is another process."""
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

import flowlab as fl
from flowlab.grading import Case, compare, render, to_plain
from flowlab.grading.compare import compare_elsewhere
from flowlab.grading.plain import MAX_DEPTH, MAX_ELEMENTS


# -- to_plain: every type ------------------------------------------------------------------------
def test_scalars_are_tagged_exactly():
    assert to_plain(3) == {"t": "int", "v": 3}
    assert to_plain(2 ** 70) == {"t": "int", "v": 2 ** 70}
    assert to_plain(1.5) == {"t": "float", "v": 1.5}
    assert to_plain(True) == {"t": "bool", "v": True}
    assert to_plain("ab") == {"t": "str", "v": "ab"}
    assert to_plain(None) == {"t": "none"}
    assert [to_plain(v)["v"] for v in (math.nan, math.inf, -math.inf)] == ["nan", "inf", "-inf"]


def test_numpy_scalars_are_numbers_of_their_kind():
    assert to_plain(np.float32(2.5)) == {"t": "float", "v": 2.5}
    assert to_plain(np.int64(7)) == {"t": "int", "v": 7}
    assert to_plain(np.bool_(False)) == {"t": "bool", "v": False}
    assert to_plain(np.float64("nan")) == {"t": "float", "v": "nan"}


def test_arrays_keep_dtype_shape_and_values():
    p = to_plain(np.array([[1, 2, 3], [4, 5, 6]], dtype=np.float32))
    assert p == {"t": "ndarray", "dtype": "float32", "shape": [2, 3], "v": [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]}
    assert to_plain(np.array(3))["shape"] == []
    assert to_plain(np.array([1.0, np.nan, -np.inf]))["v"] == [1.0, "nan", "-inf"]
    assert to_plain(np.array(["a", "bc"]))["v"] == ["a", "bc"]
    assert json.loads(json.dumps(p)) == p            # JSON-safe, NaN included
    assert to_plain(np.array([None, 1], dtype=object)) == {"t": "object", "type": "numpy.ndarray[object]"}


def test_tensors_and_variables_are_their_values():
    assert to_plain(fl.constant([1.0, 2.0])) == {"t": "tensor", "dtype": "float32", "shape": [2], "v": [1.0, 2.0]}
    assert to_plain(fl.Variable([[1, 2]])) == {"t": "tensor", "dtype": "int32", "shape": [1, 2], "v": [[1, 2]]}


def test_containers_nest():
    assert to_plain([1, (2.0, "x")]) == {"t": "list", "v": [{"t": "int", "v": 1}, {"t": "tuple", "v": [
        {"t": "float", "v": 2.0}, {"t": "str", "v": "x"}]}]}
    assert to_plain({"w": 1}) == {"t": "dict", "v": [[{"t": "str", "v": "w"}, {"t": "int", "v": 1}]]}
    assert to_plain({3, 1, 2}) == to_plain(frozenset({2, 3, 1}))
    from collections import OrderedDict, defaultdict
    assert to_plain(OrderedDict(a=1)) == to_plain(defaultdict(int, a=1)) == to_plain({"a": 1})


class AlwaysEqual:
    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False


class CheatFloat(float):
    def __eq__(self, other):
        return True

    __hash__ = float.__hash__


class CheatArray(np.ndarray):
    def __eq__(self, other):
        return np.ones(np.shape(other), bool)


class CheatList(list):
    def __eq__(self, other):
        return True


class Loud:
    """An object whose every method would be noticed: to_plain must call none of them."""
    called = []

    def __getattribute__(self, name):
        Loud.called.append(name)
        return object.__getattribute__(self, name)

    def __iter__(self):
        Loud.called.append("__iter__")
        return iter([1])


@pytest.mark.parametrize("cheat, type_name", [
    (AlwaysEqual(), "test_grading_plain.AlwaysEqual"),
    (CheatFloat(6.0), "test_grading_plain.CheatFloat"),
    (np.arange(3.0).view(CheatArray), "test_grading_plain.CheatArray"),
    (CheatList([1, 2]), "test_grading_plain.CheatList"),
    (np.ma.masked_array([1.0, 2.0]), "numpy.ma.MaskedArray"),
])
def test_cheating_objects_are_objects_and_fail(cheat, type_name):
    p = to_plain(cheat)
    assert p == {"t": "object", "type": type_name}
    ok, why = compare(to_plain(6.0), p)
    assert not ok and "only plain values are checked" in why and type_name in why
    ok, _ = compare(to_plain([1, 2]), to_plain([1, cheat]))
    assert not ok


def test_to_plain_calls_no_method_of_an_unknown_object():
    Loud.called.clear()
    assert to_plain([Loud()])["v"][0]["t"] == "object"
    assert Loud.called == []


def test_sizes_and_depth_are_bounded_with_a_reason():
    big = to_plain(np.zeros(MAX_ELEMENTS + 1, np.int8))
    assert big["t"] == "refused" and "too large" in big["why"] and "1,000,001" in big["why"]
    many = to_plain([np.zeros(MAX_ELEMENTS // 2 + 1)] * 2)
    assert many["t"] == "refused" and "in all" in many["why"]
    deep = []
    for _ in range(MAX_DEPTH + 1):
        deep = [deep]
    assert to_plain(deep) == {"t": "refused", "why": f"nested deeper than {MAX_DEPTH} levels"}
    loop = []
    loop.append(loop)
    assert to_plain(loop)["t"] == "refused"
    ok, why = compare(to_plain([1]), deep_plain := to_plain(deep))
    assert not ok and "cannot be checked" in why and deep_plain["why"] in why


# -- compare ------------------------------------------------------------------------------------
def test_equal_values_pass():
    for v in (3, 1.5, True, "x", None, [1, (2, 3)], {"a": [1.0]}, {1, 2}, np.eye(2), fl.constant([1, 2])):
        assert compare(to_plain(v), to_plain(v)) == (True, ""), v


def test_types_must_match_exactly_unless_loose():
    assert compare(to_plain(3.0), to_plain(3)) == (False, "expected a float, got an int (3.0 vs 3)")
    assert compare(to_plain(1), to_plain(True)) == (False, "expected an int, got a bool (1 vs True)")
    assert compare(to_plain((1, 2)), to_plain([1, 2]))[1] == "expected a tuple, got a list"
    assert "call .numpy()" in compare(to_plain(np.ones(2)), to_plain(fl.constant([1.0, 1.0])))[1]
    assert compare(to_plain(np.ones(2)), to_plain(np.ones(2, np.float32)))[1] == "expected dtype float64, got float32"
    assert compare(to_plain(3.0), to_plain(3), loose_types=True) == (True, "")
    assert compare(to_plain((1, 2.0)), to_plain([1.0, 2]), loose_types=True) == (True, "")
    assert compare(to_plain(np.ones(2)), to_plain(fl.constant([1.0, 1.0])), loose_types=True) == (True, "")


def test_tolerance():
    assert compare(to_plain(1.0), to_plain(1.0 + 1e-9)) == (True, "")      # default rtol 1e-6
    assert compare(to_plain(1.0), to_plain(1.001)) == (False, "expected 1.0, got 1.001")
    assert compare(to_plain(1.0), to_plain(1.001), rtol=1e-2) == (True, "")
    assert compare(to_plain(0.0), to_plain(1e-9)) == (False, "expected 0.0, got 1e-09")
    assert compare(to_plain(0.0), to_plain(1e-9), atol=1e-8) == (True, "")
    assert compare(to_plain(5), to_plain(6), rtol=0.5) == (False, "expected 5, got 6")   # ints: exact
    # rounding never hides the difference
    assert compare(to_plain(1.0000001), to_plain(1.0000002), rtol=0) == (False, "expected 1.0000001, got 1.0000002")


def test_nan_equals_nan_only_where_expected_has_nan():
    nan = float("nan")
    assert compare(to_plain(nan), to_plain(nan)) == (True, "")
    assert compare(to_plain(1.0), to_plain(nan)) == (False, "expected 1.0, got nan")
    assert compare(to_plain(nan), to_plain(1.0)) == (False, "expected nan, got 1.0")
    assert compare(to_plain(math.inf), to_plain(math.inf)) == (True, "")
    assert not compare(to_plain(math.inf), to_plain(-math.inf))[0]
    e, r = np.array([1.0, nan, 3.0]), np.array([1.0, nan, nan])
    assert compare(to_plain(e), to_plain(e)) == (True, "")
    assert compare(to_plain(e), to_plain(r)) == (False, "at [2]: expected 3.0, got nan")


def test_the_first_difference_is_named():
    e = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 3.0]])
    r = e.copy()
    r[1, 2] = 2.5
    assert compare(to_plain(e), to_plain(r)) == (False, "at [1, 2]: expected 3.0, got 2.5")
    r[0, 0] = 9
    assert compare(to_plain(e), to_plain(r)) == (False, "at [0, 0]: expected 1.0, got 9.0 (2 of 6 elements differ)")
    assert compare(to_plain(e), to_plain(e[:1])) == (False, "expected shape (2, 3), got (1, 3)")
    assert compare(to_plain([np.zeros(2), np.ones(2)]), to_plain([np.zeros(2), np.array([1.0, 4.0])])) == \
        (False, "at [1][1]: expected 1.0, got 4.0")
    assert compare(to_plain([1, 2, 3]), to_plain([1, 2])) == (False, "expected 3 items, got 2")
    assert compare(to_plain({"a": 1, "b": 2}), to_plain({"b": 2, "a": 1})) == (True, "")   # order does not matter
    assert compare(to_plain({"a": 1}), to_plain({"a": 2})) == (False, "at ['a']: expected 1, got 2")
    assert compare(to_plain({"a": 1}), to_plain({})) == (False, "missing key 'a'")
    assert compare(to_plain({"a": 1}), to_plain({"a": 1, "z": 0})) == (False, "unexpected key 'z'")
    assert compare(to_plain({1, 2}), to_plain({1, 3})) == (False, "the set misses 2")
    assert compare(to_plain("ab"), to_plain("ac")) == (False, "expected 'ab', got 'ac'")
    assert compare(to_plain(np.array([1, 2])), to_plain(np.array([1, 3]))) == (False, "at [1]: expected 2, got 3")


def test_malformed_received_data_fails_and_never_raises():
    for bad in ({"t": "float", "v": "x"}, {"t": "ndarray", "dtype": "float64", "shape": [3], "v": [1.0]},
                {"t": "ndarray", "dtype": "object", "shape": [1], "v": [1]}, {"t": "int", "v": 1.5},
                {"t": "list", "v": 3}, {"t": "weird"}, {}, None, "3"):
        ok, why = compare(to_plain(3.0) if bad != {"t": "list", "v": 3} else to_plain([1]), bad)
        assert ok is False and why, bad


def test_render_is_short_and_rounded():
    assert render(to_plain([1, 2.123456789, (3,)])) == "[1, 2.123, (3,)]"
    assert render(to_plain({"w": np.float32(0.5)})) == "{'w': 0.5}"
    assert render(to_plain(np.arange(3.0))) == "array([0.0, 1.0, 2.0], float64)"
    assert len(render(to_plain(list(range(1000))), 60)) == 60


def test_a_case_is_frozen_and_computes_its_expected_value():
    c = Case("two", args=([1.0, 2.0],), expected=lambda args: sum(args[0]))
    assert c.expected_value() == 3.0 and c.kwargs == {} and not c.hidden
    with pytest.raises(Exception):
        c.name = "x"
    assert Case("one arg", args=5).args == (5,)
    assert Case("t", rtol=0.1).tolerance({"rtol": 1e-3, "atol": 1e-9}) == {"rtol": 0.1, "atol": 1e-9,
                                                                          "loose_types": False}


# -- the comparing process ------------------------------------------------------------------------
def test_compare_runs_in_another_process():
    pairs = [[to_plain(6.0), to_plain(6.0), {}], [to_plain([1, 2]), to_plain([1, 3]), {"rtol": 0}],
             [to_plain(1.0), to_plain(1.05), {"rtol": 0.1}], [to_plain(1), to_plain(1.0), {"loose_types": True}]]
    results, pid = compare_elsewhere(pairs, with_pid=True)
    assert results == [[True, ""], [False, "at [1]: expected 2, got 3"], [True, ""], [True, ""]]
    assert isinstance(pid, int) and pid != os.getpid()


def test_python_dash_m_compare_reads_stdin_and_writes_stdout():
    payload = json.dumps({"pairs": [[to_plain(np.array([1.0, np.nan])), to_plain(np.array([1.0, np.nan])), {}]]})
    proc = subprocess.run([sys.executable, "-m", "flowlab.grading.compare"], input=payload, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == [[True, ""]]
