"""Fusing the dense and lexical legs of a hybrid search.

* **weighted** (the default) — a convex combination of the two legs' scores, each normalized by
  the bounds it can take for the query (Bruch et al., "An Analysis of Fusion Functions for Hybrid
  Retrieval", 2023: theoretical min-max): the dense similarity mapped from [-1, 1] to [0, 1]
  (:func:`dense_unit`), BM25 divided by the most any document could score for the query's terms
  (``retrieval.bm25.score_bound``). Every document has both scores (0 where a leg does not find it), so a
  shard can compute the fused score of its own documents and answer the *exact* fused top k of
  everything it holds (``index_shards.hybrid_search``: both legs read until no unseen document
  can beat the k-th); the gateway merges those lists like dense ones.
* **rrf** — reciprocal rank fusion over the two legs' merged lists (the gateway's, :func:`fuse_rrf`):
  a document scores Σ 1 / (rrf_k + rank) over the legs that returned it (rank from 1).

Ties break by doc id, as every merge in shardrag. The default weights were chosen on msmarco
only and applied unchanged to dbpedia (``benchmarks/hybrid_quality.py``; docs/hybrid.md).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from retrieval.errors import InvalidRequest

# the legs, fusions and their defaults are named in retrieval.query_defaults (no numpy: the
# cluster state reads them)
from retrieval.query_defaults import (
    DEFAULT_FUSION,
    DEFAULT_RRF_K,
    DEFAULT_WEIGHTS,
    DENSE,
    LEXICAL,
    MAX_WEIGHT,
    RRF,
    WEIGHTED,
)
from retrieval.types import Hit

LEGS = (DENSE, LEXICAL)


@dataclass(slots=True, frozen=True)
class LegRank:
    """Where one leg ranked a document — its rank from 1 (None: below the leg's top ``candidates``
    on some shard, so not known) — and the leg's own score for it."""

    rank: int | None
    score: float


@dataclass(slots=True, frozen=True)
class FusedHit:
    hit: Hit  # the document (its score is the fused one for weighted, the first leg's for rrf)
    score: float  # the fused score
    legs: Mapping[str, LegRank] = field(default_factory=dict)


@dataclass(slots=True, frozen=True)
class WeightedFusion:
    """A weighted hybrid as a shard runs it: the legs' weights, and how deep each leg is read
    first (the shard reads deeper while an unseen document could still make the top k; the
    leg ranks the gateway reports reach this deep)."""

    dense: float
    lexical: float
    depth: int

    def __post_init__(self) -> None:
        for leg, weight in ((DENSE, self.dense), (LEXICAL, self.lexical)):
            if not 0.0 <= weight <= MAX_WEIGHT:
                raise InvalidRequest(f"weights are between 0 and {MAX_WEIGHT:g} per leg; got {leg}: {weight}",
                                     field=f"weights.{leg}")
        if not 1 <= self.depth <= 10_000:
            raise InvalidRequest(f"candidates must be between 1 and 10000, got {self.depth}", field="candidates")

    def to_dict(self) -> dict[str, Any]:
        return {DENSE: self.dense, LEXICAL: self.lexical, "depth": self.depth}

    @classmethod
    def from_dict(cls, data: Any, *, field_name: str = "fuse") -> WeightedFusion:
        if not isinstance(data, dict) or not all(isinstance(data.get(key), (int, float)) and
                                                 not isinstance(data.get(key), bool)
                                                 for key in (DENSE, LEXICAL, "depth")):
            raise InvalidRequest(f"{field_name} is {{\"dense\": weight, \"lexical\": weight, \"depth\": n}}",
                                 field=field_name)
        depth = data["depth"]
        if int(depth) != depth:
            raise InvalidRequest(f"{field_name}.depth is an integer", field=f"{field_name}.depth")
        return cls(float(data[DENSE]), float(data[LEXICAL]), int(depth))


def dense_unit(scores: np.ndarray, metric: str) -> np.ndarray:
    """The dense leg's scores on [0, 1]: a cosine (inner product of unit vectors) from [-1, 1]; for
    ``l2`` (scores are -L2², which is 2·cos − 2 for unit vectors) from [-4, 0]."""
    scores = np.asarray(scores, dtype=np.float64)
    result: np.ndarray = (scores + 4.0) / 4.0 if metric == "l2" else (scores + 1.0) / 2.0
    return result


def weights_of(chosen: Mapping[str, float] | None) -> tuple[float, float]:
    """(dense, lexical) weights: the request's, or the defaults."""
    picked = DEFAULT_WEIGHTS if chosen is None else chosen
    return float(picked.get(DENSE, 0.0)), float(picked.get(LEXICAL, 0.0))


def fuse_rrf(legs: Mapping[str, Sequence[Hit]], k: int, *, rrf_k: int = DEFAULT_RRF_K) -> list[FusedHit]:
    """The top ``k`` of the legs' hit lists (each best first) by reciprocal rank fusion."""
    if rrf_k < 0:
        raise InvalidRequest("rrf_k must be ≥ 0", field="rrf_k")
    fused: dict[str, list[float]] = {}
    first: dict[str, Hit] = {}
    ranks: dict[str, dict[str, LegRank]] = {}
    for leg in LEGS:  # a fixed order: the sum's floating-point order does not depend on the caller
        for rank, hit in enumerate(legs.get(leg, ()), 1):
            fused.setdefault(hit.doc_id, []).append(1.0 / (rrf_k + rank))
            first.setdefault(hit.doc_id, hit)
            ranks.setdefault(hit.doc_id, {})[leg] = LegRank(rank, hit.score)
    totals = {doc_id: sum(values) for doc_id, values in fused.items()}
    order = sorted(totals, key=lambda doc_id: (-totals[doc_id], doc_id))[:k]
    return [FusedHit(first[doc_id], totals[doc_id], ranks[doc_id]) for doc_id in order]


class LegTops:
    """One leg's best scores on every shard (each shard's best ``depth``, best first), ready to give
    a document's rank in that leg across the shards (:meth:`rank`)."""

    def __init__(self, tops: Sequence[Sequence[float]], depth: int) -> None:
        self._ascending = sorted(-s for scores in tops for s in scores)  # every shard's, negated, for bisect
        # a shard that filled its list may hold documents below its last score but above this one's
        full = [scores[-1] for scores in tops if scores and len(scores) >= depth]
        self._lowest_known = max(full) if full else -math.inf

    def rank(self, score: float) -> int | None:
        """1 + how many scores across the shards are higher than ``score`` — known when every
        shard that filled its list ended at or below ``score`` (else None)."""
        if score < self._lowest_known:
            return None
        return 1 + bisect.bisect_left(self._ascending, -score)


def leg_rank(score: float, tops: Sequence[Sequence[float]], depth: int) -> int | None:
    """A document's rank in one leg across shards, from each shard's best ``depth`` scores of that
    leg (best first): 1 + how many score higher — known when every shard that filled its list
    ended at or below ``score`` (else a document past its list might score higher too)."""
    return LegTops(tops, depth).rank(score)


__all__ = ["DEFAULT_FUSION", "DEFAULT_RRF_K", "DEFAULT_WEIGHTS", "DENSE", "LEGS", "LEXICAL", "RRF", "WEIGHTED",
           "FusedHit", "LegRank", "LegTops", "WeightedFusion", "dense_unit", "fuse_rrf", "leg_rank", "weights_of"]
