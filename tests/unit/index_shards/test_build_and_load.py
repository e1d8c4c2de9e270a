import json
import subprocess
import sys

import numpy as np
import pytest

from index_shards.build import BuildConfig, build_collection
from index_shards.ids import doc_int_id
from index_shards.layout import list_versions, resolve_version, shard_dir
from index_shards.manifest import COLLECTION_MANIFEST, SHARD_MANIFEST, read_shard_manifest
from index_shards.shard import Shard
from retrieval.errors import BuildError, ChecksumMismatch, ManifestMissing
from tests.conftest import random_corpus


@pytest.fixture
def built(tmp_path):
    documents, vectors, version = random_corpus()
    build_collection(tmp_path, documents, vectors, version, BuildConfig("c", 3, "hash", "Flat"), show_progress=False)
    directory, manifest = resolve_version(tmp_path, "c")
    return tmp_path, directory, manifest, documents, vectors


def test_manifest_describes_every_file(built):
    _, directory, collection, documents, _ = built
    assert collection.count == len(documents) and collection.num_shards == 3
    total = 0
    for shard_id in range(3):
        manifest = read_shard_manifest(shard_dir(directory, shard_id))
        assert manifest.embedding_version == collection.embedding_version
        assert manifest.dim == 32 and manifest.metric == "ip" and manifest.factory == "Flat"
        assert set(manifest.files) == {"index.faiss", "docs.sqlite"}
        assert all(len(entry.sha256) == 64 for entry in manifest.files.values())
        total += manifest.count
    assert total == len(documents)


def test_hash_partition_is_stable_by_doc_id(built):
    _, directory, _, documents, vectors = built
    shard = Shard.load(shard_dir(directory, 1), device="cpu")
    for document, vector in zip(documents, vectors):
        if doc_int_id(document.doc_id) % 3 == 1:
            [hits] = shard.search(vector[None, :], 1)
            assert hits["doc_ids"] == [document.doc_id] and hits["titles"] == [document.title]
            break
    else:
        pytest.fail("no document landed on shard 1")


@pytest.mark.parametrize("name", ["index.faiss", "docs.sqlite"])
def test_flipped_byte_is_refused_naming_the_file(built, name):
    _, directory, _, _, _ = built
    path = shard_dir(directory, 0) / name
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(ChecksumMismatch, match=name):
        Shard.load(shard_dir(directory, 0), device="cpu")
    result = subprocess.run([sys.executable, "-m", "index_shards", "serve", "--dir", str(shard_dir(directory, 0))],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and name in result.stderr
    assert "SHARDRAG_READY" not in result.stdout


def test_shard_without_manifest_is_never_served(built):
    _, directory, _, _, _ = built
    (shard_dir(directory, 2) / SHARD_MANIFEST).unlink()
    with pytest.raises(ManifestMissing):
        Shard.load(shard_dir(directory, 2), device="cpu")


def test_version_without_manifest_is_never_served(built):
    root, directory, _, _, _ = built
    (directory / COLLECTION_MANIFEST).unlink()
    assert list_versions(root, "c") == []
    with pytest.raises(ManifestMissing):
        resolve_version(root, "c", directory.name)


def test_tampered_manifest_is_refused(built):
    _, directory, _, _, _ = built
    path = shard_dir(directory, 0) / SHARD_MANIFEST
    data = json.loads(path.read_text())
    data["files"]["index.faiss"]["size_bytes"] += 1
    path.write_text(json.dumps(data))
    with pytest.raises(ChecksumMismatch, match="index.faiss"):
        Shard.load(shard_dir(directory, 0), device="cpu")


def test_existing_version_needs_overwrite_and_failed_build_leaves_nothing(built):
    root, directory, _, documents, vectors = built
    _, _, version = random_corpus()
    with pytest.raises(BuildError, match="already exists"):
        build_collection(root, documents, vectors, version, BuildConfig("c", 3), show_progress=False)
    with pytest.raises(BuildError, match="IVF4096"):
        build_collection(root, documents, vectors, version, BuildConfig("c", 3, factory="IVF4096,Flat", overwrite=True),
                         show_progress=False)
    # the old version is intact and no staging directory is left behind
    assert resolve_version(root, "c")[0] == directory
    assert [p.name for p in (root / "c").iterdir()] == [directory.name]
    build_collection(root, documents, vectors, version, BuildConfig("c", 2, overwrite=True), show_progress=False)
    assert resolve_version(root, "c")[1].num_shards == 2


@pytest.mark.parametrize("factory, params", [
    ("Flat", {}),
    ("HNSW32", {"ef_search": 64}),
    ("IVF16,Flat", {"nprobe": 16}),
    ("IVF16,PQ8", {"nprobe": 16}),
])
def test_any_factory_string_with_stable_ids(tmp_path, factory, params):
    documents, vectors, version = random_corpus(n=800)
    build_collection(tmp_path, documents, vectors, version, BuildConfig("f", 1, factory=factory), show_progress=False)
    directory, _ = resolve_version(tmp_path, "f")
    shard = Shard.load(shard_dir(directory, 0), device="cpu")
    hits = shard.search(vectors[:20], 5, **params)
    found_self = sum(h["doc_ids"][0] == documents[i].doc_id for i, h in enumerate(hits))
    threshold = 14 if "PQ" in factory else 20  # PQ is lossy; the rest find the query's own document
    assert found_self >= threshold, (factory, found_self)


def test_param_that_does_not_apply_is_a_4xx(tmp_path):
    from retrieval.errors import InvalidRequest

    documents, vectors, version = random_corpus(n=100)
    build_collection(tmp_path, documents, vectors, version, BuildConfig("f", 1), show_progress=False)
    shard = Shard.load(shard_dir(resolve_version(tmp_path, "f")[0], 0), device="cpu")
    with pytest.raises(InvalidRequest) as info:
        shard.search(vectors[:1], 5, nprobe=4)
    assert info.value.field == "nprobe"


def test_l2_metric_scores_are_negated_distances(tmp_path):
    documents, vectors, version = random_corpus(n=100)
    build_collection(tmp_path, documents, vectors, version, BuildConfig("l", 1, metric="l2"), show_progress=False)
    shard = Shard.load(shard_dir(resolve_version(tmp_path, "l")[0], 0), device="cpu")
    [hits] = shard.search(vectors[:1], 3)
    assert hits["doc_ids"][0] == documents[0].doc_id
    assert hits["scores"][0] == pytest.approx(0.0, abs=1e-5) and hits["scores"] == sorted(hits["scores"], reverse=True)


def test_kmeans_shards_own_regions(tmp_path):
    documents, vectors, version = random_corpus(n=900)
    build_collection(tmp_path, documents, vectors, version, BuildConfig("k", 3, "kmeans"), show_progress=False)
    directory, _ = resolve_version(tmp_path, "k")
    centroids = np.stack([np.asarray(read_shard_manifest(shard_dir(directory, s)).centroid) for s in range(3)])
    for s in range(3):
        shard = Shard.load(shard_dir(directory, s), device="cpu")
        ids = set(shard.docstore.get_many([doc_int_id(d.doc_id) for d in documents]).keys())
        members = [i for i, d in enumerate(documents) if doc_int_id(d.doc_id) in ids]
        assert members, f"shard {s} is empty"
        assert (np.argmax(vectors[members] @ centroids.T, axis=1) == s).all()
