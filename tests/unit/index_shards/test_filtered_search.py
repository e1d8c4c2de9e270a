"""Filtered search on real FAISS shards against a brute-force oracle: the payload index selects
exactly what the filter means; Flat answers the exact filtered top k; HNSW and IVF (and IVF-PQ
with a refine stage), forced onto their in-index filtered search, keep a high recall@10 and always
return min(k, matches) hits."""

import numpy as np
import pytest

from index_shards.build import BuildConfig, build_collection
from index_shards.layout import resolve_version, shard_dir
from index_shards.shard import Shard
from retrieval.filters import parse_filter
from retrieval.types import Document, EmbeddingVersion

N, DIM, K = 3000, 32, 10
SELECTIVITIES = (0.001, 0.01, 0.1, 0.5, 1.0)


def corpus():
    rng = np.random.default_rng(7)
    vectors = rng.standard_normal((N, DIM)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    ranks = rng.permutation(N)  # "u" is uniform over 0..N-1: a range on it has a known selectivity
    documents = [Document(f"doc-{i}", f"text {i}", "", {
        "u": int(ranks[i]), "cat": f"c{i % 10}", "tags": [f"t{i % 7}", f"t{i % 3}"], "even": i % 2 == 0,
        **({"score": float(i) / 10} if i % 4 else {}),
        # date-times in two spellings of UTC (and one offset) where i % 5, not dates elsewhere
        **({"when": f"20{i % 30:02d}-01-15T10:{i % 60:02d}:00{('Z', '+00:00', '+01:00')[i % 3]}"} if i % 5
           else {"when": "soon"}),
    }) for i in range(N)]
    return documents, vectors


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    documents, vectors = corpus()
    version = EmbeddingVersion("filtered", "f" * 64, DIM)
    out = {}
    for factory in ("Flat", "HNSW32", "IVF16,Flat", "IVF16,PQ16x4fs,RFlat"):
        root = tmp_path_factory.mktemp(factory.replace(",", "_"))
        build_collection(root, documents, vectors, version, BuildConfig("c", 1, factory=factory), show_progress=False)
        directory, _ = resolve_version(root, "c")
        out[factory] = Shard.load(shard_dir(directory, 0), device="cpu")
    return documents, vectors, out


def filters():
    for s in SELECTIVITIES:
        yield s, {"must": [{"key": "u", "range": {"lt": s * N}}]}
    yield None, {"must": [{"key": "cat", "match": {"any": ["c1", "c2"]}}],
                 "must_not": [{"key": "even", "match": {"value": True}}]}
    yield None, {"should": [{"key": "tags", "match": {"value": "t5"}}, {"key": "score", "range": {"gte": 250}}]}
    yield None, {"must": [{"has_id": ["doc-3", "doc-4", "doc-99999"]}]}
    yield None, {"must": [{"key": "nothing", "match": {"value": 1}}]}
    yield None, {"must": [{"key": "when", "range": {"gte": "2010-01-15T10:00:00", "lt": "2020-01-15T09:30:00Z"}}]}
    yield None, {"must": [{"is_empty": {"key": "score"}}], "must_not": [{"key": "when", "range": {"gt": "2025-01-01"}}]}
    yield None, {"must_not": [{"is_empty": {"key": "score"}}, {"must_not": [{}]}]}


def oracle(documents, vectors, queries, data, k=K):
    keep = np.array([parse_filter(data).matches(d.doc_id, d.metadata) for d in documents])
    ids = np.flatnonzero(keep)
    if ids.size == 0:
        return [[] for _ in queries], 0
    scores = queries @ vectors[ids].T
    order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return [[documents[ids[j]].doc_id for j in row] for row in order], ids.size


def test_the_payload_index_selects_what_the_filter_means(shards):
    documents, _, by_factory = shards
    shard = by_factory["Flat"]
    docs = shard.docstore.get_many(shard.payload.int_ids.tolist())
    for _, data in filters():
        selected = {docs[int(i)].doc_id for i in shard.payload.select(parse_filter(data))}
        expected = {d.doc_id for d in documents if parse_filter(data).matches(d.doc_id, d.metadata)}
        assert selected == expected, data


@pytest.mark.parametrize("factory, exact_scan_max, knobs, min_recall", [
    ("Flat", 4096, {}, 1.0), ("Flat", 0, {}, 1.0), ("HNSW32", 4096, {}, 1.0), ("HNSW32", 0, {}, 0.99),
    # IVF's own approximation is nprobe's: half the lists, as unfiltered at nprobe=8 (~0.98)
    ("IVF16,Flat", 0, {"nprobe": 8}, 0.97),
    # a refine stage over 4-bit codes: the exact scan reads its full vectors back; in-index, the
    # filter reaches the first stage through the id map and the re-ranking restores the order
    ("IVF16,PQ16x4fs,RFlat", 4096, {}, 1.0), ("IVF16,PQ16x4fs,RFlat", 0, {"nprobe": 8}, 0.95),
])
def test_filtered_top_k_against_the_oracle(shards, factory, exact_scan_max, knobs, min_recall):
    documents, vectors, by_factory = shards
    shard = by_factory[factory]
    shard.filtered.exact_scan_max = exact_scan_max  # 0: every search takes the in-index path
    queries = vectors[:40] + 0.05 * np.random.default_rng(1).standard_normal((40, DIM)).astype(np.float32)
    recalls = []
    try:
        for selectivity, data in filters():
            expected, matches = oracle(documents, vectors, queries, data)
            got = shard.search(queries, K, filter_=parse_filter(data), with_text=False, **knobs)
            for row, want in zip(got, expected, strict=True):
                assert len(row["doc_ids"]) == min(K, matches), (factory, data)  # never short
                assert row["scores"] == sorted(row["scores"], reverse=True)
                assert all(parse_filter(data).matches(d, documents[int(d.split("-")[1])].metadata)
                           for d in row["doc_ids"])
                recalls.append(len(set(row["doc_ids"]) & set(want)) / len(want) if want else 1.0)
                if factory == "Flat" or exact_scan_max:
                    assert row["doc_ids"] == want, (factory, selectivity, data)
    finally:
        shard.filtered.exact_scan_max = 4096
    assert np.mean(recalls) >= min_recall, (factory, np.mean(recalls))


def test_metadata_comes_back_when_asked(shards):
    documents, vectors, by_factory = shards
    [row] = by_factory["Flat"].search(vectors[:1], 3, with_metadata=True)
    assert row["doc_ids"][0] == "doc-0" and row["metadata"][0] == documents[0].metadata
    [plain] = by_factory["Flat"].search(vectors[:1], 3)
    assert "metadata" not in plain


@pytest.mark.parametrize("factory", ["HNSW32", "Flat"])
def test_a_search_pinned_to_one_partition_scores_only_its_documents(tmp_path, factory):
    """A shard built with a partition field (a collection's tenant field) answers a filter that
    pins it by scoring that partition's documents only — however many match, never a walk of the
    index through other partitions — and exactly; other filters of the same size still take the
    index's filtered search, and so does the pinned filter on a shard built without the field.
    The field is in the manifest, so a compaction's new base keeps it."""
    from index_shards.manifest import ShardManifest

    documents, vectors = corpus()
    tenants = [Document(d.doc_id, d.title, d.text, {**d.metadata, "tenant": f"t{i % 3}"})
               for i, d in enumerate(documents)]
    version = EmbeddingVersion("filtered", "f" * 64, DIM)
    loaded = {}
    for field in ("tenant", None):
        root = tmp_path / str(field)
        build_collection(root, tenants, vectors, version, BuildConfig("c", 1, factory=factory, partition_field=field),
                         show_progress=False)
        directory, _ = resolve_version(root, "c")
        loaded[field] = Shard.load(shard_dir(directory, 0), device="cpu")
        loaded[field].filtered.exact_scan_max = 100  # 1,000 documents per tenant: past it
    partitioned, plain = loaded["tenant"], loaded[None]
    assert ShardManifest.from_dict(partitioned.manifest.to_dict()).partition_field == "tenant"
    queries = np.random.default_rng(5).standard_normal((4, DIM)).astype(np.float32)
    pinned = {"must": [{"key": "tenant", "match": {"value": "t1"}}, {"key": "u", "range": {"gte": 0}}]}
    hits = partitioned.search(queries, K, filter_=parse_filter(pinned), with_text=False)
    assert dict(partitioned.filter_plans) == {"exact": 1}
    expected, _ = oracle(tenants, vectors, queries, pinned)
    assert [row["doc_ids"] for row in hits] == expected
    same_size = {"must": [{"key": "u", "range": {"lt": N // 3}}]}
    partitioned.search(queries, K, filter_=parse_filter(same_size), with_text=False)
    plain.search(queries, K, filter_=parse_filter(pinned), with_text=False)
    assert partitioned.filter_plans["index"] == 1 and dict(plain.filter_plans) == {"index": 1}


@pytest.mark.parametrize("factory", ["Flat", "HNSW32"])
@pytest.mark.parametrize("metric", ["ip", "l2"])
def test_an_exact_scan_over_most_of_the_shard_scores_in_place_as_the_oracle(tmp_path, factory, metric):
    """Past a quarter of the shard matching, the exact scan scores every stored vector in place
    (FAISS's SIMD routines over the flat storage, memory-mapped or not) and picks the matches."""
    documents, vectors = corpus()
    version = EmbeddingVersion("filtered", "f" * 64, DIM)
    build_collection(tmp_path, documents, vectors * 3.0, version, BuildConfig("c", 1, factory=factory, metric=metric),
                     show_progress=False)
    directory, _ = resolve_version(tmp_path, "c")
    shard = Shard.load(shard_dir(directory, 0), device="cpu", mmap=True)
    data = {"must": [{"key": "u", "range": {"lt": N // 2}}]}
    keep = np.array([parse_filter(data).matches(d.doc_id, d.metadata) for d in documents])
    ids = np.flatnonzero(keep)
    queries = vectors[:8] + 0.3
    assert shard.filtered._whole_storage(shard.payload.select(parse_filter(data))) is not None
    for query, row in zip(queries, shard.search(queries, K, filter_=parse_filter(data), with_text=False), strict=True):
        stored = vectors[ids] * 3.0
        scores = stored @ query if metric == "ip" else -np.sum((stored - query) ** 2, axis=1)
        want = [documents[ids[j]].doc_id for j in np.argsort(-scores, kind="stable")[:K]]
        assert row["doc_ids"] == want
        assert np.allclose(row["scores"], np.sort(scores)[::-1][:K], rtol=1e-4, atol=1e-4)  # l2: -distance
