"""The write record: one upsert or delete of one document at one sequence number under one primary
term, and its binary framing — the same bytes in a replica's write-ahead log (``index_shards.wal``)
and on the wire between a shard's primary and its replicas (and between replicas catching up).

    frame    = "SRW2" | u32 length | u32 crc32(length bytes + body) | body        (little endian)
    body     = u64 seq | u64 term | u8 op | u32 meta length | meta (JSON, UTF-8) | vector (float32 LE)
    op       = 1 upsert (meta: id, title, text, metadata, dim) | 2 delete (meta: id) | 3 no-op

An upsert of a document stored without a vector (``no_vector`` writes: found by BM25, filters and
listings, never by a dense search) has ``dim`` 0 and no vector bytes; its ``vector`` is None.

The checksum covers the length as well as the body, and every frame starts with the magic: a
flipped bit in a length can neither pass as a record nor hide the records after it (the WAL finds
the next frame and calls the log damaged instead of truncating it as a torn tail).

``term`` is the primary term the record was sequenced under (Elasticsearch's primary term, Raft's
log term): one (seq, term) names one record everywhere, and a replica that holds a seq under
another term has diverged. ``key`` is the idempotency key of the request the record belongs to
(meta ``k``, with ``f`` the request's fingerprint), so every replica — and a promoted primary —
knows which requests it has applied.

Frames written before terms existed (``u32 length | u32 crc32(body)``, body without the term) are
still read: their term is 0. A no-op fills a sequence number (a newly promoted primary writes one
to establish its term on every replica).
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

UPSERT, DELETE, NOOP = 1, 2, 3
MAGIC = b"SRW2"
FRAME = struct.Struct("<4sII")  # magic, body length, crc32(length bytes + body)
BODY = struct.Struct("<QQBI")  # seq, term, op, meta length
LEGACY_FRAME = struct.Struct("<II")  # length, crc32(body): WAL files written before primary terms
LEGACY_BODY = struct.Struct("<QBI")  # seq, op, meta length
MAX_RECORD_BYTES = 64 << 20
_LENGTH = struct.Struct("<I")
_SEQ_TERM = struct.Struct("<QQ")  # the head of a current body


class FrameError(ValueError):
    """A frame that does not check out; ``kind`` says how (short, past_end, crc, undecodable)."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(slots=True, frozen=True)
class WalRecord:
    seq: int
    op: int  # UPSERT | DELETE | NOOP
    doc_id: str
    title: str = ""
    text: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)
    vector: np.ndarray | None = None  # float32, for upserts
    term: int = 0  # the primary term it was sequenced under (0: before terms, or not yet sequenced)
    key: str = ""  # idempotency key of its request ("" when none)
    fingerprint: str = ""  # of that request: the same key with other content is another request
    moved: bool = False  # a delete because the document's new home is another shard (kmeans), not a delete of it
    # the record's framed bytes when it was decoded from them: re-sent and logged as they are
    # (a replica writes what it received to its WAL without encoding it again)
    frame: bytes | None = field(default=None, compare=False, repr=False)

    def encode(self) -> bytes:
        if self.frame is not None:
            return self.frame
        meta: dict[str, Any] = {"id": self.doc_id}
        if self.key:
            meta.update(k=self.key, f=self.fingerprint)
        if self.moved:
            meta["m"] = 1
        vector = b""
        if self.op == UPSERT:
            array = np.ascontiguousarray(self.vector if self.vector is not None else (), dtype="<f4")
            meta.update(title=self.title, text=self.text, metadata=self.metadata, dim=int(array.size))
            vector = array.tobytes()
        meta_bytes = _dump_meta(meta)
        body = BODY.pack(self.seq, self.term, self.op, len(meta_bytes)) + meta_bytes + vector
        length = _LENGTH.pack(len(body))
        return MAGIC + length + _LENGTH.pack(zlib.crc32(body, zlib.crc32(length))) + body

    @property
    def checksum(self) -> int:
        """The frame's CRC (over seq, term, op and content): two records at one seq are the same
        record when their checksums are equal."""
        frame = self.encode()
        if frame[:4] == MAGIC:
            return int(_LENGTH.unpack_from(frame, 8)[0])
        return int(_LENGTH.unpack_from(frame, 4)[0])

    def sequenced(self, seq: int, term: int) -> WalRecord:
        """This record at ``seq`` under ``term`` (a primary numbering what a gateway sent). A
        record decoded from a current frame keeps its bytes: only the seq and term at the head of
        the body and the checksum change (no second JSON encoding of its content)."""
        frame = None
        if self.frame is not None and self.frame[:4] == MAGIC:
            body = _SEQ_TERM.pack(seq, term) + self.frame[FRAME.size + _SEQ_TERM.size:]
            length = self.frame[4:8]
            frame = MAGIC + length + _LENGTH.pack(zlib.crc32(body, zlib.crc32(length))) + body
        return WalRecord(seq, self.op, self.doc_id, self.title, self.text, self.metadata, self.vector, term,
                         self.key, self.fingerprint, self.moved, frame)


