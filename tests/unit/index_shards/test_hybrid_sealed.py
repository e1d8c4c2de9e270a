"""The batch pass of a weighted hybrid (``index_shards.hybrid_sealed``): on a shard with no
writes since its base, a batch of queries is answered in whole-batch NumPy passes — and every
query's answer (hits, each leg's score, leg tops, statistics) has the same bits as the per-query
path gives it alone, on real MiniLM vectors and msmarco texts: for several weights, depths and k,
with and without the collection's statistics, under filters, on an l2 collection, for documents
only their BM25 brings in, for queries that must read the dense leg deeper, and for a base that
holds a document without a vector (after a compaction)."""

import math

import numpy as np
import pytest

from index_shards import compaction, hybrid_sealed
from index_shards.build import BuildConfig, build_collection
from index_shards.hybrid_sealed import MIN_SEALED_BATCH, batch_pass_applies, sealed, sealed_batch
from index_shards.hybrid_search import fused_search
from index_shards.layout import resolve_version, shard_dir
from index_shards.segment import LiveShard
from index_shards.shard import Shard
from index_shards.versions import ShardVersions
from retrieval.analysis import query_terms
from retrieval.bm25 import CorpusStats, LexicalQuery
from retrieval.filters import parse_filter
from retrieval.fusion import WeightedFusion
from retrieval.records import UPSERT, WalRecord
from retrieval.types import Document, EmbeddingVersion
from tests.unit.index_shards.test_lexical import write
from tests.unit.index_shards.test_weighted_hybrid import axis_query, unit_at


def tagged(msmarco) -> list[Document]:
    """msmarco's documents with a field to filter on (five values, in turn)."""
    return [Document(d.doc_id, d.text, d.title, {"topic": i % 5, "even": i % 2 == 0})
            for i, d in enumerate(msmarco.documents)]


def live_shards(root, documents, vectors, version, shards: int, metric: str = "ip") -> list[LiveShard]:
    build_collection(root, documents, vectors, version, BuildConfig("c", shards, factory="Flat", metric=metric),
                     show_progress=False)
    directory, _ = resolve_version(root, "c")
    return [LiveShard(Shard.load(shard_dir(directory, s), device="cpu")) for s in range(shards)]


def collection_stats(lives: list[LiveShard], text: str) -> CorpusStats:
    terms = [term for term, _ in query_terms(text)]
    return CorpusStats.total(live.lexical_view(terms).stats() for live in lives)


def assert_batch_is_alone(live: LiveShard, vectors: np.ndarray, queries: list[LexicalQuery], k: int,
                          filter_=None) -> None:
    """One call with the whole batch (the batch pass) against each query in a call of its own
    (the per-query path): equal, floats to the bit."""
    assert batch_pass_applies(live, len(queries))
    together = fused_search(live, vectors, queries, k, filter_=filter_)
    for i, query in enumerate(queries):
        (alone,) = fused_search(live, vectors[i:i + 1], [query], k, filter_=filter_)
        assert together[i][0] == alone[0], (query.text, k, query.fuse)
        assert together[i][1] == alone[1]
        for mine, theirs in zip(together[i][0]["scores"], alone[0]["scores"], strict=True):
            assert math.copysign(1.0, mine) == math.copysign(1.0, theirs) and mine == theirs


SPECS = [WeightedFusion(0.8, 0.2, 20), WeightedFusion(0.3, 0.7, 20), WeightedFusion(0.5, 0.5, 50),
         WeightedFusion(0.8, 0.2, 5), WeightedFusion(1.0, 0.0, 20), WeightedFusion(0.0, 1.0, 10)]


def test_a_batch_on_a_sealed_shard_answers_every_query_as_the_per_query_path(msmarco, tmp_path):
    lives = live_shards(tmp_path / "c", tagged(msmarco), msmarco.vectors, msmarco.version, 2)
    texts = [msmarco.dataset.queries[q] for q in msmarco.query_ids]
    vectors = msmarco.query_vectors.astype(np.float32)
    summed = [collection_stats(lives, text) for text in texts]
    live = lives[0]
    for spec in SPECS:
        for k in (10, 1, 30):
            for corpus in (summed, None):
                queries = [LexicalQuery(text, corpus[i] if corpus else None, spec) for i, text in enumerate(texts)]
                for start in range(0, len(texts), 7):
                    chunk = slice(start, start + 7)
                    if len(queries[chunk]) >= MIN_SEALED_BATCH:
                        assert_batch_is_alone(live, vectors[chunk], queries[chunk], k)
    # filters: both legs keep to the documents selected, whatever the filter's share
    queries = [LexicalQuery(text, summed[i], SPECS[0]) for i, text in enumerate(texts)]
    for condition in ({"must": [{"key": "topic", "match": {"value": 3}}]},
                      {"must_not": [{"key": "even", "match": {"value": True}}]},
                      {"must": [{"key": "topic", "match": {"any": [0, 1, 2, 3]}}]}):
        assert_batch_is_alone(live, vectors[:14], queries[:14], 10, parse_filter(condition))


