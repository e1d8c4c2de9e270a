"""Shard and collection manifests: what a directory holds and the sha256 of every file.

A shard directory is served only when ``manifest.json`` exists, parses, and every file it
lists has the recorded size and sha256. The manifest is written last, so a directory whose
build was interrupted has none and is never served.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from retrieval.analysis import DEFAULT_LANGUAGE
from retrieval.atomic import atomic_write_bytes
from retrieval.errors import ChecksumMismatch, IndexIntegrityError, ManifestMissing
from retrieval.types import EmbeddingVersion

SHARD_MANIFEST = "manifest.json"
COLLECTION_MANIFEST = "collection.json"
FORMAT = 1


def sha256_file(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


@dataclass(slots=True, frozen=True)
class FileEntry:
    sha256: str
    size_bytes: int

    @classmethod
    def of(cls, path: Path) -> FileEntry:
        return cls(sha256=sha256_file(path), size_bytes=path.stat().st_size)


@dataclass(slots=True, frozen=True)
class ShardManifest:
    collection: str
    shard_id: int
    num_shards: int
    embedding_version: EmbeddingVersion
    metric: str  # "ip" (inner product; cosine on normalised vectors) or "l2"
    factory: str  # FAISS index-factory string, e.g. "Flat", "HNSW32", "IVF256,PQ32"
    count: int
    partitioner: str  # "hash" or "kmeans"
    centroid: tuple[float, ...] | None  # the shard's region (kmeans) for top_m routing
    files: dict[str, FileEntry]
    created_at: float = field(default_factory=time.time)
    format: int = FORMAT
    # built from a live collection: the version its documents came from and, per shard of that
    # version, the seq they were read at (a rollout gives this version every write after those)
    source_version: str | None = None
    source_seqs: tuple[int, ...] | None = None
    # the payload field that partitions the documents (a collection's tenant field): a search
    # whose filter pins it is scored over that partition's documents only (index_shards.shard)
    partition_field: str | None = None
    # how the lexical leg analyses this collection's texts (retrieval.analysis): one per collection
    lexical_language: str = DEFAULT_LANGUAGE
    # an HNSW factory's efConstruction where the build set one (None: FAISS's 40); a compaction
    # that rebuilds the graph builds it with the same
    ef_construction: int | None = None

    @property
    def dim(self) -> int:
        return self.embedding_version.dim

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": self.format,
            "collection": self.collection,
            "shard_id": self.shard_id,
            "num_shards": self.num_shards,
            "embedding_version": self.embedding_version.to_dict(),
            "dim": self.dim,
            "metric": self.metric,
            "factory": self.factory,
            "count": self.count,
            "partitioner": self.partitioner,
            "centroid": list(self.centroid) if self.centroid is not None else None,
            "files": {name: {"sha256": e.sha256, "size_bytes": e.size_bytes} for name, e in sorted(self.files.items())},
            "created_at": self.created_at,
            **({"source": {"version": self.source_version, "seqs": list(self.source_seqs or ())}}
               if self.source_version is not None else {}),
            **({"partition_field": self.partition_field} if self.partition_field is not None else {}),
            **({"lexical_language": self.lexical_language} if self.lexical_language != DEFAULT_LANGUAGE else {}),
            **({"ef_construction": self.ef_construction} if self.ef_construction is not None else {}),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ShardManifest:
        if data.get("format") != FORMAT:
            raise ValueError(f"unsupported manifest format {data.get('format')!r} (this build reads {FORMAT})")
        version = EmbeddingVersion.from_dict(data["embedding_version"])
        if int(data["dim"]) != version.dim:
            raise ValueError("dim disagrees with the embedding version")
        centroid = data.get("centroid")
        return cls(
            collection=str(data["collection"]),
            shard_id=int(data["shard_id"]),
            num_shards=int(data["num_shards"]),
            embedding_version=version,
            metric=str(data["metric"]),
            factory=str(data["factory"]),
            count=int(data["count"]),
            partitioner=str(data["partitioner"]),
            centroid=tuple(float(x) for x in centroid) if centroid is not None else None,
            files={name: FileEntry(str(e["sha256"]), int(e["size_bytes"])) for name, e in data["files"].items()},
            created_at=float(data.get("created_at", 0.0)),
            source_version=str(data["source"]["version"]) if isinstance(data.get("source"), dict) else None,
            source_seqs=tuple(int(x) for x in data["source"]["seqs"]) if isinstance(data.get("source"), dict)
            else None,
            partition_field=str(data["partition_field"]) if data.get("partition_field") is not None else None,
            lexical_language=str(data.get("lexical_language", DEFAULT_LANGUAGE)),
            ef_construction=_int_or_none(data.get("ef_construction")),
        )

    def write(self, directory: Path) -> None:
        atomic_write_bytes(directory / SHARD_MANIFEST, json.dumps(self.to_dict(), indent=1).encode())


def read_json(path: Path, what: str) -> dict[str, Any]:
    if not path.is_file():
        raise ManifestMissing(f"{path.parent} has no {path.name}: {what} is incomplete and is not served")
    try:
        data = json.loads(path.read_bytes())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise IndexIntegrityError(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise IndexIntegrityError(f"{path} is not a JSON object")
    return data


def read_shard_manifest(directory: str | Path) -> ShardManifest:
    directory = Path(directory)
    path = directory / SHARD_MANIFEST
    data = read_json(path, "the shard")
    try:
        return ShardManifest.from_dict(data)
    except (KeyError, TypeError, ValueError) as exc:
        raise IndexIntegrityError(f"{path} is malformed: {exc!r}") from exc


def verify_shard_dir(directory: str | Path) -> ShardManifest:
    """The shard's manifest, after checking every listed file's size and sha256."""
    directory = Path(directory)
    manifest = read_shard_manifest(directory)
    for name, expected in manifest.files.items():
        path = directory / name
        if Path(name).is_absolute() or ".." in Path(name).parts:
            raise IndexIntegrityError(f"{directory / SHARD_MANIFEST} lists a file outside the shard: {name!r}")
        if not path.is_file():
            raise ChecksumMismatch(f"{path} is missing (listed in {SHARD_MANIFEST})")
        size = path.stat().st_size
        if size != expected.size_bytes:
            raise ChecksumMismatch(f"{path} has {size} bytes, the manifest says {expected.size_bytes}")
        actual = sha256_file(path)
        if actual != expected.sha256:
            raise ChecksumMismatch(f"{path} is damaged: sha256 {actual[:16]}… != manifest {expected.sha256[:16]}…")
    return manifest


@dataclass(slots=True, frozen=True)
class CollectionManifest:
    """The version directory's summary, written after every shard and before the rename."""

    collection: str
    embedding_version: EmbeddingVersion
    num_shards: int
    partitioner: str
    factory: str
    metric: str
    count: int
    shard_manifest_sha256: tuple[str, ...]
    created_at: float = field(default_factory=time.time)
    format: int = FORMAT
    lexical_language: str = DEFAULT_LANGUAGE  # its shards' (ShardManifest.lexical_language)
    ef_construction: int | None = None  # its shards' (ShardManifest.ef_construction)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": self.format,
            "collection": self.collection,
            "embedding_version": self.embedding_version.to_dict(),
            "num_shards": self.num_shards,
            "partitioner": self.partitioner,
            "factory": self.factory,
            "metric": self.metric,
            "count": self.count,
            "shard_manifest_sha256": list(self.shard_manifest_sha256),
            "created_at": self.created_at,
            **({"lexical_language": self.lexical_language} if self.lexical_language != DEFAULT_LANGUAGE else {}),
            **({"ef_construction": self.ef_construction} if self.ef_construction is not None else {}),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CollectionManifest:
        if data.get("format") != FORMAT:
            raise ValueError(f"unsupported collection format {data.get('format')!r}")
        return cls(
            collection=str(data["collection"]),
            embedding_version=EmbeddingVersion.from_dict(data["embedding_version"]),
            num_shards=int(data["num_shards"]),
            partitioner=str(data["partitioner"]),
            factory=str(data["factory"]),
            metric=str(data["metric"]),
            count=int(data["count"]),
            shard_manifest_sha256=tuple(str(x) for x in data["shard_manifest_sha256"]),
            created_at=float(data.get("created_at", 0.0)),
            lexical_language=str(data.get("lexical_language", DEFAULT_LANGUAGE)),
            ef_construction=_int_or_none(data.get("ef_construction")),
        )

    def write(self, directory: Path) -> None:
        atomic_write_bytes(directory / COLLECTION_MANIFEST, json.dumps(self.to_dict(), indent=1).encode())


def read_collection_manifest(directory: str | Path) -> CollectionManifest:
    path = Path(directory) / COLLECTION_MANIFEST
    data = read_json(path, "the collection version")
    try:
        return CollectionManifest.from_dict(data)
    except (KeyError, TypeError, ValueError) as exc:
        raise IndexIntegrityError(f"{path} is malformed: {exc!r}") from exc


def _int_or_none(value: Any) -> int | None:
    return int(value) if value is not None else None
