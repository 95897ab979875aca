"""Record files (flowlab.data.records): round trips, examples, and corruption that is always caught."""
import json
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import flowlab as fl
from flowlab.data.records import (HEADER_SIZE, MAGIC, RECORD_OVERHEAD, DataLossError, RecordDataset,
                                  RecordSkippedWarning, RecordWriter, decode_example, encode_example,
                                  masked_crc, read_records)

PAYLOADS = [b"alpha", b"", b"b" * 100, bytes(range(256)), b"\x00" * 7, b"last one"]


def offsets_of(payloads):
    """Byte offset of each record, computed from the documented layout."""
    out, pos = [], HEADER_SIZE
    for p in payloads:
        out.append(pos)
        pos += len(p) + RECORD_OVERHEAD
    return out


def write_file(path, payloads):
    with RecordWriter(path) as w:
        for p in payloads:
            w.write(p)
    return str(path)


def mutate(path, pos, xor=0xFF):
    data = bytearray(open(path, "rb").read())
    data[pos] ^= xor
    open(path, "wb").write(bytes(data))


def cut(path, size):
    with open(path, "r+b") as f:
        f.truncate(size)


def read_all(path, ignore_errors=False):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RecordSkippedWarning)
        reader = read_records(path, ignore_errors=ignore_errors)
        return list(reader), reader


def expect_loss(path, offset, index, reason):
    with pytest.raises(DataLossError) as info:
        list(read_records(path))
    err = info.value
    assert (err.filename, err.offset, err.index, err.reason) == (str(path), offset, index, reason)
    assert str(path) in str(err) and f"byte offset {offset}" in str(err)
    if index is not None:
        assert f"record {index}" in str(err)
    return err


# -- round trips -------------------------------------------------------------------------------
def test_round_trip_many_records_with_empty_and_large(tmp_path):
    rng = np.random.default_rng(0)
    payloads = [rng.bytes(int(n)) for n in rng.integers(0, 300, size=500)]
    payloads[10] = b""
    payloads[200] = rng.bytes(1 << 20)               # 1 MB
    payloads.append(b"")
    path = tmp_path / "many.flrec"
    with RecordWriter(path) as w:
        starts = [w.write(p) for p in payloads]
    assert starts == offsets_of(payloads)
    assert os.path.getsize(path) == offsets_of(payloads)[-1] + RECORD_OVERHEAD
    got, reader = read_all(path)
    assert got == payloads and reader.skipped == 0


def test_header_layout_and_empty_file(tmp_path):
    path = write_file(tmp_path / "empty.flrec", [])
    data = open(path, "rb").read()
    assert len(data) == HEADER_SIZE and data[:8] == MAGIC
    assert data[8:12] == (1).to_bytes(4, "little")
    assert int.from_bytes(data[12:16], "little") == masked_crc(data[:12])
    assert list(read_records(path)) == []


def test_writer_accepts_bytes_like_and_dicts_and_rejects_others(tmp_path):
    path = tmp_path / "kinds.flrec"
    with RecordWriter(path) as w:
        w.write(bytearray(b"ab"))
        w.write(memoryview(b"cd"))
        w.write(np.arange(2, dtype=np.uint8))        # any buffer: its raw bytes
        w.write({"y": np.float32(1.5)})
        with pytest.raises(TypeError, match="not str"):
            w.write("text")
        with pytest.raises(TypeError):
            w.write(3)
    with pytest.raises(ValueError, match="closed"):
        w.write(b"x")
    w.close()                                        # closing twice is fine
    got = list(read_records(path))
    assert got[:3] == [b"ab", b"cd", b"\x00\x01"]
    assert decode_example(got[3])["y"] == np.float32(1.5)


def test_flush_makes_records_readable_while_writing(tmp_path):
    path = tmp_path / "live.flrec"
    w = RecordWriter(path, sync=True)
    w.write(b"one")
    w.flush()
    assert list(read_records(path)) == [b"one"]
    w.write(b"two")
    w.close()
    assert list(read_records(path)) == [b"one", b"two"]


