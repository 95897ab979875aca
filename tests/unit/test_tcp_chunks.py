"""The TCP lane's keyed handshake and its chunked messages (issue 14, item 1), in one process over
real sockets on 127.0.0.1: large frames travel as parts of at most ``transport.CHUNK`` bytes and are
joined on receipt after the signed header was checked; a peer without the key gets nothing through.
The part size is made small here (64 KiB) so that chunking shows with small arrays."""
import logging

import numpy as np
import pytest

zmq = pytest.importorskip("zmq")

from flowlab.cluster import protocol as P  # noqa: E402
from flowlab.cluster import transport as T  # noqa: E402
from flowlab.cluster.errors import ClusterError  # noqa: E402

SMALL = 64 << 10


@pytest.fixture
def pair(monkeypatch):
    """(key, listener checked by a Verifier, its verifier, connection, signer) on TCP, parts of 64 KiB."""
    monkeypatch.setenv("FLOWLAB_LOCAL_LANE", "0")
    monkeypatch.setattr(T, "CHUNK", SMALL)
    key = P.new_key()
    listener = T.ZmqTransport(key).listen("127.0.0.1", 0)
    verifier = P.Verifier(key, "srv")
    listener.check_with(verifier.admit)
    conn = T.ZmqTransport(key).connect(listener.address)
    yield key, listener, verifier, conn, P.Signer(key, "cli")
    conn.close()
    listener.close()


def receive(listener, timeout=5):
    item = listener.recv(timeout)
    assert item is not None, "nothing arrived"
    return item


def raw_dealer(key, address):
    """A bare ZeroMQ DEALER that makes the keyed handshake (``key`` None: none at all)."""
    s = T.context().socket(zmq.DEALER)
    s.linger = 0
    T.apply_key(s, key)
    s.connect(f"tcp://{address}")
    return s


def test_frames_of_every_size_around_the_part_size_arrive_whole_both_ways(pair):
    key, listener, verifier, conn, signer = pair
    sizes = [0, 1, SMALL - 1, SMALL, SMALL + 1, 3 * SMALL + 5]
    arrays = [np.arange(n, dtype=np.uint8) for n in sizes] + [np.arange(SMALL, dtype=np.float32).reshape(256, -1)]
    conn.send(signer.pack("put", "srv", {"n": len(arrays)}, arrays))
    peer, frames = receive(listener)
    assert len(frames) == 1 + len(arrays)
    msg = verifier.unpack(frames)
    for got, want in zip(msg.buffers, arrays):
        np.testing.assert_array_equal(got, want)
    listener.send(peer, P.Signer(key, "srv").pack("reply", "cli", {"re": 1, "ok": True}, arrays))
    back = P.Verifier(key, "cli").unpack(conn.recv(5))
    for got, want in zip(back.buffers, arrays):
        np.testing.assert_array_equal(got, want)


def test_small_messages_stay_one_part_per_frame(pair, monkeypatch):
    key, listener, verifier, conn, signer = pair
    sent = []
    monkeypatch.setattr(T, "_send_parts", lambda sock, frames, peer=None: sent.append(frames) or
                        sock.send_multipart(frames, copy=False))
    conn.send(signer.pack("ping", "srv"))
    assert verifier.unpack(receive(listener)[1]).type == "ping"
    assert sent == []                     # a header alone never takes the chunking path


def test_a_forged_chunked_message_is_dropped_before_its_frames_are_allocated(pair, caplog, monkeypatch):
    key, listener, verifier, conn, signer = pair
    allocated = []
    real_empty = T._empty()
    monkeypatch.setattr(T, "_empty", lambda: lambda n, dt: allocated.append(n) or real_empty(n, dt))
    forged = P.Signer(P.new_key(), "cli").pack("put", "srv", {}, [np.zeros(4 * SMALL, np.uint8)])
    genuine = signer.pack("put", "srv", {}, [np.zeros(4 * SMALL, np.uint8)])
    attacker = raw_dealer(key, listener.address)     # a peer past the handshake, sending garbage
    try:
        with caplog.at_level(logging.WARNING, logger="flowlab.cluster"):
            # a layout of 1 GiB behind a header signed with another key
            attacker.send_multipart([b"", np.array([1 << 30], "<u8").tobytes(), forged[0], b"x" * 100])
            # a genuine header listing 256 KiB, a layout announcing 512 MiB
            attacker.send_multipart([b"", np.array([1 << 29], "<u8").tobytes(), genuine[0], b"x" * 100])
            # a genuine header and layout, a part that overruns the frame
            genuine2 = signer.pack("put", "srv", {}, [np.zeros(SMALL, np.uint8)])
            attacker.send_multipart([b"", np.array([SMALL], "<u8").tobytes(), genuine2[0], b"x" * (SMALL + 1)])
            # a layout that is not a whole number of sizes
            attacker.send_multipart([b"", b"12345", genuine[0], b"x"])
            for _ in range(4):
                _, frames = receive(listener)
                with pytest.raises(P.ProtocolError):
                    verifier.unpack(frames)
        assert allocated == [SMALL], allocated       # only the genuine header with a matching layout
        assert caplog.text.count("refused before its buffers were received") == 4
        assert "bad signature" in caplog.text and "the signed header lists" in caplog.text
        conn.send(signer.pack("ping", "srv"))        # the listener goes on
        assert verifier.unpack(receive(listener)[1]).type == "ping"
    finally:
        attacker.close(0)


