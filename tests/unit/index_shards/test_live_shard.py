"""A shard taking writes, against a model of the documents: upserts replace (never duplicate),
deletes hide, searches over base + segment equal brute force over the model, reads return the
latest copy bit for bit, replays change nothing."""

import numpy as np
import pytest

from index_shards.build import BuildConfig, build_collection
from index_shards.layout import resolve_version, shard_dir
from index_shards.segment import LiveShard
from index_shards.shard import Shard
from index_shards.wal import DELETE, UPSERT, WalRecord
from retrieval.errors import InvalidRequest
from retrieval.filters import parse_filter
from tests.conftest import random_corpus

DIM = 16


@pytest.fixture(params=["Flat", "HNSW32"])
def live(request, tmp_path):
    documents, vectors, version = random_corpus(n=400, dim=DIM)
    build_collection(tmp_path, documents, vectors, version, BuildConfig("c", 1, factory=request.param),
                     show_progress=False)
    directory, _ = resolve_version(tmp_path, "c")
    shard = LiveShard(Shard.load(shard_dir(directory, 0), device="cpu"))
    model = {d.doc_id: (d.title, d.text, dict(d.metadata), vectors[i]) for i, d in enumerate(documents)}
    return shard, model


def writes(rng, model, first_seq: int, count: int) -> list[WalRecord]:
    records = []
    for seq in range(first_seq, first_seq + count):
        roll = rng.random()
        existing = sorted(model)
        if roll < 0.3 and existing:  # delete
            doc_id = existing[int(rng.integers(len(existing)))]
            model.pop(doc_id)
            records.append(WalRecord(seq, DELETE, doc_id))
            continue
        doc_id = existing[int(rng.integers(len(existing)))] if roll < 0.6 and existing else f"new-{seq}"
        vector = rng.standard_normal(DIM).astype(np.float32)
        vector /= np.linalg.norm(vector)
        metadata = {"i": int(seq), "kind": "new" if doc_id.startswith("new") else "replaced"}
        model[doc_id] = (f"title {seq}", f"text {seq}", metadata, vector)
        records.append(WalRecord(seq, UPSERT, doc_id, f"title {seq}", f"text {seq}", metadata, vector))
    return records


def brute_force(model, query, k, filter_=None):
    scored = [(float(np.dot(v, query)), doc_id) for doc_id, (_, _, metadata, v) in model.items()
              if filter_ is None or filter_.matches(doc_id, metadata)]
    return [doc_id for _, doc_id in sorted(scored, key=lambda s: (-s[0], s[1]))[:k]]


def test_writes_searches_and_reads_follow_the_model(live):
    shard, model = live
    rng = np.random.default_rng(3)
    seq = 1
    for _ in range(5):
        records = writes(rng, model, seq, 60)
        shard.apply(records)
        shard.apply(records)  # a re-sent batch changes nothing
        seq += len(records)
        assert shard.applied_seq == seq - 1
        queries = rng.standard_normal((8, DIM)).astype(np.float32)
        for query, row in zip(queries, shard.search(queries, 10, with_metadata=True), strict=True):
            want = brute_force(model, query, 10)
            got = row["doc_ids"]
            assert len(got) == len(set(got)) == 10  # an id is never duplicated
            assert len(set(got) & set(want)) >= 9 if shard.base.manifest.factory != "Flat" else got == want
            assert all(model[d][2] == m for d, m in zip(got, row["metadata"], strict=True))
    latest = {d.doc_id: d for d in shard.documents()}
    assert set(latest) == set(model)
    for doc_id, (title, text, metadata, vector) in model.items():
        stored = shard.get(doc_id, with_vector=True)
        assert stored is not None and (stored.title, stored.text, stored.metadata) == (title, text, metadata)
        assert stored.vector.tobytes() == np.asarray(vector, dtype=np.float32).tobytes()
        assert latest[doc_id].vector.tobytes() == stored.vector.tobytes()
    assert shard.get("never-written") is None


def test_filters_see_the_segment_and_skip_tombstones(live):
    shard, model = live
    rng = np.random.default_rng(5)
    shard.apply(writes(rng, model, 1, 200))
    new_only = parse_filter({"must": [{"key": "kind", "match": {"value": "new"}}]})
    queries = rng.standard_normal((5, DIM)).astype(np.float32)
    for query, row in zip(queries, shard.search(queries, 10, filter_=new_only), strict=True):
        assert row["doc_ids"] == brute_force(model, query, 10, new_only)


