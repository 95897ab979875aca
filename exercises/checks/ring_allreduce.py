"""09 · All-reduce: a ring all-reduce built from send and receive.

The answer is ``ring_allreduce(comm, x)``: called on every rank of a group at once, each with its
own communicator ``comm`` (``comm.rank``, ``comm.size``, ``comm.send(peer, header, arrays)``,
``comm.recv(timeout)``) and its own float32 vector ``x``; it returns the sum of every rank's ``x``.

The check runs it in a ``LocalGroup`` of 2, 3 and 4 ranks (threads) and reads three things:

- every rank's result, not just rank 0's;
- the bytes the busiest rank sent: a ring sends at most 2(n-1) chunks of about len(x)/n values;
- that no library collective (``fl.cluster.allreduce`` and friends) did the work: the group's
  event log records one ``collective`` event per library call."""
import math

import numpy as np

from flowlab.cluster.collectives import LocalGroup
from flowlab.grading import Case

POINTS = 3
HINTS = [
    "Every rank must end with the full sum. Check what your last rank returns, not only rank 0.",
    "Cut x into comm.size chunks (np.array_split). Reduce-scatter: in step s, rank r sends chunk (r - s) % n "
    "to rank (r + 1) % n and adds what it receives from rank (r - 1) % n into chunk (r - s - 1) % n.",
    "After n - 1 reduce-scatter steps rank r owns the finished chunk (r + 1) % n. All-gather: n - 1 more steps "
    "pass the finished chunks around the ring, each rank copying what it receives in place of its own.",
]
TOLERANCE = {"rtol": 1e-5, "atol": 1e-5}
RUN_TIMEOUT_S = 20.0


def _inputs(n, length, seed):
    rng = np.random.default_rng(seed)
    return [rng.normal(0.0, 1.0, length).astype(np.float32) for _ in range(n)]


def _bound(n, length, itemsize=4):
    return 2 * (n - 1) * math.ceil(length / n) * itemsize


def _expected(args):
    inputs = args[0]
    n, length = len(inputs), len(inputs[0])
    total = np.sum(np.asarray(inputs, dtype=np.float64), axis=0)
    return {"every rank's result": [[float(v) for v in total] for _ in range(n)],
            "bytes sent by the busiest rank": f"at most {_bound(n, length)}",
            "library collectives called": 0}


def _case(name, n, length, seed):
    return Case(name, args=(_inputs(n, length, seed),), expected=_expected)


def cases():
    yield _case("2 ranks, 4 values", 2, 4, 0)
    yield _case("3 ranks, 6 values", 3, 6, 1)
    yield _case("4 ranks, 8 values", 4, 8, 2)


### BEGIN HIDDEN TESTS
def hidden_cases():
    yield _case("3 ranks, 7 values (chunks of different sizes)", 3, 7, 3)
    yield _case("4 ranks, 1000 values", 4, 1000, 4)
    yield _case("4 ranks, 3 values (an empty chunk)", 4, 3, 5)
### END HIDDEN TESTS


class _Counting:
    """A rank's communicator that counts the bytes this rank sends (the answer sees only this)."""

    def __init__(self, comm):
        self._comm, self.rank, self.size = comm, comm.rank, comm.size
        self.sent_bytes = 0

    def send(self, peer, header, arrays):
        arrays = [np.asarray(a) for a in arrays]
        self.sent_bytes += sum(a.nbytes for a in arrays)
        self._comm.send(peer, header, arrays)

    def recv(self, timeout=None):
        return self._comm.recv(timeout)

    def __repr__(self):
        return f"<communicator: rank {self.rank} of {self.size}>"


def run(answer, case):
    inputs = case.args[0]
    n, length = len(inputs), len(inputs[0])
    with LocalGroup(n) as group:
        comms = [_Counting(c) for c in group]
        results = group.run(lambda comm: answer(comms[comm.rank], inputs[comm.rank].copy()),
                            join_timeout=RUN_TIMEOUT_S)
        collectives = len(group.events.events(kind="collective"))
    busiest = max(c.sent_bytes for c in comms)
    bound = _bound(n, length)
    return {"every rank's result": [[float(v) for v in np.asarray(r, dtype=np.float64).reshape(-1)] for r in results],
            "bytes sent by the busiest rank": f"at most {bound}" if busiest <= bound else str(busiest),
            "library collectives called": collectives}
