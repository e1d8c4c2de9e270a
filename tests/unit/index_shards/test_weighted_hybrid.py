"""A weighted hybrid on the shards (``index_shards.hybrid_search``): each shard's fused top k,
merged as the gateway merges, equals the exact top k of w·(cos+1)/2 + w'·BM25/bound over every
live document — computed here from the definitions, over all of them — on every msmarco query
with the real MiniLM vectors: as built, after upserts (one without a vector) and deletes, and
after a compaction; with a filter; for documents in neither leg's first candidates; and on an
l2 collection."""

import functools
import math
from collections import Counter

import numpy as np
import pytest

from index_shards import compaction, hybrid_sealed
from index_shards.build import BuildConfig, build_collection
from index_shards.layout import resolve_version, shard_dir
from index_shards.shard import Shard
from index_shards.versions import ShardVersions
from retrieval.analysis import document_terms, query_terms
from retrieval.bm25 import K1, B, CorpusStats, LexicalQuery, decode_lexical_queries, encode_lexical_queries
from retrieval.contract import SearchParams
from retrieval.errors import InvalidRequest
from retrieval.filters import parse_filter
from retrieval.fusion import WeightedFusion, leg_rank
from retrieval.records import DELETE, UPSERT, WalRecord
from retrieval.routing import hash_shard
from retrieval.types import Document, EmbeddingVersion
from tests.conftest import random_corpus
from tests.unit.index_shards.test_lexical import write

SHARDS = 3
K = 10


def build(root, corpus, shards: int) -> list[ShardVersions]:
    build_collection(root, corpus.documents, corpus.vectors, corpus.version, BuildConfig("c", shards, factory="Flat"),
                     show_progress=False)
    directory, _ = resolve_version(root, "c")
    return [ShardVersions(Shard.load(shard_dir(directory, s), device="cpu"), data_dir=root / f"data-{s}")
            for s in range(shards)]


def fused(replica: ShardVersions, vector: np.ndarray, text: str, spec: WeightedFusion, corpus: CorpusStats | None,
          filter_json: str | None = None):
    reply = replica.search(vector[None, :], SearchParams(K, None, filter=filter_json, lexical=True),
                           [LexicalQuery(text, corpus, spec)])
    return reply.results[0], reply.stats[0]


def sharded(replicas: list[ShardVersions], vector, text, spec, filter_json=None):
    """The gateway's protocol: the shards' statistics summed, every shard fusing under the sum,
    the lists merged by (score, doc id)."""
    stats = CorpusStats.total(fused(r, vector, text, spec, None)[1] for r in replicas)
    rows = []
    for replica in replicas:
        hits, _ = fused(replica, vector, text, spec, stats, filter_json)
        rows.extend(zip(hits["scores"], hits["doc_ids"], hits["legs"]["dense"], hits["legs"]["lexical"],
                        strict=True))
    rows.sort(key=lambda row: (-row[0], row[1]))
    return rows[:K]


@functools.cache
def term_counts(title: str, body: str) -> Counter:
    """A document's terms counted (the same text analysed once, not once a query: read, never changed)."""
    return Counter(document_terms(title, body))


def reference(model: dict[str, tuple[str, str, np.ndarray | None, dict]], vector: np.ndarray, text: str,
              spec: WeightedFusion, keep=lambda meta: True, metric: str = "ip") -> list[tuple[str, float]]:
    """Every live document scored from the definitions: cosine of the vectors in float64 (l2: the
    -L2² of unit vectors mapped from [-4, 0]), BM25 (Lucene's idf, k1 1.2, b 0.75) over the live
    documents' terms, bound Σ idf·count·(k1+1)."""
    terms = {doc_id: term_counts(title, body) for doc_id, (title, body, _, _) in model.items()}
    lengths = {doc_id: sum(c.values()) for doc_id, c in terms.items()}
    average = sum(lengths.values()) / len(lengths)
    bm25 = dict.fromkeys(model, 0.0)
    bound = 0.0
    for term, count in query_terms(text):
        df = sum(1 for c in terms.values() if term in c)
        if not df:
            continue
        weight = math.log(1 + (len(terms) - df + 0.5) / (df + 0.5)) * count
        bound += weight * (K1 + 1)
        for doc_id, c in terms.items():
            if term in c:
                tf = c[term]
                bm25[doc_id] += weight * tf * (K1 + 1) / (tf + K1 * (1 - B + B * lengths[doc_id] / average))
    query = vector.astype(np.float64)
    scores = {}
    for doc_id, (_, _, doc_vector, meta) in model.items():
        if not keep(meta):
            continue
        if doc_vector is None:
            dense = 0.0
        elif metric == "l2":
            dense = (4 - float(np.sum((doc_vector.astype(np.float64) - query) ** 2))) / 4
        else:
            dense = (float(doc_vector.astype(np.float64) @ query) + 1) / 2
        scores[doc_id] = spec.dense * dense + (spec.lexical * bm25[doc_id] / bound if bound else 0.0)
    return sorted(scores.items(), key=lambda item: (-item[1], item[0]))[:K]