def test_the_batch_pass_finishes_the_queries_itself(msmarco, tmp_path):
    """The pass is not a detour to the per-query path: it answers every query — adding the
    documents whose BM25 could reach the k-th, reading the dense leg deeper where more of them
    than a few times its depth could, and a query none of whose terms the shard holds (its
    dense leg alone)."""
    (live,) = live_shards(tmp_path / "c", msmarco.documents, msmarco.vectors, msmarco.version, 1)
    texts = [msmarco.dataset.queries[q] for q in msmarco.query_ids] + ["zzzqx unseenword"]
    vectors = np.concatenate([msmarco.query_vectors, msmarco.query_vectors[:1]]).astype(np.float32)
    queries = [LexicalQuery(text, None, WeightedFusion(0.8, 0.2, 20)) for text in texts]
    answers = sealed_batch(live, vectors, queries, 10, 20, nprobe=None, ef_search=None, filter_=None)
    assert all(answer is not None and len(answer.picked) >= 10 for answer in answers)
    assert answers[-1].leg_tops["lexical"] == [] and not answers[-1].bm25.any()
    assert_batch_is_alone(live, vectors[-3:], queries[-3:], 10)


def test_documents_only_bm25_brings_in_and_queries_that_read_deeper(tmp_path, monkeypatch):
    """Documents in neither leg's first candidates whose BM25 lifts them into the top k (the
    pass adds them), and a query with more such documents than a few times the dense leg's depth
    (the pass reads that leg deeper, as the per-query path does): the batch equals each alone."""
    rng = np.random.default_rng(5)
    query = axis_query()
    groups = [("near", 30, 0.95, "orchard harvest season"), ("worded", 300, 0.0, "apple apple apple"),
              ("both", 10, 0.9, "apple orchard harvest season"), ("far", 200, -0.5, "pear tree")]
    documents, vectors = [], []
    for name, count, cosine, body in groups:
        for i in range(count):  # lengths differ, so the worded documents' BM25 do too (no ties)
            documents.append(Document(f"{name}-{i:03d}", f"{body} {name} {' '.join(['filler'] * (i % 40))}", ""))
            vectors.append(unit_at(rng, cosine))
    (live,) = live_shards(tmp_path / "c", documents, np.stack(vectors), EmbeddingVersion("t", "0" * 64, 8), 1)
    reads: list[int] = []
    real_pass = hybrid_sealed._pass

    def recording(live_, vectors_, queries_, k_, read, *rest):  # the real pass, its depths noted
        reads.append(read)
        return real_pass(live_, vectors_, queries_, k_, read, *rest)

    monkeypatch.setattr(hybrid_sealed, "_pass", recording)
    batch = [LexicalQuery("apple", None, WeightedFusion(0.5, 0.5, 10)),
             LexicalQuery("apple harvest", None, WeightedFusion(0.3, 0.7, 5)),
             LexicalQuery("pear", None, WeightedFusion(0.8, 0.2, 10))]
    assert_batch_is_alone(live, np.stack([query] * 3), batch, 10)
    assert reads[0] == 10 and any(read > 10 for read in reads[1:])  # some query read deeper
    found = fused_search(live, query[None, :], batch[:1], 10)[0][0]["doc_ids"]
    assert all(doc_id.startswith("both-") for doc_id in found)


