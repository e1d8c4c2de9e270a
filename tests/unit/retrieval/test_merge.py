import random

from retrieval.merge import merge_topk, merge_topk_columns, sort_hits
from retrieval.types import Hit


def hit(doc_id: str, score: float, shard: int = 0) -> Hit:
    return Hit(doc_id, score, shard)


def test_merge_orders_by_score_then_doc_id():
    shard_a = [hit("b", 0.9), hit("d", 0.5)]
    shard_b = [hit("a", 0.9, 1), hit("c", 0.7, 1)]
    merged = merge_topk([shard_a, shard_b], 3)
    assert [h.doc_id for h in merged] == ["a", "b", "c"]


def test_merge_is_exact_against_global_sort():
    rng = random.Random(7)
    hits = [hit(f"d{i}", round(rng.random(), 2), i % 4) for i in range(400)]  # rounding forces ties
    per_shard = [sort_hits(h for h in hits if h.shard_id == s)[:10] for s in range(4)]
    assert merge_topk(per_shard, 10) == sort_hits(hits)[:10]


def test_merge_edge_cases():
    assert merge_topk([], 5) == []
    assert merge_topk([[hit("a", 1.0)]], 0) == []
    assert [h.doc_id for h in merge_topk([[hit("a", 1.0)], []], 5)] == ["a"]


def test_columnar_merge_agrees_with_record_merge():
    rng = random.Random(3)
    per_shard = [sort_hits(hit(f"s{s}d{i}", round(rng.random(), 1), s) for i in range(12))[:10] for s in range(3)]
    columns = [([h.doc_id for h in hits], [h.score for h in hits]) for hits in per_shard]
    winners = merge_topk_columns(columns, 10)
    assert [per_shard[s][i] for s, i in winners] == merge_topk(per_shard, 10)
    assert merge_topk_columns(columns, 0) == []
