"""A replica's write-ahead log: every write to a shard, in sequence order, on disk (fsynced)
before it is acknowledged. Records are ``retrieval.records.WalRecord`` in their own framing
(magic, length, CRC32 over length and body, body), the same bytes replication sends.

Files are ``wal-<first seq>.log`` in the replica's own WAL directory (never inside the verified
shard directory); a new file starts when the current one passes ``segment_bytes``, and
:meth:`WriteAheadLog.drop_through` removes whole files a checkpoint (compaction) has covered.

**Group commit**: :meth:`append` writes every record of a batch, then one ``fsync`` (and the
directory is fsynced when a file is created), so a batch costs one disk flush however many
documents it holds.

**Recovery** (:meth:`open`): files are read in order. A record that does not check out — a short
header, a length past the end of the file, a CRC mismatch, a sequence number that does not follow
the previous one — with no good record after it in the last file is a torn tail (a crash
mid-append): the file is truncated to the last good record, with a warning naming file and
offset; nothing it held was acknowledged. The same with a good frame anywhere after it (found by
its magic and checksum, so a damaged *length* cannot hide the records behind it), or in any file
but the last, means the log itself is damaged: :class:`WalCorrupted` stops the replica, naming the
file and the offset.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from retrieval.atomic import fsync_dir
from retrieval.errors import IndexIntegrityError
from retrieval.records import (
    DELETE,
    MAGIC,
    NOOP,
    UPSERT,
    FrameError,
    WalRecord,
    decode_frame,
    decode_records,
    encode_records,
    next_frame_after,
)

SEGMENT_BYTES = 64 << 20  # a new WAL file past this size

__all__ = ["DELETE", "NOOP", "UPSERT", "WalCorrupted", "WalRecord", "WriteAheadLog", "decode_records",
           "encode_records"]

logger = logging.getLogger(__name__)

class WalCorrupted(IndexIntegrityError):
    code = "wal_corrupted"


def _file_name(first_seq: int) -> str:
    return f"wal-{first_seq:020d}.log"


class WriteAheadLog:
    def __init__(self, directory: str | Path, *, segment_bytes: int = SEGMENT_BYTES) -> None:
        self.directory = Path(directory)
        self.segment_bytes = segment_bytes
        self.last_seq = 0  # the last sequence number on disk (0: none)
        self._handle: Any = None
        self._current: Path | None = None

    # -- recovery --------------------------------------------------------------------------------
    def files(self) -> list[Path]:
        return sorted(self.directory.glob("wal-*.log"))

    def open(self, after_seq: int = 0) -> list[WalRecord]:
        """Read the log (repairing a torn tail), ready to append; the records after ``after_seq``."""
        self.directory.mkdir(parents=True, exist_ok=True)
        records: list[WalRecord] = []
        files = self.files()
        previous = None
        for number, path in enumerate(files):
            last_file = number == len(files) - 1
            for record in self._read_file(path, truncate_torn_tail=last_file, previous_seq=previous):
                previous = record.seq
                if record.seq > after_seq:
                    records.append(record)
        self.last_seq = max(previous or 0, after_seq)  # after a checkpoint the log may hold nothing newer
        if files and (previous or 0) < after_seq:
            # A restore from a peer's snapshot checkpointed past everything logged here (a crash came
            # before the log was reset): those records are superseded, and the next one starts a file.
            self._remove_files(files)
        elif files:
            self._current = files[-1]
            self._handle = open(self._current, "ab")  # noqa: SIM115 - held open for appends
        return records

    def reset_to(self, seq: int) -> None:
        """Drop every file (a snapshot at ``seq`` supersedes them); the next append is ``seq`` + 1,
        in a new file."""
        self.close()
        self._remove_files(self.files())
        self._current = None
        self.last_seq = seq

    def _remove_files(self, files: list[Path]) -> None:
        for path in files:
            path.unlink()
        if files:
            fsync_dir(self.directory)

    def _read_file(self, path: Path, *, truncate_torn_tail: bool, previous_seq: int | None,
                   stop_at_tail: bool = False) -> Iterator[WalRecord]:
        """The file's records. A bad record with nothing good after it is truncated
        (``truncate_torn_tail``: recovery), or ends the reading quietly (``stop_at_tail``: a reader
        while a batch is being appended sees its partial tail); anything else is WalCorrupted."""
        data = path.read_bytes()
        offset = 0
        while offset < len(data):
            try:
                record, end = decode_frame(data, offset)
                reason = None
                if previous_seq is not None and record.seq != previous_seq + 1:
                    reason = f"seq {record.seq} after {previous_seq}"
            except FrameError as exc:
                reason = str(exc).split(" at byte")[0]
            if reason is None:
                previous_seq = record.seq
                offset = end
                yield record
                continue
            if stop_at_tail and self._nothing_after(data, offset):
                return
            if truncate_torn_tail and self._nothing_after(data, offset):
                logger.warning("WAL %s: torn tail at offset %d (%s): truncated to the last good record",
                               path, offset, reason)
                with open(path, "r+b") as handle:
                    handle.truncate(offset)
                    handle.flush()
                    os.fsync(handle.fileno())
                return
            raise WalCorrupted(f"WAL {path} is damaged at offset {offset}: {reason}; the replica stops (restore "
                               "it from a peer or a snapshot)", field="wal")

    @staticmethod
    def _nothing_after(data: bytes, offset: int) -> bool:
        """A bad record is the last one in the file (a torn write), not one with records after it.
        Current frames are found by their magic and checksum; a log of the framing before terms
        (no magic) by the bad record's own length."""
        if data.find(MAGIC) != -1 or data[offset:offset + 4] == MAGIC:
            return next_frame_after(data, offset) is None
        if len(data) - offset < 8:
            return True
        length = int.from_bytes(data[offset:offset + 4], "little")
        return bool(offset + 8 + length >= len(data))

    # -- appends ---------------------------------------------------------------------------------
    def append(self, records: Sequence[WalRecord]) -> None:
        """Write ``records`` (consecutive seqs following :attr:`last_seq`), then fsync once."""
        if not records:
            return
        expected = self.last_seq + 1
        for record in records:
            if record.seq != expected:
                raise ValueError(f"WAL append out of order: seq {record.seq}, expected {expected}")
            expected += 1
        if self._handle is None or (self._current is not None and self._current.stat().st_size >= self.segment_bytes):
            self._rotate(records[0].seq)
        self._handle.write(b"".join(record.encode() for record in records))
        self._handle.flush()
        os.fsync(self._handle.fileno())
        self.last_seq = records[-1].seq

    def _rotate(self, first_seq: int) -> None:
        if self._handle is not None:
            self._handle.close()
        self.directory.mkdir(parents=True, exist_ok=True)
        self._current = self.directory / _file_name(first_seq)
        self._handle = open(self._current, "ab")  # noqa: SIM115
        fsync_dir(self.directory)

    def read_after(self, seq: int) -> Iterator[WalRecord]:
        """The records after ``seq`` (a peer catching up reads these); they must still be on disk."""
        files = self.files()
        for number, path in enumerate(files):
            if number + 1 < len(files) and int(files[number + 1].name[4:-4]) - 1 <= seq:
                continue  # every record of this file is at or before seq
            try:
                for record in self._read_file(path, truncate_torn_tail=False, previous_seq=None,
                                              stop_at_tail=number == len(files) - 1):
                    if record.seq > seq:
                        yield record
            except FileNotFoundError:  # dropped by a compaction meanwhile: what it held is behind seq
                continue

    @property
    def first_seq(self) -> int | None:
        """The oldest sequence number still on disk (None when the log is empty)."""
        files = self.files()
        return int(files[0].name[4:-4]) if files else None

    def drop_through(self, seq: int) -> int:
        """Remove the files whose every record is ≤ ``seq`` (a checkpoint covers them). The file
        being written is kept. Returns how many files went."""
        files = self.files()
        dropped = 0
        for path, following in zip(files, files[1:], strict=False):
            if int(following.name[4:-4]) - 1 <= seq:
                path.unlink()
                dropped += 1
        if dropped:
            fsync_dir(self.directory)
        return dropped

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None
