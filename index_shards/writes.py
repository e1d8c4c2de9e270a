"""How a replica takes writes into one version: log (fsynced), then apply, in seq order.

Two callers:

* the shard's **primary** numbers a batch itself and appends it with :func:`append_locked` while it
  holds the version's write lock (``index_shards.primary``);
* a **replica** takes batches its primary (or a peer catching it up) sent with :func:`accept`,
  which refuses, never silently accepts:

  - a sender whose term is older than one this replica knows (``StaleTerm``): a deposed primary;
  - a record at a seq this replica already holds with other content (``Diverged``), and a batch
    whose preceding record (``prev``: seq, term, checksum) is not the one this replica holds there
    (Raft's log-matching check) — its log has gone another way and it must be restored;
  - a batch that would leave a gap (``ReplicaBehind``): the sender catches it up first.

  A record it holds with the same content is skipped (a retry applies nothing twice).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

from httpkit import tracing
from index_shards.replica_log import Mark
from index_shards.slot import VersionSlot
from retrieval.errors import Diverged, ReplicaBehind, ShardUnavailable, StaleTerm
from retrieval.records import WalRecord

if TYPE_CHECKING:
    from index_shards.versions import ShardVersions


def append_locked(versions: ShardVersions, slot: VersionSlot, records: Sequence[WalRecord]) -> int:
    """Log and apply ``records``, which continue the version's seqs; the caller holds
    ``slot.write_lock``. The applied seq after."""
    live, log = slot.live, slot.log
    assert live is not None and log is not None
    if not records:
        return live.applied_seq
    if records[0].seq != live.applied_seq + 1:
        raise ReplicaBehind(f"shard {versions.shard_id} applied up to seq {live.applied_seq}; got {records[0].seq}",
                            field="seq", shard=versions.shard_id)
    if live.segment_size + live.tombstones >= 4 * versions.compact_after and slot.compact_lock.locked():
        raise ShardUnavailable(f"shard {versions.shard_id}: the write segment is full while compaction runs; "
                               "retry shortly", field="documents", shard=versions.shard_id)
    log.append(records)
    versions.crash_point("after_wal_append")  # durable, not applied, not acknowledged
    live.apply(records)
    return live.applied_seq


def accept(versions: ShardVersions, version: str, sender_term: int, prev: Mark | None,
           records: Sequence[WalRecord]) -> int:
    """Take ``records`` from a primary of ``sender_term`` (module docstring); the applied seq after."""
    with tracing.span("replica.apply", **{"shardrag.shard": versions.shard_id, "shardrag.version": version,
                                          "shardrag.records": len(records), "shardrag.term": sender_term}):
        return _accept(versions, version, sender_term, prev, records)


def _accept(versions: ShardVersions, version: str, sender_term: int, prev: Mark | None,
            records: Sequence[WalRecord]) -> int:
    slot = versions.writable_slot(version)
    broken = versions.ignore_terms()  # index_shards.faults: a deliberately broken build
    if sender_term < versions.term and not broken:
        raise StaleTerm(f"shard {versions.shard_id}: a write from term {sender_term}, but term {versions.term} "
                        "has begun (that primary was replaced)", field="term", shard=versions.shard_id)
    versions.observe_term(sender_term)
    with slot.write_lock:
        live, log = slot.live, slot.log
        assert live is not None and log is not None
        applied = live.applied_seq
        for record in records:
            if record.seq > applied:
                break
            held = log.mark(record.seq)
            if held is not None and held.checksum != record.checksum and not broken:
                raise Diverged(f"shard {versions.shard_id}, {version}: seq {record.seq} is held here with other "
                               f"content (term {held.term}, the sender's term {record.term})", field="seq",
                               shard=versions.shard_id)
        fresh = [r for r in records if r.seq > applied]
        if not fresh:
            return applied
        if fresh[0].seq != applied + 1:
            raise ReplicaBehind(f"shard {versions.shard_id} applied up to seq {applied}; got {fresh[0].seq}",
                                field="seq", shard=versions.shard_id)
        if fresh[0] is records[0] and prev is not None and prev.seq == applied:
            held = log.mark(prev.seq)
            if held is not None and prev.checksum and held.checksum and held.checksum != prev.checksum and not broken:
                raise Diverged(f"shard {versions.shard_id}, {version}: the record before seq {fresh[0].seq} is not "
                               "the sender's (this replica's log went another way)", field="prev",
                               shard=versions.shard_id)
        applied = append_locked(versions, slot, fresh)
    maybe_compact(versions, slot)
    return applied


def maybe_compact(versions: ShardVersions, slot: VersionSlot) -> None:
    """Start a background compaction once the segment and tombstones reach the trigger."""
    live = slot.live
    if live is None or live.segment_size + live.tombstones < versions.compact_after or slot.compact_lock.locked():
        return
    from index_shards.compaction import compact_quietly

    threading.Thread(target=compact_quietly, args=(versions, slot), daemon=True,
                     name=f"compact-{slot.version_id}").start()


def writes_after(versions: ShardVersions, version: str, after_seq: int) -> list[WalRecord]:
    """The records after ``after_seq`` (a lagging peer catches up from these). NotFound when this
    replica's log no longer holds all of them — compacted away, or this replica was itself
    restored from a snapshot past them: the peer needs a snapshot."""
    from retrieval.errors import NotFound

    slot = versions.slot(version)
    if slot.log is None or slot.live is None:
        return []  # a read-only replica (no data dir) never took a write
    if after_seq >= slot.live.applied_seq:
        return []
    first = slot.log.first_seq
    if first is None or after_seq + 1 < first:
        raise NotFound(f"writes after seq {after_seq} are not in this replica's log any more (it "
                       f"{'starts at ' + str(first) if first else 'is empty after a snapshot or compaction'}): "
                       "restore from a snapshot", field="after", shard=versions.shard_id)
    return list(slot.log.records_after(after_seq))
