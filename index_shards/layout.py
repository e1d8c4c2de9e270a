"""Where collections live on disk.

    <root>/<collection>/<embedding version id>/collection.json
                                              /shard-<i>/manifest.json, index.faiss, docs.sqlite
                                                        [, regions.npz]

A version directory appears by one rename, after every shard and ``collection.json`` are
written and fsynced; staging directories start with a dot and are never listed.
"""

from __future__ import annotations

from pathlib import Path

from index_shards.manifest import COLLECTION_MANIFEST, CollectionManifest, read_collection_manifest
from retrieval.errors import ManifestMissing, NotFound

INDEX_FILE = "index.faiss"
DOCSTORE_FILE = "docs.sqlite"
BARE_FILE = "bare.npy"  # int ids of the documents stored without a vector (a compacted base; absent: none)
REGIONS_FILE = "regions.npz"  # an HNSW base's k-means regions, for filtered scans (index_shards.regions; absent: none)
DEFAULT_ROOT = "shardrag-data"


def collections_root(flag: str | None) -> Path:
    """The collections root a command-line tool uses: the flag, else $SHARDRAG_ROOT, else ./shardrag-data."""
    from retrieval import env

    return Path(flag or env.read("SHARDRAG_ROOT", DEFAULT_ROOT) or DEFAULT_ROOT)


def collection_dir(root: str | Path, collection: str) -> Path:
    return Path(root) / collection


def version_dir(root: str | Path, collection: str, version_id: str) -> Path:
    return collection_dir(root, collection) / version_id


def shard_dir(version_directory: str | Path, shard_id: int) -> Path:
    return Path(version_directory) / f"shard-{shard_id}"


def list_versions(root: str | Path, collection: str) -> list[CollectionManifest]:
    """Complete versions of a collection (those with a collection manifest), oldest first."""
    base = collection_dir(root, collection)
    if not base.is_dir():
        return []
    manifests = []
    for child in base.iterdir():
        if child.name.startswith(".") or not (child / COLLECTION_MANIFEST).is_file():
            continue
        manifests.append(read_collection_manifest(child))
    return sorted(manifests, key=lambda m: m.created_at)


def resolve_version(root: str | Path, collection: str,
                    version_id: str | None = None) -> tuple[Path, CollectionManifest]:
    """The directory and manifest of ``version_id`` (default: the newest complete version)."""
    if version_id is None:
        versions = list_versions(root, collection)
        if not versions:
            raise NotFound(f"collection {collection!r} has no complete version under {Path(root)}", field="collection")
        version_id = versions[-1].embedding_version.id
    directory = version_dir(root, collection, version_id)
    if not directory.is_dir():
        raise NotFound(f"collection {collection!r} has no version {version_id!r} under {Path(root)}", field="version")
    if not (directory / COLLECTION_MANIFEST).is_file():
        raise ManifestMissing(f"{directory} has no {COLLECTION_MANIFEST}: the version is incomplete and is not served")
    return directory, read_collection_manifest(directory)


def replica_data_dir(root: str | Path, collection: str, shard_id: int, replica: int) -> Path:
    """A replica's own state (its write-ahead logs, compacted bases, term): with the collection, so
    it outlives the process, and the same place whichever backend runs the replica."""
    return collection_dir(root, collection) / "replicas" / f"shard-{shard_id}-r{replica}"


def nodes_dir(root: str | Path, collection: str) -> Path:
    """Where a cluster's nodes keep their files: ``<root>/<collection>/nodes/node-<i>`` (every
    backend, so one can serve what another created)."""
    return collection_dir(root, collection) / "nodes"


def local_cluster_state(root: str | Path, collection: str) -> Path:
    """The local coordinator's file (the cluster state of one machine) of a collection."""
    from clusterstate.local import LOCAL_STATE_FILE

    return collection_dir(root, collection) / LOCAL_STATE_FILE