def test_a_listing_pages_through_the_live_documents_in_id_order(live):
    """scan: base and segment merged in id order, replaced and deleted base documents hidden,
    the count of every match on each page, the vectors as stored."""
    shard, model = live
    rng = np.random.default_rng(9)
    shard.apply(writes(rng, model, 1, 150))
    for data in ({}, {"must": [{"key": "kind", "match": {"value": "new"}}]},
                 {"must_not": [{"key": "kind", "match": {"value": "new"}}]}):
        filter_ = parse_filter(data)
        expected = sorted(d for d, (_, _, metadata, _) in model.items() if filter_.matches(d, metadata))
        listed, after = [], ""
        while True:
            total, page = shard.scan(filter_, after, 37)
            assert total == len(expected)
            listed.extend(page)
            if len(page) < 37:
                break
            after = page[-1].doc_id
        assert [d.doc_id for d in listed] == expected
        for doc in listed:
            title, text, metadata, vector = model[doc.doc_id]
            assert (doc.title, doc.text, doc.metadata) == (title, text, metadata)
            assert doc.vector.tobytes() == np.asarray(vector, dtype=np.float32).tobytes()
    assert shard.scan(parse_filter({}), "", 0) == (len(model), [])


def test_out_of_order_writes_are_refused(live):
    shard, _ = live
    with pytest.raises(InvalidRequest, match="does not follow"):
        shard.apply([WalRecord(5, DELETE, "doc-1")])


def test_a_long_stream_of_small_writes_keeps_filtered_searches_exact(live):
    """Many small batches with searches between them: the segment's payload chunks merge (more
    than 8) and its matrix drops dead rows (over 1,024 replaced), and results stay exact."""
    shard, model = live
    rng = np.random.default_rng(13)
    seq = 1
    replaced = parse_filter({"must": [{"key": "kind", "match": {"value": "replaced"}}]})
    recent = parse_filter({"must": [{"key": "i", "range": {"gte": 1500}}]})
    for round_ in range(40):
        records = writes(rng, model, seq, 60)
        shard.apply(records)
        seq += len(records)
        query = rng.standard_normal((1, DIM)).astype(np.float32)
        filter_ = replaced if round_ % 2 else recent
        got = shard.search(query, 10, filter_=filter_, ef_search=200)[0]["doc_ids"]
        want = brute_force(model, query[0], 10, filter_)
        if shard.base.manifest.factory == "Flat":
            assert got == want
        else:
            assert len(set(got) & set(want)) >= min(9, len(want)) and len(got) == min(10, len(want))
    assert shard._rows.count < seq - 1  # dead rows were dropped on the way


def test_a_frozen_view_keeps_its_documents_while_later_writes_grow_and_rebuild_the_segment(live):
    """The segment keeps one copy of each vector (its matrix); the documents frozen at a seq (what
    compaction and snapshots read, lazily) are still that seq's — vectors included — after later
    writes grew the matrix and replaced most rows until it was rebuilt."""
    shard, model = live
    rng = np.random.default_rng(11)
    shard.apply(writes(rng, model, 1, 300))
    frozen_at = {doc_id: (title, text, dict(metadata), vector.copy()) for doc_id, (title, text, metadata, vector)
                 in model.items()}
    seq, frozen = shard.frozen_documents()
    # 3,000 rewrites of the same 50 ids: the matrix grows, then more than half its rows are dead
    ids = sorted(model)[:50]
    later = [WalRecord(seq + 1 + n, UPSERT, ids[n % 50], "t", "x", {}, rng.standard_normal(DIM).astype(np.float32))
             for n in range(3000)]
    shard.apply(later)
    held = {d.doc_id: d for d in frozen}
    assert set(held) == set(frozen_at)
    for doc_id, (title, text, metadata, vector) in frozen_at.items():
        assert (held[doc_id].title, held[doc_id].text, held[doc_id].metadata) == (title, text, metadata)
        np.testing.assert_array_equal(held[doc_id].vector, vector)
    last = later[-1]
    np.testing.assert_array_equal(shard.get(last.doc_id, with_vector=True).vector, last.vector)
