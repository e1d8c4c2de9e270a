"""Compaction: fold a replica's mutable segment and tombstones into a new sealed base.

A replica's write state lives in its own WAL directory (``<data_dir>/<version>/``), never in the
build's shard directory (which every replica of the host shares and which stays immutable)::

    wal-<first seq>.log ...        the write-ahead log (index_shards.wal)
    base-<seq>/                    a compacted base: a complete shard directory (index, docs,
                                   seqs.json, written.npy, bare.npy, manifest.json) holding every
                                   write up to <seq> (bare.npy: the documents without a vector)
    checkpoint.json                {"base": "base-<seq>", "seq": <seq>, "term": t, "checksum": c}: the base
                                   to start from, and the term and checksum of its last record

**Publishing** (the build's protocol, one level down): the new base is written into a hidden
``.compact-*`` directory, fsynced, renamed to ``base-<seq>``, and only then ``checkpoint.json`` is
replaced atomically — the checkpoint is the manifest of the replica's state and is written last.
WAL files are dropped only after that, and only those wholly at or below ``<seq>`` (minus the
retention kept for lagging peers).

**Crash at any point**: before the checkpoint is replaced, the replica restarts from the old base
(or the build) and replays the whole WAL, and the half-written directory is removed as a
leftover; after it, from the new base plus the WAL records past ``<seq>``. Nothing acknowledged is
ever only in memory.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import faiss
import numpy as np

from index_shards.docstore import write_docstore
from index_shards.faiss_index import build_index, derive_index, is_lossy, write_index
from index_shards.layout import BARE_FILE, DOCSTORE_FILE, INDEX_FILE, REGIONS_FILE
from index_shards.manifest import FileEntry, ShardManifest, read_json
from index_shards.regions import write_regions
from index_shards.segment import StoredDocument, WrittenVectors
from index_shards.shard import Shard
from retrieval.atomic import atomic_write_bytes, fsync_dir, fsync_tree
from retrieval.errors import IndexIntegrityError
from retrieval.routing import doc_int_id
from retrieval.types import DocId, Document

if TYPE_CHECKING:
    from index_shards.slot import VersionSlot
    from index_shards.versions import ShardVersions

logger = logging.getLogger(__name__)

CHECKPOINT_FILE = "checkpoint.json"
SEQS_FILE = "seqs.json"  # int id → the seq of the write that stored it (GET reports it)
WRITTEN_FILE = "written.npy"  # the original vectors of the written documents (seq > 0), in seqs.json's order


@dataclass(slots=True, frozen=True)
class Checkpoint:
    base: str  # directory name under the WAL directory
    seq: int  # every write up to this seq is inside the base
    term: int = 0  # the term and checksum of the record at seq (0, 0: not recorded)
    checksum: int = 0


def read_checkpoint(wal_dir: Path) -> Checkpoint | None:
    path = wal_dir / CHECKPOINT_FILE
    if not path.exists():
        return None
    data = read_json(path, "the replica's checkpoint")
    try:
        checkpoint = Checkpoint(str(data["base"]), int(data["seq"]), int(data.get("term", 0)),
                                int(data.get("checksum", 0)))
    except (KeyError, TypeError, ValueError) as exc:
        raise IndexIntegrityError(f"{path} is malformed: {exc!r}") from exc
    if "/" in checkpoint.base or not (wal_dir / checkpoint.base).is_dir():
        raise IndexIntegrityError(f"{path} names base {checkpoint.base!r}, which is not in {wal_dir}")
    return checkpoint


def read_seqs(base_dir: Path) -> dict[int, int]:
    path = base_dir / SEQS_FILE
    if not path.exists():  # a build's directory: everything in it came from the build (seq 0)
        return {}
    pairs = json.loads(path.read_bytes())
    return {int(i): int(s) for i, s in pairs}


def remove_leftovers(wal_dir: Path, keep: str | None) -> None:
    """Half-written compactions and bases no checkpoint names (a crash between the rename and
    the checkpoint, or an older base the last compaction replaced)."""
    if not wal_dir.is_dir():
        return
    for child in wal_dir.iterdir():
        if child.is_dir() and (child.name.startswith(".compact-") or
                               (child.name.startswith("base-") and child.name != keep)):
            logger.warning("removing %s (not named by %s)", child, CHECKPOINT_FILE)
            shutil.rmtree(child, ignore_errors=True)


def write_base(wal_dir: Path, build: Shard, documents: Iterable[StoredDocument], seq: int) -> Path:
    """Write every document as a sealed shard directory ``base-<seq>`` and return it; the checkpoint
    is not touched (see :func:`publish_checkpoint`). ``documents``: every live document as of
    ``seq``; a written one (seq > 0) carries its original vector, a build one (seq 0) is taken from
    ``build`` — the version's own build, never a previous compaction, so nothing is encoded from a
    decoded copy twice. For a compressed index (PQ, SQ) the build's codes are kept as they are and
    only the written documents are encoded, once, from their originals, which the base keeps
    (``written.npy``) for the next compaction and for snapshots."""
    template = build.manifest
    docs: list[Document] = []
    seqs: list[tuple[int, int]] = []
    written_rows: list[np.ndarray] = []
    bare: list[int] = []  # documents stored without a vector: in the docstore, not in the index
    for stored in documents:
        docs.append(Document(DocId(stored.doc_id), stored.text, stored.title, dict(stored.metadata)))
        seqs.append((doc_int_id(stored.doc_id), stored.seq))
        if stored.vector is None:
            assert stored.seq > 0, "a document without a vector was written"
            bare.append(seqs[-1][0])
        elif stored.seq > 0:
            written_rows.append(np.asarray(stored.vector, dtype=np.float32))
    all_ids = np.asarray([i for i, _ in seqs], dtype=np.int64)
    bare_ids = np.asarray(sorted(bare), dtype=np.int64)
    vectored = ~np.isin(all_ids, bare_ids) if bare else np.ones(all_ids.size, dtype=bool)
    int_ids = all_ids[vectored]
    is_written = np.asarray([s > 0 for _, s in seqs], dtype=bool)[vectored]
    written = np.stack(written_rows) if written_rows else np.zeros((0, template.dim), dtype=np.float32)
    staging = wal_dir / f".compact-{seq}-{uuid.uuid4().hex[:8]}"
    staging.mkdir(parents=True)
    try:
        index = _base_index(build, int_ids, is_written, written)
        write_index(index, staging / INDEX_FILE)
        regions = (REGIONS_FILE,) if write_regions(index, staging, template.metric) else ()
        write_docstore(staging / DOCSTORE_FILE, all_ids.tolist(), docs)
        (staging / SEQS_FILE).write_bytes(json.dumps(seqs).encode())
        np.save(staging / WRITTEN_FILE, written, allow_pickle=False)
        np.save(staging / BARE_FILE, bare_ids, allow_pickle=False)
        manifest = ShardManifest(
            collection=template.collection, shard_id=template.shard_id, num_shards=template.num_shards,
            embedding_version=template.embedding_version, metric=template.metric, factory=template.factory,
            count=len(docs), partitioner=template.partitioner, centroid=template.centroid,
            partition_field=template.partition_field, lexical_language=template.lexical_language,
            ef_construction=template.ef_construction,
            files={name: FileEntry.of(staging / name) for name in (INDEX_FILE, DOCSTORE_FILE, SEQS_FILE,
                                                                   WRITTEN_FILE, BARE_FILE, *regions)})
        manifest.write(staging)  # last inside the directory, as a build does
        fsync_tree(staging)
        target = wal_dir / f"base-{seq}"
        if target.exists():  # an earlier attempt at the same seq that no checkpoint names
            shutil.rmtree(target)
        staging.rename(target)
        fsync_dir(wal_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


def _base_index(build: Shard, int_ids: np.ndarray, is_written: np.ndarray, written: np.ndarray) -> faiss.Index:
    factory, metric = build.manifest.factory, build.manifest.metric
    kept_build_ids = int_ids[~is_written]
    if is_lossy(factory):
        build_ids = np.fromiter((int_id for int_id, _, _ in build.docstore.iter_metadata()), dtype=np.int64)
        dropped = np.setdiff1d(build_ids, kept_build_ids, assume_unique=True)
        derived = derive_index(build.directory / INDEX_FILE, dropped, written, int_ids[is_written])
        if derived is not None:
            return derived
        logger.warning("%s cannot drop ids: its build documents are decoded and encoded again at this compaction "
                       "(once, from the build's codes)", factory)
    matrix = np.zeros((len(int_ids), build.manifest.dim), dtype=np.float32)
    if len(kept_build_ids):
        matrix[~is_written] = build.filtered.vectors(kept_build_ids)
    matrix[is_written] = written
    return build_index(matrix, int_ids, factory, metric, ef_construction=build.manifest.ef_construction)


def read_written(base_dir: Path) -> WrittenVectors | None:
    """The original vectors of the written documents a compacted base holds (mapped, not read)."""
    path = base_dir / WRITTEN_FILE
    if not path.exists():
        return None
    seqs = [(int(i), int(s)) for i, s in json.loads((base_dir / SEQS_FILE).read_bytes())]
    bare = set(np.load(base_dir / BARE_FILE, allow_pickle=False).tolist()) if (base_dir / BARE_FILE).exists() else set()
    ids = np.asarray([i for i, s in seqs if s > 0 and i not in bare], dtype=np.int64)
    vectors = np.load(path, mmap_mode="r", allow_pickle=False)
    if len(vectors) != len(ids):
        raise IndexIntegrityError(f"{path} holds {len(vectors)} vectors, {SEQS_FILE} names {len(ids)} written "
                                  "documents")
    return WrittenVectors(ids, vectors)


def publish_checkpoint(wal_dir: Path, base: Path, seq: int, term: int = 0, checksum: int = 0) -> None:
    """Name ``base`` as the replica's state at ``seq`` (whose record had ``term`` and ``checksum``)."""
    atomic_write_bytes(wal_dir / CHECKPOINT_FILE, json.dumps({"base": base.name, "seq": seq, "term": term,
                                                              "checksum": checksum}).encode())


