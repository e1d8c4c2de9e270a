"""Exact top-k merge of per-shard results: score descending, ties by doc id ascending."""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence

from retrieval.types import Hit


def _rank_key(hit: Hit) -> tuple[float, str]:
    return (-hit.score, hit.doc_id)


def merge_topk(per_shard: Iterable[Sequence[Hit]], k: int) -> list[Hit]:
    """Merge the hit lists of several shards into the global top ``k``.

    Exact when every shard returned its own top ``k``: a document of the global top k is
    necessarily in the top k of its shard. Ties in score are broken by doc id so the
    order does not depend on which shard answered first.
    """
    if k <= 0:
        return []
    return heapq.nsmallest(k, (hit for hits in per_shard for hit in hits), key=_rank_key)


def sort_hits(hits: Iterable[Hit]) -> list[Hit]:
    """All hits in canonical order (score desc, doc id asc)."""
    return sorted(hits, key=_rank_key)


def merge_topk_columns(per_shard: Sequence[tuple[Sequence[str], Sequence[float]]], k: int) -> list[tuple[int, int]]:
    """:func:`merge_topk` over columnar results: ``per_shard[s] = (doc_ids, scores)``.

    Returns (s, position) of the global top ``k``, in order. The gateway's hot path uses this
    so it builds records for the k winners only, not for every shard's candidates.
    """
    if k <= 0:
        return []
    keys = ((-score, doc_id, s, i)
            for s, (doc_ids, scores) in enumerate(per_shard)
            for i, (doc_id, score) in enumerate(zip(doc_ids, scores)))
    return [(s, i) for _, _, s, i in heapq.nsmallest(k, keys)]
