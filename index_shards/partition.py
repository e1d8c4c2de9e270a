"""Partitioners assign each document to one shard.

* ``hash``: stable hash of the doc id modulo the number of shards (balanced, query-agnostic).
* ``kmeans``: spherical k-means centroids over the vectors; each shard owns one region, so a
  query can be routed to its ``top_m`` nearest shards (``retrieval.routing.route_top_m``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from retrieval.errors import BuildError, ConfigError
from retrieval.routing import assign_to_centroids


@dataclass(slots=True, frozen=True)
class Partition:
    assignment: np.ndarray  # shard id per document, int64
    centroids: np.ndarray | None  # (num_shards, dim) for kmeans, else None


class Partitioner(Protocol):
    name: str

    def partition(self, int_ids: np.ndarray, vectors: np.ndarray, num_shards: int) -> Partition: ...


class HashPartitioner:
    name = "hash"

    def partition(self, int_ids: np.ndarray, vectors: np.ndarray, num_shards: int) -> Partition:
        # int ids are already a uniform 63-bit hash of the doc id (index_shards.ids).
        return Partition(assignment=(int_ids % num_shards).astype(np.int64), centroids=None)


class KMeansPartitioner:
    name = "kmeans"

    def __init__(self, *, niter: int = 25, seed: int = 1234, spherical: bool = True) -> None:
        self.niter = niter
        self.seed = seed
        self.spherical = spherical

    def partition(self, int_ids: np.ndarray, vectors: np.ndarray, num_shards: int) -> Partition:
        import faiss

        if num_shards == 1:
            centroid = vectors.mean(axis=0, keepdims=True).astype(np.float32)
            return Partition(np.zeros(len(vectors), dtype=np.int64),
                             _normalise(centroid) if self.spherical else centroid)
        if len(vectors) < num_shards:
            raise BuildError(f"kmeans needs at least {num_shards} documents for {num_shards} shards, "
                             f"got {len(vectors)}")
        kmeans = faiss.Kmeans(
            vectors.shape[1], num_shards, niter=self.niter, seed=self.seed, spherical=self.spherical,
            gpu=False, verbose=False, min_points_per_centroid=1,
        )
        kmeans.train(np.ascontiguousarray(vectors, dtype=np.float32))
        centroids = np.ascontiguousarray(kmeans.centroids, dtype=np.float32)
        assignment = assign_to_centroids(vectors, centroids)
        return Partition(assignment=assignment, centroids=centroids)


def _normalise(matrix: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    normalised: np.ndarray = (matrix / np.maximum(norms, 1e-12)).astype(np.float32)
    return normalised


PARTITIONERS: dict[str, type[Partitioner]] = {"hash": HashPartitioner, "kmeans": KMeansPartitioner}


def make_partitioner(name: str) -> Partitioner:
    try:
        return PARTITIONERS[name]()
    except KeyError:
        raise ConfigError(f"unknown partitioner {name!r}; use one of {sorted(PARTITIONERS)}",
                          field="partitioner") from None
