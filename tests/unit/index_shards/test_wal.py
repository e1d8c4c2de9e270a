"""The write-ahead log on a real disk: replay, group commit, rotation, a torn tail truncated, a
damaged record in the middle refused with its offset."""

import logging

import numpy as np
import pytest

from index_shards.wal import DELETE, UPSERT, WalCorrupted, WalRecord, WriteAheadLog
from retrieval.records import decode_records, encode_records


def upsert(seq: int, dim: int = 8) -> WalRecord:
    vector = np.random.default_rng(seq).standard_normal(dim).astype(np.float32)
    return WalRecord(seq, UPSERT, f"doc-{seq}", f"title {seq}", f"text {seq} ünïcode", {"n": seq, "tags": ["a"]},
                     vector)


def batch(first: int, count: int) -> list[WalRecord]:
    return [upsert(s) if s % 5 else WalRecord(s, DELETE, f"doc-{s - 1}") for s in range(first, first + count)]


def same(a: WalRecord, b: WalRecord) -> bool:
    vectors_equal = (a.vector is None and b.vector is None) or (
        a.vector is not None and b.vector is not None and a.vector.tobytes() == b.vector.tobytes())
    return (a.seq, a.op, a.doc_id, a.title, a.text, a.metadata) == (b.seq, b.op, b.doc_id, b.title, b.text,
                                                                      b.metadata) and vectors_equal


def test_records_come_back_bit_for_bit_after_a_reopen(tmp_path):
    wal = WriteAheadLog(tmp_path)
    assert wal.open() == [] and wal.last_seq == 0
    written = batch(1, 30)
    wal.append(written[:10])
    wal.append(written[10:])
    wal.close()
    again = WriteAheadLog(tmp_path)
    replayed = again.open()
    assert again.last_seq == 30 and len(replayed) == 30 and all(map(same, replayed, written))
    assert [r.seq for r in again.open(after_seq=25)] == [26, 27, 28, 29, 30]
    with pytest.raises(ValueError, match="out of order"):
        again.append([upsert(40)])


def test_records_received_are_logged_as_the_bytes_sent(tmp_path):
    """A replica writes the framing it received to its WAL (no second encoding), and every
    metadata type survives the wire and the log: 64-bit integer bounds, floats, unicode."""
    sent = [WalRecord(1, UPSERT, "ü-\U0001f600", "t", "x", {"min": -(2**63), "max": 2**63 - 1, "f": 1e-05, "b": True,
                                                            "l": ["a", "\u2028"]}, np.ones(4, dtype=np.float32)),
            WalRecord(2, DELETE, "gone")]
    wire = encode_records(sent)
    received = decode_records(wire)
    assert all(map(same, received, sent)) and received[0].metadata["max"] == 2**63 - 1
    wal = WriteAheadLog(tmp_path)
    wal.open()
    wal.append(received)
    wal.close()
    assert b"".join(path.read_bytes() for path in wal.files()) == wire
    assert all(map(same, WriteAheadLog(tmp_path).open(), sent))


def test_a_torn_tail_is_truncated_to_the_last_good_record(tmp_path, caplog):
    wal = WriteAheadLog(tmp_path)
    wal.open()
    wal.append(batch(1, 5))
    wal.close()
    [path] = wal.files()
    good = path.stat().st_size
    for tail in (upsert(6).encode()[:-7], b"\x01\x02", upsert(6).encode()[:-1] + b"\x00"):
        path.write_bytes(path.read_bytes()[:good] + tail)  # a crash mid-append
        with caplog.at_level(logging.WARNING):
            reopened = WriteAheadLog(tmp_path)
            assert [r.seq for r in reopened.open()] == [1, 2, 3, 4, 5]
        assert "torn tail" in caplog.text and f"offset {good}" in caplog.text
        assert path.stat().st_size == good
        reopened.append([upsert(6)])  # and the log goes on from there
        reopened.close()
        assert [r.seq for r in WriteAheadLog(tmp_path).open()][-1] == 6
        path.write_bytes(path.read_bytes()[:good])


def test_a_damaged_record_in_the_middle_stops_the_replica_naming_the_offset(tmp_path):
    wal = WriteAheadLog(tmp_path)
    wal.open()
    records = batch(1, 10)
    wal.append(records)
    wal.close()
    [path] = wal.files()
    offset = sum(len(r.encode()) for r in records[:4])
    data = bytearray(path.read_bytes())
    data[offset + 12] ^= 0x40  # inside record 5's body: records 6..10 follow it
    path.write_bytes(bytes(data))
    with pytest.raises(WalCorrupted) as caught:
        WriteAheadLog(tmp_path).open()
    assert f"offset {offset}" in caught.value.message and path.name in caught.value.message
    assert path.stat().st_size == len(data)  # never "repaired" by dropping acknowledged writes


def test_rotation_catch_up_reads_and_dropping_checkpointed_files(tmp_path):
    wal = WriteAheadLog(tmp_path, segment_bytes=600)
    wal.open()
    for first in range(1, 41, 4):
        wal.append(batch(first, 4))
    files = wal.files()
    assert len(files) > 3 and wal.first_seq == 1
    assert [r.seq for r in wal.read_after(33)] == [34, 35, 36, 37, 38, 39, 40]
    dropped = wal.drop_through(20)
    assert dropped > 0 and wal.first_seq is not None and 1 < wal.first_seq <= 21
    assert [r.seq for r in wal.read_after(20)] == list(range(21, 41))
    wal.close()
    reopened = WriteAheadLog(tmp_path)
    assert reopened.open()[-1].seq == 40 and reopened.last_seq == 40


