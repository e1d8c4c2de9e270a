"""Regions of an HNSW shard's vectors: a k-means clustering of its storage, written beside the
index (``regions.npz``) when a base is built, so that a filtered search whose filter runs
*against* the query reads only the nearest regions that hold its documents.

Why: where a filter keeps none of the query's neighbourhood (an "other tenants' topics" filter),
the graph walk finds nothing near the query, and the planner used to score every document the
filter keeps — 500k of a 1M shard for a filter keeping half, ~110 ms a query. An IVF's lists say
where the kept documents lie (``filtered._ivf_scan``); a graph does not, so the base keeps a
clustering of its own: ``2·√n`` centroids (spherical k-means for ``ip``), trained on 32 vectors
a centroid, and each stored vector's region. The scan then goes through the regions nearest the
query first, skipping those holding no kept document, until it has seen
:data:`SCAN_REGIONS` regions' worth of kept documents (``80·√n``: 25k of 100k, 80k of 1M).

Measured on the benchmark's data (benchmarks/filtered_recall.py: MiniLM vectors grown to 100k
and 1M, anti-correlated filters keeping 10–90 %), recall@10 of the scan against the exact
filtered top 10: at 1M, 0.98–0.99 reading ~63k documents, 0.99–1.00 at ~125k (1,000, 2,000 or
4,000 regions alike: what matters is how many documents are read); at 100k 0.985–0.993 at 12.5k.

Built only for HNSW over flat storage (the vectors are scored in place, by position) with at
least :data:`MIN_VECTORS` of them: below that, scoring every kept document costs a few ms.
Derived from the base's own vectors, so a compaction, a snapshot's restore and a build each
write their own (~8–10 s at 1M, beside ~130 s for the graph); a base written before regions
existed has none and is searched as before. In memory: 4 bytes a vector (its region), 8 more for
the members by region (sorted at load), the centroids (3 MB at 1M).
"""

from __future__ import annotations

import io
import logging
import math
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from index_shards.faiss_index import has_id_map, inner_index
from index_shards.layout import REGIONS_FILE
from retrieval.errors import IndexIntegrityError

logger = logging.getLogger(__name__)

MIN_VECTORS = 50_000  # fewer: an exact scan of the kept documents costs a few ms, no regions are built
REGIONS_PER_ROOT = 2  # regions: 2·√n (≈ √n / 2 vectors each)
TRAIN_PER_REGION = 32  # k-means trained on 32 vectors a region (FAISS samples them)
TRAIN_ITERATIONS = 10
SCAN_REGIONS = 160  # a scan reads this many regions' worth of kept documents (80·√n), then stops
SEED = 1234


@dataclass(slots=True)
class Regions:
    """``centroids`` (regions × d) and ``of_position`` (each stored vector's region), with the
    members by region (positions ascending within each) sorted once (``read_regions`` does it at
    load)."""

    centroids: np.ndarray
    of_position: np.ndarray
    metric: str
    _members: tuple[np.ndarray, np.ndarray] | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def count(self) -> int:
        return int(self.centroids.shape[0])

    @property
    def scan_size(self) -> int:
        """How many kept documents a scan reads before it stops: SCAN_REGIONS mean regions."""
        return int(SCAN_REGIONS * self.of_position.size / self.count)

    def nearest(self, query: np.ndarray) -> np.ndarray:
        """The regions, nearest ``query`` first."""
        products = self.centroids @ query
        if self.metric == "l2":  # |q - c|² ranks as |c|² - 2 q·c
            return np.argsort(np.einsum("ij,ij->i", self.centroids, self.centroids) - 2.0 * products, kind="stable")
        return np.argsort(-products, kind="stable")

    def kept_per_region(self, kept: np.ndarray) -> np.ndarray:
        """How many of each region's vectors ``kept`` (a bitmap by storage position) keeps."""
        members, starts = self.members()
        flags = kept[members].view(np.uint8)
        filled = starts[:-1] < starts[1:]
        counts = np.zeros(self.count, dtype=np.int64)
        if members.size:  # reduceat over the non-empty regions (it would misread an empty one)
            counts[filled] = np.add.reduceat(flags, starts[:-1][filled], dtype=np.int64)
        return counts

    def members(self) -> tuple[np.ndarray, np.ndarray]:
        """(storage positions sorted by region, each region's start in them; ``count + 1`` long)."""
        if self._members is None:
            with self._lock:
                if self._members is None:
                    # 16-bit keys sort by radix: 9 ms for 1M against 67 as int32
                    keys = self.of_position.astype(np.uint16) if self.count <= 1 << 16 else self.of_position
                    members = np.argsort(keys, kind="stable")
                    sizes = np.bincount(self.of_position, minlength=self.count)
                    starts = np.concatenate(([0], np.cumsum(sizes))).astype(np.int64)
                    self._members = (members, starts)
        return self._members

    def chosen(self, query: np.ndarray, kept_counts: np.ndarray, needed: int) -> np.ndarray:
        """The regions a scan for ``query`` reads: those holding a kept document, nearest first,
        up to and including the one where their kept documents reach ``needed``."""
        order = self.nearest(query)
        holding = kept_counts[order]
        seen_before = np.cumsum(holding) - holding
        picked: np.ndarray = order[(holding > 0) & (seen_before < needed)]
        return picked


