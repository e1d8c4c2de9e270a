"""Fusing ranked lists of the dense and lexical legs into one (hybrid search).

* **rrf** — reciprocal rank fusion: a document scores Σ 1 / (rrf_k + rank) over the legs that
  returned it (rank from 1). Scale-free: needs no calibration between cosine and BM25.
* **weighted** — each leg's scores min-max normalized over the hits it returned (the best → 1,
  its last → 0; a leg with one distinct score gives 1), then Σ weight × normalized (Weaviate's
  relativeScoreFusion); a leg that did not return a document adds 0.

Ties break by doc id, as every merge in shardrag. The default weights were chosen on msmarco
only and applied unchanged to dbpedia (``benchmarks/hybrid_quality.py``; docs/hybrid.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from retrieval.errors import InvalidRequest
from retrieval.types import Hit

DENSE, LEXICAL = "dense", "lexical"
LEGS = (DENSE, LEXICAL)
DEFAULT_RRF_K = 60
DEFAULT_WEIGHTS: Mapping[str, float] = {DENSE: 0.6, LEXICAL: 0.4}  # chosen on msmarco (docs/hybrid.md)


@dataclass(slots=True, frozen=True)
class LegRank:
    """Where one leg ranked a document: its rank (from 1) and its own score."""

    rank: int
    score: float


@dataclass(slots=True, frozen=True)
class FusedHit:
    hit: Hit  # the document as a leg returned it (its score is the leg's)
    score: float  # the fused score
    legs: Mapping[str, LegRank] = field(default_factory=dict)


def fuse(legs: Mapping[str, Sequence[Hit]], k: int, *, method: str = "rrf", rrf_k: int = DEFAULT_RRF_K,
         weights: Mapping[str, float] | None = None) -> list[FusedHit]:
    """The top ``k`` of the legs' hit lists (each best first) fused by ``method``."""
    if method == "rrf":
        if rrf_k < 0:
            raise InvalidRequest("rrf_k must be ≥ 0", field="rrf_k")
        contribution = {leg: [1.0 / (rrf_k + rank) for rank in range(1, len(hits) + 1)]
                        for leg, hits in legs.items()}
    elif method == "weighted":
        chosen = dict(DEFAULT_WEIGHTS if weights is None else weights)
        for leg, weight in chosen.items():
            if leg not in LEGS or weight < 0:
                raise InvalidRequest(f"weights are ≥ 0 per leg ({', '.join(LEGS)}); got {leg}: {weight}",
                                     field=f"weights.{leg}")
        contribution = {leg: [chosen.get(leg, 0.0) * value for value in _normalized([h.score for h in hits])]
                        for leg, hits in legs.items()}
    else:
        raise InvalidRequest(f"fusion must be rrf or weighted, got {method!r}", field="fusion")
    fused: dict[str, list[float]] = {}
    first: dict[str, Hit] = {}
    ranks: dict[str, dict[str, LegRank]] = {}
    for leg in LEGS:  # a fixed order: the sum's floating-point order does not depend on the caller
        for rank, (hit, value) in enumerate(zip(legs.get(leg, ()), contribution.get(leg, ()), strict=True), 1):
            fused.setdefault(hit.doc_id, []).append(value)
            first.setdefault(hit.doc_id, hit)
            ranks.setdefault(hit.doc_id, {})[leg] = LegRank(rank, hit.score)
    totals = {doc_id: sum(values) for doc_id, values in fused.items()}
    order = sorted(totals, key=lambda doc_id: (-totals[doc_id], doc_id))[:k]
    return [FusedHit(first[doc_id], totals[doc_id], ranks[doc_id]) for doc_id in order]


def _normalized(scores: Sequence[float]) -> list[float]:
    if not scores:
        return []
    high, low = max(scores), min(scores)
    if high == low:
        return [1.0] * len(scores)
    return [(s - low) / (high - low) for s in scores]
