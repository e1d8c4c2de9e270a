import random

from retrieval.merge import merge_topk, sort_hits
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
