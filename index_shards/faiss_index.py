"""FAISS indexes for one shard: build from any index-factory string with stable int64 ids,
read/write, search parameters, and the automatic GPU move.

FAISS is imported here and nowhere in ``retrieval``. Ids: IVF indexes store them natively;
every other factory (``Flat``, ``HNSW32``, ``PQ32``...) is wrapped in an id map so the int64 id
of a document never depends on its position. The map is FAISS's plain ``IndexIDMap`` (a vector of
ids), not ``IndexIDMap2``, which also builds a hash table id → position in each replica's own
memory when the file is read: 50 bytes a document against 8 (measured), 10 MB more per replica
for a 250k-vector shard whose mapped index is otherwise shared between replicas. The rare reads
by id (filtered exact scans, get-by-id, tuning) use :class:`IdPositions`, built on first use.
Files written with ``IndexIDMap2`` before still load and work.

A refine stage (a factory ending in ``,RFlat`` or ``,Refine(SQ8)``: FAISS's ``IndexRefine``)
re-ranks ``k_factor × k`` candidates of the compressed first stage on fuller vectors. That is
what lets 4-bit PQ codes reach a recall target at all (alone they stall near 0.3 at 1M); its
``k_factor`` is a search knob like ``nprobe``, set to :data:`REFINE_K_FACTOR` at build.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from retrieval.errors import BuildError, ConfigError, IndexIntegrityError, InvalidRequest
from retrieval.types import check_ef_construction

logger = logging.getLogger(__name__)

METRICS = {"ip": faiss.METRIC_INNER_PRODUCT, "l2": faiss.METRIC_L2}


def metric_code(metric: str) -> int:
    try:
        return METRICS[metric]
    except KeyError:
        raise ConfigError(f"unknown metric {metric!r}; use one of {sorted(METRICS)}", field="metric") from None


def gpu_count() -> int:
    """GPUs FAISS can use (0 with faiss-cpu, which still has the function)."""
    getter = getattr(faiss, "get_num_gpus", None)
    return int(getter()) if getter else 0


def wants_gpu(device: str) -> bool:
    """True when ``device`` sends the index to the GPU: "gpu", or "auto" with a GPU FAISS can use."""
    return device == "gpu" or (device == "auto" and gpu_count() > 0)


# Candidates re-ranked per result by a refine stage, as a multiple of k. Measured at 1M synthetic
# MiniLM vectors (250k per shard, IVF2048,PQ96x4fs,Refine(SQ8), nprobe 128): recall@10 0.920 at 8,
# 0.950 at 16, 0.966 at 32 — and re-ranking 320 SQ8 rows costs a few µs against the lists' scan.
REFINE_K_FACTOR = 32


def has_id_map(index: faiss.Index) -> bool:
    """Whether ``index`` is an id map over another index (``IndexIDMap``, or ``IndexIDMap2`` in
    files written before the plain map was used)."""
    return isinstance(index, (faiss.IndexIDMap, faiss.IndexIDMap2))


def inner_index(index: faiss.Index) -> Any:
    """The index under an id map, or ``index`` itself. (Typed ``Any``: FAISS's stubs know few of
    the subclasses' fields.)"""
    return faiss.downcast_index(index.index) if has_id_map(index) else index  # type: ignore[attr-defined]


def refine_of(index: faiss.Index) -> Any:
    """The ``IndexRefine`` inside ``index`` (under an id map), or None. (Typed ``Any``: FAISS's
    stubs do not know its ``k_factor``.)"""
    inner = inner_index(index)
    return inner if isinstance(inner, faiss.IndexRefine) else None


class IdPositions:
    """Document id → storage position for an index under an id map: the ids sorted once (16 bytes
    a document, built on the first read by id rather than for every replica at load, as
    ``IndexIDMap2``'s hash table is)."""

    def __init__(self, stored: np.ndarray) -> None:
        self._order = np.argsort(stored, kind="stable")
        self._sorted = stored[self._order]

    def of(self, ids: np.ndarray) -> np.ndarray:
        """The positions of ``ids``; an id the index does not hold is an IndexIntegrityError (the
        callers ask only for ids their payload index says are stored)."""
        ids = np.asarray(ids, dtype=np.int64)
        slots = np.minimum(np.searchsorted(self._sorted, ids), max(len(self._sorted) - 1, 0))
        found = self._sorted[slots] == ids if len(self._sorted) else np.zeros(len(ids), dtype=bool)
        if not found.all():
            missing = ids[~found][:5].tolist()
            raise IndexIntegrityError(f"the index holds no vector under id(s) {missing}")
        return self._order[slots].astype(np.int64)


def id_positions(index: faiss.Index, stored: np.ndarray | None = None) -> IdPositions | None:
    """An :class:`IdPositions` for an index under a plain ``IndexIDMap``; None where the index
    reconstructs by id itself (``IndexIDMap2``, IVF with a direct map, bare indexes). ``stored``:
    the id vector where the caller already copied it out of FAISS (else it is copied here)."""
    if not has_id_map(index) or isinstance(index, faiss.IndexIDMap2):
        return None
    if stored is None:
        stored = faiss.vector_to_array(index.id_map)  # type: ignore[attr-defined]
    return IdPositions(np.asarray(stored, dtype=np.int64))


def reconstruct_ids(index: faiss.Index, ids: np.ndarray, positions: IdPositions | None) -> np.ndarray:
    """The stored vectors (decoded codes for PQ/SQ) under ``ids``: through ``positions`` (from
    :func:`id_positions`) for a plain id map, else the index's own ``reconstruct_batch``."""
    if positions is not None:
        return np.asarray(inner_index(index).reconstruct_batch(positions.of(ids)), dtype=np.float32)
    return np.asarray(index.reconstruct_batch(np.asarray(ids, dtype=np.int64)), dtype=np.float32)


# What FAISS links each vector of an HNSW graph with when nothing sets it (``hnsw.efConstruction``;
# its factory string cannot say another). Kept as shardrag's default: a larger one builds a better
# graph, more slowly (docs/filters.md: one shard of 1M synthetic MiniLM vectors, HNSW32 at
# ef_search 256 — 100 built in 201–205 s against 140–145 and recalled 0.938 against 0.895
# unfiltered, 0.988–0.995 against 0.925–0.965 under filters along or across the query).
FAISS_EF_CONSTRUCTION = 40


def build_index(vectors: np.ndarray, ids: np.ndarray, factory: str, metric: str = "ip", *,
                ef_construction: int | None = None) -> faiss.Index:
    """Train (when the factory needs it) and fill an index with ``vectors`` under ``ids``.
    ``ef_construction``: the candidates every HNSW graph in the factory (the index itself or an
    IVF's quantizer) keeps while linking a vector (None: FAISS's :data:`FAISS_EF_CONSTRUCTION`); a
    ConfigError where the factory has no graph. FAISS writes it into the index file."""
    dim = vectors.shape[1]
    try:
        base = faiss.index_factory(dim, factory, metric_code(metric))
    except RuntimeError as exc:
        raise BuildError(f"FAISS cannot build index factory {factory!r}: {str(exc).strip().splitlines()[-1]}") from exc
    skip_polysemous_training(base)
    if ef_construction is not None:
        set_ef_construction(base, factory, ef_construction)
    refine = isinstance(base, faiss.IndexRefine)
    if refine:
        base.k_factor = REFINE_K_FACTOR  # type: ignore[attr-defined]  # stored in the file: searched with unless tuned
    # a refine stage keeps its vectors by position, so it takes its ids from an id map even over IVF
    native_ids = not refine and (faiss.try_extract_index_ivf(base) is not None
                                 or factory.replace(" ", "").upper().startswith("IDMAP"))
    index = base if native_ids else faiss.IndexIDMap(base)
    if not index.is_trained:
        if len(vectors) == 0:
            raise BuildError(f"index factory {factory!r} needs training vectors, this shard has none")
        try:
            index.train(vectors)
        except RuntimeError as exc:
            raise BuildError(
                f"training {factory!r} on {len(vectors)} vectors failed ({str(exc).strip().splitlines()[-1]}); "
                "use fewer lists/centroids or more documents per shard"
            ) from exc
    if len(vectors):
        index.add_with_ids(vectors, ids)
    return index


def set_ef_construction(index: faiss.Index, factory: str, value: int) -> None:
    """Set ``efConstruction`` on every HNSW graph inside ``index`` (before anything is added)."""
    check_ef_construction(value)
    graphs = [part for part in index_parts(index) if isinstance(part, faiss.IndexHNSW)]
    if not graphs:
        raise ConfigError(f"ef_construction applies to HNSW graphs, and index factory {factory!r} has none",
                          field="ef_construction")
    for graph in graphs:
        graph.hnsw.efConstruction = value


def index_parts(index: faiss.Index) -> list[Any]:
    """``index`` and every index inside it, downcast: under an id map or a pre-transform, both
    stages of a refine, an HNSW's storage, an IVF's quantizer. (Typed ``Any``: FAISS's stubs know
    few of the subclasses' fields.)"""
    parts: list[Any] = []
    pending: list[Any] = [index]
    while pending:
        current: Any = faiss.downcast_index(pending.pop())
        parts.append(current)
        if isinstance(current, faiss.IndexRefine):
            pending += [current.base_index, current.refine_index]
        elif isinstance(current, (faiss.IndexPreTransform, faiss.IndexIDMap)):
            pending.append(current.index)
        elif isinstance(current, faiss.IndexHNSW):
            pending.append(current.storage)
        else:
            ivf = faiss.try_extract_index_ivf(current)
            if ivf is not None and ivf.quantizer is not None:
                pending.append(ivf.quantizer)
    return parts


def skip_polysemous_training(index: faiss.Index) -> None:
    """Switch off the polysemous training of every PQ in ``index`` (``IndexPQ``, ``IndexIVFPQ``,
    also under a refine stage, a pre-transform or as HNSW's storage). FAISS's factory leaves it on:
    it reorders each codebook's centroids so that Hamming distances between codes mimic real ones,
    which only a polysemous search (``search_type`` ST_polysemous, ``polysemous_ht`` > 0) uses —
    shardrag never asks for one, and the ordinary search's distances are the same either way. It
    cost 25 s of a one-core build whatever the shard's size (simulated annealing over 256
    centroids per sub-quantizer), 0.5 s without it."""
    for part in index_parts(index):
        if isinstance(part, (faiss.IndexPQ, faiss.IndexIVFPQ)):
            part.do_polysemous_training = False  # type: ignore[union-attr]  # (not in the stubs)


_LOSSY_MARKERS = ("PQ", "SQ", "LSH", "RQ", "LSQ", "RFLAT", "REFINE")


def is_lossy(factory: str) -> bool:
    """Whether the factory stores codes rather than the vectors themselves (PQ, SQ, refine stages):
    what it decodes is an approximation, and encoding that again adds error."""
    name = factory.replace(" ", "").upper()
    return any(marker in name for marker in _LOSSY_MARKERS)


def derive_index(source: Path, drop_ids: np.ndarray, vectors: np.ndarray, ids: np.ndarray) -> faiss.Index | None:
    """The index in ``source`` (a build's file) without ``drop_ids`` and with ``vectors`` added under
    ``ids``, encoded by its already-trained quantizers: the codes it keeps are not decoded and
    re-encoded, and nothing is retrained. None when the index type cannot remove ids (HNSW, a
    refine stage): the caller rebuilds instead."""
    index = read_index(source, mmap=False)
    try:
        if len(drop_ids):
            index.remove_ids(faiss.IDSelectorBatch(np.asarray(drop_ids, dtype=np.int64)))
        if len(ids):
            index.add_with_ids(np.ascontiguousarray(vectors, dtype=np.float32), np.asarray(ids, dtype=np.int64))
    except RuntimeError as exc:
        logger.info("%s cannot be derived (%s); rebuilding", type(index).__name__, str(exc).strip()[:120])
        return None
    return index


def write_index(index: faiss.Index, path: Path) -> None:
    faiss.write_index(index, str(path))


def read_index(path: Path, *, mmap: bool = False) -> faiss.Index:
    """Read an index file. ``mmap``: map its vectors / codes / inverted lists from the file instead
    of copying them into the process, so replicas of one shard on one host share the page cache
    (FAISS's mmap I/O flags: flat codes for Flat/HNSW/PQ storage, on-disk inverted lists for IVF).
    An index type FAISS cannot map is read into memory instead, with a warning."""
    if mmap:
        for flags in (faiss.IO_FLAG_MMAP_IFC, faiss.IO_FLAG_MMAP | faiss.IO_FLAG_READ_ONLY):
            try:
                return faiss.read_index(str(path), flags)
            except RuntimeError:
                continue  # IVF refuses the flat-codes flag, flat storage ignores the IVF one: try the other
        logger.warning("%s cannot be memory-mapped; reading it into memory", path)
    try:
        return faiss.read_index(str(path))
    except RuntimeError as exc:
        raise IndexIntegrityError(f"{path} is not a readable FAISS index: {str(exc).strip()[:200]}") from exc


# The search knobs a query (or a version's tuned defaults) may set, by their FAISS names
# (``k_factor`` only from a version's defaults: search.json).
KNOB_NAMES = {"nprobe": "nprobe", "ef_search": "efSearch", "k_factor": "k_factor_rf"}


def native_search_params(index: faiss.Index) -> dict[str, int]:
    """The knobs this index has, with the values it was loaded with (FAISS's own defaults:
    nprobe 1, efSearch 16; a refine stage's k_factor as built). Empty for a flat index, and for
    GPU indexes (set only when asked)."""
    found: dict[str, int] = {}
    ivf = faiss.try_extract_index_ivf(index)
    if ivf is not None:
        found["nprobe"] = int(ivf.nprobe)
    hnsw = getattr(inner_index(index), "hnsw", None)
    if hnsw is not None:
        found["ef_search"] = int(hnsw.efSearch)
    refine = refine_of(index)
    if refine is not None:
        found["k_factor"] = max(1, int(refine.k_factor))
    return found


@dataclass(slots=True)
class SearchableIndex:
    """An index ready to search, on the GPU when FAISS has one and the index type allows it.

    ``native`` holds the knobs the index was loaded with, ``defaults`` the version's tuned values
    (``search.json``). A search uses the query's knob, else the tuned one, else the native one, and
    sets it explicitly (only when it differs from the last search's), so one query's ``nprobe``
    never leaks into the next query's results."""

    index: faiss.Index
    on_gpu: bool
    _space: faiss.ParameterSpace
    native: dict[str, int] = field(default_factory=dict)
    defaults: dict[str, int] = field(default_factory=dict)
    _current: dict[str, int] = field(default_factory=dict)
    # what a search without knobs of its own sets: native values overridden by the tuned ones
    # (worked out when they change, so the hot path visits only the knobs this index has)
    _baseline: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._baseline = {**self.native, **self.defaults}

    @classmethod
    def wrap(cls, index: faiss.Index, device: str = "auto") -> SearchableIndex:
        if device not in ("auto", "cpu", "gpu"):
            raise ConfigError(f"device must be auto, cpu or gpu, not {device!r}", field="device")
        native = native_search_params(index)
        if wants_gpu(device):
            if gpu_count() == 0:
                raise ConfigError("device=gpu but FAISS reports no GPU (is faiss-gpu installed?)", field="device")
            try:
                gpu_index = faiss.index_cpu_to_all_gpus(index)
                return cls(gpu_index, True, faiss.GpuParameterSpace(), native)
            except (RuntimeError, AttributeError) as exc:
                # HNSW and a few others have no GPU implementation: serve them from the CPU.
                logger.warning("index stays on CPU, GPU move failed: %s", str(exc).strip().splitlines()[-1])
        return cls(index, False, faiss.ParameterSpace(), native, {}, dict(native))

    @property
    def ntotal(self) -> int:
        return int(self.index.ntotal)

    def set_defaults(self, params: dict[str, int]) -> None:
        """Use ``params`` (tuned values) when a query sets none; a knob this index lacks is refused."""
        for field_name, value in params.items():
            self._set(field_name, value)  # raises when the knob does not apply
            self.defaults[field_name] = value
        self._baseline = {**self.native, **self.defaults}

    def baseline(self, name: str, fallback: int) -> int:
        """A knob's value when the query does not set it: tuned, else as loaded, else ``fallback``."""
        return self.defaults.get(name, self.native.get(name, fallback))

    def search(
        self, queries: np.ndarray, k: int, *, nprobe: int | None = None, ef_search: int | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        # Searches run one at a time on the server's event loop, so setting parameters on the
        # shared index just before the call cannot race with another request.
        wanted = self._baseline
        if nprobe is not None or ef_search is not None:
            wanted = dict(wanted)
            if nprobe is not None:
                wanted["nprobe"] = nprobe
            if ef_search is not None:
                wanted["ef_search"] = ef_search
        current = self._current
        for name, value in wanted.items():
            if current.get(name) != value:
                self._set(name, value)
        return self.index.search(queries, k)

    def _set(self, field_name: str, value: int) -> None:
        try:
            self._space.set_index_parameter(self.index, KNOB_NAMES[field_name], value)
        except RuntimeError as exc:
            raise InvalidRequest(f"{field_name} does not apply to this index ({type(self.index).__name__})",
                                 field=field_name) from exc
        self._current[field_name] = value