def wants_regions(index: faiss.Index) -> bool:
    """True for an HNSW over flat storage under a plain id map holding at least MIN_VECTORS."""
    if index.ntotal < MIN_VECTORS or not has_id_map(index) or isinstance(index, faiss.IndexIDMap2):
        return False
    inner = inner_index(index)
    return isinstance(inner, faiss.IndexHNSW) and isinstance(faiss.downcast_index(inner.storage), faiss.IndexFlat)


def stored_vectors(index: faiss.Index) -> np.ndarray:
    """The flat storage of an HNSW under an id map, by position (a read-only view)."""
    storage: Any = faiss.downcast_index(inner_index(index).storage)
    view: np.ndarray = faiss.rev_swig_ptr(storage.get_xb(), storage.ntotal * storage.d)
    view = view.reshape(storage.ntotal, storage.d)
    view.flags.writeable = False
    return view


def build_regions(vectors: np.ndarray, metric: str) -> Regions:
    """k-means over ``vectors`` (by storage position): REGIONS_PER_ROOT·√n regions."""
    n, d = vectors.shape
    count = max(1, min(n, round(REGIONS_PER_ROOT * math.sqrt(n))))
    kmeans: Any = faiss.Kmeans(d, count, niter=TRAIN_ITERATIONS, seed=SEED, spherical=metric == "ip",
                               max_points_per_centroid=TRAIN_PER_REGION, verbose=False)
    kmeans.train(np.ascontiguousarray(vectors, dtype=np.float32))
    _, assigned = kmeans.index.search(np.ascontiguousarray(vectors, dtype=np.float32), 1)
    centroids = np.ascontiguousarray(kmeans.centroids, dtype=np.float32)
    return Regions(centroids, assigned[:, 0].astype(np.int32), metric)


def write_regions(index: faiss.Index, directory: Path, metric: str) -> bool:
    """Write ``directory/regions.npz`` for ``index`` when it wants regions (:func:`wants_regions`);
    True when written. The caller lists it in the manifest and fsyncs the directory, as for the
    index file (both are written into a staging directory published by one rename)."""
    if not wants_regions(index):
        return False
    regions = build_regions(stored_vectors(index), metric)
    buffer = io.BytesIO()
    np.savez(buffer, centroids=regions.centroids, of_position=regions.of_position)
    with open(directory / REGIONS_FILE, "wb") as out:
        out.write(buffer.getvalue())
    logger.info("regions of %s: %d over %d vectors", directory, regions.count, index.ntotal)
    return True


def read_regions(path: Path, index: faiss.Index, metric: str) -> Regions:
    """The regions written beside ``index``, checked against it."""
    with np.load(path, allow_pickle=False) as data:
        centroids = np.ascontiguousarray(data["centroids"], dtype=np.float32)
        of_position = np.ascontiguousarray(data["of_position"], dtype=np.int32)
    if of_position.shape != (index.ntotal,) or centroids.ndim != 2 or centroids.shape[1] != index.d:
        raise IndexIntegrityError(f"{path} does not match its index ({of_position.shape[0]} positions, "
                                  f"centroids {centroids.shape}; the index holds {index.ntotal} × {index.d})")
    if of_position.size and (of_position.min() < 0 or of_position.max() >= centroids.shape[0]):
        raise IndexIntegrityError(f"{path} names a region it does not hold")
    regions = Regions(centroids, of_position, metric)
    regions.members()  # here, not on the first filtered query (~10 ms at 1M)
    return regions
