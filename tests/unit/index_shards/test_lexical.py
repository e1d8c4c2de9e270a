"""The lexical leg: a sharded BM25 ranking (each shard's statistics summed, every shard scoring
with the sum) equals the unsharded one — ids, order and score bits — on every msmarco and
dbpedia query, before writes, after upserts and deletes, and after a compaction; and the
unsharded ranking is BM25 as a plain reference implementation computes it."""

import math
from collections import Counter

import numpy as np
import pytest

from index_shards import compaction
from index_shards.build import BuildConfig, build_collection
from index_shards.layout import resolve_version, shard_dir
from index_shards.shard import Shard
from index_shards.versions import ShardVersions
from index_shards.writes import accept
from retrieval.analysis import analyze, document_terms, query_terms
from retrieval.bm25 import K1, B, CorpusStats, LexicalQuery, decode_lexical_queries, encode_lexical_queries
from retrieval.contract import SearchParams
from retrieval.datasets import load_beir
from retrieval.errors import InvalidRequest
from retrieval.filters import parse_filter
from retrieval.records import DELETE, UPSERT, WalRecord
from retrieval.routing import hash_shard
from retrieval.types import Document, EmbeddingVersion
from tests.conftest import data_dir

DIM = 8
SHARDS = 4
K = 10


def build(root, documents, shards: int) -> list[ShardVersions]:
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((len(documents), DIM)).astype(np.float32)  # the dense leg is not under test
    build_collection(root, documents, vectors, EmbeddingVersion("lex", "0" * 64, DIM),
                     BuildConfig("c", shards, factory="Flat"), show_progress=False)
    directory, _ = resolve_version(root, "c")
    return [ShardVersions(Shard.load(shard_dir(directory, s), device="cpu"), data_dir=root / f"data-{s}")
            for s in range(shards)]


def lexical(replica: ShardVersions, text: str, k: int, corpus: CorpusStats | None = None,
            filter_json: str | None = None) -> tuple[dict, CorpusStats]:
    reply = replica.search(np.zeros((0, DIM)), SearchParams(k, None, filter=filter_json, lexical=True),
                           [LexicalQuery(text, corpus)])
    return reply.results[0], reply.stats[0]


def sharded_search(replicas: list[ShardVersions], text: str, k: int, filter_json: str | None = None):
    """The gateway's protocol over ``replicas``: scored under the sum of the shards' statistics,
    merged as the gateway merges (score, doc id)."""
    stats = CorpusStats.total(lexical(r, text, k)[1] for r in replicas)
    rows = []
    for replica in replicas:
        hits, own = lexical(replica, text, k, stats, filter_json)
        rows.extend(zip(hits["scores"], hits["doc_ids"], strict=True))
    rows.sort(key=lambda row: (-row[0], row[1]))
    return [(doc_id, value) for value, doc_id in rows[:k]]


def unsharded_search(replica: ShardVersions, text: str, k: int, filter_json: str | None = None):
    hits, _ = lexical(replica, text, k, None, filter_json)
    return list(zip(hits["doc_ids"], hits["scores"], strict=True))


def reference_bm25(terms: dict[str, Counter], text: str, k: int):
    """BM25 straight from its definition, over the live documents' term counts."""
    lengths = {doc_id: sum(c.values()) for doc_id, c in terms.items()}
    average = sum(lengths.values()) / len(lengths)
    scores: dict[str, float] = {}
    for term, count in query_terms(text):
        df = sum(1 for c in terms.values() if term in c)
        if not df:
            continue
        idf = math.log(1 + (len(terms) - df + 0.5) / (df + 0.5))
        for doc_id, c in terms.items():
            if term in c:
                tf = c[term]
                scores[doc_id] = scores.get(doc_id, 0.0) + idf * count * tf * (K1 + 1) / (
                    tf + K1 * (1 - B + B * lengths[doc_id] / average))
    return sorted(scores.items(), key=lambda item: (-item[1], item[0]))[:k]


def write(replica: ShardVersions, records: list[WalRecord]) -> None:
    version = replica.ready_ids()[0]
    live = replica.get(version)
    numbered = [WalRecord(live.applied_seq + i + 1, r.op, r.doc_id, r.title, r.text, r.metadata, r.vector)
                for i, r in enumerate(records)]
    accept(replica, version, 0, None, numbered)


def mutate(dataset, documents: list[Document], rng) -> tuple[dict[str, Document], list[WalRecord]]:
    """Upserts (new documents, and existing ones given another document's text) and deletes."""
    model = {d.doc_id: d for d in documents}
    records = []
    ids = sorted(model)
    for i in range(300):
        roll = rng.random()
        doc_id = ids[int(rng.integers(len(ids)))]
        if roll < 0.3 and doc_id in model:
            model.pop(doc_id)
            records.append(WalRecord(0, DELETE, doc_id))
            continue
        donor = documents[int(rng.integers(len(documents)))]
        target = f"new-{i}" if roll < 0.6 else doc_id
        text = f"{donor.text} {dataset.queries[sorted(dataset.queries)[i % len(dataset.queries)]]}"
        model[target] = Document(target, text, donor.title, {"written": True})
        records.append(WalRecord(0, UPSERT, target, donor.title, text, {"written": True},
                                 rng.standard_normal(DIM).astype(np.float32)))
    return model, records


