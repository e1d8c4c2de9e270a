"""An HNSW base's regions (index_shards/regions.py): written by a build and by a compaction for
HNSW over flat storage only, checked when loaded; a filtered search whose filter runs against the
query scores exactly the kept documents of the regions its definition names; scoring kept
documents in place by position answers as the other exact paths."""

import numpy as np
import pytest

from index_shards import compaction, regions
from index_shards.build import BuildConfig, build_collection
from index_shards.faiss_index import build_index
from index_shards.ids import doc_int_id
from index_shards.layout import REGIONS_FILE, resolve_version, shard_dir
from index_shards.segment import StoredDocument
from index_shards.shard import Shard
from retrieval.errors import IndexIntegrityError
from retrieval.filters import parse_filter
from retrieval.types import Document, EmbeddingVersion

N, DIM, K, TOPICS = 3000, 32, 10, 6


def data(seed: int = 3):
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((TOPICS, DIM)).astype(np.float32)
    topic = rng.integers(0, TOPICS, N)
    vectors = centers[topic] + 0.6 * rng.standard_normal((N, DIM)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    documents = [Document(f"doc-{i}", f"text {i}", "", {"topic": int(topic[i])}) for i in range(N)]
    return documents, vectors, topic


INT_IDS = np.asarray([doc_int_id(f"doc-{i}") for i in range(N)], dtype=np.int64)  # by row


def as_int_ids(doc_ids) -> list[int]:
    return [doc_int_id(d) for d in doc_ids]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    documents, vectors, topic = data()
    version = EmbeddingVersion("regions", "r" * 64, DIM)
    dirs = {}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(regions, "MIN_VECTORS", 1000)
        for factory, metric in (("HNSW32", "ip"), ("HNSW32", "l2"), ("Flat", "ip"), ("IVF16,Flat", "ip"),
                                ("HNSW32,SQ8", "ip")):
            root = tmp_path_factory.mktemp(f"{factory.replace(',', '_')}_{metric}")
            build_collection(root, documents, vectors, version, BuildConfig("c", 1, factory=factory, metric=metric),
                             show_progress=False)
            directory, _ = resolve_version(root, "c")
            dirs[factory, metric] = shard_dir(directory, 0)
    return documents, vectors, topic, dirs


def nearest_regions(loaded: regions.Regions, vectors: np.ndarray) -> np.ndarray:
    if loaded.metric == "l2":
        return np.argmin(((vectors[:, None, :] - loaded.centroids[None, :, :]) ** 2).sum(axis=2), axis=1)
    return np.argmax(vectors @ loaded.centroids.T, axis=1)


def test_only_an_hnsw_over_flat_storage_gets_regions(built, tmp_path):
    documents, vectors, _, dirs = built
    for (factory, metric), directory in dirs.items():
        shard = Shard.load(directory, device="cpu")
        wanted = factory == "HNSW32"
        assert (REGIONS_FILE in shard.manifest.files) is wanted, (factory, metric)
        assert (shard.filtered.regions is not None) is wanted
        if wanted:
            loaded = shard.filtered.regions
            assert loaded.count == round(regions.REGIONS_PER_ROOT * np.sqrt(N))
            stored = regions.stored_vectors(shard.index.index)
            # every stored vector's region is its nearest centroid (k-means' own assignment)
            assert (nearest_regions(loaded, stored) == loaded.of_position).mean() > 0.99
    # below MIN_VECTORS (not lowered here): none
    build_collection(tmp_path, documents, vectors, EmbeddingVersion("regions", "r" * 64, DIM),
                     BuildConfig("c", 1, factory="HNSW32"), show_progress=False)
    directory, _ = resolve_version(tmp_path, "c")
    assert REGIONS_FILE not in Shard.load(shard_dir(directory, 0), device="cpu").manifest.files


def anti_filter(topic_of_query: int):
    return parse_filter({"must_not": [{"key": "topic", "match": {"value": topic_of_query}}]})


def queries_and_topics(vectors, topic):
    rng = np.random.default_rng(11)
    rows = rng.choice(N, 12, replace=False)
    noisy = vectors[rows] + 0.05 * rng.standard_normal((12, DIM)).astype(np.float32)
    return (noisy / np.linalg.norm(noisy, axis=1, keepdims=True)).astype(np.float32), topic[rows]


def by_definition(shard: Shard, query: np.ndarray, kept_ids: np.ndarray, needed: int) -> np.ndarray:
    """The region scan's answer from its definition: the regions nearest the query holding a kept
    document, up to the one where they reach ``needed`` kept documents; the exact top k of theirs."""
    loaded = shard.filtered.regions
    stored_ids = shard.filtered._stored_ids()
    kept = np.isin(stored_ids, kept_ids)
    counts = np.bincount(loaded.of_position[kept], minlength=loaded.count)
    if loaded.metric == "l2":
        order = np.argsort(((loaded.centroids - query) ** 2).sum(axis=1), kind="stable")
    else:
        order = np.argsort(-(loaded.centroids @ query), kind="stable")
    chosen, seen = [], 0
    for region in order:
        if counts[region] and seen < needed:
            chosen.append(region)
            seen += counts[region]
    positions = np.flatnonzero(kept & np.isin(loaded.of_position, chosen))
    stored = regions.stored_vectors(shard.index.index)[positions]
    scores = -((stored - query) ** 2).sum(axis=1) if loaded.metric == "l2" else stored @ query
    return stored_ids[positions][np.lexsort((stored_ids[positions], -scores))[:K]]


@pytest.mark.parametrize("metric", ["ip", "l2"])
def test_a_filter_against_the_query_scores_the_nearest_regions_holding_matches(built, metric, monkeypatch):
    documents, vectors, topic, dirs = built
    monkeypatch.setattr(regions, "SCAN_REGIONS", 4)  # a few regions' worth: far fewer than the matches
    shard = Shard.load(dirs["HNSW32", metric], device="cpu")
    shard.filtered.exact_scan_max = 0  # the planner decides (in-index, unless the walk would cost more)
    queries, topics = queries_and_topics(vectors, topic)
    needed = shard.filtered.regions.scan_size
    assert 2 * needed < (topic != 0).sum()
    for query, own in zip(queries, topics, strict=True):
        got = shard.search(query[None, :], K, filter_=anti_filter(int(own)), with_text=False)[0]["doc_ids"]
        want = by_definition(shard, query, INT_IDS[topic != own], needed)
        assert as_int_ids(got) == want.tolist()
    assert shard.filter_plans["region rows"] == len(queries)  # (the probe held no match: all went this way)


def exact_top(vectors, query, kept_rows, metric):
    """The int ids of the exact top k among these rows (equal scores in id order)."""
    scores = -((vectors[kept_rows] - query) ** 2).sum(axis=1) if metric == "l2" else vectors[kept_rows] @ query
    ids = INT_IDS[kept_rows]
    return ids[np.lexsort((ids, -scores))[:K]]


def test_a_row_whose_regions_hold_most_matches_is_scanned_exactly(built, monkeypatch):
    documents, vectors, topic, dirs = built
    monkeypatch.setattr(regions, "SCAN_REGIONS", 10**6)  # every region's worth: the scan would read them all
    shard = Shard.load(dirs["HNSW32", "ip"], device="cpu")
    shard.filtered.exact_scan_max = 0
    queries, topics = queries_and_topics(vectors, topic)
    for query, own in zip(queries, topics, strict=True):
        got = shard.search(query[None, :], K, filter_=anti_filter(int(own)), with_text=False)[0]["doc_ids"]
        assert as_int_ids(got) == exact_top(vectors, query, np.flatnonzero(topic != own), "ip").tolist()
    assert shard.filter_plans["region rows"] == 0


@pytest.mark.parametrize("metric", ["ip", "l2"])
def test_scoring_by_position_answers_as_the_other_exact_paths(built, metric):
    """One row (in place, by position), many rows (copied out for one product) and by id alone."""
    documents, vectors, topic, dirs = built
    shard = Shard.load(dirs["HNSW32", metric], device="cpu")
    searcher = shard.filtered
    queries, _ = queries_and_topics(vectors, topic)
    stored_ids = searcher._stored_ids()
    for share in (0.05, 0.4):
        positions = np.sort(np.random.default_rng(7).choice(N, int(share * N), replace=False))
        allowed = stored_ids[positions]
        one = [searcher.exact(q[None, :], K, allowed, positions=positions) for q in queries]
        many = searcher.exact(queries, K, allowed, positions=positions)
        by_id = searcher.exact(queries, K, allowed)
        for row, (scores, ids) in enumerate(one):
            assert ids[0].tolist() == many[1][row].tolist() == by_id[1][row].tolist()
            np.testing.assert_allclose(scores[0], many[0][row], rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(scores[0], by_id[0][row], rtol=1e-5, atol=1e-5)
            rows = np.flatnonzero(np.isin(INT_IDS, allowed))
            assert ids[0].tolist() == exact_top(vectors, queries[row], rows, metric).tolist()


def test_a_compaction_writes_the_new_bases_regions(built, tmp_path, monkeypatch):
    documents, vectors, topic, dirs = built
    monkeypatch.setattr(regions, "MIN_VECTORS", 1000)
    build = Shard.load(dirs["HNSW32", "ip"], device="cpu")
    rng = np.random.default_rng(2)
    written = rng.standard_normal((40, DIM)).astype(np.float32)
    written /= np.linalg.norm(written, axis=1, keepdims=True)
    stored = [StoredDocument(d.doc_id, d.title, d.text, dict(d.metadata), 0, vectors[i])
              for i, d in enumerate(documents[:2500])]
    stored += [StoredDocument(f"new-{i}", "", "", {}, 100 + i, written[i]) for i in range(40)]
    base = Shard.load(compaction.write_base(tmp_path, build, stored, 200), device="cpu")
    assert REGIONS_FILE in base.manifest.files and base.index.ntotal == 2540
    loaded = base.filtered.regions
    assert loaded.of_position.size == 2540 and loaded.count == round(regions.REGIONS_PER_ROOT * np.sqrt(2540))
    assert (nearest_regions(loaded, regions.stored_vectors(base.index.index)) == loaded.of_position).mean() > 0.99


def test_regions_that_do_not_match_their_index_are_refused(built, tmp_path, monkeypatch):
    documents, vectors, topic, dirs = built
    monkeypatch.setattr(regions, "MIN_VECTORS", 1000)
    index = build_index(vectors, np.arange(N, dtype=np.int64), "HNSW32")
    assert regions.write_regions(index, tmp_path, "ip")
    other = build_index(vectors[:2000], np.arange(2000, dtype=np.int64), "HNSW32")
    with pytest.raises(IndexIntegrityError, match="does not match its index"):
        regions.read_regions(tmp_path / REGIONS_FILE, other, "ip")
    assert regions.read_regions(tmp_path / REGIONS_FILE, index, "ip").of_position.size == N
