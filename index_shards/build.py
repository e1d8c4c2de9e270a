"""Build a collection version: vectors → partitions → per-shard FAISS index + doc store +
manifest, staged in a hidden directory, fsynced, and published by one rename.

A crash at any point leaves either the previous state or a ``.staging-*`` directory that is
never served (no collection manifest at the version path) and is removed by the next build.
"""

from __future__ import annotations

import logging
import shutil
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from index_shards.docstore import write_docstore
from index_shards.faiss_index import build_index, metric_code, write_index
from index_shards.ids import doc_int_ids
from index_shards.layout import DOCSTORE_FILE, INDEX_FILE, REGIONS_FILE, collection_dir, shard_dir
from index_shards.manifest import (
    SHARD_MANIFEST,
    CollectionManifest,
    FileEntry,
    ShardManifest,
    sha256_file,
)
from index_shards.partition import make_partitioner
from index_shards.regions import write_regions
from retrieval.analysis import DEFAULT_LANGUAGE, check_language
from retrieval.atomic import fsync_dir, fsync_tree
from retrieval.encoders import Encoder, encode_documents
from retrieval.errors import BuildError, ConfigError, IndexIntegrityError
from retrieval.types import DocId, Document, EmbeddingVersion, check_ef_construction

logger = logging.getLogger(__name__)


@dataclass(slots=True, frozen=True)
class BuildConfig:
    collection: str
    num_shards: int = 2  # slices of the index, one shard server (group of replicas) each
    partitioner: str = "hash"  # "hash" (balanced) or "kmeans" (regions, enables top_m routing)
    factory: str = "Flat"  # any FAISS index-factory string: "Flat", "HNSW32", "IVF256,Flat", ...
    metric: str = "ip"  # "ip" (cosine on normalised vectors) or "l2"
    overwrite: bool = False  # replace an existing version directory of the same id
    source_version: str | None = None  # built from a live collection: the version read ...
    source_seqs: tuple[int, ...] | None = None  # ... and the seq each of its shards was read at
    partition_field: str | None = None  # a tenant field: searches pinned to one value score only its documents
    lexical_language: str = DEFAULT_LANGUAGE  # how the lexical leg analyses the texts (retrieval.analysis)
    ef_construction: int | None = None  # HNSW factories: candidates kept while linking (None: FAISS's 40)

    def validate(self) -> None:
        if not self.collection or "/" in self.collection or self.collection.startswith("."):
            raise ConfigError(f"invalid collection name {self.collection!r}", field="collection")
        if self.num_shards < 1:
            raise ConfigError(f"num_shards must be ≥ 1, got {self.num_shards}", field="num_shards")
        metric_code(self.metric)
        make_partitioner(self.partitioner)
        check_language(self.lexical_language)
        check_ef_construction(self.ef_construction)