def test_the_shards_fused_lists_are_the_exact_weighted_top_k_through_writes_and_compaction(msmarco, tmp_path):
    replicas = build(tmp_path / "sharded", msmarco, SHARDS)
    single = build(tmp_path / "single", msmarco, 1)
    model = {d.doc_id: (d.title, d.text, msmarco.vectors[i], dict(d.metadata or {}))
             for i, d in enumerate(msmarco.documents)}
    queries = [(msmarco.query_vectors[i], msmarco.dataset.queries[q]) for i, q in enumerate(msmarco.query_ids)]
    spec = WeightedFusion(0.8, 0.2, 20)

    def check(layouts, queries_checked) -> None:
        for vector, text in queries_checked:
            want = reference(model, vector, text, spec)
            for layout in layouts:
                got = sharded(layout, vector, text, spec)
                assert [row[1] for row in got] == [doc_id for doc_id, _ in want], text
                assert np.allclose([row[0] for row in got], [score for _, score in want], rtol=1e-9, atol=1e-12)
                for _, doc_id, dense, bm25 in got:  # each leg's own score, as the leg computes it
                    _, _, doc_vector, _ = model[doc_id]
                    assert dense is None if doc_vector is None else math.isclose(
                        dense, float(doc_vector.astype(np.float64) @ vector.astype(np.float64)), rel_tol=1e-9)
                    assert bm25 is None or bm25 > 0

    check([replicas, single], queries)
    # writes: new documents carrying a query's words, rewrites, deletes, one without a vector
    rng = np.random.default_rng(3)
    records = []
    ids = sorted(model)
    for i in range(120):
        doc_id = ids[int(rng.integers(len(ids)))]
        if i % 4 == 0 and doc_id in model:
            model.pop(doc_id)
            records.append(WalRecord(0, DELETE, doc_id))
            continue
        vector, text = queries[i % len(queries)]
        noisy = vector + 0.3 * rng.standard_normal(vector.size).astype(np.float32)
        noisy /= np.linalg.norm(noisy)
        target = f"new-{i}" if i % 2 else doc_id
        doc_vector = None if i == 7 else noisy.astype(np.float32)
        body = f"{text} {msmarco.documents[i].text}"
        model[target] = ("", body, doc_vector, {"written": True})
        records.append(WalRecord(0, UPSERT, target, "", body, {"written": True}, doc_vector))
    for start in range(0, len(records), 40):
        batch = records[start:start + 40]
        write(single[0], batch)
        for s, replica in enumerate(replicas):
            write(replica, [r for r in batch if hash_shard(r.doc_id, SHARDS) == s])
    assert sum(r.get(None).segment_size for r in replicas) > 0
    check([replicas, single], queries)
    # a filter: both legs and the bound's reach keep to the documents it selects
    written = parse_filter({"must": [{"key": "written", "match": {"value": True}}]}).canonical()
    for vector, text in queries[:10]:
        want = reference(model, vector, text, spec, keep=lambda meta: meta.get("written") is True)
        assert [row[1] for row in sharded(replicas, vector, text, spec, written)] == [d for d, _ in want], text
    for replica in replicas:
        compaction.compact(replica, replica.ready_ids()[0])
        assert replica.get(None).segment_size == 0
    check([replicas], queries[:20])