def _record(seq: int, term: int, op: int, meta: dict[str, Any], body: memoryview, vector_at: int,
            frame: bytes) -> WalRecord:
    key, fingerprint = str(meta.get("k", "")), str(meta.get("f", ""))
    if op in (DELETE, NOOP):
        return WalRecord(seq, op, str(meta.get("id", "")), term=term, key=key, fingerprint=fingerprint,
                         moved=bool(meta.get("m", 0)), frame=frame)
    if op != UPSERT:
        raise ValueError(f"unknown op {op}")
    dim = int(meta["dim"])
    vector = np.frombuffer(body, dtype="<f4", offset=vector_at, count=dim).astype(np.float32) if dim else None
    return WalRecord(seq, op, str(meta["id"]), str(meta.get("title", "")), str(meta.get("text", "")),
                     dict(meta.get("metadata", {})), vector, term, key, fingerprint, False, frame)


def decode_frame(data: bytes, offset: int = 0) -> tuple[WalRecord, int]:
    """The record framed at ``offset`` and the offset after it; FrameError when it does not check
    out. Reads both the current framing and the one of logs written before primary terms."""
    if data[offset:offset + 4] == MAGIC:
        if len(data) - offset < FRAME.size:
            raise FrameError(f"a short record header at byte {offset}", "short")
        _, length, crc = FRAME.unpack_from(data, offset)
        end = offset + FRAME.size + length
        if length > MAX_RECORD_BYTES or end > len(data):
            raise FrameError(f"a record of {length} bytes past the end at byte {offset}", "past_end")
        frame = data[offset:end]
        body = memoryview(frame)[FRAME.size:]
        if zlib.crc32(body, zlib.crc32(frame[4:8])) != crc:
            raise FrameError(f"a CRC mismatch at byte {offset}", "crc")
        try:
            seq, term, op, meta_length = BODY.unpack_from(body)
            meta = _load_meta(bytes(body[BODY.size:BODY.size + meta_length]))
            return _record(seq, term, op, meta, body, BODY.size + meta_length, frame), end
        except (KeyError, ValueError, UnicodeDecodeError, struct.error) as exc:
            raise FrameError(f"an undecodable record at byte {offset}: {exc}", "undecodable") from exc
    if len(data) - offset < LEGACY_FRAME.size:
        raise FrameError(f"a short record header at byte {offset}", "short")
    length, crc = LEGACY_FRAME.unpack_from(data, offset)
    end = offset + LEGACY_FRAME.size + length
    if length > MAX_RECORD_BYTES or end > len(data):
        raise FrameError(f"a record of {length} bytes past the end at byte {offset}", "past_end")
    frame = data[offset:end]
    body = memoryview(frame)[LEGACY_FRAME.size:]
    if zlib.crc32(body) != crc:
        raise FrameError(f"a CRC mismatch at byte {offset}", "crc")
    try:
        seq, op, meta_length = LEGACY_BODY.unpack_from(body)
        meta = _load_meta(bytes(body[LEGACY_BODY.size:LEGACY_BODY.size + meta_length]))
        return _record(seq, 0, op, meta, body, LEGACY_BODY.size + meta_length, frame), end
    except (KeyError, ValueError, UnicodeDecodeError, struct.error) as exc:
        raise FrameError(f"an undecodable record at byte {offset}: {exc}", "undecodable") from exc


