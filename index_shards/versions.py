"""The embedding versions one replica holds for its shard slot (collection, shard id).

A replica starts with one version and can load another next to it — ``stage`` — in a
background thread (checksums verified as at start), reporting ``loading`` → ``ready`` or
``failed`` with the reason. Loading is refused up front when the replica already holds
``max_versions`` or when the new index would not fit in the memory the machine has available.
A search names its version; one the replica does not hold (or not ready yet) is a 409 that
lists what it has.

The other jobs of a replica's store live in their own modules and act on a version's
:class:`~index_shards.slot.VersionSlot`: taking writes (``index_shards.writes``), compaction
(``index_shards.compaction``), snapshots and restores (``index_shards.snapshots``). This class
keeps what they share: the slots, the replica's primary term (persisted with its data, so a
restarted replica still refuses a deposed primary) and the exclusive lock on its data dir.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from index_shards.hybrid_search import fused_search
from index_shards.layout import INDEX_FILE
from index_shards.lexical_search import shard_search
from index_shards.lexical_warm import LexicalWarmth
from index_shards.manifest import SHARD_MANIFEST
from index_shards.segment import LiveShard
from index_shards.shard import Shard
from index_shards.slot import VersionSlot, open_live
from index_shards.wal import SEGMENT_BYTES
from retrieval.atomic import atomic_write_bytes
from retrieval.bm25 import LexicalQuery
from retrieval.contract import (
    FAILED,
    LOADING,
    READY,
    HealthInfo,
    ReplicaInfo,
    RoleInfo,
    SearchParams,
    SearchReply,
    StageReply,
    UnloadReply,
    VersionInfo,
)
from retrieval.dirlock import DirLock
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
from retrieval.records import UPSERT, ScanPage, WalRecord

COMPACT_AFTER = 20_000  # segment documents + tombstones that start a background compaction
WAL_RETAIN = 100_000  # WAL records kept behind a checkpoint, for peers that fall behind
TERM_FILE = "term.json"

logger = logging.getLogger(__name__)


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
                 crash_point: Callable[[str], None] | None = None, mmap: bool = True,
                 ignore_terms: Callable[[], bool] | None = None, lexical_warm: str = "auto") -> None:
        """``data_dir``: where this replica keeps its write-ahead logs and compacted bases (one folder
        per version), held by this process alone (a second one is refused, naming the holder);
        None: the replica is read-only. ``compact_after``: segment documents plus tombstones that
        start a background compaction (writes are refused with 503 past 4× that while it runs: the
        segment's memory is bounded). ``crash_point``: the fault injector's hook, called at named
        points of the write path (index_shards.faults). ``lexical_warm``: when a base's lexical
        index is built (index_shards.lexical_warm)."""
        manifest = first.manifest
        self.data_dir = Path(data_dir) if data_dir is not None else None
        if compact_after < 1:
            raise InvalidRequest(f"compact_after must be ≥ 1, got {compact_after}", field="compact_after")
        self.compact_after = compact_after
        self.wal_retain = max(0, wal_retain)
        self.wal_file_bytes = max(1, wal_file_bytes)  # a WAL file past this size is closed, a new one begun
        self.crash_point = crash_point or (lambda point: None)
        self.ignore_terms = ignore_terms or (lambda: False)  # the broken build of index_shards.faults
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
        self._dir_lock = DirLock(self.data_dir, "replica data dir").acquire() if self.data_dir is not None else None
        self.lexical_warmth = LexicalWarmth(lexical_warm, self.data_dir)
        self.warming: threading.Thread | None = None  # the first version's lexical index, built in the background
        self._term_lock = threading.Lock()
        self.term = self._read_term()
        self.role: Callable[[], RoleInfo | None] = lambda: None  # set by the shard's role (index_shards.role)
        self.builds: dict[str, Shard] = {first.version_id: first}  # each version's own build (compaction reads it)
        try:
            slot = VersionSlot(first.version_id, first.directory, LOADING, started_at=time.time())
            self._open(slot, first)
            slot.state, slot.ready_at = READY, time.time()
        except BaseException:
            self.close()
            raise
        self._slots: dict[str, VersionSlot] = {first.version_id: slot}
        assert slot.shard is not None
        self.warming = self.lexical_warmth.warm_soon(slot.shard)  # dense queries are served meanwhile

    def _open(self, slot: VersionSlot, build: Shard) -> None:
        open_live(slot, build, self.data_dir, device=self.device, mmap=self.mmap,
                  filter_exact_max=self.filter_exact_max, wal_file_bytes=self.wal_file_bytes)

    @property
    def writable(self) -> bool:
        return self.data_dir is not None

    # -- the replica's primary term --------------------------------------------------------------
    def _read_term(self) -> int:
        if self.data_dir is None:
            return 0
        path = self.data_dir / TERM_FILE
        try:
            return int(json.loads(path.read_bytes())["term"])
        except FileNotFoundError:
            return 0
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise IndexIntegrityError(f"{path} is unreadable: {exc!r}", field="data_dir") from exc

    def observe_term(self, term: int) -> int:
        """Know of primary term ``term`` (persisted before it is acted on); the term known after."""
        with self._term_lock:
            if term > self.term:
                if self.data_dir is not None:
                    atomic_write_bytes(self.data_dir / TERM_FILE, json.dumps({"term": term}).encode())
                self.term = term
            return self.term

    # -- queries ------------------------------------------------------------------------------
    def ready_ids(self) -> list[str]:
        return [v for v, s in self._slots.items() if s.state == READY]

    def slots(self) -> list[VersionSlot]:
        return [s for s in list(self._slots.values()) if s.state == READY]

    def get(self, version_id: str | None) -> LiveShard:
        """The ready shard of ``version_id`` (None: the only ready version, if there is one), with
        the writes applied to it."""
        live = self.slot(version_id).live
        assert live is not None  # a ready slot is live
        return live

    def slot(self, version_id: str | None) -> VersionSlot:
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

    def writable_slot(self, version_id: str | None) -> VersionSlot:
        slot = self.slot(version_id)
        if slot.log is None or slot.live is None:
            raise ShardUnavailable(f"this replica of shard {self.shard_id} takes no writes (no --data-dir)",
                                   shard=self.shard_id)
        return slot

    def search(self, vectors: np.ndarray, params: SearchParams, lexical: Sequence[LexicalQuery] = ()) -> SearchReply:
        """One search against the version ``params`` names (409 when this replica does not hold it;
        ``replica_behind`` when a session read needs a write it has not applied). With
        ``params.lexical``, the BM25 top k of each of ``lexical`` instead, each with this replica's
        statistics for its terms."""
        started = time.perf_counter()
        slot = self.slot(params.version)
        shard = slot.live
        assert shard is not None  # a ready slot is live
        if params.min_seq is not None and shard.applied_seq < params.min_seq:
            raise ReplicaBehind(f"shard {self.shard_id} applied up to seq {shard.applied_seq}, the read needs "
                                f"{params.min_seq}", field="min_seq", shard=self.shard_id)
        if params.min_term is not None and (held := self.applied_term(slot)) < params.min_term:
            # Past the seq but not in the term: this log holds records of an older primary that the
            # write's primary never had (diverged, not yet restored) — it may lack the write.
            raise ReplicaBehind(f"shard {self.shard_id}'s records up to seq {shard.applied_seq} are of term {held}; "
                                f"the read needs a write of term {params.min_term}", field="min_term",
                                shard=self.shard_id)
        filter_ = filter_from_canonical(params.filter) if params.filter else None
        if params.lexical:
            self.lexical_warmth.note_used()
        if params.lexical and any(query.fuse is not None for query in lexical):
            if not all(query.fuse is not None for query in lexical) or len(vectors) != len(lexical):
                raise InvalidRequest("a weighted hybrid call fuses every query, each with its vector", field="body")
            fused = fused_search(shard, np.asarray(vectors, dtype=np.float32), lexical, params.k,
                                 nprobe=params.nprobe, ef_search=params.ef_search, with_text=params.with_text,
                                 with_metadata=params.with_metadata, filter_=filter_)
            return SearchReply(self.shard_id, shard.version_id, (time.perf_counter() - started) * 1000.0,
                               [hits for hits, _ in fused], [stats for _, stats in fused])
        if params.lexical:
            answers = [shard_search(shard, query.text, query.corpus, params.k, with_text=params.with_text,
                                    with_metadata=params.with_metadata, filter_=filter_) for query in lexical]
            dense = None
            if len(vectors):  # a hybrid call: the vectors' top k in the same call
                dense = shard.search(np.asarray(vectors, dtype=np.float32), params.k, nprobe=params.nprobe,
                                     ef_search=params.ef_search, with_text=params.with_text,
                                     with_metadata=params.with_metadata, filter_=filter_)
            return SearchReply(self.shard_id, shard.version_id, (time.perf_counter() - started) * 1000.0,
                               [hits for hits, _ in answers], [stats for _, stats in answers], dense)
        results = shard.search(np.asarray(vectors, dtype=np.float32), params.k, nprobe=params.nprobe,
                               ef_search=params.ef_search, with_text=params.with_text,
                               with_metadata=params.with_metadata, filter_=filter_)
        return SearchReply(self.shard_id, shard.version_id, (time.perf_counter() - started) * 1000.0, results)

    @staticmethod
    def applied_term(slot: VersionSlot) -> int:
        """The term of the record at the slot's applied seq (0: none, or no log): a log is a prefix of
        that term's primary's log, which holds every write acknowledged under that term or before."""
        live, log = slot.live, slot.log
        if live is None or log is None or live.applied_seq == 0:
            return 0
        mark = log.mark(live.applied_seq)
        return mark.term if mark is not None else 0

    def matching_ids(self, version_id: str, filter_canonical: str, limit: int) -> list[str]:
        """Ids of live documents of the version that the filter (canonical JSON) selects."""
        return self.get(version_id).matching_ids(filter_from_canonical(filter_canonical), limit)

    def scan(self, version_id: str, filter_canonical: str, after: str, limit: int) -> ScanPage:
        """A page of the version's live documents the filter selects, in id order after ``after``."""
        total, documents = self.get(version_id).scan(filter_from_canonical(filter_canonical), after, limit)
        return ScanPage(total, [WalRecord(d.seq, UPSERT, d.doc_id, d.title, d.text, d.metadata, d.vector)
                                for d in documents])

    def document(self, version_id: str | None, doc_id: str) -> dict[str, object] | None:
        """``GET /v1/documents/{id}``'s answer: the document as this replica holds it, or None."""
        live = self.get(version_id)
        stored = live.get(doc_id)
        if stored is None:
            return None
        return {"id": stored.doc_id, "title": stored.title, "text": stored.text, "metadata": stored.metadata,
                "seq": stored.seq, "shard": self.shard_id, "version": live.version_id,
                "applied_seq": live.applied_seq}

    def describe(self) -> tuple[VersionInfo, ...]:
        return tuple(slot.describe() for slot in list(self._slots.values()))

    def info(self) -> ReplicaInfo:
        """What ``GET /v1/info`` reports: the slot, every version held with its state, the role."""
        return ReplicaInfo(self.collection, self.shard_id, self.num_shards, self.describe(), role=self.role())

    def health(self) -> HealthInfo:
        return HealthInfo(self.shard_id, tuple(self.ready_ids()))

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
            build = Shard.load(slot.directory, device=self.device, mmap=self.mmap)
            if self.filter_exact_max is not None:
                build.filtered.exact_scan_max = self.filter_exact_max
            m = build.manifest
            if m.embedding_version.id != slot.version_id:
                raise IndexIntegrityError(f"{slot.directory} holds version {m.embedding_version.id}, "
                                          f"not {slot.version_id}")
            if (m.collection, m.shard_id, m.num_shards) != (self.collection, self.shard_id, self.num_shards):
                raise IndexIntegrityError(
                    f"{slot.directory} is shard {m.shard_id}/{m.num_shards} of {m.collection!r}; this replica "
                    f"serves shard {self.shard_id}/{self.num_shards} of {self.collection!r}")
            self._open(slot, build)
            assert slot.shard is not None
            self.lexical_warmth.warm_now(slot.shard)  # ready with it: the rollout's first hybrid query never waits
            self.builds[slot.version_id] = build
        except ShardragError as exc:
            slot.state, slot.error = FAILED, exc.message
            logger.error("version %s failed to load: %s", slot.version_id, exc.message)
            return
        except Exception as exc:  # noqa: BLE001 - reported through /v1/info, never crashes the server
            slot.state, slot.error = FAILED, f"{type(exc).__name__}: {exc}"
            logger.exception("version %s failed to load", slot.version_id)
            return
        slot.ready_at, slot.state = time.time(), READY
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
        with slot.write_lock:
            if slot.log is not None:
                slot.log.close()
        if slot.shard is not None:
            slot.shard.docstore.close()
        self.builds.pop(version_id, None)
        logger.warning("version %s unloaded", version_id)
        return True

    def close(self) -> None:
        """Close every log and release the data dir (another process may open it after this)."""
        for slot in list(getattr(self, "_slots", {}).values()):
            with slot.write_lock:
                if slot.log is not None:
                    slot.log.close()
        if self._dir_lock is not None:
            self._dir_lock.release()
