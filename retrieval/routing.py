"""Centroid routing, shared by the kmeans partitioner (build) and the gateway (query):
a document lives in the shard of its nearest centroid; a query visits its ``top_m`` nearest."""

from __future__ import annotations

import numpy as np


def assign_to_centroids(vectors: np.ndarray, centroids: np.ndarray) -> np.ndarray:
    """Nearest centroid by inner product (spherical k-means), ties to the lower shard id."""
    nearest: np.ndarray = np.argmax(vectors @ centroids.T, axis=1).astype(np.int64)
    return nearest


def route_top_m(queries: np.ndarray, centroids: np.ndarray, top_m: int) -> np.ndarray:
    """For each query (row), the ids of its ``top_m`` nearest shards, best first."""
    scores = np.atleast_2d(queries) @ centroids.T
    order = np.argsort(-scores, axis=1, kind="stable")
    return order[:, : max(1, min(top_m, centroids.shape[0]))]
