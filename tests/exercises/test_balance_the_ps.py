"""Exercise balance-the-ps (exercises/checks/balance_the_ps.py): the reference greedy placement
passes every case, visible and hidden; typical mistakes fail with a reason that says what went wrong."""
import flowlab as fl
from _grade import all_pass, failures
from flowlab.grading.check import reset_attempts

ID = "balance-the-ps"


def greedy(sizes, num_ps):
    loads, out = [0] * num_ps, []
    for size in sizes:
        ps = loads.index(min(loads))
        out.append(ps)
        loads[ps] += size
    return out


def largest_first(sizes, num_ps):
    """Greedy over the variables sorted by size, indices given back in the original order."""
    loads, out = [0] * num_ps, [0] * len(sizes)
    for i in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
        ps = loads.index(min(loads))
        out[i] = ps
        loads[ps] += sizes[i]
    return out


def round_robin(sizes, num_ps):
    return [i % num_ps for i in range(len(sizes))]


def largest_first_wrong_order(sizes, num_ps):
    """Sorts the sizes, then returns the indices in sorted order, not the variables' order."""
    loads, out = [0] * num_ps, []
    for size in sorted(sizes, reverse=True):
        ps = loads.index(min(loads))
        out.append(ps)
        loads[ps] += size
    return out


def one_based(sizes, num_ps):
    return [ps + 1 for ps in greedy(sizes, num_ps)]


def test_greedy_passes_every_case():
    assert all_pass(ID, greedy)


def test_largest_first_passes_too():
    assert all_pass(ID, largest_first)


def test_round_robin_fails_on_bytes():
    fails = failures(ID, round_robin)
    assert len(fails) >= 3
    name, why = fails[0]
    assert "busiest ps task" in why and "expected 'at most 11028'" in why and "13568 on ps task 0" in why


def test_sorted_order_indices_fail():
    fails = failures(ID, largest_first_wrong_order)
    assert fails and all("busiest ps task" in why for _, why in fails)


def test_one_based_indices_fail_as_invalid():
    fails = failures(ID, one_based)
    assert fails
    assert "placement" in fails[0][1] and "not a ps task index in 0..1" in fails[0][1]


def test_wrong_length_and_type():
    assert any("2 indices for 6 variables" in why for _, why in failures(ID, lambda sizes, m: [0, 1]))
    assert any("not a list" in why for _, why in failures(ID, lambda sizes, m: None))
    assert any("True" in why for _, why in failures(ID, lambda sizes, m: [True] * len(sizes)))


def test_check_in_place_shows_a_hint():
    reset_attempts(ID)
    result = fl.grading.check(ID, round_robin)
    assert not result.passed and result.hint and "bytes" in result.hint
    reset_attempts(ID)
