"""The correctness oracle: one unsharded exact IndexFlatIP over the same vectors."""

from __future__ import annotations

from collections.abc import Sequence

import faiss
import numpy as np


class ExactOracle:
    def __init__(self, doc_ids: Sequence[str], vectors: np.ndarray) -> None:
        self.doc_ids = list(doc_ids)
        self.index = faiss.IndexFlatIP(vectors.shape[1])
        self.index.add(np.ascontiguousarray(vectors, dtype=np.float32))

    def top_k(self, query: np.ndarray, k: int) -> list[tuple[str, float]]:
        """Top k in canonical order (score desc, doc id asc), exact ties resolved like the gateway."""
        scores, ids = self.index.search(np.ascontiguousarray(query[None, :], dtype=np.float32), k + 20)
        ranked = sorted(((self.doc_ids[i], float(s)) for s, i in zip(scores[0], ids[0]) if i >= 0),
                        key=lambda pair: (-pair[1], pair[0]))
        return ranked[:k]


def assert_same_ranking(got: list[tuple[str, float]], expected: list[tuple[str, float]], *, atol: float = 1e-5) -> None:
    """Same ids in the same order, scores within ``atol``.

    The only latitude: two hits whose exact scores differ by less than float32 rounding (1e-6)
    may be computed in either order by two BLAS code paths; such a pair must still hold the
    same two documents.
    """
    assert len(got) == len(expected), (got, expected)
    for position, ((got_id, got_score), (exp_id, exp_score)) in enumerate(zip(got, expected)):
        assert abs(got_score - exp_score) <= atol, (position, got_id, got_score, exp_id, exp_score)
        if got_id != exp_id:
            tied = {doc for doc, score in expected if abs(score - exp_score) < 1e-6}
            assert got_id in tied and len(tied) > 1, f"rank {position}: got {got_id}, expected {exp_id}"
