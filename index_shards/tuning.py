"""Auto-tuning a version's search knob to a recall target — the shard-side half of ``shardrag tune``.

Each shard is evaluated on its own (in a worker process or a Ray task, next to its files):
:func:`sample_queries` draws stored vectors as pseudo-queries; :func:`evaluate_shard` answers the
tuning queries exactly (every stored vector scored) and once per candidate value of the knob —
``nprobe`` for IVF, ``ef_search`` for HNSW — one query at a time, timing each candidate. The
driver (:func:`tune`) merges the shards' top k as the gateway would, so the recall it reports is
the recall of the sharded search, and picks the cheapest value whose recall meets the target with
95 % confidence on the tuning queries; a held-out third of the queries then checks the choice.

With ``rebuild`` (``shardrag tune --rebuild``) the structure is searched too: each worker rebuilds
its shard's index from the stored vectors under every candidate of :func:`structure_candidates`
(nlist for IVF, M for HNSW, PQ code sizes, and for a Flat index the approximate structures that
could replace it) — every HNSW candidate at each build breadth of :func:`breadth_candidates` —
and evaluates each one's knob grid the same way; the driver picks per structure, then the
structure whose choice serves the most queries per second.

Exact answers come from the vectors the index stores. For PQ/SQ indexes those are decoded codes
(for fast-scan codes, which cannot be decoded one by one, the index's own every-list scan): the
recall is then that of the probe over the compressed vectors, and the report says so. A caller
holding the original vectors passes their exact answers to :func:`choose` instead.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import faiss
import numpy as np

from index_shards.faiss_index import (
    FAISS_EF_CONSTRUCTION,
    SearchableIndex,
    build_index,
    has_id_map,
    id_positions,
    native_search_params,
    read_index,
    reconstruct_ids,
    refine_of,
)
from index_shards.layout import INDEX_FILE
from index_shards.manifest import read_shard_manifest
from retrieval.errors import ConfigError
from retrieval.tuning_choice import (  # the choosing half (pure numpy): the gateway uses it too
    NO_ID,
    ShardTuning,
    TuneReport,
    choose,
    is_lossy,
    merge_top_k,
)
from retrieval.types import check_ef_construction

# Candidate values: roughly ×1.5 steps, so the frontier has enough points and the chosen value
# is at most ~1.5× the cheapest that would do.
_STEPS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072,
          4096, 6144, 8192)
EF_MAX = 1024


def stored_ids(index: faiss.Index) -> np.ndarray:
    """The int64 ids an index holds, in storage order."""
    if has_id_map(index):
        return faiss.vector_to_array(index.id_map).astype(np.int64)  # type: ignore[attr-defined]
    ivf = faiss.try_extract_index_ivf(index)
    if ivf is None:
        return np.arange(index.ntotal, dtype=np.int64)
    invlists = ivf.invlists
    assert invlists is not None  # an IVF index always has its lists
    parts = []
    for list_no in range(ivf.nlist):
        size = invlists.list_size(list_no)
        if size:
            parts.append(faiss.rev_swig_ptr(invlists.get_ids(list_no), size).copy())
    return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, dtype=np.int64)


def stored_vectors(index: faiss.Index, ids: np.ndarray) -> np.ndarray:
    """The vectors stored under ``ids`` (decoded for PQ/SQ codes)."""
    ivf = faiss.try_extract_index_ivf(index)
    if ivf is not None and refine_of(index) is None:  # a refine stage reconstructs from its own vectors
        # id → (list, offset) for arbitrary ids
        ivf.set_direct_map_type(faiss.DirectMap.Hashtable)  # type: ignore[attr-defined]
    positions = id_positions(index)
    out = np.empty((len(ids), index.d), dtype=np.float32)
    for start in range(0, len(ids), 65536):  # bounded temporaries on big shards
        out[start:start + 65536] = reconstruct_ids(index, ids[start:start + 65536], positions)
    return out


def is_fast_scan(index: faiss.Index) -> bool:
    """Fast-scan codes (``...x4fs``) are packed in blocks: FAISS cannot decode them one by one
    (behind a refine stage they need not be: its vectors are decoded instead)."""
    if refine_of(index) is not None:
        return False
    ivf = faiss.try_extract_index_ivf(index)
    return isinstance(faiss.downcast_index(ivf if ivf is not None else index),
                      (faiss.IndexIVFFastScan, faiss.IndexFastScan))


def knob_of(index: faiss.Index) -> tuple[str, list[int]] | None:
    """The knob worth tuning and its candidate values, or None for an exact (flat) index."""
    ivf = faiss.try_extract_index_ivf(index)
    if ivf is not None:
        return "nprobe", sorted({v for v in _STEPS if v < ivf.nlist} | {int(ivf.nlist)})
    if "ef_search" in native_search_params(index):
        return "ef_search", [v for v in _STEPS if 8 <= v <= EF_MAX]
    return None


_HNSW_M = (8, 16, 24, 32, 48)
_MIN_PER_LIST = 39  # FAISS's k-means warns below 39 training points per centroid
_PQ_MIN_ROWS = 39 * 256  # 8-bit PQ codebooks need this many training vectors per shard


def structure_candidates(factory: str, dim: int, min_count: int) -> list[str]:
    """Factory strings worth building instead of ``factory`` (itself first), for a version whose
    smallest shard holds ``min_count`` vectors of ``dim`` dims: IVF at ¼…4× the lists (plus PQ
    codes of dim/4 and dim/8 bytes over Flat lists, where a shard has enough vectors to train
    them), HNSW at M 8…48, and for Flat the approximate structures that could replace it.
    Compressed originals (PQ, SQ) are refused: their vectors cannot be decoded back exactly."""
    compact = factory.replace(" ", "")
    if is_lossy(compact):
        raise ConfigError(f"--rebuild needs the original vectors, and {factory} stores compressed codes; rebuild "
                          "from the corpus with `shardrag build --factory ...` and tune each build instead",
                          field="rebuild")
    head, _, tail = compact.partition(",")
    upper = head.upper()
    max_lists = max(1, min_count // _MIN_PER_LIST)
    out = [compact]
    if upper.startswith("IVF") and upper[3:].isdigit():
        nlist = int(upper[3:])
        for lists in (nlist // 4, nlist // 2, nlist * 2, nlist * 4):
            if 4 <= lists <= max_lists:
                out.append(f"IVF{lists},{tail}")
        if tail.upper() == "FLAT" and min_count >= _PQ_MIN_ROWS:
            out += [f"IVF{nlist},PQ{m}" for m in (dim // 4, dim // 8) if m >= 1 and dim % m == 0]
    elif upper.startswith("HNSW") and upper[4:].isdigit() and not tail:
        out += [f"HNSW{m}" for m in _HNSW_M if m != int(upper[4:])]
    elif upper == "FLAT" and not tail:
        lists = 1 << int(math.log2(max(4.0, min(4 * math.sqrt(min_count), max_lists))))  # ~4·√n, a power of 2
        out += ["HNSW16", "HNSW32"] + ([f"IVF{lists},Flat"] if max_lists >= 4 else [])
    return list(dict.fromkeys(out))


# The wider breadth tried beside the published one (FAISS links with 40 unless told otherwise):
# at 1M vectors 100 against 40 lifted recall@10 at ef_search 256 from 0.895 to 0.938 (filtered
# worst queries from 0.0 to 0.7–0.8) for a 1.4× build and the same QPS (docs/benchmarks.md, "An
# HNSW graph's build breadth").
WIDER_EF_CONSTRUCTION = 100
_MAX_TRIED_BREADTH = 800  # past it a build costs ~20× FAISS's default for a graph already well linked


def breadth_candidates(factory: str, published: int | None) -> list[int | None]:
    """The build breadths (``ef_construction``) ``--rebuild`` links an HNSW ``factory`` with: the
    published version's (None: FAISS's 40), then a wider one — 100, or twice the published when
    that is 100 or more. Only the breadth of a structure without an HNSW graph is None alone."""
    if "HNSW" not in factory.upper():
        return [None]
    base = published if published is not None else FAISS_EF_CONSTRUCTION
    wider = min(max(WIDER_EF_CONSTRUCTION, 2 * base), _MAX_TRIED_BREADTH)
    return [published] + ([wider] if wider > base else [])


def structure_label(factory: str, ef_construction: int | None) -> str:
    """How a report names a structure: its factory, and its build breadth when one was given."""
    return factory if ef_construction is None else f"{factory} efC{ef_construction}"


@dataclass(frozen=True, slots=True)
class ShardTask:
    """What one worker evaluates: a shard directory and the tuning queries."""

    shard_dir: str
    queries: np.ndarray  # n × dim float32
    exclude: np.ndarray  # n int64: a pseudo-query's own id, never counted as a hit (-1: none)
    k: int
    max_value: int | None = None  # never try the knob above this (a latency budget); None: the full grid
    exact: bool = True  # compute this shard's exact answers (False: the caller brings ground truth to choose())
    rebuild_as: str | None = None  # rebuild the shard's index with this factory (from its stored vectors) first
    ef_construction: int | None = None  # a rebuilt HNSW graph's breadth (None: FAISS's 40)


def _higher_better(scores: np.ndarray, metric: str) -> np.ndarray:
    return -scores if metric == "l2" else scores


def _drop_excluded(scores: np.ndarray, ids: np.ndarray, exclude: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Top ``k`` per row once each row's own id (and FAISS's -1 padding) is removed."""
    out_scores = np.full((len(ids), k), -np.inf, dtype=np.float32)
    out_ids = np.full((len(ids), k), NO_ID, dtype=np.int64)
    for row in range(len(ids)):
        keep = (ids[row] != exclude[row]) & (ids[row] != NO_ID)
        kept_ids, kept_scores = ids[row][keep][:k], scores[row][keep][:k]
        out_ids[row, :len(kept_ids)] = kept_ids
        out_scores[row, :len(kept_scores)] = kept_scores
    return out_scores, out_ids