def test_crash_mid_write_leaves_earlier_records_readable(tmp_path):
    path = tmp_path / "crash.flrec"
    code = (
        "import os, sys\n"
        "from flowlab.data.records import RecordWriter\n"
        "w = RecordWriter(sys.argv[1])\n"
        "for i in range(5):\n"
        "    w.write(bytes([i]) * 1000)\n"
        "w.flush()\n"
        "w._file.write(b'\\x10\\x27\\x00\\x00\\x00\\x00\\x00\\x00' + b'\\x01' * 50)  # a torn 6th record\n"
        "w._file.flush()\n"
        "os._exit(0)\n")                               # die without closing
    subprocess.run([sys.executable, "-c", code, str(path)], check=True, timeout=60)
    good = [bytes([i]) * 1000 for i in range(5)]
    torn = offsets_of(good + [b""])[-1]
    reader = read_records(path)
    assert [next(reader) for _ in range(5)] == good
    with pytest.raises(DataLossError) as info:
        next(reader)
    assert (info.value.offset, info.value.index) == (torn, 5)


def test_every_prefix_reads_complete_records_then_reports_the_tail(tmp_path):
    # A crash leaves a prefix of the stream: every complete record must come back, and the
    # partial one must be reported at its own offset (never as garbage).
    payloads = [b"x" * 5, b"", b"y" * 13]
    full = open(write_file(tmp_path / "full.flrec", payloads), "rb").read()
    offs = offsets_of(payloads) + [len(full)]
    for end in range(len(full) + 1):
        path = tmp_path / "prefix.flrec"
        path.write_bytes(full[:end])
        complete = [p for p, o in zip(payloads, offs[1:]) if o <= end]
        if end < HEADER_SIZE:
            expect_loss(path, 0, None, "truncated file header")
        elif end in offs:
            assert list(read_records(path)) == complete
        else:
            k = len(complete)
            reader = read_records(path)
            assert [next(reader) for _ in range(k)] == complete
            with pytest.raises(DataLossError) as info:
                next(reader)
            assert (info.value.offset, info.value.index, info.value.reason) == (offs[k], k, "truncated record")


# -- examples ----------------------------------------------------------------------------------
DTYPES = [np.float32, np.float64, np.int32, np.int64, np.uint8, np.bool_, np.int8, np.int16, np.float16]
SHAPES = [(), (0,), (5,), (2, 3), (3, 0, 2), (1, 1, 1, 4)]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_example_round_trip_dtypes_and_shapes(dtype):
    rng = np.random.default_rng(1)
    feats = {f"f{i}": (rng.standard_normal(shape) * 50).astype(dtype) for i, shape in enumerate(SHAPES)}
    payload = encode_example(feats)
    out = decode_example(payload)
    assert list(out) == list(feats)
    base = np.frombuffer(payload, np.uint8).__array_interface__["data"][0]
    for name, arr in feats.items():
        got = out[name]
        assert got.dtype == arr.dtype and got.shape == arr.shape
        np.testing.assert_array_equal(got, arr)
        assert not got.flags.writeable
        if got.size:                                  # a zero-copy view into the payload, aligned
            addr = got.__array_interface__["data"][0]
            assert base <= addr < base + len(payload) and (addr - base) % 8 == 0


def test_example_accepts_tensors_numbers_bytes_and_str():
    feats = {"t": fl.constant([[1.0, 2.0]]), "i": 3, "f": 2.5, "b": True, "raw": b"\x00\xffraw\x00",
             "empty": b"", "text": "héllo", "big_endian": np.arange(4, dtype=">f4"),
             "fortran": np.asfortranarray(np.arange(6, dtype=np.int32).reshape(2, 3)),
             "strided": np.arange(10, dtype=np.int64)[::3]}
    out = decode_example(encode_example(feats))
    np.testing.assert_array_equal(out["t"], [[1.0, 2.0]])
    assert out["t"].dtype == np.float32
    assert out["i"].shape == () and out["i"].dtype == np.int64 and out["i"] == 3
    assert out["f"].dtype == np.float64 and out["f"] == 2.5
    assert out["b"].dtype == np.bool_ and out["b"]
    assert out["raw"] == b"\x00\xffraw\x00" and out["empty"] == b"" and out["text"] == "héllo"
    np.testing.assert_array_equal(out["big_endian"], np.arange(4, dtype=np.float32))
    assert out["big_endian"].dtype == np.float32
    np.testing.assert_array_equal(out["fortran"], np.arange(6).reshape(2, 3))
    np.testing.assert_array_equal(out["strided"], [0, 3, 6, 9])
    assert decode_example(encode_example({})) == {}


