"""The embedding versions one replica holds for its shard slot (collection, shard id).

A replica starts with one version and can load another next to it — ``stage`` — in a
background thread (checksums verified as at start), reporting ``loading`` → ``ready`` or
``failed`` with the reason. Loading is refused up front when the replica already holds
``max_versions`` or when the new index would not fit in the memory the machine has available.
A search names its version; one the replica does not hold (or not ready yet) is a 409 that
lists what it has.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from index_shards import compaction
from index_shards.layout import INDEX_FILE
from index_shards.manifest import SHARD_MANIFEST
from index_shards.segment import LiveShard, StoredDocument
from index_shards.shard import Shard
from index_shards.wal import SEGMENT_BYTES, UPSERT, WalCorrupted, WalRecord, WriteAheadLog
from retrieval.contract import (
    FAILED,
    LOADING,
    READY,
    HealthInfo,
    ReplicaInfo,
    SearchParams,
    SearchReply,
    StageReply,
    UnloadReply,
    VersionInfo,
)
from retrieval.errors import (
    IndexIntegrityError,
    InvalidRequest,
    NotFound,
    ReplicaBehind,
    ResourceExhausted,
    ShardragError,
    ShardUnavailable,
    VersionConflict,
)
from retrieval.filters import filter_from_canonical

COMPACT_AFTER = 20_000  # segment documents + tombstones that start a background compaction
WAL_RETAIN = 100_000  # WAL records kept behind a checkpoint, for peers that fall behind

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class VersionSlot:
    version_id: str
    directory: Path
    state: str
    shard: Shard | None = None
    error: str | None = None
    started_at: float = 0.0
    ready_at: float | None = None
    live: LiveShard | None = None  # the shard with the writes applied since its base
    wal: WriteAheadLog | None = None  # None: this replica takes no writes (no --data-dir)
    write_lock: threading.Lock = field(default_factory=threading.Lock)
    compact_lock: threading.Lock = field(default_factory=threading.Lock)  # one compaction at a time
    compactions: int = 0

    def describe(self) -> VersionInfo:
        load_s = self.ready_at - self.started_at if self.ready_at is not None else None
        if self.shard is None:
            return VersionInfo(self.version_id, self.state, error=self.error, load_s=load_s)
        m = self.shard.manifest
        live = self.live
        return VersionInfo(
            self.version_id, self.state, error=self.error, embedding_version=m.embedding_version, count=m.count,
            dim=m.dim, metric=m.metric, factory=m.factory, partitioner=m.partitioner, num_shards=m.num_shards,
            centroid=tuple(float(x) for x in m.centroid) if m.centroid is not None else None,
            on_gpu=self.shard.index.on_gpu, load_s=load_s,
            applied_seq=live.applied_seq if live is not None and self.wal is not None else None,
            segment=live.segment_size if live is not None and self.wal is not None else None,
            tombstones=live.tombstones if live is not None and self.wal is not None else None,
            search_defaults=dict(self.shard.index.defaults) or None)


def available_memory_bytes() -> int | None:
    """MemAvailable from /proc/meminfo (None where there is no such file)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