def test_a_log_behind_a_snapshot_checkpoint_is_superseded(tmp_path):
    """A restore checkpoints at a peer's seq past everything logged here: reset_to drops the
    files and the next append begins a new one at seq + 1; a crash before the reset is handled
    the same way when the log is opened behind the checkpoint."""
    wal = WriteAheadLog(tmp_path)
    wal.open()
    wal.append(batch(1, 10))
    wal.reset_to(50)
    assert wal.files() == [] and wal.last_seq == 50
    wal.append([upsert(51), upsert(52)])
    wal.close()
    assert [r.seq for r in WriteAheadLog(tmp_path).open(after_seq=50)] == [51, 52]
    crashed = tmp_path / "crashed"
    wal = WriteAheadLog(crashed)
    wal.open()
    wal.append(batch(1, 10))
    wal.close()
    again = WriteAheadLog(crashed)
    assert again.open(after_seq=80) == [] and again.last_seq == 80 and again.files() == []
    again.append([upsert(81)])
    again.close()
    assert [r.seq for r in WriteAheadLog(crashed).open(after_seq=80)] == [81]


def test_a_snapshot_carries_its_seq_the_mark_there_and_records():
    from retrieval.records import Snapshot

    back = Snapshot.decode(Snapshot(77, 3, 123456, batch(1, 6)).encode())
    assert (back.seq, back.term, back.checksum) == (77, 3, 123456) and all(map(same, back.records, batch(1, 6)))
    with pytest.raises(ValueError, match="20 bytes"):
        Snapshot.decode(b"\x01\x02")


def test_a_flipped_bit_in_a_length_is_damage_not_a_torn_tail(tmp_path):
    """Issue 33, item 5: the checksum covered only the body, so a length bit flipped to point past
    the end of the file read as a torn tail and silently truncated every record after it. The
    header is checksummed now and the records after a bad one are found by their magic."""
    wal = WriteAheadLog(tmp_path)
    wal.open()
    records = batch(1, 10)
    wal.append(records)
    wal.close()
    [path] = wal.files()
    offset = sum(len(r.encode()) for r in records[:4])
    length_at = 4 if records[4].encode()[:4] == b"SRW2" else 0  # after the magic
    for byte, bit in ((length_at + 2, 0x10), (length_at, 0x01), (0, 0x01)):  # length +1 MiB, +1; the first byte
        data = bytearray(path.read_bytes())
        data[offset + byte] ^= bit
        path.write_bytes(bytes(data))
        with pytest.raises(WalCorrupted) as caught:
            WriteAheadLog(tmp_path).open()
        assert f"offset {offset}" in caught.value.message
        assert path.stat().st_size == len(data)  # nothing truncated
        data[offset + byte] ^= bit
        path.write_bytes(bytes(data))
    assert [r.seq for r in WriteAheadLog(tmp_path).open()] == list(range(1, 11))


def test_terms_and_idempotency_keys_travel_in_the_record(tmp_path):
    record = WalRecord(7, UPSERT, "a", "t", "x", {"n": 1}, np.ones(4, dtype=np.float32), term=3, key="k-1",
                       fingerprint="f" * 64)
    [back] = decode_records(record.encode())
    assert (back.seq, back.term, back.key, back.fingerprint) == (7, 3, "k-1", "f" * 64) and same(back, record)
    assert back.checksum == record.checksum
    assert record.sequenced(7, 4).checksum != record.checksum  # another term: another record at that seq
    assert WalRecord(8, DELETE, "a", term=3).checksum != WalRecord(8, DELETE, "b", term=3).checksum


def _legacy_frame(seq: int, op: int, meta: dict, vector: bytes = b"") -> bytes:
    """The framing of logs written before primary terms: u32 length | u32 crc32(body) | body."""
    import struct
    import zlib

    import orjson

    meta_bytes = orjson.dumps(meta)
    body = struct.pack("<QBI", seq, op, len(meta_bytes)) + meta_bytes + vector
    return struct.pack("<II", len(body), zlib.crc32(body)) + body


def test_a_log_written_before_terms_is_still_read(tmp_path):
    vector = np.arange(4, dtype="<f4")
    old = (_legacy_frame(1, UPSERT, {"id": "a", "title": "t", "text": "x", "metadata": {}, "dim": 4},
                         vector.tobytes()) + _legacy_frame(2, DELETE, {"id": "b"}))
    (tmp_path / "wal-00000000000000000001.log").write_bytes(old + b"\x05\x00")  # and a torn tail
    wal = WriteAheadLog(tmp_path)
    replayed = wal.open()
    assert [(r.seq, r.op, r.doc_id, r.term) for r in replayed] == [(1, UPSERT, "a", 0), (2, DELETE, "b", 0)]
    assert replayed[0].vector is not None and replayed[0].vector.tolist() == [0, 1, 2, 3]
    wal.append([upsert(3)])  # new records follow in the new framing, in the same file
    wal.close()
    assert [r.seq for r in WriteAheadLog(tmp_path).open()] == [1, 2, 3]


def test_a_record_numbered_by_the_primary_is_the_record_encoded_afresh():
    """The primary re-frames a gateway's record in place (seq, term, checksum); the bytes must be
    exactly what encoding the numbered record from scratch gives."""
    sent = WalRecord(0, UPSERT, "a", "t", "x", {"n": 1}, np.ones(4, dtype=np.float32), key="k", fingerprint="f")
    [received] = decode_records(sent.encode())
    numbered = received.sequenced(42, 7)
    fresh = WalRecord(42, UPSERT, "a", "t", "x", {"n": 1}, np.ones(4, dtype=np.float32), term=7, key="k",
                      fingerprint="f")
    assert numbered.frame is not None and numbered.encode() == fresh.encode()
    [back] = decode_records(numbered.encode())
    assert (back.seq, back.term, back.key) == (42, 7, "k")