# -- compacting a live version (the slot-level job) ---------------------------------------------
def compact(versions: ShardVersions, version: str) -> dict[str, float | int | str]:
    """Fold the version's segment and tombstones into a new sealed base now; queries and writes go
    on meanwhile. Returns what was done."""
    slot = versions.writable_slot(version)
    with slot.compact_lock:
        return _compact(versions, slot)


def compact_quietly(versions: ShardVersions, slot: VersionSlot) -> None:
    """A background compaction (started by a write): one at a time, failures logged."""
    if not slot.compact_lock.acquire(blocking=False):
        return
    try:
        _compact(versions, slot)
    except Exception:  # noqa: BLE001 - a background compaction that fails is retried by the next write
        logger.exception("compaction of version %s failed", slot.version_id)
    finally:
        slot.compact_lock.release()


def _compact(versions: ShardVersions, slot: VersionSlot) -> dict[str, float | int | str]:
    from index_shards.replica_log import Mark
    from index_shards.segment import LiveShard
    from index_shards.slot import load_base

    live, log = slot.live, slot.log
    assert live is not None and log is not None and versions.data_dir is not None
    started = time.perf_counter()
    with slot.write_lock:  # the seq, the documents as of it and the mark of its record, together
        seq, documents = live.frozen_documents()
        mark = log.mark(seq) or Mark(seq, 0, 0)
    if seq == live.base_seq:
        return {"version": slot.version_id, "base_seq": seq, "count": live.base.manifest.count,
                "compacted": 0, "seconds": 0.0}
    wal_dir = versions.data_dir / slot.version_id
    folded = live.segment_size + live.tombstones
    base_dir = write_base(wal_dir, versions.builds[slot.version_id], documents, seq)
    versions.crash_point("mid_compaction")  # the new base is on disk, no checkpoint names it yet
    publish_checkpoint(wal_dir, base_dir, seq, mark.term, mark.checksum)
    versions.crash_point("after_checkpoint")  # named by the checkpoint; the WAL is still whole
    base = load_base(base_dir, live.base, device=versions.device, mmap=versions.mmap,
                     filter_exact_max=versions.filter_exact_max)
    if live.base.has_lexicon or versions.lexical_warmth.wanted:
        base.lexicon  # noqa: B018 - built here, off the query path: lexical queries never wait for it
    with slot.write_lock:  # the writes applied while the base was built move to the new segment
        current = slot.live
        assert current is not None
        fresh = LiveShard(base, base_seq=seq, base_seqs=read_seqs(base_dir), written=read_written(base_dir))
        fresh.apply(list(log.records_after(seq)))
        if fresh.applied_seq != current.applied_seq:
            raise IndexIntegrityError(f"compaction of {slot.version_id}: the WAL reaches seq "
                                      f"{fresh.applied_seq}, the replica {current.applied_seq}")
        slot.live, slot.shard = fresh, base
        log.rebase(mark)
        slot.compactions += 1
    # queries still running on the old base hold their own references; its files can go
    remove_leftovers(wal_dir, keep=base_dir.name)
    log.drop_through(seq - versions.wal_retain)
    took = time.perf_counter() - started
    logger.warning("version %s compacted at seq %d: %d documents, %d segment entries folded (%.2f s)",
                   slot.version_id, seq, base.manifest.count, folded, took)
    return {"version": slot.version_id, "base_seq": seq, "count": base.manifest.count, "compacted": folded,
            "seconds": round(took, 3)}
