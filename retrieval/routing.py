"""Routing, shared by the build (index_shards) and the gateway (queries and writes): a document's
int64 id and its shard — by id hash, or the nearest centroid for kmeans partitions — and the
``top_m`` nearest shards of a query."""

from __future__ import annotations

import hashlib

import numpy as np

_MASK_63 = (1 << 63) - 1  # keep ids positive: FAISS uses -1 for "no result"


def doc_int_id(doc_id: str) -> int:
    """The stable int64 of a string doc id: the same on every build, shard and machine."""
    digest = hashlib.blake2b(doc_id.encode("utf-8"), digest_size=8, person=b"shardrag.id").digest()
    return int.from_bytes(digest, "little") & _MASK_63


def hash_shard(doc_id: str, num_shards: int) -> int:
    """The shard of ``doc_id`` in a hash-partitioned collection (what the build's partitioner does)."""
    return doc_int_id(doc_id) % num_shards


def assign_to_centroids(vectors: np.ndarray, centroids: np.ndarray) -> np.ndarray:
    """Nearest centroid by inner product (spherical k-means), ties to the lower shard id."""
    nearest: np.ndarray = np.argmax(vectors @ centroids.T, axis=1).astype(np.int64)
    return nearest


def route_top_m(queries: np.ndarray, centroids: np.ndarray, top_m: int) -> np.ndarray:
    """For each query (row), the ids of its ``top_m`` nearest shards, best first."""
    scores = np.atleast_2d(queries) @ centroids.T
    order = np.argsort(-scores, axis=1, kind="stable")
    return order[:, : max(1, min(top_m, centroids.shape[0]))]