def axis_query(dim: int = 8) -> np.ndarray:
    """The unit query vector along the first axis."""
    query = np.zeros(dim, dtype=np.float32)
    query[0] = 1.0
    return query


def unit_at(rng: np.random.Generator, cosine: float, dim: int = 8) -> np.ndarray:
    """A random unit vector at ``cosine`` to :func:`axis_query`."""
    side = rng.standard_normal(dim - 1)
    side *= math.sqrt(1 - cosine ** 2) / np.linalg.norm(side)
    return np.concatenate([[cosine], side]).astype(np.float32)


def test_documents_neither_leg_ranks_high_are_found_by_their_bm25(tmp_path):
    """30 documents close to the query without its word, 30 far from it with the word three
    times, and 10 fairly close with the word once — the 10 are the fused top 10 at 0.5 / 0.5 but
    in neither leg's top 30: a shard must look past both legs' first candidates (at every document
    whose BM25 could lift it past the 10th) to find them."""
    rng = np.random.default_rng(5)
    query = axis_query()

    groups = [("near", 30, 0.95, "orchard harvest season"), ("worded", 30, 0.0, "apple apple apple"),
              ("both", 10, 0.9, "apple orchard harvest season")]
    documents, vectors = [], []
    for name, count, cosine, body in groups:
        for i in range(count):
            documents.append(Document(f"{name}-{i:02d}", body, ""))
            vectors.append(unit_at(rng, cosine))
    model = {d.doc_id: ("", d.text, v, {}) for d, v in zip(documents, vectors, strict=True)}
    spec = WeightedFusion(0.5, 0.5, 10)
    want = reference(model, query, "apple", spec)
    assert all(doc_id.startswith("both-") for doc_id, _ in want)  # the case is what it says
    for shards in (1, 2):
        build_collection(tmp_path / str(shards), documents, np.stack(vectors), EmbeddingVersion("t", "0" * 64, 8),
                         BuildConfig("c", shards, factory="Flat"), show_progress=False)
        directory, _ = resolve_version(tmp_path / str(shards), "c")
        replicas = [ShardVersions(Shard.load(shard_dir(directory, s), device="cpu")) for s in range(shards)]
        assert [row[1] for row in sharded(replicas, query, "apple", spec)] == [d for d, _ in want]


def test_an_l2_collection_fuses_its_distances_as_unit_vectors_cosines(msmarco, tmp_path):
    """An l2 collection: the dense leg's score is -L2², mapped from [-4, 0] (unit vectors) — the
    same ranking as the cosine's, computed from the distances, sharded as unsharded."""
    documents = msmarco.documents[:600]
    vectors = msmarco.vectors[:600]
    model = {d.doc_id: (d.title, d.text, vectors[i], {}) for i, d in enumerate(documents)}
    spec = WeightedFusion(0.6, 0.4, 10)
    layouts = []
    for shards in (2, 1):
        root = tmp_path / str(shards)
        build_collection(root, documents, vectors, msmarco.version,
                         BuildConfig("c", shards, factory="Flat", metric="l2"), show_progress=False)
        directory, _ = resolve_version(root, "c")
        layouts.append([ShardVersions(Shard.load(shard_dir(directory, s), device="cpu")) for s in range(shards)])
    for i in range(0, len(msmarco.query_ids), 3):
        vector, text = msmarco.query_vectors[i], msmarco.dataset.queries[msmarco.query_ids[i]]
        want = reference(model, vector, text, spec, metric="l2")
        for replicas in layouts:
            got = sharded(replicas, vector, text, spec)
            assert [row[1] for row in got] == [doc_id for doc_id, _ in want], text
            assert np.allclose([row[0] for row in got], [score for _, score in want], rtol=1e-9, atol=1e-12)


def test_a_batch_answers_each_query_as_alone(msmarco, tmp_path):
    """Queries coalesced into one call (one dense search for the batch, one document read), with
    different depths, answer exactly what each answers alone."""
    (replica,) = build(tmp_path / "one", msmarco, 1)
    vectors = msmarco.query_vectors[:12]
    queries = [LexicalQuery(msmarco.dataset.queries[q], None, WeightedFusion(0.7, 0.3, 5 if i % 2 else 30))
               for i, q in enumerate(msmarco.query_ids[:12])]
    params = SearchParams(K, None, lexical=True)
    together = replica.search(vectors, params, queries)
    for i, query in enumerate(queries):
        alone = replica.search(vectors[i:i + 1], params, [query])
        assert together.results[i] == alone.results[0] and together.stats[i] == alone.stats[0]