def load_index(shard_dir: str | Path) -> tuple[faiss.Index, str, str, int]:
    """(index, factory, metric, shard id) of a published shard, read without its doc store."""
    manifest = read_shard_manifest(shard_dir)
    return read_index(Path(shard_dir) / INDEX_FILE), manifest.factory, manifest.metric, manifest.shard_id


def sample_queries(shard_dir: str, count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``count`` stored vectors of one shard drawn at random, with their ids: pseudo-queries whose
    own document is left out of every answer (they stand in for held-out documents)."""
    index, factory, _, _ = load_index(shard_dir)
    return sample_index(index, factory, count, seed)


def sample_index(index: faiss.Index, factory: str, count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`sample_queries` of an index in hand (a running replica's base)."""
    if is_fast_scan(index):
        raise ConfigError(f"{factory} stores fast-scan codes, which cannot be decoded into pseudo-queries; "
                          "tune it with real queries (--queries FILE)", field="queries")
    ids = stored_ids(index)
    chosen = np.random.default_rng(seed).choice(len(ids), size=min(count, len(ids)), replace=False)
    return stored_vectors(index, ids[chosen]), ids[chosen]


def evaluate_shard(task: ShardTask) -> ShardTuning:
    """Exact and per-candidate answers of one shard to the tuning queries (runs in a worker)."""
    index, factory, metric, shard_id = load_index(task.shard_dir)
    faiss.omp_set_num_threads(1)  # one query at a time on one core: the figure a replica serves at c=1
    return evaluate_index(index, factory, metric, shard_id, task,
                          index_bytes=(Path(task.shard_dir) / INDEX_FILE).stat().st_size,
                          breadth=read_shard_manifest(task.shard_dir).ef_construction)


def evaluate_index(index: faiss.Index, factory: str, metric: str, shard_id: int, task: ShardTask, *,
                   index_bytes: int, breadth: int | None = None) -> ShardTuning:
    """:func:`evaluate_shard` of an index in hand (``task.shard_dir`` unused; ``breadth``: the
    ``ef_construction`` it was built with). It sets the knob on ``index`` for every candidate:
    give it an index no live query searches (a clone)."""
    queries = np.ascontiguousarray(task.queries, dtype=np.float32)
    ask = min(task.k + 1, max(int(index.ntotal), 1))  # +1: room to drop a pseudo-query's own id
    if task.exact:
        exact_scores, exact_ids = _exact_answers(index, metric, queries, ask, task)
    else:
        exact_scores = np.zeros((len(queries), 0), dtype=np.float32)
        exact_ids = np.zeros((len(queries), 0), dtype=np.int64)
    build_s, rebuilt = 0.0, False
    if task.rebuild_as is not None and (task.rebuild_as != factory or _relinked(task, factory, breadth)):
        ids = stored_ids(index)
        vectors = stored_vectors(index, ids)
        started = time.perf_counter()  # on the worker's one core: the tasks run side by side
        wanted = task.ef_construction if "HNSW" in task.rebuild_as.upper() else None
        index, factory = build_index(vectors, ids, task.rebuild_as, metric, ef_construction=wanted), task.rebuild_as
        build_s, rebuilt = time.perf_counter() - started, True
    knob = knob_of(index)
    values = [v for v in knob[1] if task.max_value is None or v <= task.max_value] if knob else []
    if knob is None and task.rebuild_as is not None:
        values = [0]  # an exact structure among rebuild candidates: one pass, for its QPS (recall is 1)
    result = ShardTuning(shard_id, factory, int(index.ntotal), knob[0] if knob else None, values,
                         exact_scores, exact_ids, build_s=build_s,
                         index_bytes=int(faiss.serialize_index(index).nbytes) if rebuilt else index_bytes)
    searchable = SearchableIndex.wrap(index, "cpu")
    for value in result.values:
        params = {result.knob: value} if result.knob else {}
        found_scores = np.empty((len(queries), ask), dtype=np.float32)
        found_ids = np.empty((len(queries), ask), dtype=np.int64)
        searchable.search(queries[:8], ask, **params)  # warm caches: the first value is not charged for them
        started = time.perf_counter()
        for row in range(len(queries)):
            found_scores[row:row + 1], found_ids[row:row + 1] = searchable.search(queries[row:row + 1], ask,
                                                                                  **params)
        result.seconds.append(time.perf_counter() - started)
        scores, hit_ids = _drop_excluded(_higher_better(found_scores, metric), found_ids, task.exclude, task.k)
        result.scores.append(scores)
        result.ids.append(hit_ids)
    return result


def _relinked(task: ShardTask, factory: str, breadth: int | None) -> bool:
    """Whether ``task`` asks for the published HNSW ``factory`` linked with another breadth (None
    and 40 are the same: FAISS's default)."""
    def named(value: int | None) -> int:
        return FAISS_EF_CONSTRUCTION if value is None else value

    return "HNSW" in factory.upper() and named(task.ef_construction) != named(breadth)


def _exact_answers(index: faiss.Index, metric: str, queries: np.ndarray, ask: int,
                   task: ShardTask) -> tuple[np.ndarray, np.ndarray]:
    """Every stored vector scored. Fast-scan codes cannot be decoded one by one, so there the
    reference is the index's own exhaustive scan (every list probed)."""
    ivf = faiss.try_extract_index_ivf(index)
    if ivf is not None and is_fast_scan(index):
        searchable = SearchableIndex.wrap(index, "cpu")
        raw_scores, raw_ids = searchable.search(queries, ask, nprobe=int(ivf.nlist))
        return _drop_excluded(_higher_better(raw_scores, metric), raw_ids, task.exclude, task.k)
    ids = stored_ids(index)
    exact = faiss.IndexFlatIP(index.d) if metric == "ip" else faiss.IndexFlatL2(index.d)
    exact.add(stored_vectors(index, ids))
    raw_scores, positions = exact.search(queries, ask)
    raw_ids = np.where(positions >= 0, ids[np.maximum(positions, 0)], NO_ID)
    return _drop_excluded(_higher_better(raw_scores, metric), raw_ids, task.exclude, task.k)


@dataclass(frozen=True, slots=True)
class Structure:
    """A candidate of ``--rebuild``: a factory, and for an HNSW graph the breadth it is linked with
    (None: FAISS's 40, or whatever the published index was built with when it is not rebuilt)."""

    factory: str
    ef_construction: int | None = None

    @property
    def label(self) -> str:
        return structure_label(self.factory, self.ef_construction)


def structures_to_try(factory: str, dim: int, min_count: int, published_breadth: int | None,
                      breadths: Sequence[int] | None = None) -> list[Structure]:
    """Every structure ``--rebuild`` builds and tunes for a published ``factory`` (itself first,
    as published): :func:`structure_candidates`, each HNSW one at every breadth of ``breadths``
    (default :func:`breadth_candidates`). FAISS's 40 is named None, so the same graph is never
    built twice under two names."""
    def named(breadth: int | None) -> int | None:
        return None if breadth == FAISS_EF_CONSTRUCTION else breadth

    published = Structure(factory.replace(" ", ""), named(published_breadth) if "HNSW" in factory.upper() else None)
    out = [published]
    for candidate in structure_candidates(factory, dim, min_count):
        tried = breadth_candidates(candidate, published_breadth) if breadths is None or "HNSW" not in \
            candidate.upper() else [check_ef_construction(b) for b in breadths]
        out += [Structure(candidate, named(breadth)) for breadth in tried]
    return list(dict.fromkeys(out))


@dataclass(frozen=True, slots=True)
class StructureReport:
    """One candidate structure of ``--rebuild``: its knob search and what it costs to hold."""

    factory: str
    build_s: float  # the slowest shard's rebuild, on one core (0: the published index)
    index_bytes: int  # every shard's index together
    report: TuneReport
    ef_construction: int | None = None  # an HNSW graph's build breadth (None: FAISS's 40 / as published)

    @property
    def label(self) -> str:
        return structure_label(self.factory, self.ef_construction)


def choose_structure(by_structure: dict[Structure, list[ShardTuning]], target: float, k: int,
                     tune_rows: np.ndarray, holdout_rows: np.ndarray
                     ) -> tuple[list[StructureReport], StructureReport | None]:
    """:func:`choose` per structure, against the exact answers of the first (the published index,
    whose tasks computed them), then the structure whose choice serves the most queries/s. A wider
    build breadth of a factory competes only where it needs a smaller knob value than a narrower
    breadth of the same factory that meets the target: at the same value the two search alike, and
    their QPS differ by timing noise alone, so the cheaper build is kept."""
    published = next(iter(by_structure.values()))
    truth = merge_top_k([r.exact_scores for r in published], [r.exact_ids for r in published], k)
    reports = [StructureReport(structure.factory, max(r.build_s for r in results),
                               sum(r.index_bytes for r in results),
                               choose(results, target, k, tune_rows, holdout_rows, truth=truth),
                               structure.ef_construction)
               for structure, results in by_structure.items()]
    meeting = [s for s in reports if s.report.chosen is not None and not _narrower_does_as_well(s, reports)]
    return reports, max(meeting, key=lambda s: s.report.chosen.qps if s.report.chosen else 0.0) if meeting else None


def _breadth(structure: StructureReport) -> int:
    return structure.ef_construction if structure.ef_construction is not None else FAISS_EF_CONSTRUCTION


def _narrower_does_as_well(structure: StructureReport, reports: list[StructureReport]) -> bool:
    """Whether a narrower build of ``structure``'s factory meets the target at a knob value no
    larger than ``structure``'s own choice."""
    chosen = structure.report.chosen
    assert chosen is not None
    return any(other.factory == structure.factory and _breadth(other) < _breadth(structure)
               and other.report.chosen is not None and other.report.chosen.value <= chosen.value
               for other in reports)
