"""Snapshots: a replica's whole state of one version, for a peer too far behind (or diverged) to
catch up from a log.

:func:`take` lists every live document as of the applied seq — written documents with their
original vectors, build documents as the build holds them — plus the term and checksum of the
record at that seq. :func:`restore` writes such a snapshot as a new sealed base ``base-<seq>`` and
a checkpoint, exactly as a compaction does (crash-safe, checkpoint last; build documents keep
the build's own codes), then starts an empty log that continues at seq + 1.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import numpy as np

from index_shards import compaction
from index_shards.replica_log import Mark
from index_shards.segment import LiveShard, StoredDocument
from index_shards.slot import load_base
from retrieval.errors import ShardUnavailable
from retrieval.records import UPSERT, Snapshot, WalRecord

if TYPE_CHECKING:
    from index_shards.versions import ShardVersions

logger = logging.getLogger(__name__)


def take(versions: ShardVersions, version: str) -> Snapshot:
    slot = versions.slot(version)
    assert slot.live is not None
    with slot.write_lock:  # the mark and the documents of one seq
        seq, documents = slot.live.frozen_documents()
        mark = slot.log.mark(seq) if slot.log is not None else None
    records = [WalRecord(doc.seq, UPSERT, doc.doc_id, doc.title, doc.text, dict(doc.metadata),
                         np.asarray(doc.vector, dtype=np.float32) if doc.vector is not None else None)
               for doc in documents]
    return Snapshot(seq, mark.term if mark else 0, mark.checksum if mark else 0, records)


def restore(versions: ShardVersions, version: str, snapshot: Snapshot, *, force: bool = False) -> int:
    """Replace the version's state with ``snapshot`` (module docstring). Without ``force`` nothing
    changes when this replica has already applied the snapshot's seq; with it (a diverged
    replica) the state is replaced whatever it held. The applied seq after."""
    slot = versions.writable_slot(version)
    if versions.data_dir is None:
        raise ShardUnavailable(f"this replica of shard {versions.shard_id} takes no writes (no --data-dir)",
                               shard=versions.shard_id)
    documents = [StoredDocument(r.doc_id, r.title, r.text, r.metadata, r.seq, r.vector) for r in snapshot.records
                 if r.op == UPSERT]
    build = versions.builds[version]
    with slot.compact_lock, slot.write_lock:
        live, log = slot.live, slot.log
        assert live is not None and log is not None
        was = live.applied_seq
        if live.applied_seq >= snapshot.seq and not force:
            return live.applied_seq
        wal_dir = versions.data_dir / slot.version_id
        base_dir = compaction.write_base(wal_dir, build, documents, snapshot.seq)
        # from here a restart loads the snapshot
        compaction.publish_checkpoint(wal_dir, base_dir, snapshot.seq, snapshot.term, snapshot.checksum)
        base = load_base(base_dir, build, device=versions.device, mmap=versions.mmap,
                         filter_exact_max=versions.filter_exact_max)
        log.reset_to(Mark(snapshot.seq, snapshot.term, snapshot.checksum))
        slot.live = LiveShard(base, base_seq=snapshot.seq, base_seqs=compaction.read_seqs(base_dir),
                              written=compaction.read_written(base_dir))
        slot.shard = base
    compaction.remove_leftovers(wal_dir, keep=base_dir.name)
    versions.lexical_warmth.warm_soon(base)  # not under the write lock: writes resume at once
    logger.warning("version %s restored from a peer's snapshot at seq %d (%d documents; was at seq %d%s)",
                   slot.version_id, snapshot.seq, len(documents), was, ", diverged" if force else "")
    return snapshot.seq


def restore_from(versions: ShardVersions, version: str, sender_term: int, snapshot: Snapshot, *,
                 force: bool = False) -> int:
    """:func:`restore`, sent by the primary of ``sender_term``: refused from a deposed primary."""
    from retrieval.errors import StaleTerm

    if sender_term < versions.term:
        raise StaleTerm(f"shard {versions.shard_id}: a restore from term {sender_term}, but term {versions.term} "
                        "has begun", field="term", shard=versions.shard_id)
    versions.observe_term(sender_term)
    return restore(versions, version, snapshot, force=force)