def test_an_l2_collection_and_a_base_holding_a_document_without_a_vector(msmarco, tmp_path):
    documents, vectors = msmarco.documents[:600], msmarco.vectors[:600]
    (l2,) = live_shards(tmp_path / "l2", documents, vectors, msmarco.version, 1, metric="l2")
    texts = [msmarco.dataset.queries[q] for q in msmarco.query_ids]
    queries = [LexicalQuery(text, None, WeightedFusion(0.6, 0.4, 10)) for text in texts]
    assert_batch_is_alone(l2, msmarco.query_vectors[:21].astype(np.float32), queries[:21], 10)
    # a document without a vector, carrying the queries' words, compacted into the base
    root = tmp_path / "bare"
    build_collection(root, documents, vectors, msmarco.version, BuildConfig("c", 1, factory="Flat"),
                     show_progress=False)
    directory, _ = resolve_version(root, "c")
    replica = ShardVersions(Shard.load(shard_dir(directory, 0), device="cpu"), data_dir=root / "data")
    write(replica, [WalRecord(0, UPSERT, "no-vector", "", " ".join(texts[:21]), {}, None)])
    assert not sealed(replica.get(None))
    compaction.compact(replica, replica.ready_ids()[0])
    live = replica.get(None)
    assert sealed(live) and live.base.bare.size == 1
    batch = [LexicalQuery(text, None, WeightedFusion(0.2, 0.8, 10)) for text in texts[:21]]
    assert_batch_is_alone(live, msmarco.query_vectors[:21].astype(np.float32), batch, 10)
    hits = fused_search(live, msmarco.query_vectors[:21].astype(np.float32), batch, 10)
    legs = [(doc_id, dense) for columns, _ in hits
            for doc_id, dense in zip(columns["doc_ids"], columns["legs"]["dense"], strict=True)]
    assert ("no-vector", None) in legs  # found by its words alone, with no dense score
    # the batch pass reads candidates' vectors by row: the same floats as by int id, none for it
    over_base = LiveShard(live.base)
    rows = np.arange(live.base.lexicon.count)
    by_row, present = over_base.base_row_matrix(rows)
    by_id, present_by_id = over_base.base_matrix(live.base.lexicon.int_ids)
    assert np.array_equal(by_row, by_id) and np.array_equal(present, present_by_id) and (~present).sum() == 1


@pytest.mark.parametrize("cells", [200, 1 << 22])
def test_a_batch_split_to_bound_its_memory_answers_the_same(msmarco, tmp_path, cells, monkeypatch):
    import index_shards.hybrid_sealed as hybrid_sealed

    (live,) = live_shards(tmp_path / "c", msmarco.documents, msmarco.vectors, msmarco.version, 1)
    monkeypatch.setattr(hybrid_sealed, "MAX_CELLS", cells)  # 200: one query a pass
    texts = [msmarco.dataset.queries[q] for q in msmarco.query_ids[:9]]
    queries = [LexicalQuery(text, None, WeightedFusion(0.8, 0.2, 20)) for text in texts]
    assert_batch_is_alone(live, msmarco.query_vectors[:9].astype(np.float32), queries, 10)


@pytest.mark.parametrize("filtered", [False, True])
def test_a_deeper_pass_reuses_its_queries_lexical_leg_as_scored(msmarco, tmp_path, filtered):
    """The queries a pass sends deeper keep their lexical leg (no dense read changes it): their
    share of the batch's arrays is what scoring those queries alone gives, array for array."""
    (live,) = live_shards(tmp_path / "c", tagged(msmarco), msmarco.vectors, msmarco.version, 1)
    filter_ = parse_filter({"must": [{"key": "topic", "match": {"any": [1, 3]}}]}) if filtered else None
    texts = [msmarco.dataset.queries[q] for q in msmarco.query_ids[:12]] + ["zzzqx unseenword"]
    queries = [LexicalQuery(text, None, WeightedFusion(0.7, 0.3, 5 + 7 * (i % 3))) for i, text in enumerate(texts)]
    leg = hybrid_sealed._LexicalLeg.score(live, queries, 10, filter_)
    for chosen in ([0], [2, 5, 11], [1, 12], list(range(13))):
        alone = hybrid_sealed._LexicalLeg.score(live, [queries[i] for i in chosen], 10, filter_)
        part = leg.of(chosen)
        assert part.owns == alone.owns
        for name in ("per_bm25", "bm25", "touched_q", "touched_rows", "touched", "in_top"):
            mine, theirs = getattr(part, name), getattr(alone, name)
            assert mine.dtype == theirs.dtype and np.array_equal(mine, theirs), (chosen, name)


def test_a_big_base_answers_a_batch_the_per_query_way_with_the_same_answers(msmarco, tmp_path, monkeypatch):
    """Past MAX_SEALED_ROWS documents the per-query path is the cheaper one (measured in the
    constant's comment): a batch there never reaches the batch pass, and answers as before."""
    (live,) = live_shards(tmp_path / "c", msmarco.documents, msmarco.vectors, msmarco.version, 1)
    texts = [msmarco.dataset.queries[q] for q in msmarco.query_ids][:7]
    vectors = msmarco.query_vectors[:7].astype(np.float32)
    queries = [LexicalQuery(text, None, WeightedFusion(0.8, 0.2, 20)) for text in texts]
    assert batch_pass_applies(live, 7) and not batch_pass_applies(live, MIN_SEALED_BATCH - 1)
    small = fused_search(live, vectors, queries, 10)
    monkeypatch.setattr(hybrid_sealed, "MAX_SEALED_ROWS", live.base.lexicon.count - 1)
    assert sealed(live) and not batch_pass_applies(live, 7)
    passes = []
    monkeypatch.setattr(hybrid_sealed, "_pass", lambda *args: passes.append(args) or [None] * len(args[2]))
    assert fused_search(live, vectors, queries, 10) == small and not passes
