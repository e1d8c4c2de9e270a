"""An HNSW graph's build breadth (``ef_construction``): set on every graph a build makes, kept in
the index file and the manifests, used again by a compaction that rebuilds the graph, refused
where it does not apply — and it changes the graph, not only the record."""

import json

import numpy as np
import pytest

from index_shards import compaction
from index_shards.build import BuildConfig, build_collection
from index_shards.faiss_index import FAISS_EF_CONSTRUCTION, index_parts, read_index
from index_shards.ids import doc_int_id
from index_shards.layout import COLLECTION_MANIFEST, INDEX_FILE, collection_dir, resolve_version, shard_dir
from index_shards.manifest import SHARD_MANIFEST
from index_shards.segment import StoredDocument
from index_shards.shard import Shard
from index_shards.tuning import ShardTask, evaluate_shard
from retrieval.errors import ConfigError
from retrieval.tuning_choice import per_query_recall
from retrieval.types import Document, EmbeddingVersion

N, DIM = 4000, 32
VERSION = EmbeddingVersion("efc", "e" * 64, DIM)


def ef_construction_of(index) -> int:
    """What the first HNSW graph in ``index`` says it was linked with (FAISS writes it in the file)."""
    return next(int(part.hnsw.efConstruction) for part in index_parts(index) if hasattr(part, "hnsw"))