def test_example_rejects_what_it_cannot_store():
    with pytest.raises(TypeError, match="'c'"):
        encode_example({"c": np.array([1j])})
    with pytest.raises(TypeError, match="'o'"):
        encode_example({"o": np.array([object()])})
    with pytest.raises(TypeError, match="names must be str"):
        encode_example({1: np.zeros(2)})
    with pytest.raises(TypeError):
        encode_example([("a", 1)])
    def forged(entry):
        head = json.dumps({"v": 1, "features": [entry]}).encode()
        return b"FLEX" + len(head).to_bytes(4, "little") + head + bytes(300 - 8 - len(head))

    good = {"name": "a", "dtype": "int32", "shape": [2], "offset": 200, "nbytes": 8}
    assert decode_example(forged(good))["a"].tolist() == [0, 0]
    forgeries = [forged(dict(good, **change)) for change in
                 [{"dtype": ["int32"]}, {"dtype": "complex64"}, {"shape": [3]}, {"shape": [-1]},
                  {"nbytes": 10 ** 9}, {"offset": 296}, {"offset": 8}, {"name": None}, {"shape": 5}]]
    for junk in [b"", b"FLEX", b"not an example at all", b"FLEX\xff\x00\x00\x00{}", *forgeries]:
        with pytest.raises(fl.errors.InvalidArgumentError, match="not an encoded example"):
            decode_example(junk)


@settings(max_examples=150, deadline=None)
@given(pos=st.integers(0, 10_000), xor=st.integers(1, 255))
def test_decode_example_of_a_corrupted_payload_raises_only_invalid_argument(pos, xor):
    payload = bytearray(encode_example({"a": np.arange(6, dtype=np.float32).reshape(2, 3), "s": "hi",
                                        "b": np.array([True, False])}))
    payload[pos % len(payload)] ^= xor
    try:
        decode_example(bytes(payload))
    except fl.errors.InvalidArgumentError:
        pass


