"""IR metrics as BEIR reports them (trec_eval conventions).

* nDCG@k: linear gains (the graded relevance), discount log2(rank + 1), ideal DCG from all
  judged grades of the query (retrieved or not).
* recall@k: relevant retrieved in the top k / all relevant (grade > 0).
* MRR@k: 1 / rank of the first relevant document in the top k, 0 if none.

Queries with no positive judgment are skipped, as BEIR does. Each function takes the ranked
doc ids per query (best first) and returns the mean over evaluated queries.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

Ranking = Mapping[str, Sequence[str]]
Qrels = Mapping[str, Mapping[str, int]]


def _evaluated(qrels: Qrels) -> list[str]:
    return [query_id for query_id, judged in qrels.items() if any(grade > 0 for grade in judged.values())]


def ndcg_at_k_per_query(ranking: Sequence[str], judged: Mapping[str, int], k: int) -> float:
    dcg = sum(max(judged.get(doc_id, 0), 0) / math.log2(rank + 2) for rank, doc_id in enumerate(ranking[:k]))
    ideal_grades = sorted((grade for grade in judged.values() if grade > 0), reverse=True)[:k]
    ideal = sum(grade / math.log2(rank + 2) for rank, grade in enumerate(ideal_grades))
    return dcg / ideal if ideal > 0 else 0.0


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def ndcg_at_k(rankings: Ranking, qrels: Qrels, k: int = 10) -> float:
    return _mean([ndcg_at_k_per_query(rankings.get(q, ()), qrels[q], k) for q in _evaluated(qrels)])


def recall_at_k(rankings: Ranking, qrels: Qrels, k: int = 10) -> float:
    scores = []
    for query_id in _evaluated(qrels):
        relevant = {doc_id for doc_id, grade in qrels[query_id].items() if grade > 0}
        retrieved = set(rankings.get(query_id, ())[:k])
        scores.append(len(relevant & retrieved) / len(relevant))
    return _mean(scores)


def mrr_at_k(rankings: Ranking, qrels: Qrels, k: int = 10) -> float:
    scores = []
    for query_id in _evaluated(qrels):
        judged = qrels[query_id]
        reciprocal = 0.0
        for rank, doc_id in enumerate(rankings.get(query_id, ())[:k]):
            if judged.get(doc_id, 0) > 0:
                reciprocal = 1.0 / (rank + 1)
                break
        scores.append(reciprocal)
    return _mean(scores)


def overlap_at_k(a: Sequence[str], b: Sequence[str], k: int = 10) -> float:
    """|top-k(a) ∩ top-k(b)| / |top-k(b)|: how much of reference ranking ``b`` ``a`` recovers.

    With ``b`` the exact ranking this is recall@k against exact search.
    """
    reference = set(b[:k])
    if k <= 0 or not reference:
        return 0.0
    return len(set(a[:k]) & reference) / len(reference)