def test_a_connection_with_the_wrong_key_is_refused_clearly(pair):
    key, listener, verifier, conn, signer = pair
    wrong = T.ZmqTransport(P.new_key()).connect(listener.address)
    keyless = T.ZmqTransport().connect(listener.address)
    try:
        for c in (wrong, keyless):
            with pytest.raises(ClusterError, match="cluster key") as e:
                c.send(signer.pack("ping", "srv"))
                c.recv(5)
                c.send(signer.pack("ping", "srv"))
            assert listener.address in str(e.value)
        assert listener.recv(0.3) is None            # nothing of theirs arrived
    finally:
        wrong.close()
        keyless.close()


def test_a_raw_peer_without_the_handshake_delivers_nothing(pair):
    key, listener, verifier, conn, signer = pair
    for k in (None, P.new_key()):
        s = raw_dealer(k, listener.address)
        try:
            s.send_multipart(signer.pack("ping", "srv"), flags=zmq.NOBLOCK)
        except zmq.Again:
            pass
        finally:
            assert listener.recv(0.5) is None
            s.close(0)
    conn.send(signer.pack("ping", "srv"))
    assert verifier.unpack(receive(listener)[1]).type == "ping"


def test_a_header_over_the_part_size_is_refused_at_the_sender(pair):
    key, listener, verifier, conn, signer = pair
    with pytest.raises(ClusterError, match="FLOWLAB_TCP_CHUNK_MB"):
        conn.send(signer.pack("put", "srv", {"big": "x" * (2 * SMALL)}))


def test_credentials_are_derived_from_the_key_not_the_key_itself():
    key = P.new_key()
    k = T._Keys(key)
    assert key.hex() not in k.password and key.hex() not in k.domain
    assert T._Keys(key).password == k.password and T._Keys(P.new_key()).password != k.password
    assert zmq.curve_public(k.server_secret) == k.server_public and k.server_public != k.client_public


def test_the_zap_handler_answers_200_only_for_the_credentials_of_the_domain():
    keys, other = T._Keys(P.new_key()), T._Keys(P.new_key())
    zap = T._Zap.__new__(T._Zap)          # its answers only: no socket, no thread
    zap.domains = {keys.domain.encode(): keys}
    d = keys.domain.encode()

    def status(*request):
        return zap.answer(list(request))[2]
    assert status(b"1.0", b"7", d, b"127.0.0.1", b"", b"PLAIN", b"flowlab", keys.password.encode()) == b"200"
    assert status(b"1.0", b"7", d, b"127.0.0.1", b"", b"PLAIN", b"flowlab", other.password.encode()) == b"400"
    assert status(b"1.0", b"7", d, b"127.0.0.1", b"", b"CURVE", keys.client_public_raw) == b"200"
    assert status(b"1.0", b"7", d, b"127.0.0.1", b"", b"CURVE", other.client_public_raw) == b"400"
    assert status(b"1.0", b"7", other.domain.encode(), b"", b"", b"PLAIN", b"flowlab", other.password.encode()) == b"400"
    assert status(b"1.0", b"7", d, b"", b"", b"NULL") == b"400"
    assert status(b"2.0", b"7", d, b"", b"", b"PLAIN", b"flowlab", keys.password.encode()) == b"400"
    assert zap.answer([b"junk"])[2] == b"400"


def test_waking_a_listener_that_closed_meanwhile_is_harmless():
    """A server's stop() wakes its loop while the loop may be closing the listener on its own: the
    wake then finds its poster closed, which must not raise (it did: ZMQError ENOTSOCK)."""
    listener = T.Listener("127.0.0.1", 0)
    listener.wake()              # this thread's poster exists now
    listener.close()
    listener.wake()
    listener.post(b"some-peer", [b"late answer"])
