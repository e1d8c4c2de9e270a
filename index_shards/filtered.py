"""Filtered search on one shard: the payload index says which documents a filter selects, a
planner picks how to find the top k among them.

* **exact scan** — when at most ``exact_scan_max`` documents match: the matching vectors are
  read back from the index (``reconstruct_batch``) and scored directly, so the answer is the
  exact filtered top k (exact for Flat and HNSW, which keep the vectors; against the stored
  codes for PQ/SQ indexes).
* **in-index filtered search** — when many match: the index's own search with an ``IDSelector``
  (FAISS skips what the filter excludes while it walks the graph or the lists), as wide as the
  filter's overlap with *the query's neighbourhood* needs — not its global selectivity, which
  says nothing about a filter that runs against the query (an "other topics only" filter keeps
  half the corpus and nothing near the query; a walk of the usual width then finds k matches
  that are not the best ones, and nothing tells it):

  - **HNSW**: an unfiltered probe of the ``4 × efSearch`` nearest documents. Holding k matches,
    it is the answer (the first k matches in the unfiltered order); else the share of matches in
    it sets the walk's width, and a walk that would evaluate more vectors than the filter
    matches gives way to a scan — of the kept documents in the regions nearest the query that
    hold them, where the base has regions (index_shards.regions) and they hold fewer than half
    the matches, else of every kept document;
  - **IVF**: the lists hold their documents' ids, so the overlap is counted: nearest lists are
    scanned until they held as many matching documents as the unfiltered search scans documents
    (skipping lists that hold none, and stopping each row at ``SCAN_SLACK`` times that);
  - a flat index's filtered search is exact by itself.

  A row that comes back with fewer than ``min(k, matches)`` hits is searched again wider, and
  then exactly: never fewer than k results when at least k documents match.

An exact scan of a flat storage (Flat, HNSW over Flat) reads the kept vectors in place by
position (FAISS's ``*_by_idx``: no copy) for calls of up to 3 rows while fewer than 2/3 of the
vectors are kept; else every stored vector in place (many kept) or a copy of the kept ones for one
matrix product (many rows).

The filter reaches the index as a :class:`~index_shards.selection.Selection`: for HNSW and Flat
under an id map (on this host) a bitmap by storage position — the graph or the matrix is searched
under the id map, and the positions found mapped to ids — else the int ids in FAISS's hash-set
selector (an IVF's lists hold the ids themselves), built from the smaller of the kept and the
rejected sets; an IVF's per-list counts come from the payload positions' lists, not id lookups.

Qdrant plans on a cardinality estimate against a full-scan threshold; here the cardinality is
exact (the payload index is in memory) and the overlap is measured per query.
benchmarks/filtered_recall.py measures recall and latency by kind of filter.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable
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
from index_shards.regions import Regions
from index_shards.selection import PayloadFrame, Selection

logger = logging.getLogger(__name__)

EXACT_SCAN_MAX = 4096  # matching documents up to which an exact scan is cheaper than a filtered walk
MAX_EF = 4096  # widest HNSW breadth a filtered search may use
# A filtered walk starts at efSearch ≥ 6·k (before the 1/selectivity factor): a restricted graph walk
# has fewer useful neighbours per hop, and the filtered answer should not be worse than unfiltered.
FILTERED_EF_PER_HIT = 6
NO_RESULT = -1
PROBE_FACTOR = 4  # an HNSW filtered search first looks at the 4 × efSearch nearest documents, unfiltered
WALK_COST = 1.0  # a walk's vector evaluation against an exact scan's (random access against a matrix product)
# an exact scan over flat storage scores every stored vector in place once 1/16 of them match: at
# 200k × 384, 11 ms for all of them against 57 ms to copy out and score 50k (8 ms for 10k)
WHOLE_MATRIX_SHARE = 16
# scoring stored vectors by position in place (FAISS's *_by_idx) against all of them in place: 0.16
# against 0.105 µs a vector at 1M × 384, so by position while fewer than 2/3 of them are scored —
# and against copying them out for one matrix product (0.5 µs a vector, shared by the rows) while a
# call has at most 3 rows
BY_POSITION_SHARE = 2 / 3
BY_POSITION_MAX_ROWS = 3
# reading one IVF list entry's document (a gather) against hashing one id into a selector: ~1/16
LIST_PASS_PER_HASH = 16
# an IVF row's scan stops once its lists held this many times the matching documents it needs
# (see _ivf_scan; at 1M anti-correlated recall@10 0.963 stopping at 2×, 0.985 at 4×, 0.995 at 8×)
SCAN_SLACK = 8


@dataclass(slots=True)
class FilterPlan:
    """What the planner chose for one filtered search (reported in the shard's diagnostics)."""

    matches: int
    strategy: str  # "none" | "exact" | "index"
    widened_rows: int = 0
    exact_rows: int = 0
    probe_rows: int = 0  # HNSW: rows answered by the unfiltered probe (it held k matches)
    region_rows: int = 0  # HNSW: rows scored over the nearest regions holding matches (index_shards.regions)


@dataclass(slots=True)
class _Walk:
    """One filtered search's in-index walk: ``run(queries, breadth)``, and the selector it tests
    (None where each call makes its own)."""

    run: Callable[[np.ndarray, float], tuple[np.ndarray, np.ndarray]]
    selector: Any

    def __call__(self, queries: np.ndarray, breadth: float) -> tuple[np.ndarray, np.ndarray]:
        return self.run(queries, breadth)


class FilteredSearcher:
    def __init__(self, searchable: SearchableIndex, metric: str, *, exact_scan_max: int = EXACT_SCAN_MAX,
                 regions: Regions | None = None) -> None:
        self.searchable = searchable
        self.metric = metric
        self.exact_scan_max = exact_scan_max
        self.regions = regions if not searchable.on_gpu else None  # (a GPU shard scans exactly)
        self._lock = threading.Lock()
        self._direct_map_ready = False
        index = searchable.index
        self._ivf = faiss.try_extract_index_ivf(index) if not searchable.on_gpu else None
        self._hnsw = isinstance(inner_index(index), faiss.IndexHNSW)
        # a flat index scans every stored vector: its top k is exact (its last score bounds every
        # vector it did not return) and a read k deep costs what a shallow one does. An HNSW walk is
        # ef_search wide whatever k (FAISS returns fewer than k past it); IVF reads nprobe lists
        inner = inner_index(index)
        self.scans_all = isinstance(inner, faiss.IndexFlat) or type(inner).__name__.startswith("GpuIndexFlat")
        self._refine = refine_of(index) if has_id_map(index) else None
        # built on the first read by id / filtered refine search, not at load (see faiss_index)
        self._positions: IdPositions | None = None
        self._id_map: np.ndarray | None = None
        self._lists: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None  # IVF: ids sorted, their lists, sizes
        self._flat: np.ndarray | None = None  # flat storage's vectors, viewed in place (see _flat_matrix)
        self._flat_checked = False
        # HNSW and Flat under an id map on this host are searched by storage position with a
        # bitmap selector (one bit test a visit; no hash set of the matching ids built per query)
        inner = inner_index(index)
        self._positional = (not searchable.on_gpu and has_id_map(index) and self._refine is None
                            and (self._hnsw or isinstance(inner, faiss.IndexFlat)))
        # an IVF searched directly (its lists hold the ids; no transform or id map in front of it)
        self._listed = (not searchable.on_gpu and self._ivf is not None and self._refine is None
                        and isinstance(faiss.downcast_index(index), faiss.IndexIVF))
        self._frame: PayloadFrame | None = None
        self._frame_lock = threading.Lock()

    def frame(self, payload_ids: np.ndarray, bare: np.ndarray) -> PayloadFrame:
        """The payload's positions mapped to this index's storage positions (or IVF lists), made
        once: ``payload_ids`` the payload index's int ids by position, ``bare`` the sorted ids
        without a vector. (The base of a loaded shard never changes, so neither does its frame.)"""
        frame = self._frame
        if frame is not None and frame.payload_ids is payload_ids:
            return frame
        with self._frame_lock:
            if self._frame is None or self._frame.payload_ids is not payload_ids:
                built = PayloadFrame.build(payload_ids, bare)
                if self._positional:
                    built.attach_storage(self._stored_ids())
                elif self._ivf is not None and self._refine is None:
                    self._list_layout()
                    assert self._lists is not None
                    built.attach_lists(self._lists[0], self._lists[1])
                self._frame = built
            return self._frame

    def search(self, queries: np.ndarray, k: int, selection: Selection | np.ndarray, *, nprobe: int | None = None,
               ef_search: int | None = None, exact: bool = False) -> tuple[np.ndarray, np.ndarray, FilterPlan]:
        """(distances as FAISS gives them, int ids, the plan) for ``queries`` among the documents
        ``selection`` keeps (or these int ids). ``exact``: score those documents only, however
        many (a partition's search: the index is not walked through other partitions' documents)."""
        if isinstance(selection, np.ndarray):
            selection = Selection.of_ids(selection)
        n_queries, matches = len(queries), selection.matches
        if matches == 0:
            empty = np.full((n_queries, k), NO_RESULT, dtype=np.int64)
            return np.zeros((n_queries, k), dtype=np.float32), empty, FilterPlan(0, "none")
        if exact or matches <= self.exact_scan_max or self.searchable.on_gpu:
            # by storage position when most of the storage is scored anyway (few: by id, a lookup each)
            whole = self._positional and matches * WHOLE_MATRIX_SHARE > self.searchable.ntotal
            distances, ids = self._exact_of(queries, k, selection, selection.storage_mask() if whole else None)
            return distances, ids, FilterPlan(matches, "exact", exact_rows=n_queries)
        # by storage position: a bitmap of the kept documents (None: the index is searched by id)
        kept = selection.storage_mask() if self._positional else None
        plan = FilterPlan(matches, "index")
        walk = self._walker(k, selection, kept, nprobe, ef_search)
        distances = np.zeros((n_queries, k), dtype=np.float32)
        ids = np.full((n_queries, k), NO_RESULT, dtype=np.int64)
        if self._hnsw:  # rows whose probe already holds k matches are answered by it (breadth 0)
            breadths = self._hnsw_plan(queries, k, matches, walk.selector, kept, ef_search, distances, ids)
            plan.probe_rows = int((breadths == 0).sum())
        elif self._ivf is not None and self._refine is None:
            breadths = self._ivf_breadths(queries, selection)
        else:
            breadths = np.full(n_queries, max(1.0, self.searchable.ntotal / matches))
        scan = np.flatnonzero(np.isinf(breadths))  # the walk would cost more than scoring the matches
        if scan.size and kept is not None and self.regions is not None:  # the nearest regions holding matches
            scan = self._region_scan(queries, scan, k, selection, kept, distances, ids, plan)
        if scan.size:
            plan.exact_rows = int(scan.size)
            distances[scan], ids[scan] = self._exact_of(queries[scan], k, selection, kept)
        for breadth in np.unique(breadths[np.isfinite(breadths) & (breadths > 0)]):  # one call per breadth
            rows = np.flatnonzero(breadths == breadth)
            distances[rows], ids[rows] = walk(queries[rows], float(breadth))
        wanted = min(k, matches)
        short = np.flatnonzero((ids >= 0).sum(axis=1) < wanted)
        if short.size:  # widen once, then score the rest exactly
            plan.widened_rows = int(short.size)
            for row in short:
                d2, i2 = walk(queries[row:row + 1], float(breadths[row]) * 4)
                distances[row], ids[row] = d2[0], i2[0]
            still = short[(ids[short] >= 0).sum(axis=1) < wanted]
            if still.size:
                plan.exact_rows += int(still.size)
                distances[still], ids[still] = self._exact_of(queries[still], k, selection, kept)
        return distances, ids, plan

    def _walker(self, k: int, selection: Selection, kept: np.ndarray | None, nprobe: int | None,
                ef_search: int | None) -> _Walk:
        """How this index walks under the filter, ``breadth`` times its usual width."""
        if kept is not None:  # a bit test a visit, by storage position
            # (FAISS's Python wrapper takes the array alone and keeps it alive; its stubs do not know)
            bitmap = faiss.IDSelectorBitmap(np.packbits(kept, bitorder="little"))  # type: ignore[call-arg,arg-type]
            return _Walk(lambda q, breadth: self._in_index(q, k, bitmap, nprobe, ef_search, breadth, positional=True),
                         bitmap)
        whole: Any = None

        def every_kept() -> Any:  # the selector of every kept id (or of every rejected one, when fewer), made once
            nonlocal whole
            if whole is None:
                if (rejected := selection.rejected()) is not None:  # the smaller set: a hash set of 900k
                    whole = faiss.IDSelectorNot(faiss.IDSelectorBatch(rejected))  # ids costs ~90 ms, of 100k ~10
                else:
                    whole = faiss.IDSelectorBatch(selection.allowed)
            return whole

        if self._listed and selection.frame is not None and selection.frame.list_members is not None:
            # an IVF over its own ids: a hash set of the ids in the lists each call scans, where cheaper
            return _Walk(lambda q, breadth: self._ivf_lists_search(q, k, selection, nprobe, breadth, every_kept),
                         None)
        selector = every_kept()
        return _Walk(lambda q, breadth: self._in_index(q, k, selector, nprobe, ef_search, breadth), selector)

    def _ivf_lists_search(self, queries: np.ndarray, k: int, selection: Selection, nprobe: int | None,
                          breadth: float, every_kept: Callable[[], Any]) -> tuple[np.ndarray, np.ndarray]:
        """An IVF's filtered search over the lists it scans: chosen first (the quantizer's
        nearest, as the IVF's own search does) and handed to ``search_preassigned``, so the
        selector and the scan agree by construction (see :meth:`_ivf_scan`)."""
        assert self._ivf is not None
        base = nprobe or self.searchable.baseline("nprobe", int(self._ivf.nprobe))
        width = int(min(int(self._ivf.nlist), math.ceil(base * breadth)))
        centroid_distances, lists = self._ivf.quantizer.search(queries, width)
        lists, selector = self._ivf_scan(lists, selection, every_kept, base)
        params: Any = faiss.SearchParametersIVF()
        params.nprobe = width
        params.sel = selector
        # the C++ call itself: FAISS's Python wrapper of it refuses search parameters (and a selector)
        queries = np.ascontiguousarray(queries, dtype=np.float32)
        lists = np.ascontiguousarray(lists, dtype=np.int64)
        centroid_distances = np.ascontiguousarray(centroid_distances, dtype=np.float32)
        distances = np.empty((len(queries), k), dtype=np.float32)
        ids = np.empty((len(queries), k), dtype=np.int64)
        ivf: Any = self._ivf
        ivf.search_preassigned_c(len(queries), faiss.swig_ptr(queries), k, faiss.swig_ptr(lists),
                                 faiss.swig_ptr(centroid_distances), faiss.swig_ptr(distances), faiss.swig_ptr(ids),
                                 False, params)
        return distances, ids

    def _ivf_scan(self, lists: np.ndarray, selection: Selection, every_kept: Callable[[], Any],
                  base: int) -> tuple[np.ndarray, Any]:
        """(the lists each query scans, the selector they are scanned under) for the quantizer's
        ``lists``, nearest first (-1: none). Lists are left out (-1; FAISS skips them):

        * a list holding no kept document — every entry would be read only to be rejected (an
          anti-correlated filter's walk passes the query's own, emptied, neighbourhood);
        * the lists past the point where a row has seen ``SCAN_SLACK`` times the matching
          documents it needs — as many as an unfiltered search at ``base`` lists scans, or all
          of them. A breadth is a power of two (the rows of a batch share calls), which on a
          filter spread evenly over the lists scans up to twice what is needed (under the
          stop); past the query's emptied neighbourhood it is far more: an anti-correlated
          filter keeping half of 1M documents needs ~2,100 of 4,096 lists to see 8k of its
          documents, the breadth rounds that to all 4,096, and they hold 500k (~140 ms a query
          with the empty lists skipped, ~35 stopping at 8 × 8k).

        Where every scanned list holds only kept documents there is no selector (a filter along
        the clustering: the lists are whole topics); else a hash set of the kept ids of the
        scanned lists (or of their rejected ones, when fewer: negated) — a filter keeping half of
        1M documents with 64 of 4,096 lists scanned: ~8k ids, not 500k. Where the scanned lists
        hold most of the shard (a narrow filter far from the query, spread over every list),
        gathering their ids costs more than hashing the kept ids themselves: ``every_kept``
        gives that selector instead."""
        _, sizes = self._list_layout()
        per_list = selection.per_list(int(sizes.size))
        assert per_list is not None
        holding = np.where(lists >= 0, per_list[np.maximum(lists, 0)], 0)
        scanned = np.where(lists[:, :base] >= 0, sizes[np.maximum(lists[:, :base], 0)], 0).sum(axis=1)
        needed = SCAN_SLACK * np.minimum(scanned, selection.matches)
        seen_before = np.cumsum(holding, axis=1) - holding  # (a row's lists stop after the one reaching it)
        lists = np.where((holding > 0) & (seen_before < needed[:, None]), lists, NO_RESULT)
        chosen = np.unique(lists[lists >= 0])
        entries, inside = int(sizes[chosen].sum()), int(per_list[chosen].sum())
        if inside == entries:  # (a list's kept documents are among its entries: all of them)
            return lists, None
        smaller = min(selection.matches, self.searchable.ntotal - selection.matches)
        # the lists' set: a pass over their entries and a hash of its smaller part; the whole set: a
        # hash of the smaller of the kept and the rejected documents
        if min(inside, entries - inside) + entries // LIST_PASS_PER_HASH >= smaller:
            return lists, every_kept()
        listed, negated = selection.ids_in_lists(chosen)
        selector: Any = faiss.IDSelectorBatch(listed)
        if negated:  # (the documents these lists hold but the filter rejects were the smaller set)
            selector = faiss.IDSelectorNot(selector)
        return lists, selector

    def _region_scan(self, queries: np.ndarray, rows: np.ndarray, k: int, selection: Selection, kept: np.ndarray,
                     distances: np.ndarray, ids: np.ndarray, plan: FilterPlan) -> np.ndarray:
        """Score each of ``rows`` over the kept documents of the regions nearest its query, until
        they held ``Regions.scan_size`` of them (:meth:`Regions.chosen`); the rows where those
        would be more than half of all the matches are returned, for an exact scan (about the
        same cost, and exact)."""
        regions = self.regions
        assert regions is not None
        needed = max(regions.scan_size, k)
        if 2 * min(needed, selection.matches) > selection.matches:  # (read at least needed: most of them)
            return rows
        counts = regions.kept_per_region(kept)
        stored = self._stored_ids()
        exact: list[int] = []
        for row in rows.tolist():
            inside = np.zeros(regions.count, dtype=bool)
            inside[regions.chosen(queries[row], counts, needed)] = True
            positions = np.flatnonzero(inside[regions.of_position] & kept)
            if 2 * positions.size > selection.matches:
                exact.append(row)
                continue
            distances[row], ids[row] = (part[0] for part in self.exact(queries[row:row + 1], k, stored[positions],
                                                                       positions=positions))
            plan.region_rows += 1
        return np.asarray(exact, dtype=np.int64)

    def _exact_of(self, queries: np.ndarray, k: int, selection: Selection,
                  kept: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`exact` over the selection — by storage position when ``kept`` is its bitmap (no
        id → position lookups)."""
        if kept is None:
            return self.exact(queries, k, selection.allowed)
        positions = np.flatnonzero(kept)
        return self.exact(queries, k, self._stored_ids()[positions], positions=positions)

    # -- the planner: how the filter overlaps each query's neighbourhood ---------------------------
    def _hnsw_plan(self, queries: np.ndarray, k: int, matches: int, selector: Any, kept: np.ndarray | None,
                   ef_search: int | None, distances: np.ndarray, ids: np.ndarray) -> np.ndarray:
        """HNSW: first an unfiltered probe of the nearest ``4 × base`` documents (base: the walk's
        efSearch). A row whose probe holds k matches in its first half is answered from it — the
        first k matches in the unfiltered order are the filtered top k, as exactly as the probe is
        (breadth 0; past its first half a beam of that width misses too many). For the
        others the probe measures the filter's density around the query: the filtered walk widens
        by its inverse, not by the filter's global selectivity (a filter that keeps half the corpus
        but none of the query's topic leaves a walk of the usual width with no match near it). A
        walk that would evaluate more vectors than the filter matches (each step visits up to
        2·M neighbours), or be wider than MAX_EF, gives way to an exact scan (inf). ``kept``: the
        selection by storage position — the probe then runs on the graph itself, and membership is
        one array lookup for the whole probe."""
        inner: Any = inner_index(self.searchable.index)
        default = self.searchable.baseline("ef_search", int(inner.hnsw.efSearch))
        base = ef_search or max(default, FILTERED_EF_PER_HIT * k)
        probe = int(min(PROBE_FACTOR * base, MAX_EF, self.searchable.ntotal))
        params: Any = faiss.SearchParametersHNSW()  # type: ignore[attr-defined]
        params.efSearch = probe
        if kept is not None:
            near_distances, near = inner.search(queries, probe, params=params)
            members = (near >= 0) & kept[np.maximum(near, 0)]
            near = np.where(near >= 0, self._stored_ids()[np.maximum(near, 0)], NO_RESULT)
        else:
            near_distances, near = self.searchable.index.search(queries, probe, params=params)
            members = np.array([[i >= 0 and selector.is_member(int(i)) for i in row] for row in near], dtype=bool)
        breadths = np.zeros(len(queries))
        per_step = float(inner.hnsw.nb_neighbors(0))  # level 0 holds 2·M links
        for row in range(len(queries)):
            inside = np.flatnonzero(members[row])
            if inside.size >= k and inside[k - 1] < probe // 2:  # the probe's first half: its surest part
                ids[row], distances[row] = near[row, inside[:k]], near_distances[row, inside[:k]]
                continue
            breadth = max(1.0, (probe + 1.0) / (inside.size + 1.0))
            wanted_ef = base * breadth
            if wanted_ef > MAX_EF or wanted_ef * per_step * WALK_COST > matches:
                breadths[row] = np.inf
            else:  # in powers of two: the rows of a batch fall into a few calls
                breadths[row] = float(np.exp2(np.ceil(np.log2(breadth))))
        return breadths

    def _ivf_breadths(self, queries: np.ndarray, selection: Selection) -> np.ndarray:
        """IVF: the lists hold their documents' ids, so the overlap is counted, not estimated. An
        unfiltered search at nprobe scans the documents of the nprobe nearest lists; a filtered one
        scans nearest lists until it has seen as many matching documents (or all of them). For a
        filter unrelated to the query that is nprobe / selectivity lists; near the query, fewer;
        away from it, as many as it takes."""
        assert self._ivf is not None
        lists_of, sizes = self._list_layout()
        nlist = int(self._ivf.nlist)
        per_list = selection.per_list(nlist)  # by payload position: one gather, no id lookups
        if per_list is None:
            per_list = np.bincount(lists_of(selection.allowed), minlength=nlist)
        base = max(1, self.searchable.baseline("nprobe", int(self._ivf.nprobe)))
        _, order = self._ivf.quantizer.search(queries, nlist)
        scanned = np.take(sizes, order[:, :base]).sum(axis=1)
        seen = np.cumsum(np.take(per_list, order), axis=1)
        target = np.minimum(scanned, selection.matches)
        needed = np.array([int(np.searchsorted(row, want)) + 1 for row, want in zip(seen, target, strict=True)])
        needed = np.minimum(needed, nlist)
        breadths: np.ndarray = np.exp2(np.ceil(np.log2(np.maximum(1.0, needed / base))))
        return breadths

    def _list_layout(self) -> tuple[Any, np.ndarray]:
        """(int ids → their IVF list, each list's size), read out of the inverted lists once."""
        if self._lists is None:
            with self._lock:
                if self._lists is None:
                    assert self._ivf is not None
                    invlists: Any = self._ivf.invlists
                    nlist = int(self._ivf.nlist)
                    sizes = np.array([invlists.list_size(i) for i in range(nlist)], dtype=np.int64)
                    stored = np.empty(int(sizes.sum()), dtype=np.int64)
                    position = 0
                    for i in range(nlist):
                        if sizes[i]:
                            pointer = invlists.get_ids(i)
                            stored[position:position + sizes[i]] = faiss.rev_swig_ptr(pointer, int(sizes[i]))
                            invlists.release_ids(i, pointer)
                            position += int(sizes[i])
                    owner = np.repeat(np.arange(nlist, dtype=np.int64), sizes)
                    order = np.argsort(stored, kind="stable")
                    self._lists = (stored[order], owner[order], sizes)
        stored_sorted, owner_sorted, sizes = self._lists

        def lists_of(ids: np.ndarray) -> np.ndarray:
            slots = np.minimum(np.searchsorted(stored_sorted, ids), max(len(stored_sorted) - 1, 0))
            return owner_sorted[slots]

        return lists_of, sizes

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

    def _in_index(self, queries: np.ndarray, k: int, selector: Any, nprobe: int | None, ef_search: int | None,
                  breadth: float, *, positional: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """The index's own search under ``selector``, ``breadth`` times its usual width;
        ``positional``: the selector tests storage positions, so the index under the id map is
        searched and its positions mapped to ids here."""
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
        if positional:
            distances, positions = inner_index(self.searchable.index).search(queries, k, params=params)
            return distances, np.where(positions >= 0, self._stored_ids()[np.maximum(positions, 0)], NO_RESULT)
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

    def exact(self, queries: np.ndarray, k: int, allowed: np.ndarray, *,
              positions: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Score every allowed vector: the exact filtered top k, best first (FAISS's convention:
        inner products descending, L2 distances ascending). ``positions``: their storage
        positions, when the caller has them (a flat storage is then read without id lookups)."""
        whole = None
        if positions is not None and len(queries) <= BY_POSITION_MAX_ROWS \
                and allowed.size < BY_POSITION_SHARE * self.searchable.ntotal:
            in_place = self._whole_storage(allowed, positions)
            if in_place is not None:  # few rows: theirs scored in place by position (SIMD, no copy)
                return self._top_k(self._by_position(queries, in_place[0], positions), allowed, k)
        if allowed.size * WHOLE_MATRIX_SHARE > self.searchable.ntotal:
            whole = self._whole_storage(allowed, positions)
        if whole is not None:  # many match: every stored vector scored in place (SIMD, no copy), theirs picked
            storage, picked = whole
            scores = np.empty((len(queries), picked.size), dtype=np.float32)
            row = np.empty(storage.ntotal, dtype=np.float32)
            against: Any = (faiss.fvec_L2sqr_ny if self.metric == "l2"  # type: ignore[attr-defined]
                            else faiss.fvec_inner_products_ny)  # type: ignore[attr-defined]
            for i, query in enumerate(np.ascontiguousarray(queries, dtype=np.float32)):
                against(faiss.swig_ptr(row), faiss.swig_ptr(query), storage.get_xb(), storage.d, storage.ntotal)
                scores[i] = -row[picked] if self.metric == "l2" else row[picked]
        else:  # few: read theirs back (a copy each) and score those
            flat = self._flat_matrix() if positions is not None else None
            vectors = flat[positions] if flat is not None else self.vectors(allowed)
            products = queries @ vectors.T
            if self.metric == "l2":
                scores = -(np.sum(queries ** 2, axis=1)[:, None] - 2.0 * products
                           + np.sum(vectors ** 2, axis=1)[None, :])
            else:
                scores = products
        return self._top_k(scores, allowed, k)

    def _by_position(self, queries: np.ndarray, storage: Any, positions: np.ndarray) -> np.ndarray:
        """Each query's scores (higher is better) against the flat ``storage``'s vectors at
        ``positions``, read in place."""
        positions = np.ascontiguousarray(positions, dtype=np.int64)
        scores = np.empty((len(queries), positions.size), dtype=np.float32)
        against: Any = (faiss.fvec_L2sqr_by_idx if self.metric == "l2"  # type: ignore[attr-defined]
                        else faiss.fvec_inner_products_by_idx)  # type: ignore[attr-defined]
        for i, query in enumerate(np.ascontiguousarray(queries, dtype=np.float32)):
            row = scores[i]
            against(faiss.swig_ptr(row), faiss.swig_ptr(query), storage.get_xb(), faiss.swig_ptr(positions),
                    storage.d, 1, positions.size)
        return -scores if self.metric == "l2" else scores

    def _top_k(self, scores: np.ndarray, allowed: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The best ``k`` of ``scores`` (queries × allowed, higher is better) as FAISS gives them:
        best first, equal scores in id order (like the merge), L2 distances positive."""
        n_rows = len(scores)
        kk = min(k, allowed.size)
        top = np.argpartition(-scores, kk - 1, axis=1)[:, :kk] if kk < allowed.size else \
            np.tile(np.arange(allowed.size), (n_rows, 1))
        rows = np.arange(n_rows)[:, None]
        # best first; equal scores in id order, like the merge
        order = np.lexsort((allowed[top], -scores[rows, top]), axis=1)
        chosen = top[rows, order]
        out_ids = np.full((n_rows, k), NO_RESULT, dtype=np.int64)
        out_scores = np.zeros((n_rows, k), dtype=np.float32)
        out_ids[:, :kk] = allowed[chosen]
        best = scores[rows, chosen]
        out_scores[:, :kk] = -best if self.metric == "l2" else best
        return out_scores, out_ids

    def _whole_storage(self, allowed: np.ndarray, known: np.ndarray | None = None) -> tuple[Any, np.ndarray] | None:
        """(the flat storage holding every vector as plain floats, the storage rows of ``allowed``)
        for Flat and HNSW-over-Flat indexes under a plain id map on this host; else None. (Scored
        by FAISS's own routines in place: a NumPy view of a memory-mapped index can be unaligned,
        and NumPy then multiplies without BLAS — 160 ms for 100k × 384 instead of 6.)"""
        index = self.searchable.index
        if self.searchable.on_gpu or not has_id_map(index) or isinstance(index, faiss.IndexIDMap2):
            return None
        inner = inner_index(index)
        storage = faiss.downcast_index(inner.storage) if isinstance(inner, faiss.IndexHNSW) else inner
        if not isinstance(storage, faiss.IndexFlat) or storage.ntotal == 0:
            return None
        if known is not None:  # the storage positions of ``allowed``, from the caller
            return storage, known
        positions = self._position_map()
        if positions is None:
            return None
        return storage, positions.of(allowed)

    def _flat_matrix(self) -> np.ndarray | None:
        """Every stored vector of a flat storage (Flat, HNSW over Flat) under a plain id map on this
        host, as a read-only NumPy view of FAISS's own array (made once; the index is never
        changed after load, and ``self.searchable`` keeps it alive); None for other indexes. A
        weighted hybrid reads its candidates' vectors from here on every query."""
        if not self._flat_checked:  # (two threads may both look: they find the same view)
            whole = self._whole_storage(np.zeros(0, dtype=np.int64)) if self._ivf is None else None
            if whole is not None:
                storage = whole[0]
                view = faiss.rev_swig_ptr(storage.get_xb(), storage.ntotal * storage.d)
                view = view.reshape(storage.ntotal, storage.d)
                view.flags.writeable = False
                self._flat = view
            self._flat_checked = True
        return self._flat

    def _position_map(self) -> IdPositions | None:
        """Int id → storage position under a plain id map (None: ids are positions), built once."""
        if self._positions is None and has_id_map(self.searchable.index):
            stored = self._stored_ids()  # (takes the lock itself)
            with self._lock:
                if self._positions is None:
                    self._positions = id_positions(self.searchable.index, stored)
        return self._positions

    def _stored_ids(self) -> np.ndarray:
        """The id map's ids by position, copied out of FAISS once."""
        if self._id_map is None:
            with self._lock:
                if self._id_map is None:
                    self._id_map = faiss.vector_to_array(self.searchable.index.id_map)  # type: ignore[attr-defined]
        return self._id_map

    def flat_storage(self) -> tuple[np.ndarray, IdPositions] | None:
        """Where :meth:`vectors` reads a flat storage from: its matrix (a read-only view) and the
        int id → position map; None for other indexes."""
        flat = self._flat_matrix()
        if flat is None:
            return None
        positions = self._position_map()
        assert positions is not None  # _flat_matrix requires a plain id map
        return flat, positions

    def vectors(self, ids: np.ndarray) -> np.ndarray:
        """The stored vectors of these int ids (for PQ/SQ indexes: decoded from their codes)."""
        flat = self._flat_matrix()
        if flat is not None:  # the same floats reconstruct_batch copies out, without a FAISS call per read
            positions = self._position_map()
            assert positions is not None  # _flat_matrix requires a plain id map
            gathered: np.ndarray = flat[positions.of(ids)]
            return gathered
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