def data(seed: int = 1) -> tuple[list[Document], np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((20, DIM)).astype(np.float32)
    vectors = centers[rng.integers(0, 20, N)] + 0.7 * rng.standard_normal((N, DIM)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    queries = vectors[:200] + 0.1 * rng.standard_normal((200, DIM)).astype(np.float32)
    return [Document(f"doc-{i}", "", "") for i in range(N)], vectors, queries


def build(root, factory: str, ef_construction: int | None, documents=None, vectors=None) -> Shard:
    if documents is None:
        documents, vectors, _ = data()
    build_collection(root, documents, vectors, VERSION,
                     BuildConfig("c", 1, factory=factory, ef_construction=ef_construction), show_progress=False)
    directory, _ = resolve_version(root, "c")
    return Shard.load(shard_dir(directory, 0), device="cpu")


def test_a_build_links_its_graph_as_asked_and_records_it(tmp_path):
    shard = build(tmp_path / "asked", "HNSW16", 120)
    assert ef_construction_of(read_index(shard.directory / INDEX_FILE)) == 120  # what FAISS wrote in the file
    assert shard.manifest.ef_construction == 120
    version_dir, collection = resolve_version(tmp_path / "asked", "c")
    assert collection.ef_construction == 120
    assert json.loads((version_dir / COLLECTION_MANIFEST).read_text())["ef_construction"] == 120

    default = build(tmp_path / "default", "HNSW16", None)
    assert ef_construction_of(read_index(default.directory / INDEX_FILE)) == FAISS_EF_CONSTRUCTION
    assert default.manifest.ef_construction is None  # and not written: older manifests read the same
    assert "ef_construction" not in json.loads((default.directory / SHARD_MANIFEST).read_text())


def test_an_ivf_quantizer_graph_is_linked_as_asked(tmp_path):
    shard = build(tmp_path, "IVF16_HNSW8,Flat", 64)
    graphs = [part for part in index_parts(read_index(shard.directory / INDEX_FILE)) if hasattr(part, "hnsw")]
    assert [int(g.hnsw.efConstruction) for g in graphs] == [64]


def test_the_breadth_changes_the_graph(tmp_path):
    """Set before the vectors are added (after, FAISS would record it and build with 40): a graph
    linked with 4 candidates recalls far less at the same small ef_search."""
    documents, vectors, queries = data()
    truth = np.argsort(-(queries @ vectors.T), axis=1)[:, :10]
    row_of = {doc_int_id(d.doc_id): i for i, d in enumerate(documents)}

    def recall(shard: Shard) -> float:
        _, found = shard.search_ids(queries, 10, ef_search=10)
        rows = [{row_of[int(i)] for i in row if int(i) in row_of} for row in found]
        return float(np.mean([len(got & set(t.tolist())) / 10 for got, t in zip(rows, truth, strict=True)]))

    narrow = recall(build(tmp_path / "narrow", "HNSW8", 4, documents, vectors))
    default = recall(build(tmp_path / "default", "HNSW8", None, documents, vectors))
    assert narrow < default - 0.15, (narrow, default)


def test_a_compaction_rebuilds_the_graph_with_the_builds_breadth(tmp_path):
    documents, vectors, _ = data()
    shard = build(tmp_path / "root", "HNSW16", 96, documents[:500], vectors[:500])
    written = vectors[500:540]
    stored = [StoredDocument(d.doc_id, d.title, d.text, {}, 0, vectors[i]) for i, d in enumerate(documents[:480])]
    stored += [StoredDocument(f"new-{i}", "", "", {}, 100 + i, written[i]) for i in range(40)]
    base = Shard.load(compaction.write_base(tmp_path / "wal", shard, stored, 200), device="cpu")
    assert base.index.ntotal == 520
    assert ef_construction_of(read_index(base.directory / INDEX_FILE)) == 96
    assert base.manifest.ef_construction == 96


@pytest.mark.parametrize("factory,value,message", [
    ("Flat", 64, "applies to HNSW graphs"),
    ("IVF16,Flat", 64, "applies to HNSW graphs"),
    ("HNSW16", 3, "between 4 and 4096"),
    ("HNSW16", 5000, "between 4 and 4096"),
])
def test_a_breadth_that_does_not_apply_is_refused_and_nothing_is_published(tmp_path, factory, value, message):
    documents, vectors, _ = data()
    with pytest.raises(ConfigError, match=message) as refused:
        build(tmp_path, factory, value, documents[:400], vectors[:400])
    assert refused.value.field == "ef_construction"
    base = collection_dir(tmp_path, "c")
    assert not base.exists() or not any(base.iterdir())  # no version, no staging left


def test_a_tune_rebuild_links_its_hnsw_candidates_as_the_published_graph(tmp_path):
    """``shardrag tune --rebuild`` rebuilds each candidate from the shard's vectors: an HNSW one
    with the published version's breadth (the task carries it), not FAISS's — here a deliberately
    poor 4, which the candidate's recall at a small ef_search shows."""
    shard = build(tmp_path, "HNSW16", 4)
    queries = data()[2][:100]
    exclude = np.full(len(queries), -1, dtype=np.int64)

    def smallest_ef_recall(breadth: int | None) -> float:
        result = evaluate_shard(ShardTask(str(shard.directory), queries, exclude, 10, max_value=10,
                                          rebuild_as="HNSW8", ef_construction=breadth))
        assert result.factory == "HNSW8" and result.values[0] == 8 and result.build_s > 0
        return float(per_query_recall(result.ids[0][:, :10], result.exact_ids[:, :10]).mean())

    assert smallest_ef_recall(4) < smallest_ef_recall(None) - 0.15
    flat = evaluate_shard(ShardTask(str(shard.directory), queries, exclude, 10, max_value=10,
                                    rebuild_as="IVF16,Flat", ef_construction=4))  # no graph: the breadth is not for it
    assert flat.factory == "IVF16,Flat"


def test_a_tune_rebuild_relinks_the_published_graph_only_at_another_breadth(tmp_path):
    """``--rebuild`` tries the published HNSW factory linked wider too: that task rebuilds the
    graph from the stored vectors (and it searches better at the same ef_search), while the task at
    the published breadth tunes the published graph as it is."""
    shard = build(tmp_path, "HNSW16", 4)
    queries = data()[2][:100]
    exclude = np.full(len(queries), -1, dtype=np.int64)

    def evaluated(breadth: int | None) -> tuple[float, float]:
        result = evaluate_shard(ShardTask(str(shard.directory), queries, exclude, 10, max_value=10,
                                          rebuild_as="HNSW16", ef_construction=breadth))
        assert result.factory == "HNSW16" and result.values[0] == 8
        return result.build_s, float(per_query_recall(result.ids[0][:, :10], result.exact_ids[:, :10]).mean())

    (as_published, published_recall), (wider, wider_recall) = evaluated(4), evaluated(100)
    assert as_published == 0 and wider > 0  # only the other breadth was built
    assert wider_recall > published_recall + 0.15
    assert evaluated(None)[0] > 0  # FAISS's 40 is another breadth than the published 4 too
    default = build(tmp_path / "default", "HNSW16", 40)  # a build that named FAISS's own 40
    unnamed = evaluate_shard(ShardTask(str(default.directory), queries, exclude, 10, max_value=10,
                                       rebuild_as="HNSW16", ef_construction=None))
    assert unnamed.build_s == 0  # None is 40: the published graph, tuned as it is
