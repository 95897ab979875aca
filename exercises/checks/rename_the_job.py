"""03 · Devices, exercise 1: rename the job.

The answer is ``build(job)``: the tutorial's two-task graph, with its ClusterSpec's job called
``job`` instead of "local". It returns ``(cluster, y)``; the check reads the spec's dict and the
device of every op in ``y``'s graph (nothing is run: that needs the cluster of lesson 07)."""
from flowlab.grading import Case

POINTS = 1
HINTS = [
    "The job name appears in two places: the ClusterSpec's key, and every device string that names a task.",
    "Build each device string from the argument, e.g. f\"/job:{job}/task:1\", so that no \"local\" is left.",
]

ADDRESSES = ["localhost:2222", "localhost:2223"]


def _expected(job):
    return {"cluster": {job: list(ADDRESSES)},
            "devices": [f"/job:{job}/task:0", f"/job:{job}/task:1"]}


def cases():
    yield Case("job 'training'", args=("training",), expected=_expected("training"))
    yield Case("job 'worker'", args=("worker",), expected=_expected("worker"))


### BEGIN HIDDEN TESTS
def hidden_cases():
    yield Case("job 'ps'", args=("ps",), expected=_expected("ps"))
    yield Case("job 'node-7'", args=("node-7",), expected=_expected("node-7"))
### END HIDDEN TESTS


def run(answer, case):
    cluster, y = answer(*case.args, **case.kwargs)
    devices = sorted({op.device.to_string() for op in y.graph.get_operations() if op.device is not None})
    return {"cluster": cluster.as_dict(), "devices": devices}
