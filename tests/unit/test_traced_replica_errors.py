"""A NaN found in a traced ``strategy.run`` replica names the replica: the failing graph node's name
(``replica_<i>/...``, see flowlab/distribute/_traced.py) is in the error, whether the check is
``fl.debugging.enable_check_numerics()`` or a ``check_numerics`` op that runs inside the compiled plan."""
import numpy as np
import pytest

import flowlab as fl
from flowlab import distribute as ds


@pytest.fixture
def two_cpus(hidden_gpus):
    fl.config.set_logical_devices("CPU", 2)
    yield
    fl.debugging.disable_check_numerics()
    fl.config.set_logical_devices("CPU", None)


def _inputs(bad_replica):
    parts = [fl.constant([1.0, 2.0]), fl.constant([3.0, 4.0])]
    if bad_replica is not None:
        parts[bad_replica] = fl.constant([-3.0, 4.0])       # log(-3) is NaN in that replica only
    return ds.PerReplica(parts)


@pytest.mark.parametrize("bad", [1, 0])
def test_enable_check_numerics_names_the_replica(two_cpus, bad):
    s = ds.MirroredStrategy()
    step = fl.function(lambda x: s.run(lambda v: fl.log(v) * 2.0, args=(x,)))
    ok = step(_inputs(None))
    np.testing.assert_allclose(ok.values[1].numpy(), 2 * np.log([3.0, 4.0]), rtol=1e-6)
    fl.debugging.enable_check_numerics()
    with np.errstate(invalid="ignore"), pytest.raises(fl.errors.NumericsError) as info:
        step(_inputs(bad))
    message = str(info.value)
    assert f"graph node replica_{bad}/log" in message and f"replica_{1 - bad}" not in message
    assert "1 NaN" in message


def test_check_numerics_op_in_the_compiled_plan_names_the_replica_and_the_user_line(two_cpus):
    s = ds.MirroredStrategy()
    step = fl.function(lambda x: s.run(
        lambda v: fl.debugging.check_numerics(fl.log(v), "after log"), args=(x,)))
    assert [v.numpy().shape for v in step(_inputs(None)).values] == [(2,), (2,)]
    with np.errstate(invalid="ignore"), pytest.raises(fl.errors.NumericsError) as info:
        step(_inputs(1))
    message = str(info.value)
    assert "after log" in message and "graph node replica_1/check_numerics" in message
    assert "<flowlab plan" not in message                     # not the generated code's line...
    assert "test_traced_replica_errors.py" in message         # ...but the line that made the node
    assert info.value.source.endswith("(graph node replica_1/check_numerics)")


def test_a_kernel_error_in_a_replica_still_names_it(two_cpus):
    s = ds.MirroredStrategy()
    table = fl.constant(np.arange(4, dtype=np.float32))
    step = fl.function(lambda i: s.run(lambda j: fl.gather(table, j), args=(i,)))
    with pytest.raises(fl.errors.InvalidArgumentError, match="replica_1/gather"):
        step(ds.PerReplica([fl.constant([1]), fl.constant([9])]))