def build_collection(
    root: str | Path,
    documents: Sequence[Document],
    vectors: np.ndarray,
    version: EmbeddingVersion,
    config: BuildConfig,
    *,
    show_progress: bool = True,
) -> CollectionManifest:
    """Publish ``documents`` with their ``vectors`` as version ``version.id`` of the collection."""
    from tqdm.auto import tqdm

    config.validate()
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    if vectors.ndim != 2 or vectors.shape[0] != len(documents):
        raise BuildError(f"{len(documents)} documents but vectors of shape {vectors.shape}")
    if vectors.shape[1] != version.dim:
        raise BuildError(f"vectors have {vectors.shape[1]} dims, embedding version {version.id} has {version.dim}")
    if not np.isfinite(vectors).all():
        raise BuildError("vectors hold NaN or infinity")
    int_ids = doc_int_ids(d.doc_id for d in documents)
    partition = make_partitioner(config.partitioner).partition(int_ids, vectors, config.num_shards)

    base = collection_dir(root, config.collection)
    base.mkdir(parents=True, exist_ok=True)
    _remove_stale_staging(base)
    target = base / version.id
    if target.exists() and not config.overwrite:
        raise BuildError(f"{target} already exists; pass overwrite to replace it", field="version")
    staging = base / f".staging-{version.id}-{uuid.uuid4().hex[:8]}"
    staging.mkdir()
    try:
        shard_manifests = []
        for shard_id in tqdm(range(config.num_shards), desc="building shards", unit="shard", disable=not show_progress):
            members = np.flatnonzero(partition.assignment == shard_id)
            centroid = partition.centroids[shard_id] if partition.centroids is not None else None
            manifest = _build_shard(
                shard_dir(staging, shard_id), shard_id, config, version,
                [documents[int(i)] for i in members], vectors[members], int_ids[members], centroid,
            )
            shard_manifests.append(manifest)
        collection = CollectionManifest(
            collection=config.collection,
            embedding_version=version,
            num_shards=config.num_shards,
            partitioner=config.partitioner,
            factory=config.factory,
            metric=config.metric,
            count=len(documents),
            shard_manifest_sha256=tuple(
                sha256_file(shard_dir(staging, m.shard_id) / SHARD_MANIFEST) for m in shard_manifests
            ),
            lexical_language=config.lexical_language,
            ef_construction=config.ef_construction,
        )
        collection.write(staging)  # last: its presence marks the version complete
        fsync_tree(staging)
        _publish(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    logger.info("published %s (%d docs, %d shards)", target, len(documents), config.num_shards)
    return collection


def _build_shard(
    directory: Path,
    shard_id: int,
    config: BuildConfig,
    version: EmbeddingVersion,
    documents: list[Document],
    vectors: np.ndarray,
    int_ids: np.ndarray,
    centroid: np.ndarray | None,
) -> ShardManifest:
    directory.mkdir(parents=True)
    try:
        index = build_index(vectors, int_ids, config.factory, config.metric, ef_construction=config.ef_construction)
    except BuildError as exc:
        raise BuildError(f"shard {shard_id}: {exc.message}", shard=shard_id) from exc
    write_index(index, directory / INDEX_FILE)
    write_docstore(directory / DOCSTORE_FILE, int_ids.tolist(), documents)
    files = (INDEX_FILE, DOCSTORE_FILE) + ((REGIONS_FILE,) if write_regions(index, directory, config.metric) else ())
    manifest = ShardManifest(
        collection=config.collection,
        shard_id=shard_id,
        num_shards=config.num_shards,
        embedding_version=version,
        metric=config.metric,
        factory=config.factory,
        count=len(documents),
        partitioner=config.partitioner,
        centroid=tuple(float(x) for x in centroid) if centroid is not None else None,
        files={name: FileEntry.of(directory / name) for name in files},
        source_version=config.source_version, source_seqs=config.source_seqs,
        partition_field=config.partition_field, lexical_language=config.lexical_language,
        ef_construction=config.ef_construction,
    )
    manifest.write(directory)
    return manifest


def _publish(staging: Path, target: Path) -> None:
    if target.exists():
        # Versions are immutable; an explicit overwrite swaps directories. Between the two
        # renames the version is briefly absent (never half-written).
        trash = target.parent / f".trash-{target.name}-{uuid.uuid4().hex[:8]}"
        target.rename(trash)
        staging.rename(target)
        fsync_dir(target.parent)
        shutil.rmtree(trash, ignore_errors=True)
    else:
        staging.rename(target)
        fsync_dir(target.parent)


def _remove_stale_staging(base: Path, older_than_s: float = 3600.0) -> None:
    """Leftovers of crashed builds (hidden, never served) older than an hour."""
    now = time.time()
    for child in base.iterdir():
        if child.name.startswith((".staging-", ".trash-")) and now - child.stat().st_mtime > older_than_s:
            shutil.rmtree(child, ignore_errors=True)


def encode_and_build(
    root: str | Path,
    documents: Sequence[Document],
    encoder: Encoder,
    config: BuildConfig,
    *,
    show_progress: bool = True,
) -> CollectionManifest:
    """Encode ``documents`` with ``encoder`` (BEIR document layout) and build the collection."""
    if not documents:
        raise BuildError("the corpus has no documents", field="corpus")
    config.validate()
    vectors = encode_documents(encoder, documents, show_progress=show_progress)
    return build_collection(root, documents, vectors, encoder.version, config, show_progress=show_progress)


def live_documents_of_version(root: str | Path, collection: str,
                              version_id: str | None = None) -> tuple[list[Document], tuple[int, ...], str]:
    """Every live document of a collection version — the build's documents with every write its
    replicas applied since (read from the most up-to-date replica's data dir of each shard, as the
    files stand: a running cluster keeps running) — the seq each shard was read at, and the
    version's id. A new version built from these records that cut, so its rollout replays only
    the writes after it (``serving.writes.staging``). Documents written as vectors only have no
    text to embed: they are left out, with a warning."""
    from index_shards.layout import collection_dir, resolve_version
    from index_shards.segment import LiveShard
    from index_shards.shard import Shard
    from index_shards.slot import read_live

    directory, manifest = resolve_version(root, collection, version_id)
    version = manifest.embedding_version.id
    replicas_dir = collection_dir(root, collection) / "replicas"
    documents: list[Document] = []
    seqs: list[int] = []
    vector_only = 0
    for shard_id in range(manifest.num_shards):
        build = Shard.load(shard_dir(directory, shard_id), device="cpu")
        best: LiveShard | None = None
        for replica in sorted(replicas_dir.glob(f"shard-{shard_id}-r*")):
            if not (replica / version).is_dir():
                continue
            for attempt in range(3):  # a compaction may replace the base while it is read
                try:
                    live = read_live(build, replica / version)
                    break
                except (FileNotFoundError, IndexIntegrityError):
                    if attempt == 2:
                        raise
            if best is None or live.applied_seq > best.applied_seq:
                best = live
        live = best or LiveShard(build)
        seqs.append(live.applied_seq)
        for doc in live.documents():
            if not doc.text.strip() and not doc.title.strip():
                vector_only += 1
                continue
            documents.append(Document(DocId(doc.doc_id), doc.text, doc.title, dict(doc.metadata)))
    if vector_only:
        logger.warning("%d documents of %s were written as vectors only: there is no text to embed them from, so "
                       "the new version lacks them", vector_only, version)
    documents.sort(key=lambda d: d.doc_id)
    return documents, tuple(seqs), version


def documents_of_version(root: str | Path, collection: str, version_id: str | None = None) -> list[Document]:
    """Every document of a built collection version, read back from its shards' doc stores
    (verified) — to rebuild the same slices with another encoder."""
    from index_shards.docstore import DocStore
    from index_shards.layout import DOCSTORE_FILE, resolve_version
    from index_shards.manifest import verify_shard_dir

    directory, manifest = resolve_version(root, collection, version_id)
    documents: list[Document] = []
    for shard_id in range(manifest.num_shards):
        path = shard_dir(directory, shard_id)
        verify_shard_dir(path)
        store = DocStore(path / DOCSTORE_FILE)
        try:
            for int_id, doc in store.iter_all():
                metadata = store.get_metadata(int_id) or {}
                documents.append(Document(DocId(doc.doc_id), doc.text, doc.title, metadata))
        finally:
            store.close()
    documents.sort(key=lambda d: d.doc_id)
    return documents