def next_frame_after(data: bytes, offset: int) -> int | None:
    """The offset of the first frame past ``offset`` that checks out completely (None if there is
    none): a damaged record with a good one after it is damage, not a torn tail."""
    at = data.find(MAGIC, offset + 1)
    while at != -1:
        try:
            decode_frame(data, at)
            return at
        except FrameError:
            at = data.find(MAGIC, at + 1)
    return None


def _dump_meta(meta: dict[str, Any]) -> bytes:
    """Compact UTF-8 JSON (orjson: ~10x faster than json, and the gateway frames every written
    document). Metadata integers are validated to 64 bits, which orjson reads back exactly."""
    return orjson.dumps(meta)


def _load_meta(data: bytes) -> Any:
    return orjson.loads(data)


def encode_records(records: Sequence[WalRecord]) -> bytes:
    """Records in the WAL's own framing: what replication sends over the wire."""
    return b"".join(record.encode() for record in records)


def decode_records(data: bytes) -> list[WalRecord]:
    """Records framed by :func:`encode_records`; ValueError (a FrameError) at the first that does
    not check out."""
    records: list[WalRecord] = []
    offset = 0
    while offset < len(data):
        record, offset = decode_frame(data, offset)
        records.append(record)
    return records


_SNAPSHOT_HEAD = struct.Struct("<QQI")  # seq, term and checksum of the record at seq


@dataclass(slots=True, frozen=True)
class Snapshot:
    """A replica's state of one version at ``seq`` for a peer to restore from: every live document
    as an upsert record carrying its own seq (0: from the build), and the term and checksum of the
    record at ``seq`` (the restored replica's log must match its primary's there).

        snapshot = u64 seq | u64 term | u32 checksum | records      (little endian)
    """

    seq: int
    term: int
    checksum: int
    records: Sequence[WalRecord]

    def encode(self) -> bytes:
        return _SNAPSHOT_HEAD.pack(self.seq, self.term, self.checksum) + encode_records(self.records)

    @classmethod
    def decode(cls, data: bytes) -> Snapshot:
        """ValueError when it does not check out."""
        if len(data) < _SNAPSHOT_HEAD.size:
            raise ValueError(f"a snapshot starts with its seq, term and checksum ({_SNAPSHOT_HEAD.size} bytes)")
        seq, term, checksum = _SNAPSHOT_HEAD.unpack_from(data)
        return cls(seq, term, checksum, decode_records(data[_SNAPSHOT_HEAD.size:]))


_SCAN_HEAD = struct.Struct("<Q")  # how many documents the filter selects on the replica


@dataclass(slots=True, frozen=True)
class ScanPage:
    """A page of a replica's listing (``ShardClient.scan``): how many live documents the filter
    selects there, and a page of them in id order, each an upsert record carrying its own seq.

        page = u64 matches | records      (little endian)
    """

    matches: int
    records: Sequence[WalRecord]

    def encode(self) -> bytes:
        return _SCAN_HEAD.pack(self.matches) + encode_records(self.records)

    @classmethod
    def decode(cls, data: bytes) -> ScanPage:
        """ValueError when it does not check out."""
        if len(data) < _SCAN_HEAD.size:
            raise ValueError(f"a scan page starts with its count ({_SCAN_HEAD.size} bytes)")
        (matches,) = _SCAN_HEAD.unpack_from(data)
        return cls(int(matches), decode_records(data[_SCAN_HEAD.size:]))


def document_fingerprint(doc_id: str, vector: np.ndarray | None, title: str, text: str, metadata: Any) -> bytes:
    """The bytes a replica's digest hashes for one document (``LiveShard.digest``; backups and
    tests build the same): its id, title, text and metadata as canonical JSON, then its vector's
    float32 little-endian bytes (none for a document stored without a vector: its JSON head says
    so, so it never hashes like one with an empty vector)."""
    import json

    described = [doc_id, title, text, metadata] + ([] if vector is not None else [None])
    head = json.dumps(described, sort_keys=True, separators=(",", ":")).encode()
    tail = np.ascontiguousarray(vector, dtype="<f4").tobytes() if vector is not None else b""
    return len(head).to_bytes(8, "little") + head + tail
