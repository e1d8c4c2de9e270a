"""Filtered search on one shard: the payload index says which documents a filter selects, a
planner picks how to find the top k among them.

* **exact scan** — when at most ``exact_scan_max`` documents match: the matching vectors are
  read back from the index (``reconstruct_batch``) and scored directly, so the answer is the
  exact filtered top k (exact for Flat and HNSW, which keep the vectors; against the stored
  codes for PQ/SQ indexes).
* **in-index filtered search** — when many match: the index's own search with an ``IDSelector``
  (FAISS skips what the filter excludes while it walks the graph or the lists), with the search
  breadth raised by the inverse of the selectivity (HNSW ``efSearch``, IVF ``nprobe``; a flat
  index's filtered search is exact by itself). A row
  that comes back with fewer than ``min(k, matches)`` hits is searched again wider, and then
  exactly: never fewer than k results when at least k documents match.

Qdrant plans the same way (a cardinality estimate against a full-scan threshold); here the
cardinality is exact, because the payload index is in memory.
"""

from __future__ import annotations

import logging
import math
import threading
from dataclasses import dataclass
from typing import Any

import faiss
import numpy as np

from index_shards.faiss_index import (
    REFINE_K_FACTOR,
    IdPositions,
    SearchableIndex,
    has_id_map,
    id_positions,
    inner_index,
    reconstruct_ids,
    refine_of,
)

logger = logging.getLogger(__name__)

EXACT_SCAN_MAX = 4096  # matching documents up to which an exact scan is cheaper than a filtered walk
MAX_EF = 4096  # widest HNSW breadth a filtered search may use
# A filtered walk starts at efSearch ≥ 6·k (before the 1/selectivity factor): a restricted graph walk
# has fewer useful neighbours per hop, and the filtered answer should not be worse than unfiltered.
FILTERED_EF_PER_HIT = 6
NO_RESULT = -1


@dataclass(slots=True)
class FilterPlan:
    """What the planner chose for one filtered search (reported in the shard's diagnostics)."""

    matches: int
    strategy: str  # "none" | "exact" | "index"
    widened_rows: int = 0
    exact_rows: int = 0


