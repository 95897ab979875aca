"""03 · Devices, exercise 3: a device on a remote task's GPU.

The answer is ``build_remote(job)``: the tutorial's graph again, but the subtraction ``y2`` runs on
GPU 0 of task 1, the other task of job ``job``, while ``y1`` and ``y`` stay on task 0. It returns
``y``; the check reads the device of every op in ``y``'s graph."""
from flowlab.grading import Case

POINTS = 1
HINTS = [
    "A device string can name a task and a device in it at once: read the first cells of lesson 03.",
    "Put the subtraction under fl.device(f\"/job:{job}/task:1/device:GPU:0\") (\"/gpu:0\" at the end works too).",
]


def _expected(job):
    return [f"/job:{job}/task:0", f"/job:{job}/task:1/device:GPU:0"]


def cases():
    yield Case("job 'local'", args=("local",), expected=_expected("local"))
    yield Case("job 'training'", args=("training",), expected=_expected("training"))


### BEGIN HIDDEN TESTS
def hidden_cases():
    yield Case("job 'worker'", args=("worker",), expected=_expected("worker"))
### END HIDDEN TESTS


def run(answer, case):
    y = answer(*case.args, **case.kwargs)
    return sorted({op.device.to_string() for op in y.graph.get_operations() if op.device is not None})