# -- corruption and truncation -----------------------------------------------------------------
@pytest.mark.parametrize("k", [0, 2, 5])
@pytest.mark.parametrize("where", ["payload", "data_crc"])
def test_bad_payload_raises_then_ignore_errors_resyncs(tmp_path, k, where):
    path = write_file(tmp_path / "p.flrec", PAYLOADS)
    off = offsets_of(PAYLOADS)[k]
    n = len(PAYLOADS[k])
    if where == "payload" and n == 0:
        pytest.skip("an empty payload has no byte to flip")
    mutate(path, off + 12 + n // 2 if where == "payload" else off + 12 + n + 1)
    err = expect_loss(path, off, k, "payload CRC mismatch")
    assert "CRC" in str(err)
    with pytest.warns(RecordSkippedWarning, match=f"byte offset {off}"):
        reader = read_records(path, ignore_errors=True)
        got = list(reader)
    assert got == PAYLOADS[:k] + PAYLOADS[k + 1:]
    assert reader.skipped == 1 and reader.errors[0].offset == off


@pytest.mark.parametrize("k", [0, 3, 5])
@pytest.mark.parametrize("byte", [0, 7, 8, 11])          # in the length, or in the length's CRC
def test_bad_length_raises_then_ignore_errors_stops_the_file(tmp_path, k, byte):
    path = write_file(tmp_path / "l.flrec", PAYLOADS)
    off = offsets_of(PAYLOADS)[k]
    mutate(path, off + byte, 0x01)
    expect_loss(path, off, k, "length CRC mismatch")
    got, reader = read_all(path, ignore_errors=True)
    assert got == PAYLOADS[:k] and reader.skipped == 1


@pytest.mark.parametrize("pos, reason", [(0, "bad magic bytes"), (7, "bad magic bytes"),
                                         (8, "file header CRC mismatch"), (13, "file header CRC mismatch")])
def test_bad_file_header(tmp_path, pos, reason):
    path = write_file(tmp_path / "h.flrec", PAYLOADS)
    mutate(path, pos)
    err = expect_loss(path, 0, None, reason)
    assert "file header" in str(err)
    got, reader = read_all(path, ignore_errors=True)
    assert got == [] and reader.skipped == 1


def test_not_a_record_file_and_unknown_version(tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text("just some text, long enough for a header\n")
    expect_loss(text, 0, None, "bad magic bytes")
    head = MAGIC + (2).to_bytes(4, "little")
    future = tmp_path / "v2.flrec"
    future.write_bytes(head + masked_crc(head).to_bytes(4, "little"))
    expect_loss(future, 0, None, "unsupported version")


@pytest.mark.parametrize("k", [0, 2, 5])
@pytest.mark.parametrize("into", ["length", "length_crc", "payload", "data_crc"])
def test_truncated_record(tmp_path, k, into):
    path = write_file(tmp_path / "t.flrec", PAYLOADS)
    off, n = offsets_of(PAYLOADS)[k], len(PAYLOADS[k])
    if into == "payload" and n < 2:
        pytest.skip("payload too short to cut inside")
    cut(path, {"length": off + 3, "length_crc": off + 10, "payload": off + 12 + n // 2,
               "data_crc": off + 12 + n + 2}[into])
    expect_loss(path, off, k, "truncated record")
    got, reader = read_all(path, ignore_errors=True)
    assert got == PAYLOADS[:k] and reader.skipped == 1


def test_trusted_length_past_the_end_is_truncation_not_a_huge_read(tmp_path):
    path = write_file(tmp_path / "big.flrec", [b"ok"])
    length = (1 << 62).to_bytes(8, "little")
    with open(path, "ab") as f:
        f.write(length + masked_crc(length).to_bytes(4, "little") + b"tiny")
    err = expect_loss(path, offsets_of([b"ok", b""])[1], 1, "truncated record")
    assert "file size" in str(err)


def test_zero_filled_tail_is_never_an_empty_record(tmp_path):
    # After a crash some file systems leave the unwritten tail as zeros.
    path = write_file(tmp_path / "z.flrec", [b"ok"])
    with open(path, "ab") as f:
        f.write(b"\x00" * 64)
    expect_loss(path, offsets_of([b"ok", b""])[1], 1, "length CRC mismatch")


def test_error_is_an_op_error_and_picklable(tmp_path):
    import pickle
    path = write_file(tmp_path / "e.flrec", [b"abc"])
    mutate(path, HEADER_SIZE + 12)
    err = expect_loss(path, HEADER_SIZE, 0, "payload CRC mismatch")
    assert isinstance(err, fl.errors.OpError)
    again = pickle.loads(pickle.dumps(err))
    assert type(again) is DataLossError and str(again) == str(err)
    assert (again.filename, again.offset, again.index) == (err.filename, err.offset, err.index)


# -- never silent garbage ----------------------------------------------------------------------
_ORIGINAL = [b"first", b"", b"\x00" * 20, bytes(range(40)), b"z"]


def _is_subsequence(got, original):
    it = iter(original)
    return all(any(g == o for o in it) for g in got)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pos=st.integers(0, 1000), xor=st.integers(1, 255))
def test_any_single_byte_corruption_is_caught(tmp_path, pos, xor):
    path = tmp_path / "fuzz.flrec"
    if not path.exists():
        write_file(path, _ORIGINAL)
    clean = path.read_bytes()
    data = bytearray(clean)
    data[pos % len(data)] ^= xor
    bad = tmp_path / "fuzz_bad.flrec"
    bad.write_bytes(bytes(data))
    got = []
    with pytest.raises(DataLossError) as info:      # CRC-32 catches every burst of <= 32 bits
        for payload in read_records(bad):
            got.append(payload)
    assert got == _ORIGINAL[:len(got)]               # whatever came first is the original
    assert str(bad) in str(info.value)
    kept, reader = read_all(bad, ignore_errors=True)
    assert _is_subsequence(kept, _ORIGINAL) and reader.skipped >= 1
    assert len(kept) >= len(got)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pos=st.integers(0, 1000), junk=st.binary(min_size=1, max_size=40), end=st.integers(0, 1000))