class FilteredSearcher:
    def __init__(self, searchable: SearchableIndex, metric: str, *, exact_scan_max: int = EXACT_SCAN_MAX) -> None:
        self.searchable = searchable
        self.metric = metric
        self.exact_scan_max = exact_scan_max
        self._lock = threading.Lock()
        self._direct_map_ready = False
        index = searchable.index
        self._ivf = faiss.try_extract_index_ivf(index) if not searchable.on_gpu else None
        self._hnsw = isinstance(inner_index(index), faiss.IndexHNSW)
        self._refine = refine_of(index) if has_id_map(index) else None
        # built on the first read by id / filtered refine search, not at load (see faiss_index)
        self._positions: IdPositions | None = None
        self._id_map: np.ndarray | None = None

    def search(self, queries: np.ndarray, k: int, allowed: np.ndarray, *, nprobe: int | None = None,
               ef_search: int | None = None, exact: bool = False) -> tuple[np.ndarray, np.ndarray, FilterPlan]:
        """``exact``: score the allowed documents only, however many (a partition's search: the
        index is not walked through other partitions' documents)."""
        """(distances as FAISS gives them, int ids, the plan) for ``queries`` among ``allowed`` ids."""
        n_queries, matches = len(queries), int(allowed.size)
        if matches == 0:
            empty = np.full((n_queries, k), NO_RESULT, dtype=np.int64)
            return np.zeros((n_queries, k), dtype=np.float32), empty, FilterPlan(0, "none")
        if exact or matches <= self.exact_scan_max or self.searchable.on_gpu:
            distances, ids = self.exact(queries, k, allowed)
            return distances, ids, FilterPlan(matches, "exact", exact_rows=n_queries)
        plan = FilterPlan(matches, "index")
        selectivity = matches / max(self.searchable.ntotal, 1)
        breadth = max(1.0, 1.0 / selectivity)
        distances, ids = self._in_index(queries, k, allowed, nprobe, ef_search, breadth)
        wanted = min(k, matches)
        short = np.flatnonzero((ids >= 0).sum(axis=1) < wanted)
        if short.size:  # widen once, then score the rest exactly
            plan.widened_rows = int(short.size)
            d2, i2 = self._in_index(queries[short], k, allowed, nprobe, ef_search, breadth * 4)
            distances[short], ids[short] = d2, i2
            still = short[(i2 >= 0).sum(axis=1) < wanted]
            if still.size:
                plan.exact_rows = int(still.size)
                distances[still], ids[still] = self.exact(queries[still], k, allowed)
        return distances, ids, plan

    def search_excluding(self, queries: np.ndarray, k: int, excluded: np.ndarray, every: np.ndarray, *,
                         nprobe: int | None = None, ef_search: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Every document but ``excluded`` (tombstones): the index's search with an ``IDSelectorNot``;
        rows left short are scored exactly over ``every`` minus ``excluded``."""
        remaining = max(int(every.size) - int(excluded.size), 0)
        selector = faiss.IDSelectorNot(faiss.IDSelectorBatch(excluded))
        breadth = max(1.0, every.size / max(remaining, 1))
        distances, ids = self._in_index(queries, k, selector, nprobe, ef_search, breadth)
        short = np.flatnonzero((ids >= 0).sum(axis=1) < min(k, remaining))
        if short.size:
            allowed = np.setdiff1d(every, excluded, assume_unique=True)
            distances[short], ids[short] = self.exact(queries[short], k, allowed)
        return distances, ids

    def _in_index(self, queries: np.ndarray, k: int, allowed: np.ndarray | Any, nprobe: int | None,
                  ef_search: int | None, breadth: float) -> tuple[np.ndarray, np.ndarray]:
        selector = faiss.IDSelectorBatch(allowed) if isinstance(allowed, np.ndarray) else allowed
        params: Any  # faiss's stubs know neither SearchParametersHNSW nor its fields
        if self._hnsw:
            params = faiss.SearchParametersHNSW()  # type: ignore[attr-defined]
            inner: Any = faiss.downcast_index(self.searchable.index.index)  # type: ignore[attr-defined]
            # the tuned or loaded efSearch, not the index's current one (the last query may have set it)
            default = self.searchable.baseline("ef_search", int(inner.hnsw.efSearch))
            base = ef_search or max(default, FILTERED_EF_PER_HIT * k)
            params.efSearch = int(min(MAX_EF, math.ceil(base * breadth)))
        elif self._ivf is not None:
            params = faiss.SearchParametersIVF()
            base = nprobe or self.searchable.baseline("nprobe", int(self._ivf.nprobe))
            params.nprobe = int(min(self._ivf.nlist, math.ceil(base * breadth)))
        else:
            params = faiss.SearchParameters()
        if self._refine is not None:
            return self._refine_search(queries, k, selector, params)
        params.sel = selector
        distances, ids = self.searchable.index.search(queries, k, params=params)
        return distances, ids

    def _refine_search(self, queries: np.ndarray, k: int, selector: Any,
                       base_params: Any) -> tuple[np.ndarray, np.ndarray]:
        """A refine stage under an id map: FAISS's id map translates the selector only on the
        outer parameters, which ``IndexRefine`` does not pass to its first stage, so the selector
        is translated here, given to the first stage, and the positions mapped back to ids."""
        assert self._refine is not None
        id_map = self._stored_ids()
        base_params.sel = faiss.IDSelectorTranslated(self.searchable.index.id_map, selector)  # type: ignore[attr-defined]
        params: Any = faiss.IndexRefineSearchParameters()
        params.k_factor = float(self.searchable.baseline("k_factor", REFINE_K_FACTOR))
        params.base_index_params = base_params
        distances, positions = self._refine.search(queries, k, params=params)
        ids = np.where(positions >= 0, id_map[np.maximum(positions, 0)], NO_RESULT)
        return distances, ids

    def exact(self, queries: np.ndarray, k: int, allowed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Score every allowed vector: the exact filtered top k, best first (FAISS's convention:
        inner products descending, L2 distances ascending)."""
        vectors = self.vectors(allowed)
        if self.metric == "l2":
            scores = -(np.sum(queries ** 2, axis=1)[:, None] - 2.0 * queries @ vectors.T
                       + np.sum(vectors ** 2, axis=1)[None, :])
        else:
            scores = queries @ vectors.T
        kk = min(k, allowed.size)
        top = np.argpartition(-scores, kk - 1, axis=1)[:, :kk] if kk < allowed.size else \
            np.tile(np.arange(allowed.size), (len(queries), 1))
        rows = np.arange(len(queries))[:, None]
        # best first; equal scores in id order, like the merge
        order = np.lexsort((allowed[top], -scores[rows, top]), axis=1)
        chosen = top[rows, order]
        out_ids = np.full((len(queries), k), NO_RESULT, dtype=np.int64)
        out_scores = np.zeros((len(queries), k), dtype=np.float32)
        out_ids[:, :kk] = allowed[chosen]
        best = scores[rows, chosen]
        out_scores[:, :kk] = -best if self.metric == "l2" else best
        return out_scores, out_ids

    def _stored_ids(self) -> np.ndarray:
        """The id map's ids by position, copied out of FAISS once."""
        if self._id_map is None:
            with self._lock:
                if self._id_map is None:
                    self._id_map = faiss.vector_to_array(self.searchable.index.id_map)  # type: ignore[attr-defined]
        return self._id_map

    def vectors(self, ids: np.ndarray) -> np.ndarray:
        """The stored vectors of these int ids (for PQ/SQ indexes: decoded from their codes)."""
        index = self.searchable.index
        if self._ivf is not None and self._refine is None and not self._direct_map_ready:
            with self._lock:  # a hash table id → list entry, built once, on the first filtered query
                if not self._direct_map_ready:
                    self._ivf.set_direct_map_type(faiss.DirectMap.Hashtable)  # type: ignore[attr-defined]
                    self._direct_map_ready = True
        if self._positions is None and has_id_map(index):  # (a GPU copy keeps the same id vector)
            with self._lock:  # id → position for a plain id map, built once, on the first read by id
                if self._positions is None:  # a refine stage's id vector, when already copied, is reused
                    self._positions = id_positions(index, self._id_map)
        return np.ascontiguousarray(reconstruct_ids(index, ids, self._positions), dtype=np.float32)
