"""Fault injection's parts in one process: seeded choices, corrupted frames rejected by the real
Verifier, the ``fault`` message on an in-process Server, the monitor's ``paused`` state, and the
root-cause table's layout. The same faults on real worker processes: tests/process/test_cluster_faults.py."""
import random
import time

import pytest

from flowlab.cluster.client import root_cause_table
from flowlab.cluster.errors import ClusterTimeoutError, ProtocolError, WorkerPausedError
from flowlab.cluster.faults import Faults, flip_byte, random_plan
from flowlab.cluster.inproc import InprocTransport
from flowlab.cluster.liveness import Heartbeat, Monitor
from flowlab.cluster.protocol import Signer, Verifier

KEY = bytes(range(40, 72))
TASK = "/job:worker/task:0"


def test_seeded_choices_repeat_and_fractions_hold():
    a, b = Faults(drop=0.3, corrupt=0.2, seed=5), Faults(drop=0.3, corrupt=0.2, seed=5)
    rolls = [a.roll() for _ in range(2000)]
    assert rolls == [b.roll() for _ in range(2000)]
    assert 450 < rolls.count("drop") < 750 and 200 < rolls.count("corrupt") < 450
    assert Faults(drop=0.0, corrupt=0.0).roll() is None and not Faults().active


@pytest.mark.parametrize("kw, word", [({"drop": 1.5}, "drop"), ({"corrupt": -0.1}, "corrupt"),
                                      ({"delay_ms": -3}, "delay")])
def test_bad_fault_values_name_what_is_wrong(kw, word):
    with pytest.raises(ValueError, match=word):
        Faults(**kw)


def test_a_flipped_byte_fails_the_signature_check():
    signer, verifier = Signer(KEY, "me"), Verifier(KEY, "you")
    rng = random.Random(0)
    for i in range(200):
        frames = signer.pack("ping", "you", {"i": i})
        with pytest.raises(ProtocolError, match="signature|malformed"):
            verifier.unpack(flip_byte(frames, rng))
    assert verifier.unpack(signer.pack("ping", "you", {"i": -1})).body == {"i": -1}


def test_random_plan_is_reproducible_and_pauses_end():
    plan = random_plan(["/job:worker/task:1", "/job:worker/task:2"], 5.0, 6, seed=42)
    assert plan == random_plan(["/job:worker/task:1", "/job:worker/task:2"], 5.0, 6, seed=42)
    assert [p[0] for p in plan] == sorted(p[0] for p in plan)
    pauses = [p for p in plan if p[1] == "pause"]
    assert len([p for p in plan if p[1] == "resume"]) == len(pauses)


def test_fault_message_sets_drop_delay_corrupt_and_clear(inproc_task):
    server, client = inproc_task
    assert server._faults is None
    assert client.request(TASK, "fault", {"drop": 1.0, "seed": 1}).body["faults"]["drop"] == 1.0
    with pytest.raises(ClusterTimeoutError, match="did not answer"):
        client.request(TASK, "ping", {}, timeout=0.3)
    client.request(TASK, "fault", {"clear": True})
    assert server._faults is None and client.request(TASK, "ping", {"x": 2}).body["x"] == 2

    client.request(TASK, "fault", {"corrupt": 1.0, "seed": 2})
    dropped = server.stats["dropped"]
    with pytest.raises(ClusterTimeoutError):
        client.request(TASK, "ping", {}, timeout=0.3)
    assert server.stats["dropped"] == dropped + 1
    client.request(TASK, "fault", {"corrupt": 0.0, "delay_ms": 150})
    t0 = time.perf_counter()
    client.request(TASK, "ping", {})
    assert time.perf_counter() - t0 >= 0.15
    client.request(TASK, "fault", {"delay_ms": 0})
    assert server._faults is None
    names = [e.name for e in server.log.events(kind="fault")]
    assert names[:2] == ["set", "dropped"] and "corrupted" in names and names[-1] == "clear"


class _Proc:
    pid = 4343

    def poll(self):
        return None


def test_a_paused_task_is_paused_not_unresponsive_and_resumes():
    m = Monitor(InprocTransport(), KEY, interval=0.05, timeout=0.3, poll=0.02)
    hb = None
    try:
        m.watch(TASK, _Proc())
        hb = Heartbeat(InprocTransport(), KEY, m.address, m.id, TASK, {"address": "inproc:1", "pid": 4343, "id": "s"},
                       interval=0.05).start()
        m.wait_ready([TASK], 5)
        m.pause(TASK, "cluster.resume(0)")
        hb.stop()       # a stopped process sends nothing
        time.sleep(0.8)
        assert m.state(TASK).status == "paused"
        err = m.problem(TASK, "running f")
        assert isinstance(err, WorkerPausedError) and "cluster.resume(0)" in str(err) and TASK in str(err)
        m.resume(TASK)
        assert m.state(TASK).status == "alive" and m.problem(TASK) is None
    finally:
        m.close()


def test_root_cause_table_is_aligned_plain_text():
    rows = [{"task": "/job:worker/task:1", "pid": 11, "state": "dead", "exit": "killed by signal 9 (SIGKILL)",
             "doing": "run step", "log": "a\nb"},
            {"task": "/job:worker/task:0", "pid": 10, "state": "cancelled", "exit": "-", "doing": "run step",
             "log": None}]
    lines = root_cause_table(rows).splitlines()
    assert lines[0] == "root cause (first failure first):"
    cols = [ln.index("pid") if i == 0 else None for i, ln in enumerate(lines[1:2])]
    assert lines[2].index("11") == cols[0] and lines[3].index("10") == cols[0]
    assert lines[-3:] == ["  last lines of /job:worker/task:1's log:", "    | a", "    | b"]
