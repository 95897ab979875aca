"""The event log that timelines and widgets draw from."""
import threading

from flowlab.cluster.events import Event, EventLog


def test_span_records_one_event_with_fields():
    log = EventLog(task="/job:worker/task:1", rank=1)
    with log.span("send", "allreduce", bytes=128, peer=2):
        pass
    (ev,) = log.events()
    assert (ev.kind, ev.name, ev.task, ev.rank, ev.bytes, ev.attrs) == ("send", "allreduce", "/job:worker/task:1", 1, 128, {"peer": 2})
    assert ev.end >= ev.start and ev.duration >= 0


def test_ring_drops_oldest_and_counts():
    log = EventLog(maxlen=3)
    for i in range(5):
        log.record("op", f"o{i}", i, i + 1)
    assert [e.name for e in log.events()] == ["o2", "o3", "o4"] and log.dropped == 2
    log.clear()
    assert len(log) == 0 and log.dropped == 0


def test_filters_and_round_trip_through_dicts():
    log = EventLog()
    log.record("op", "a", 0.0, 1.0)
    log.record("recv", "b", 1.0, 2.0, bytes=8)
    assert [e.name for e in log.events(kind="recv")] == ["b"]
    assert [e.name for e in log.events(since=1.5)] == ["b"]
    other = EventLog()
    other.extend(e.to_dict() for e in log.events())
    assert other.events() == log.events()
    assert Event.from_dict(log.events()[0].to_dict()) == log.events()[0]


def test_disabled_log_records_nothing_and_threads_lose_nothing():
    log = EventLog()
    log.enabled = False
    assert log.record("op", "x", 0, 1) is None and len(log) == 0
    log.enabled = True
    threads = [threading.Thread(target=lambda: [log.record("op", "t", 0, 1) for _ in range(1000)]) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(log) == 4000


def test_record_fields_reads_back_as_the_same_events_as_record():
    log = EventLog(maxlen=4, task="/job:worker/task:0", rank=0)
    log.record("send", "allreduce", 1.0, 2.0, bytes=16, peer=1, step=0)
    log.record_fields("send", "allreduce", 1.0, 2.0, 16, None, ("peer", "step"), (1, 0))
    log.record_fields("recv", "allreduce", 2.0, 3.0, 16, 5, ("peer", "step"), (1, 0))
    log.record_fields("collective", "barrier", 3.0, 4.0, 0, None, (), ())
    a, b, c, d = log.events()
    assert type(b) is Event and a == b
    assert (c.kind, c.rank, c.task, c.attrs) == ("recv", 5, "/job:worker/task:0", {"peer": 1, "step": 0})
    assert d.attrs is None and [e.name for e in log.events(kind="collective")] == ["barrier"]
    log.record_fields("op", "more", 4.0, 5.0, 0, None, (), ())      # a full ring still counts drops
    assert log.dropped == 1 and [e.kind for e in log.events()] == ["send", "recv", "collective", "op"]
    log.enabled = False
    log.record_fields("op", "off", 5.0, 6.0, 0, None, (), ())
    assert len(log) == 4
