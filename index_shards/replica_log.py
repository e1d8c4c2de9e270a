"""A replica's log of one version: the write-ahead log on disk (``index_shards.wal``) plus what the
write path asks of it in memory —

* the **checksum of every recent seq** (term and CRC of the record, ``retrieval.records``), so a
  record re-sent at a seq this replica holds is recognised as the same record or refused as
  another one (``Diverged``), and a batch is accepted only after a record that matches the
  sender's (Raft's log-matching check: ``prev``);
* the **idempotency keys** of the requests its records belong to, so a retried request — through
  any gateway, to this primary or to one promoted after it — is answered from its first outcome
  and applied once. Keys are remembered for the records the WAL retains (``--wal-retain``).

The checksum of the last record inside a compacted base or a restored snapshot comes from its
checkpoint (``anchor``): the log of a replica that has just compacted still matches at that seq.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from index_shards.wal import SEGMENT_BYTES, WriteAheadLog
from retrieval.records import WalRecord

RECENT_CHECKSUMS = 200_000  # seqs whose checksums are kept in memory (4 + 8 bytes each)


@dataclass(slots=True, frozen=True)
class Mark:
    """One seq's record, as far as matching needs: its term and checksum."""

    seq: int
    term: int
    checksum: int


@dataclass(slots=True, frozen=True)
class KeyedWrite:
    """What a request with an idempotency key did on this shard: its fingerprint and the seqs."""

    fingerprint: str
    first_seq: int
    last_seq: int
    doc_ids: tuple[str, ...]


class ReplicaLog:
    def __init__(self, directory: Path, *, segment_bytes: int = SEGMENT_BYTES) -> None:
        self.wal = WriteAheadLog(directory, segment_bytes=segment_bytes)
        self._first = 0  # the seq of _terms[0]
        self._terms = array("Q")
        self._checksums = array("I")
        self._anchor: Mark | None = None  # the last record inside the base (from its checkpoint)
        self.keys: dict[str, KeyedWrite] = {}

    @property
    def last_seq(self) -> int:
        return self.wal.last_seq

    def open(self, base: Mark) -> list[WalRecord]:
        """Read the log (a torn tail repaired); the records after the base's seq, to apply. Every
        record on disk (the retained ones behind the base too) is indexed for matching and keys."""
        self._anchor = base
        records = self.wal.open(after_seq=0)
        self._first, self._terms, self._checksums = 0, array("Q"), array("I")
        for record in records:
            self._index(record)
        if self.wal.last_seq < base.seq:  # superseded by a snapshot (WriteAheadLog.open dropped it)
            self._first, self._terms, self._checksums = 0, array("Q"), array("I")
            self.wal.last_seq = base.seq
        return [r for r in records if r.seq > base.seq]

    def append(self, records: Sequence[WalRecord]) -> None:
        """Log ``records`` (fsynced) and index them."""
        self.wal.append(records)
        for record in records:
            self._index(record)

    def _index(self, record: WalRecord) -> None:
        if not self._terms or record.seq != self._first + len(self._terms):
            self._first, self._terms, self._checksums = record.seq, array("Q"), array("I")
        self._terms.append(record.term)
        self._checksums.append(record.checksum)
        if len(self._terms) > 2 * RECENT_CHECKSUMS:
            drop = len(self._terms) - RECENT_CHECKSUMS
            del self._terms[:drop]
            del self._checksums[:drop]
            self._first += drop
        if record.key:  # a request's records on one shard are consecutive: one entry per request
            earlier = self.keys.get(record.key)
            new_id = (record.doc_id,) if record.doc_id else ()
            if earlier is None:
                self.keys[record.key] = KeyedWrite(record.fingerprint, record.seq, record.seq, new_id)
            elif earlier.last_seq == record.seq - 1 and earlier.fingerprint == record.fingerprint:
                self.keys[record.key] = KeyedWrite(record.fingerprint, earlier.first_seq, record.seq,
                                                   earlier.doc_ids + new_id)

    def mark(self, seq: int) -> Mark | None:
        """The term and checksum of the record at ``seq``, when this replica still knows them."""
        if self._anchor is not None and seq == self._anchor.seq:
            return self._anchor
        index = seq - self._first
        if self._terms and 0 <= index < len(self._terms):
            return Mark(seq, int(self._terms[index]), int(self._checksums[index]))
        return None

    def last_mark(self) -> Mark | None:
        return self.mark(self.wal.last_seq)

    def records_after(self, seq: int) -> Iterator[WalRecord]:
        return self.wal.read_after(seq)

    @property
    def first_seq(self) -> int | None:
        return self.wal.first_seq

    def reset_to(self, base: Mark) -> None:
        """Drop the log: a snapshot at ``base.seq`` supersedes it (keys of the dropped records go too)."""
        self.wal.reset_to(base.seq)
        self._anchor = base
        self._first, self._terms, self._checksums = 0, array("Q"), array("I")
        self.keys.clear()

    def rebase(self, base: Mark) -> None:
        """A compaction sealed everything up to ``base.seq`` into a new base."""
        self._anchor = base

    def drop_through(self, seq: int) -> None:
        self.wal.drop_through(seq)

    def close(self) -> None:
        self.wal.close()