def test_leg_ranks_count_every_shards_better_scores_and_say_when_they_cannot():
    tops = [[0.9, 0.8, 0.7], [0.85, 0.5]]  # the second shard's list is short: it holds no more
    assert leg_rank(0.9, tops, 3) == 1
    assert leg_rank(0.8, tops, 3) == 3
    assert leg_rank(0.7, tops, 3) == 4
    assert leg_rank(0.6, tops, 3) is None  # the first shard may hold documents between 0.7 and 0.6


def test_weighted_specs_travel_in_the_lexical_encoding_and_bad_ones_are_named():
    spec = WeightedFusion(0.7, 0.3, 25)
    body = encode_lexical_queries([LexicalQuery("a b", None, spec)], b"")
    (query,), rest = decode_lexical_queries(body, max_queries=4)
    assert query.fuse == spec and rest == b""
    with pytest.raises(InvalidRequest) as bad:
        WeightedFusion(-1.0, 0.5, 20)
    assert bad.value.field == "weights.dense"
    with pytest.raises(InvalidRequest) as bad:
        WeightedFusion.from_dict({"dense": 1, "lexical": 1, "depth": 2.5}, field_name="body.queries.0.fuse")
    assert bad.value.field == "body.queries.0.fuse.depth"
    with pytest.raises(InvalidRequest) as bad:
        WeightedFusion.from_dict({"dense": 1}, field_name="body.queries.0.fuse")
    assert bad.value.field == "body.queries.0.fuse"


def test_a_documents_similarity_has_the_same_bits_wherever_it_sits_among_the_candidates():
    """The candidates' matrix differs per query and per shard; a BLAS matrix-vector product gives
    a row different last bits by its position (its kernels treat a block's last rows apart)."""
    from index_shards.hybrid_search import _similarity

    rng = np.random.default_rng(7)
    matrix = rng.standard_normal((37, 384)).astype(np.float32)
    query = rng.standard_normal(384).astype(np.float32)
    present = np.ones(37, dtype=bool)
    for metric in ("ip", "l2"):
        whole = _similarity(matrix, present, query, metric)
        order = rng.permutation(37)
        assert np.array_equal(_similarity(matrix[order], present, query, metric), whole[order])
        for row in (0, 5, 36):
            assert _similarity(matrix[row:row + 1], present[:1], query, metric)[0] == whole[row]


def test_a_shards_hits_are_ordered_by_fused_score_then_doc_id_and_a_missing_document_is_named():
    """Ties at the k-th fused score are all picked; the shard keeps the lowest doc ids among them
    (the gateway merges by (score, doc id), so it must), base and segment documents alike."""
    from index_shards.docstore import StoredDoc
    from index_shards.hybrid_search import _Candidates, _columns
    from retrieval.errors import IndexIntegrityError

    base_ids = np.asarray([3, 5, 8, 9], dtype=np.int64)
    stored = {3: StoredDoc("d", "t3", "x3"), 5: StoredDoc("b", "t5", "x5"), 8: StoredDoc("z", "t8", "x8"),
              9: StoredDoc("a", "t9", "x9")}
    similarity, bm25 = np.asarray([0.1, 0.2, 0.3, np.nan, 0.5]), np.asarray([0.0, 2.0, 1.0, 3.0, 0.0])
    found = _Candidates(base_ids, ["c"], similarity, bm25, {"c": StoredDoc("c", "tc", "xc")})
    fused = np.asarray([0.5, 0.7, 0.7, 0.5, 0.7])
    columns = _columns(found, fused, np.arange(5), stored, 4, True, False)
    assert columns["doc_ids"] == ["b", "c", "z", "a"]  # 0.7 by doc id (the segment's "c" among them), then 0.5
    assert columns["scores"] == [0.7, 0.7, 0.7, 0.5]
    assert columns["titles"] == ["t5", "tc", "t8", "t9"] and columns["texts"] == ["x5", "xc", "x8", "x9"]
    assert columns["legs"] == {"dense": [0.2, 0.5, 0.3, None], "lexical": [2.0, None, 1.0, 3.0]}
    bare = _columns(found, fused, np.asarray([1, 2, 4]), stored, 2, False, False)
    assert bare["doc_ids"] == ["b", "c"] and bare["titles"] == ["", ""] and bare["texts"] == ["", ""]
    del stored[8]
    with pytest.raises(IndexIntegrityError, match="8"):
        _columns(found, fused, np.arange(5), stored, 4, True, False)


