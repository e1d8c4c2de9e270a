"""Synthetic corpora and filters grown from real embeddings, for tests and benchmarks at sizes
the shipped data does not reach.

* :func:`synthesize` — ``total`` vectors: the real ones first, then draws from a Gaussian
  mixture fitted to them (per cluster of ``CLUSTERS`` its mean and empirical covariance, plus an
  isotropic floor of ``NOISE_FLOOR`` × the real vectors' median per-dimension std), normalised.
  (A diagonal mixture spreads points evenly in all dimensions, far harder for any ANN index than
  real embeddings: at 1M, HNSW32 reached recall@10 0.892 at ef_search 1024.)
* :class:`TopicFilters` — clustered metadata and per-query filters of a chosen correlation with
  the query: each vector's ``topic`` (its k-means cluster), its ``rank`` inside the topic and a
  corpus-wide uniform ``u``. A **correlated** filter keeps the topics nearest the query, an
  **anti-correlated** one the farthest, an **uncorrelated** one a range of ``u`` — each cut to the
  asked selectivity exactly (whole topics, then a rank range of the next one).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import faiss
import numpy as np

CLUSTERS = 256
NOISE_FLOOR = 0.1  # isotropic noise, as a fraction of the real vectors' median per-dimension std
KINDS = ("correlated", "anti-correlated", "uncorrelated")


def synthesize(real: np.ndarray, total: int, seed: int = 0) -> np.ndarray:
    """``total`` vectors: the real ones first, then draws from the Gaussian mixture fitted to them
    (per cluster its mean and its empirical covariance, plus a small isotropic floor)."""
    if total <= len(real):
        return real[:total].copy()
    kmeans = faiss.Kmeans(real.shape[1], CLUSTERS, niter=20, seed=seed, spherical=True)
    kmeans.train(real)
    _, assign = kmeans.index.search(real, 1)
    assign = assign[:, 0]
    members = [real[assign == c] for c in range(CLUSTERS)]
    counts = np.array([len(m) for m in members], dtype=np.float64)
    floor = float(np.median(real.std(axis=0))) * NOISE_FLOOR
    rng = np.random.default_rng(seed)
    out = np.empty((total, real.shape[1]), dtype=np.float32)
    out[:len(real)] = real
    picks = rng.choice(CLUSTERS, size=total - len(real), p=counts / counts.sum())
    position = len(real)
    for cluster in np.flatnonzero(counts >= 2):
        size = int((picks == cluster).sum())
        if not size:
            continue
        mean = members[cluster].mean(axis=0)
        # x = mean + z·D/√(n−1), z ~ N(0, I_n): exactly the cluster's empirical covariance DᵀD/(n−1)
        spread = (members[cluster] - mean) / np.sqrt(len(members[cluster]) - 1)
        for start in range(0, size, 50_000):  # bounded temporaries
            block_size = min(50_000, size - start)
            block = mean + rng.standard_normal((block_size, len(spread))) @ spread
            block += floor * rng.standard_normal(block.shape)
            out[position:position + block_size] = block / np.linalg.norm(block, axis=1, keepdims=True)
            position += block_size
    while position < total:  # draws for single-member clusters go to a real vector plus the floor
        base = real[rng.integers(len(real))]
        vector = base + floor * rng.standard_normal(real.shape[1])
        out[position] = vector / np.linalg.norm(vector)
        position += 1
    return out


@dataclass
class TopicFilters:
    """Metadata for ``vectors`` and filters of each kind (module docstring)."""

    centroids: np.ndarray  # (topics, dim)
    topic: np.ndarray  # per vector
    rank: np.ndarray  # per vector: its place in its topic, 0..size-1, shuffled
    uniform: np.ndarray  # per vector: a permutation of 0..n-1

    @classmethod
    def fit(cls, vectors: np.ndarray, topics: int = 32, seed: int = 1) -> TopicFilters:
        kmeans = faiss.Kmeans(vectors.shape[1], topics, niter=15, seed=seed, spherical=True)
        kmeans.train(np.ascontiguousarray(vectors, dtype=np.float32))
        _, assign = kmeans.index.search(np.ascontiguousarray(vectors, dtype=np.float32), 1)
        topic = assign[:, 0].astype(np.int64)
        rng = np.random.default_rng(seed)
        rank = np.zeros(len(vectors), dtype=np.int64)
        for t in range(topics):
            members = np.flatnonzero(topic == t)
            rank[members] = rng.permutation(len(members))
        return cls(np.asarray(kmeans.centroids), topic, rank, rng.permutation(len(vectors)).astype(np.int64))

    def metadata(self, row: int) -> dict[str, Any]:
        return {"topic": int(self.topic[row]), "rank": int(self.rank[row]), "u": int(self.uniform[row])}

    def filter(self, kind: str, query: np.ndarray, selectivity: float) -> tuple[dict[str, Any], np.ndarray]:
        """The filter (the query API's form) and the mask of the vectors it keeps."""
        need = int(round(selectivity * len(self.topic)))
        if kind == "uncorrelated":
            return {"must": [{"key": "u", "range": {"lt": need}}]}, self.uniform < need
        if kind not in KINDS:
            raise ValueError(f"unknown filter kind {kind!r}; one of {KINDS}")
        order = np.argsort(-(self.centroids @ query))
        if kind == "anti-correlated":
            order = order[::-1]
        sizes = np.bincount(self.topic, minlength=len(self.centroids))
        whole: list[int] = []
        for t in order.tolist():
            if sum(int(sizes[w]) for w in whole) + int(sizes[t]) > need:
                rest = need - sum(int(sizes[w]) for w in whole)
                clauses: list[dict[str, Any]] = [{"key": "topic", "match": {"any": whole}}] if whole else []
                mask = np.isin(self.topic, whole)
                if rest > 0:
                    clauses.append({"must": [{"key": "topic", "match": {"value": t}},
                                             {"key": "rank", "range": {"lt": rest}}]})
                    mask |= (self.topic == t) & (self.rank < rest)
                return {"should": clauses}, mask
            whole.append(t)
        return {"must": [{"key": "topic", "match": {"any": whole}}]}, np.isin(self.topic, whole)
