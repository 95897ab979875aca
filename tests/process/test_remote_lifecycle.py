"""Remote eager execution starts and ends with a cluster (a module of its own: no other cluster open)."""
import pytest

import flowlab as fl
from flowlab.core.device import RemoteDeviceError, remote_interpreter

pytestmark = pytest.mark.process


def test_closing_the_cluster_restores_the_plain_error():
    x = fl.constant([1.0])
    with fl.cluster.LocalCluster(workers=1) as c:
        with fl.device("/job:worker/task:0"):
            h = x + 1.0
        assert remote_interpreter() is not None
    assert c.closed
    with pytest.raises(fl.cluster.ClusterError, match="closed"):
        h.numpy()
    with fl.device("/job:worker/task:0"):
        with pytest.raises(RemoteDeviceError, match="needs a cluster"):
            x + 1.0


def test_a_cluster_collected_without_close_stops_taking_ops():
    import gc

    c = fl.cluster.LocalCluster(workers=1)
    assert remote_interpreter() is not None
    del c
    gc.collect()
    assert remote_interpreter() is None
    x = fl.constant([1.0])
    with fl.device("/job:worker/task:0"), pytest.raises(RemoteDeviceError, match="needs a cluster"):
        x + 1.0