def test_a_bigger_shard_reads_the_dense_leg_deeper_first_and_answers_the_same(msmarco, tmp_path, monkeypatch):
    """``hybrid_sealed.first_read``: a shard of n documents reads the dense leg n // 128 deep at
    first (at most 512, at least the request's depth), so that a query whose terms many documents
    hold does not read it again 4× deeper, and again. On a flat index the answers — fused lists,
    each leg's scores, leg tops, statistics — are the same as with a first read of the request's
    depth, for calls of one query (the per-query path) and of many (the batch pass), with fewer
    index searches."""
    (replica,) = build(tmp_path / "one", msmarco, 1)
    live = replica.get(None)
    documents = live.base.lexicon.count
    assert documents // 128 > 20  # a shard big enough to read deeper than the request's 20
    assert hybrid_sealed.first_read(live, 20) == documents // 128
    assert hybrid_sealed.first_read(live, 600) == 600  # never shallower than asked
    monkeypatch.setattr(hybrid_sealed, "FIRST_READ_SHARE", 1)
    assert hybrid_sealed.first_read(live, 20) == hybrid_sealed.FIRST_READ_MAX

    searches: list[int] = []
    search_ids = Shard.search_ids

    def counted(self, queries, k, **kwargs):  # the real search, counted
        searches.append(k)
        return search_ids(self, queries, k, **kwargs)

    monkeypatch.setattr(Shard, "search_ids", counted)
    vectors = msmarco.query_vectors
    queries = [LexicalQuery(msmarco.dataset.queries[q], None, WeightedFusion(0.8, 0.2, 20)) for q in msmarco.query_ids]
    params = SearchParams(K, None, lexical=True)

    def answers(share: int) -> tuple[list, list, int]:
        monkeypatch.setattr(hybrid_sealed, "FIRST_READ_SHARE", share)
        searches.clear()
        alone = [replica.search(vectors[i:i + 1], params, [query]) for i, query in enumerate(queries)]
        together = replica.search(vectors, params, queries)
        return [(r.results[0], r.stats[0]) for r in alone], list(zip(together.results, together.stats, strict=True)), \
            len(searches)

    shallow_alone, shallow_together, shallow_searches = answers(10**9)  # the request's depth first
    deep_alone, deep_together, deep_searches = answers(8)  # documents // 8 ≥ 512: the most
    assert deep_alone == shallow_alone
    assert deep_together == shallow_together == shallow_alone
    assert deep_searches < shallow_searches  # the deeper reads that followed a shallow first read
    assert deep_searches == len(queries) + 1  # one search a call


@pytest.mark.parametrize("factory, deeper", [("HNSW16", False), ("IVF4,Flat", False), ("Flat", True)])
def test_only_a_flat_shard_reads_its_dense_leg_deeper_first(tmp_path, monkeypatch, factory, deeper):
    """HNSW and IVF shards keep the request's depth for the first dense read (their lists are
    approximate: the last score does not bound what they missed, and a deep first read agreed
    less with the exact answer); a flat shard's scan is exact and costs the same at any depth."""
    documents, vectors, version = random_corpus(600)
    build_collection(tmp_path, documents, vectors, version, BuildConfig("c", 1, factory=factory), show_progress=False)
    directory, _ = resolve_version(tmp_path, "c")
    live = ShardVersions(Shard.load(shard_dir(directory, 0), device="cpu")).get(None)
    monkeypatch.setattr(hybrid_sealed, "FIRST_READ_SHARE", 1)
    assert live.base.filtered.scans_all is deeper
    assert hybrid_sealed.first_read(live, 20) == (hybrid_sealed.FIRST_READ_MAX if deeper else 20)