@pytest.mark.parametrize("name", ["msmarco", "dbpedia"])
def test_sharded_bm25_equals_unsharded_on_every_query_through_writes_and_compaction(name, tmp_path):
    dataset = load_beir(data_dir() / name)
    documents = list(dataset.corpus)
    sharded = build(tmp_path / "sharded", documents, SHARDS)
    single = build(tmp_path / "single", documents, 1)[0]
    queries = [dataset.queries[q] for q in sorted(dataset.queries)]

    def check(model: dict[str, Document], *, reference: bool) -> None:
        terms = {doc_id: Counter(document_terms(d.title, d.text)) for doc_id, d in model.items()}
        for text in queries:
            want = unsharded_search(single, text, K)
            assert sharded_search(sharded, text, K) == want, text  # ids, order and score bits
            if reference:
                expected = reference_bm25(terms, text, K)
                assert [d for d, _ in want] == [d for d, _ in expected], text
                assert np.allclose([s for _, s in want], [s for _, s in expected], rtol=1e-12)

    check({d.doc_id: d for d in documents}, reference=True)
    rng = np.random.default_rng(7)
    model, records = mutate(dataset, documents, rng)
    for start in range(0, len(records), 50):
        batch = records[start:start + 50]
        write(single, batch)
        for s, replica in enumerate(sharded):
            write(replica, [r for r in batch if hash_shard(r.doc_id, SHARDS) == s])
    assert sum(r.get(None).segment_size for r in sharded) > 0
    check(model, reference=True)
    for replica in [*sharded, single]:
        compaction.compact(replica, replica.ready_ids()[0])
        assert replica.get(None).segment_size == 0
    check(model, reference=False)
    # and filters apply to both phases' documents alike (statistics stay the collection's)
    written = parse_filter({"must": [{"key": "written", "match": {"value": True}}]}).canonical()
    for text in queries[:10]:
        assert sharded_search(sharded, text, K, written) == unsharded_search(single, text, K, written)
        assert all(model[d].metadata.get("written") for d, _ in unsharded_search(single, text, K, written))


def test_the_analyzer_stems_and_drops_stop_words():
    assert analyze("The Running of the Studies, ÉTÉ_2024!") == ["run", "studi", "été", "2024"]
    assert query_terms("run running runs the") == [("run", 3)]


def test_lexical_queries_travel_in_one_encoding_and_bad_ones_are_named(tmp_path):
    replica = build(tmp_path, [Document(f"d{i}", f"text {i}", "", {}) for i in range(20)], 1)[0]
    queries = [LexicalQuery("text 3"), LexicalQuery("text", CorpusStats(40, 80, {"text": 40}))]
    assert decode_lexical_queries(encode_lexical_queries(queries), max_queries=8) == (queries, b"")
    assert decode_lexical_queries(encode_lexical_queries(queries, b"vectors"), max_queries=8) == (queries, b"vectors")
    params = SearchParams.from_query_string(SearchParams(5, None, lexical=True).query_string(), 100)
    reply = replica.search(np.zeros((0, DIM)), params, queries)
    assert reply.stats == [CorpusStats(20, 40, {"text": 20, "3": 1}), CorpusStats(20, 40, {"text": 20})]
    assert reply.results[0]["doc_ids"][0] == "d3" and len(reply.results[1]["doc_ids"]) == 5
    def framed(head: bytes) -> bytes:
        return len(head).to_bytes(4, "little") + head

    for body, field in ((b"[", "body"), (b"\xff\x00\x00\x00{}", "body"), (framed(b"["), "body"),
                        (framed(b'{"queries": []}'), "body.queries"),
                        (framed(b'{"queries": [{"text": 3}]}'), "body.queries.0.text"),
                        (framed(b'{"queries": [{"text": "%s"}]}' % (b"x" * 10_001)), "body.queries.0.text"),
                        (framed(b'{"queries": [{"text": "a", "corpus": {"docs": -1, "length": 0}}]}'),
                         "body.queries.0.corpus.docs"),
                        (framed(b'{"queries": [{"text": "a", "corpus": {"docs": 1, "length": 0, "df": {"a": 2}}}]}'),
                         "body.queries.0.corpus.df")):
        with pytest.raises(InvalidRequest) as error:
            decode_lexical_queries(body, max_queries=8)
        assert error.value.field == field, body
