"""Compaction: fold a replica's mutable segment and tombstones into a new sealed base.

A replica's write state lives in its own WAL directory (``<data_dir>/<version>/``), never in the
build's shard directory (which every replica of the host shares and which stays immutable)::

    wal-<first seq>.log ...        the write-ahead log (index_shards.wal)
    base-<seq>/                    a compacted base: a complete shard directory (index, docs,
                                   seqs.json, manifest.json) holding every write up to <seq>
    checkpoint.json                {"base": "base-<seq>", "seq": <seq>}: the base to start from

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
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from index_shards.docstore import write_docstore
from index_shards.faiss_index import build_index, write_index
from index_shards.layout import DOCSTORE_FILE, INDEX_FILE
from index_shards.manifest import FileEntry, ShardManifest, read_json
from index_shards.segment import StoredDocument
from retrieval.atomic import atomic_write_bytes, fsync_dir, fsync_tree
from retrieval.errors import IndexIntegrityError
from retrieval.routing import doc_int_id
from retrieval.types import DocId, Document

logger = logging.getLogger(__name__)

CHECKPOINT_FILE = "checkpoint.json"
SEQS_FILE = "seqs.json"  # int id → the seq of the write that stored it (GET reports it)


@dataclass(slots=True, frozen=True)
class Checkpoint:
    base: str  # directory name under the WAL directory
    seq: int  # every write up to this seq is inside the base


def read_checkpoint(wal_dir: Path) -> Checkpoint | None:
    path = wal_dir / CHECKPOINT_FILE
    if not path.exists():
        return None
    data = read_json(path, "the replica's checkpoint")
    try:
        checkpoint = Checkpoint(str(data["base"]), int(data["seq"]))
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


def write_base(wal_dir: Path, template: ShardManifest, documents: Iterable[StoredDocument], seq: int) -> Path:
    """Write every document (with its vector) as a sealed shard directory ``base-<seq>`` and return
    it; the checkpoint is not touched (see :func:`publish_checkpoint`)."""
    docs: list[Document] = []
    vectors: list[np.ndarray] = []
    seqs: list[tuple[int, int]] = []
    for stored in documents:
        assert stored.vector is not None
        docs.append(Document(DocId(stored.doc_id), stored.text, stored.title, dict(stored.metadata)))
        vectors.append(np.asarray(stored.vector, dtype=np.float32))
        seqs.append((doc_int_id(stored.doc_id), stored.seq))
    int_ids = np.asarray([i for i, _ in seqs], dtype=np.int64)
    matrix = np.stack(vectors) if vectors else np.zeros((0, template.dim), dtype=np.float32)
    staging = wal_dir / f".compact-{seq}-{uuid.uuid4().hex[:8]}"
    staging.mkdir(parents=True)
    try:
        write_index(build_index(matrix, int_ids, template.factory, template.metric), staging / INDEX_FILE)
        write_docstore(staging / DOCSTORE_FILE, int_ids.tolist(), docs)
        (staging / SEQS_FILE).write_bytes(json.dumps(seqs).encode())
        manifest = ShardManifest(
            collection=template.collection, shard_id=template.shard_id, num_shards=template.num_shards,
            embedding_version=template.embedding_version, metric=template.metric, factory=template.factory,
            count=len(docs), partitioner=template.partitioner, centroid=template.centroid,
            files={name: FileEntry.of(staging / name) for name in (INDEX_FILE, DOCSTORE_FILE, SEQS_FILE)})
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


def publish_checkpoint(wal_dir: Path, base: Path, seq: int) -> None:
    atomic_write_bytes(wal_dir / CHECKPOINT_FILE, json.dumps({"base": base.name, "seq": seq}).encode())