class ShardVersions:
    def __init__(self, first: Shard, *, max_versions: int = 2, device: str = "auto",
                 memory_headroom: float = 0.2, filter_exact_max: int | None = None,
                 data_dir: str | Path | None = None, compact_after: int = COMPACT_AFTER,
                 wal_retain: int = WAL_RETAIN, wal_file_bytes: int = SEGMENT_BYTES,
                 crash_point: Callable[[str], None] | None = None, mmap: bool = True) -> None:
        """``data_dir``: where this replica keeps its write-ahead logs and compacted bases (one folder
        per version); None: the replica is read-only. ``compact_after``: segment documents plus
        tombstones that start a background compaction (writes are refused with 503 past 4× that
        while it runs: the segment's memory is bounded). ``crash_point``: the fault injector's hook,
        called at named points of the write path (index_shards.faults)."""
        manifest = first.manifest
        self.data_dir = Path(data_dir) if data_dir is not None else None
        if compact_after < 1:
            raise InvalidRequest(f"compact_after must be ≥ 1, got {compact_after}", field="compact_after")
        self.compact_after = compact_after
        self.wal_retain = max(0, wal_retain)
        self.wal_file_bytes = max(1, wal_file_bytes)  # a WAL file past this size is closed, a new one begun
        self._crash_point = crash_point or (lambda point: None)
        self.filter_exact_max = filter_exact_max  # None: each shard's default (index_shards.filtered)
        if filter_exact_max is not None:
            first.filtered.exact_scan_max = filter_exact_max
        self.collection = manifest.collection
        self.shard_id = manifest.shard_id
        self.num_shards = manifest.num_shards
        # <root>/<collection>/<version>/shard-<i>: other versions live next to the first one
        self.collection_dir = first.directory.parent.parent
        self.max_versions = max_versions
        self.device = device
        self.mmap = mmap  # map staged and compacted indexes from their files (see Shard.load)
        self.memory_headroom = memory_headroom
        self._lock = threading.Lock()
        slot = VersionSlot(first.version_id, first.directory, LOADING, first, started_at=time.time())
        slot.shard = self._go_live(slot, first)
        slot.state, slot.ready_at = READY, time.time()
        self._slots: dict[str, VersionSlot] = {first.version_id: slot}

    def _go_live(self, slot: VersionSlot, shard: Shard) -> Shard:
        """The shard plus the writes its WAL holds: the last compacted base (when a checkpoint
        names one) and the WAL records past it, replayed in order. A damaged WAL or base stops
        here. Returns the base in use."""
        if self.data_dir is None:
            slot.live = LiveShard(shard)
            return shard
        wal_dir = self.data_dir / slot.version_id
        checkpoint = compaction.read_checkpoint(wal_dir)
        compaction.remove_leftovers(wal_dir, checkpoint.base if checkpoint else None)
        base_seq, base_seqs = 0, {}
        if checkpoint is not None:
            shard.docstore.close()
            shard = self._load_base(wal_dir / checkpoint.base, shard)
            base_seq, base_seqs = checkpoint.seq, compaction.read_seqs(shard.directory)
        wal = WriteAheadLog(wal_dir, segment_bytes=self.wal_file_bytes)
        records = wal.open(after_seq=base_seq)
        live = LiveShard(shard, base_seq=base_seq, base_seqs=base_seqs)
        if records and records[0].seq != base_seq + 1:
            raise WalCorrupted(f"WAL {wal_dir} resumes at seq {records[0].seq}, but the base holds writes up to "
                               f"{base_seq}: writes {base_seq + 1}..{records[0].seq - 1} are missing", field="wal")
        live.apply(records)
        slot.live, slot.wal = live, wal
        if records or checkpoint:
            logger.warning("version %s: base at seq %d, replayed %d writes from the WAL (applied seq %d)",
                           slot.version_id, base_seq, len(records), live.applied_seq)
        return shard

    def _load_base(self, directory: Path, build: Shard) -> Shard:
        base = Shard.load(directory, device=self.device, mmap=self.mmap)
        if self.filter_exact_max is not None:
            base.filtered.exact_scan_max = self.filter_exact_max
        m, b = base.manifest, build.manifest
        if (m.embedding_version.id, m.shard_id, m.num_shards) != (b.embedding_version.id, b.shard_id, b.num_shards):
            raise IndexIntegrityError(f"{directory} is not a compaction of {build.directory}")
        return base

    # -- queries ------------------------------------------------------------------------------
    def ready_ids(self) -> list[str]:
        return [v for v, s in self._slots.items() if s.state == READY]

    def get(self, version_id: str | None) -> LiveShard:
        """The ready shard of ``version_id`` (None: the only ready version, if there is one), with
        the writes applied to it."""
        live = self._slot(version_id).live
        assert live is not None  # a ready slot is live
        return live

    def _slot(self, version_id: str | None) -> VersionSlot:
        if version_id is None:
            ready = self.ready_ids()
            if len(ready) == 1:
                return self._slots[ready[0]]
            raise VersionConflict(f"this replica holds versions {ready}; name one in 'version'", field="version")
        slot = self._slots.get(version_id)
        if slot is None or slot.state != READY:
            held = ", ".join(f"{v} ({s.state})" for v, s in self._slots.items())
            raise VersionConflict(f"this replica does not hold {version_id!r} ready; it has: {held}", field="version")
        return slot

    # -- writes -------------------------------------------------------------------------------
    def write(self, version_id: str, records: Sequence[WalRecord]) -> int:
        """Append ``records`` to the version's WAL (fsynced) and apply them; the applied seq after.
        Records this replica has already applied are skipped (a retry applies nothing twice); a
        batch that would leave a gap is refused with ReplicaBehind (it must catch up first)."""
        slot = self._slot(version_id)
        if slot.wal is None or slot.live is None:
            raise ShardUnavailable(f"this replica of shard {self.shard_id} takes no writes (no --data-dir)",
                                   shard=self.shard_id)
        with slot.write_lock:
            applied = slot.live.applied_seq
            fresh = [r for r in records if r.seq > applied]
            if fresh and fresh[0].seq != applied + 1:
                raise ReplicaBehind(f"shard {self.shard_id} applied up to seq {applied}; got {fresh[0].seq}",
                                    field="seq", shard=self.shard_id)
            live = slot.live
            if fresh and live.segment_size + live.tombstones >= 4 * self.compact_after and slot.compact_lock.locked():
                raise ShardUnavailable(f"shard {self.shard_id}: the write segment is full while compaction runs; "
                                       "retry shortly", field="documents", shard=self.shard_id)
            if fresh:
                slot.wal.append(fresh)
                self._crash_point("after_wal_append")  # durable, not applied, not acknowledged
                live.apply(fresh)
            applied = live.applied_seq
            due = live.segment_size + live.tombstones >= self.compact_after
        if due and not slot.compact_lock.locked():
            threading.Thread(target=self._compact_quietly, args=(slot,), daemon=True,
                             name=f"compact-{slot.version_id}").start()
        return applied

    # -- compaction ---------------------------------------------------------------------------
    def compact(self, version_id: str) -> dict[str, float | int | str]:
        """Fold the version's segment and tombstones into a new sealed base (index_shards.compaction);
        queries and writes go on meanwhile. Returns what was done."""
        slot = self._slot(version_id)
        if slot.wal is None:
            raise ShardUnavailable(f"this replica of shard {self.shard_id} takes no writes (no --data-dir)",
                                   shard=self.shard_id)
        with slot.compact_lock:
            return self._compact(slot)

    def _compact_quietly(self, slot: VersionSlot) -> None:
        if not slot.compact_lock.acquire(blocking=False):
            return
        try:
            self._compact(slot)
        except Exception:  # noqa: BLE001 - a background compaction that fails is retried by the next write
            logger.exception("compaction of version %s failed", slot.version_id)
        finally:
            slot.compact_lock.release()

    def _compact(self, slot: VersionSlot) -> dict[str, float | int | str]:
        assert slot.live is not None and slot.wal is not None and self.data_dir is not None
        started = time.perf_counter()
        live = slot.live
        seq, documents = live.frozen_documents()
        if seq == live.base_seq:
            return {"version": slot.version_id, "base_seq": seq, "count": live.base.manifest.count,
                    "compacted": 0, "seconds": 0.0}
        wal_dir = self.data_dir / slot.version_id
        folded = live.segment_size + live.tombstones
        base_dir = compaction.write_base(wal_dir, live.base.manifest, documents, seq)
        self._crash_point("mid_compaction")  # the new base is on disk, no checkpoint names it yet
        compaction.publish_checkpoint(wal_dir, base_dir, seq)
        self._crash_point("after_checkpoint")  # named by the checkpoint; the WAL is still whole
        base = self._load_base(base_dir, live.base)
        with slot.write_lock:  # the writes applied while the base was built move to the new segment
            current = slot.live
            fresh = LiveShard(base, base_seq=seq, base_seqs=compaction.read_seqs(base_dir))
            fresh.apply(list(slot.wal.read_after(seq)))
            if fresh.applied_seq != current.applied_seq:
                raise IndexIntegrityError(f"compaction of {slot.version_id}: the WAL reaches seq "
                                          f"{fresh.applied_seq}, the replica {current.applied_seq}")
            slot.live, slot.shard = fresh, base
            slot.compactions += 1
        # queries still running on the old base hold their own references; its files can go
        compaction.remove_leftovers(wal_dir, keep=base_dir.name)
        slot.wal.drop_through(seq - self.wal_retain)
        took = time.perf_counter() - started
        logger.warning("version %s compacted at seq %d: %d documents, %d segment entries folded (%.2f s)",
                       slot.version_id, seq, base.manifest.count, folded, took)
        return {"version": slot.version_id, "base_seq": seq, "count": base.manifest.count, "compacted": folded,
                "seconds": round(took, 3)}

    def writes_after(self, version_id: str, after_seq: int) -> list[WalRecord]:
        """The records after ``after_seq`` (a lagging peer catches up from these)."""
        slot = self._slot(version_id)
        if slot.wal is None:
            raise NotFound(f"this replica of shard {self.shard_id} keeps no WAL", field="version")
        first = slot.wal.first_seq
        if first is not None and after_seq < first - 1:
            raise NotFound(f"writes after seq {after_seq} are compacted away here (the WAL starts at {first})",
                           field="after")
        return list(slot.wal.read_after(after_seq))

    def snapshot(self, version_id: str) -> tuple[int, list[WalRecord]]:
        """Every live document of the version as of its applied seq, as upsert records whose seq is
        the write that stored each document (0: from the build): what a peer too far behind for
        :meth:`writes_after` restores from."""
        seq, documents = self.get(version_id).frozen_documents()
        records = []
        for doc in documents:
            assert doc.vector is not None
            records.append(WalRecord(doc.seq, UPSERT, doc.doc_id, doc.title, doc.text, dict(doc.metadata),
                                     np.asarray(doc.vector, dtype=np.float32)))
        return seq, records

    def restore(self, version_id: str, seq: int, records: Sequence[WalRecord]) -> int:
        """Replace the version's state with a peer's snapshot at ``seq`` (this replica is behind
        what any peer's WAL still holds): a new sealed base of those documents and a checkpoint at
        ``seq`` (crash-safe, as a compaction), then an empty WAL that continues at ``seq`` + 1.
        Nothing changes when this replica has already applied ``seq``. The applied seq after."""
        slot = self._slot(version_id)
        if slot.wal is None or slot.live is None or self.data_dir is None:
            raise ShardUnavailable(f"this replica of shard {self.shard_id} takes no writes (no --data-dir)",
                                   shard=self.shard_id)
        documents = [StoredDocument(r.doc_id, r.title, r.text, r.metadata, r.seq, r.vector) for r in records
                     if r.op == UPSERT]
        with slot.compact_lock, slot.write_lock:
            live = slot.live
            if live.applied_seq >= seq:
                return live.applied_seq
            wal_dir = self.data_dir / slot.version_id
            base_dir = compaction.write_base(wal_dir, live.base.manifest, documents, seq)
            compaction.publish_checkpoint(wal_dir, base_dir, seq)  # from here a restart loads the snapshot
            base = self._load_base(base_dir, live.base)
            slot.wal.reset_to(seq)
            slot.live, slot.shard = LiveShard(base, base_seq=seq, base_seqs=compaction.read_seqs(base_dir)), base
        compaction.remove_leftovers(wal_dir, keep=base_dir.name)
        logger.warning("version %s restored from a peer's snapshot at seq %d (%d documents; was at seq %d)",
                       slot.version_id, seq, len(documents), live.applied_seq)
        return seq

    def matching_ids(self, version_id: str, filter_canonical: str, limit: int) -> list[str]:
        """Ids of live documents of the version that the filter (canonical JSON) selects."""
        return self.get(version_id).matching_ids(filter_from_canonical(filter_canonical), limit)

    def describe(self) -> tuple[VersionInfo, ...]:
        return tuple(slot.describe() for slot in list(self._slots.values()))

    def info(self) -> ReplicaInfo:
        """What ``GET /v1/info`` reports: the slot and every version held, with its state."""
        return ReplicaInfo(self.collection, self.shard_id, self.num_shards, self.describe())

    def health(self) -> HealthInfo:
        return HealthInfo(self.shard_id, tuple(self.ready_ids()))

    def search(self, vectors: np.ndarray, params: SearchParams) -> SearchReply:
        """One search against the version ``params`` names (409 when this replica does not hold it)."""
        started = time.perf_counter()
        shard = self.get(params.version)
        if params.min_seq is not None and shard.applied_seq < params.min_seq:
            raise ReplicaBehind(f"shard {self.shard_id} applied up to seq {shard.applied_seq}, the read needs "
                                f"{params.min_seq}", field="min_seq", shard=self.shard_id)
        results = shard.search(np.asarray(vectors, dtype=np.float32), params.k, nprobe=params.nprobe,
                               ef_search=params.ef_search, with_text=params.with_text,
                               with_metadata=params.with_metadata,
                               filter_=filter_from_canonical(params.filter) if params.filter else None)
        return SearchReply(self.shard_id, shard.version_id, (time.perf_counter() - started) * 1000.0, results)

    def stage_reply(self, version_id: str) -> StageReply:
        """:meth:`stage`, answered as ``POST /admin/versions`` answers."""
        return StageReply(self.stage(version_id).describe(), self.describe())

    def unload_reply(self, version_id: str) -> UnloadReply:
        """:meth:`unload`, answered as ``DELETE /admin/versions/{id}`` answers."""
        return UnloadReply(self.unload(version_id), self.describe())

    # -- staging -------------------------------------------------------------------------------
    def stage(self, version_id: str) -> VersionSlot:
        """Start loading ``version_id`` next to the others. Idempotent: a version loading or ready
        is left alone; a failed one is tried again."""
        if not version_id or "/" in version_id or version_id.startswith("."):
            raise InvalidRequest(f"invalid version id {version_id!r}", field="version")
        with self._lock:
            slot = self._slots.get(version_id)
            if slot is not None and slot.state in (LOADING, READY):
                return slot
            directory = self.collection_dir / version_id / f"shard-{self.shard_id}"
            if not (directory / SHARD_MANIFEST).is_file():
                raise NotFound(f"version {version_id!r} of {self.collection!r} has no shard {self.shard_id} at "
                               f"{directory} (not built, or its manifest is missing)", field="version")
            held = [s for s in self._slots.values() if s.state != FAILED and s.version_id != version_id]
            if len(held) >= self.max_versions:
                raise ResourceExhausted(f"this replica already holds {len(held)} versions "
                                        f"({', '.join(s.version_id for s in held)}); retire one first "
                                        f"(max_versions={self.max_versions})", field="version")
            self._check_memory(directory, version_id)
            slot = VersionSlot(version_id, directory, LOADING, started_at=time.time())
            self._slots[version_id] = slot
        threading.Thread(target=self._load, args=(slot,), daemon=True, name=f"load-{version_id}").start()
        logger.warning("staging version %s from %s", version_id, directory)
        return slot

    def _check_memory(self, directory: Path, version_id: str) -> None:
        needed = (directory / INDEX_FILE).stat().st_size if (directory / INDEX_FILE).exists() else 0
        available = available_memory_bytes()
        if available is not None and needed > available * (1.0 - self.memory_headroom):
            raise ResourceExhausted(
                f"not enough memory to load {version_id}: its index needs {needed / 2**20:.0f} MiB, "
                f"{available / 2**20:.0f} MiB is available (keeping {self.memory_headroom:.0%} headroom)",
                field="version")

    def _load(self, slot: VersionSlot) -> None:
        try:
            shard = Shard.load(slot.directory, device=self.device, mmap=self.mmap)
            if self.filter_exact_max is not None:
                shard.filtered.exact_scan_max = self.filter_exact_max
            m = shard.manifest
            if m.embedding_version.id != slot.version_id:
                raise IndexIntegrityError(f"{slot.directory} holds version {m.embedding_version.id}, "
                                          f"not {slot.version_id}")
            if (m.collection, m.shard_id, m.num_shards) != (self.collection, self.shard_id, self.num_shards):
                raise IndexIntegrityError(
                    f"{slot.directory} is shard {m.shard_id}/{m.num_shards} of {m.collection!r}; this replica "
                    f"serves shard {self.shard_id}/{self.num_shards} of {self.collection!r}")
            shard = self._go_live(slot, shard)
        except ShardragError as exc:
            slot.state, slot.error = FAILED, exc.message
            logger.error("version %s failed to load: %s", slot.version_id, exc.message)
            return
        except Exception as exc:  # noqa: BLE001 - reported through /v1/info, never crashes the server
            slot.state, slot.error = FAILED, f"{type(exc).__name__}: {exc}"
            logger.exception("version %s failed to load", slot.version_id)
            return
        slot.shard, slot.ready_at, slot.state = shard, time.time(), READY
        logger.warning("version %s ready (%.1f s)", slot.version_id, slot.ready_at - slot.started_at)

    def unload(self, version_id: str) -> bool:
        """Drop ``version_id``. Idempotent (False when it was not held); the last ready version stays."""
        with self._lock:
            slot = self._slots.get(version_id)
            if slot is None:
                return False
            if slot.state == READY and self.ready_ids() == [version_id]:
                raise VersionConflict(f"{version_id} is the only version this replica holds; stage another "
                                      "before unloading it", field="version")
            del self._slots[version_id]
        if slot.wal is not None:
            slot.wal.close()
        if slot.shard is not None:
            slot.shard.docstore.close()
        logger.warning("version %s unloaded", version_id)
        return True