def test_overwrites_and_truncations_never_yield_garbage(tmp_path, pos, junk, end):
    path = tmp_path / "fuzz2.flrec"
    if not path.exists():
        write_file(path, _ORIGINAL)
    data = bytearray(path.read_bytes())
    pos %= len(data)
    data[pos:pos + len(junk)] = junk                  # may also grow or shrink the file
    data = data[:len(data) - end % 30]
    bad = tmp_path / "fuzz2_bad.flrec"
    bad.write_bytes(bytes(data))
    for ignore in (False, True):
        got = []
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RecordSkippedWarning)
                for payload in read_records(bad, ignore_errors=ignore):
                    got.append(payload)
        except DataLossError as e:
            assert not ignore and e.filename == str(bad)
        assert _is_subsequence(got, _ORIGINAL)


# -- RecordDataset -----------------------------------------------------------------------------
def _elements(ds):
    return [e.numpy().item() if hasattr(e, "numpy") else e for e in ds]


def test_record_dataset_reads_files_in_order(tmp_path):
    a = write_file(tmp_path / "a.flrec", [b"a0", b"a1"])
    b = write_file(tmp_path / "b.flrec", [b"b0"])
    ds = RecordDataset([a, b])
    assert _elements(ds) == [b"a0", b"a1", b"b0"]
    assert _elements(ds) == [b"a0", b"a1", b"b0"]       # iterable again
    assert _elements(RecordDataset(a)) == [b"a0", b"a1"]  # a single name


def test_record_dataset_raises_or_skips(tmp_path):
    a = write_file(tmp_path / "a.flrec", [b"a0", b"a1", b"a2"])
    b = write_file(tmp_path / "b.flrec", [b"b0", b"b1"])
    mutate(a, offsets_of([b"a0", b"a1"])[1] + 12)     # payload of a1
    with pytest.raises(DataLossError, match="a.flrec"):
        _elements(RecordDataset([a, b]))
    ds = RecordDataset([a, b], ignore_errors=True)
    with pytest.warns(RecordSkippedWarning):
        assert _elements(ds) == [b"a0", b"a2", b"b0", b"b1"]
    assert ds.skipped == 1


def test_record_dataset_decodes_examples_to_tensors(tmp_path):
    path = tmp_path / "ex.flrec"
    with RecordWriter(path) as w:
        for i in range(3):
            w.write({"x": np.full((2, 2), i, np.float32), "y": np.int32(i), "id": f"item{i}"})
    out = list(RecordDataset(str(path), decode=True))
    assert len(out) == 3
    for i, ex in enumerate(out):
        assert isinstance(ex["x"], fl.Tensor) and ex["x"].dtype == fl.float32
        np.testing.assert_array_equal(ex["x"].numpy(), np.full((2, 2), i))
        assert int(ex["y"]) == i and ex["y"].dtype == fl.int32
        assert ex["id"] == f"item{i}"


def test_record_dataset_is_a_dataset_and_composes(tmp_path):
    path = tmp_path / "pipe.flrec"
    with RecordWriter(path) as w:
        for i in range(6):
            w.write({"x": np.full([2], i, np.float32), "y": np.int64(i)})
    raw = RecordDataset(path)
    assert isinstance(raw, fl.data.Dataset) and raw.element_spec is bytes
    batches = raw.shuffle(6, seed=1).map(decode_example, num_parallel_calls=2).batch(3)
    assert sorted(int(y) for b in batches for y in b["y"].numpy()) == list(range(6))
    ds = RecordDataset(path, decode=True)
    assert ds.element_spec == {"x": fl.TensorSpec([2], fl.float32), "y": fl.TensorSpec([], fl.int64)}
    first = next(iter(ds.batch(4).prefetch(1).take(1)))
    np.testing.assert_array_equal(first["x"].numpy(), np.repeat(np.arange(4.0), 2).reshape(4, 2))
