"""One embedding version as a replica holds it: its state (loading, ready, failed), its build, the
live shard with the writes applied since, and the log those writes came from.

:func:`open_live` brings a version's state back from disk: the base named by the checkpoint (a
compaction or a restored snapshot; else the build itself), then every WAL record after it,
replayed in order. A damaged log, a base that is not this version's, or a log that resumes past
the base stops here, naming what is wrong.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path

from index_shards import compaction
from index_shards.manifest import ShardManifest
from index_shards.replica_log import Mark, ReplicaLog
from index_shards.search_defaults import read_search_defaults
from index_shards.segment import LiveShard
from index_shards.shard import Shard
from index_shards.wal import WalCorrupted
from retrieval.contract import VersionInfo
from retrieval.errors import IndexIntegrityError

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class VersionSlot:
    version_id: str
    directory: Path  # the version's build of this shard
    state: str
    shard: Shard | None = None  # the base in use: the build, or a compacted / restored base
    error: str | None = None
    started_at: float = 0.0
    ready_at: float | None = None
    live: LiveShard | None = None  # the base with the writes applied since it was sealed
    log: ReplicaLog | None = None  # None: this replica takes no writes (no --data-dir)
    write_lock: threading.Lock = field(default_factory=threading.Lock)  # one batch at a time, in seq order
    compact_lock: threading.Lock = field(default_factory=threading.Lock)  # one compaction at a time
    compactions: int = 0
    build_manifest: ShardManifest | None = None  # the version's own build (a compacted base has no source)

    def describe(self) -> VersionInfo:
        load_s = self.ready_at - self.started_at if self.ready_at is not None else None
        if self.shard is None:
            return VersionInfo(self.version_id, self.state, error=self.error, load_s=load_s)
        m = self.shard.manifest
        build = self.build_manifest or m
        live, log = self.live, self.log
        writable = live is not None and log is not None
        last = log.last_mark() if log is not None else None
        lexicon_bytes = self.shard.lexicon_bytes
        return VersionInfo(
            self.version_id, self.state, error=self.error, embedding_version=m.embedding_version, count=m.count,
            dim=m.dim, metric=m.metric, factory=m.factory, partitioner=m.partitioner, num_shards=m.num_shards,
            centroid=tuple(float(x) for x in m.centroid) if m.centroid is not None else None,
            on_gpu=self.shard.index.on_gpu, load_s=load_s,
            applied_seq=live.applied_seq if writable and live is not None else None,
            segment=live.segment_size if writable and live is not None else None,
            tombstones=live.tombstones if writable and live is not None else None,
            search_defaults=dict(self.shard.index.defaults) or None,
            last_term=last.term if last is not None else None,
            last_checksum=last.checksum if last is not None else None,
            source_version=build.source_version, source_seqs=build.source_seqs,
            lexical_index=self.shard.lexicon_state, lexical_index_bytes=lexicon_bytes,
            lexical_index_build_s=self.shard.lexicon_build_s if lexicon_bytes is not None else None,
            lexical_language=m.lexical_language, ef_construction=m.ef_construction)


def load_base(directory: Path, build: Shard, *, device: str, mmap: bool, filter_exact_max: int | None) -> Shard:
    """A compacted or restored base, checked to be a base of ``build``'s shard and version."""
    base = Shard.load(directory, device=device, mmap=mmap)  # the replica's own tuned defaults, if any
    if filter_exact_max is not None:
        base.filtered.exact_scan_max = filter_exact_max
    m, b = base.manifest, build.manifest
    if (m.embedding_version.id, m.shard_id, m.num_shards) != (b.embedding_version.id, b.shard_id, b.num_shards):
        raise IndexIntegrityError(f"{directory} is not a compaction of {build.directory}")
    if not base.index.defaults and build.index.defaults:
        # else the build's (`shardrag tune`): a compaction must not drop back to FAISS's own values
        base.index.set_defaults(dict(build.index.defaults))
    return base


def _apply_replica_defaults(base: Shard, wal_dir: Path) -> None:
    """A replica's own tuned defaults (``<data dir>/<version>/search.json``, from a REST tune:
    index_shards.live_tuning) over the ones its build was loaded with."""
    own = read_search_defaults(wal_dir)
    if own is not None and own.params:
        base.index.set_defaults(own.params)


def open_live(slot: VersionSlot, build: Shard, data_dir: Path | None, *, device: str, mmap: bool,
              filter_exact_max: int | None, wal_file_bytes: int) -> None:
    """Set ``slot``'s base, live shard and log from disk (module docstring)."""
    slot.build_manifest = build.manifest
    if data_dir is None:
        slot.shard, slot.live = build, LiveShard(build)
        return
    wal_dir = data_dir / slot.version_id
    checkpoint = compaction.read_checkpoint(wal_dir)
    compaction.remove_leftovers(wal_dir, checkpoint.base if checkpoint else None)
    base, base_mark, base_seqs, written = build, Mark(0, 0, 0), {}, None
    if checkpoint is not None:
        base = load_base(wal_dir / checkpoint.base, build, device=device, mmap=mmap,
                         filter_exact_max=filter_exact_max)
        base_mark = Mark(checkpoint.seq, checkpoint.term, checkpoint.checksum)
        base_seqs, written = compaction.read_seqs(base.directory), compaction.read_written(base.directory)
    _apply_replica_defaults(base, wal_dir)
    log = ReplicaLog(wal_dir, segment_bytes=wal_file_bytes)
    records = log.open(base_mark)
    live = LiveShard(base, base_seq=base_mark.seq, base_seqs=base_seqs, written=written)
    if records and records[0].seq != base_mark.seq + 1:
        raise WalCorrupted(f"WAL {wal_dir} resumes at seq {records[0].seq}, but the base holds writes up to "
                           f"{base_mark.seq}: writes {base_mark.seq + 1}..{records[0].seq - 1} are missing",
                           field="wal")
    live.apply(records)
    slot.shard, slot.live, slot.log = base, live, log
    if records or checkpoint:
        logger.warning("version %s: base at seq %d, replayed %d writes from the WAL (applied seq %d)",
                       slot.version_id, base_mark.seq, len(records), live.applied_seq)


def read_live(build: Shard, wal_dir: Path) -> LiveShard:
    """A replica's state of a version as its files hold it, read without changing them (a build
    of a new version reads a running collection this way): the checkpoint's base, then the log."""
    from index_shards.wal import WriteAheadLog

    checkpoint = compaction.read_checkpoint(wal_dir)
    if checkpoint is None:
        live = LiveShard(build)
    else:
        base = load_base(wal_dir / checkpoint.base, build, device="cpu", mmap=True, filter_exact_max=None)
        live = LiveShard(base, base_seq=checkpoint.seq, base_seqs=compaction.read_seqs(base.directory),
                         written=compaction.read_written(base.directory))
    wal = WriteAheadLog(wal_dir)
    records = [r for r in wal.read_after(live.applied_seq)]
    live.apply([r for r in records if r.seq > live.applied_seq])
    return live
