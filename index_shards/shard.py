"""A shard loaded for serving: verified files, FAISS index (GPU when available), doc store.

The doc store (and so the payload index and the lexicon) holds every document; the FAISS index
holds those with a vector. A compacted base may hold documents stored without one (``bare.npy``,
their int ids): a filtered or tombstoned dense search leaves them out of what it scores."""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np

from index_shards.docstore import DocStore
from index_shards.faiss_index import SearchableIndex, read_index, wants_gpu
from index_shards.filtered import FilteredSearcher
from index_shards.layout import BARE_FILE, DOCSTORE_FILE, INDEX_FILE, REGIONS_FILE
from index_shards.lexical import BaseLexicon
from index_shards.lexical_warm import build_base_lexicon
from index_shards.manifest import ShardManifest, verify_shard_dir
from index_shards.payload import PayloadIndex
from index_shards.regions import Regions, read_regions
from index_shards.search_defaults import read_search_defaults
from index_shards.selection import Selection
from retrieval.contract import HitColumns
from retrieval.errors import DimensionMismatch, IndexIntegrityError, InvalidRequest
from retrieval.filters import Filter

logger = logging.getLogger(__name__)


class Shard:
    def __init__(self, directory: Path, manifest: ShardManifest, index: SearchableIndex, docstore: DocStore,
                 bare: np.ndarray | None = None, regions: Regions | None = None) -> None:
        self.directory = directory
        self.bare = bare if bare is not None else np.zeros(0, dtype=np.int64)  # sorted int ids without a vector
        self._vectored: np.ndarray | None = None  # the payload's int ids less the bare ones (made on first use)
        self.manifest = manifest
        self.index = index
        self.docstore = docstore
        self._negate = manifest.metric == "l2"  # report -L2² so that higher is always better
        self._payload: PayloadIndex | None = None  # built on the first filtered search
        self._payload_lock = threading.Lock()
        self.filtered = FilteredSearcher(index, manifest.metric, regions=regions)
        self.filter_plans: Counter[str] = Counter()  # filtered searches by strategy (none / exact / index)
        self._lexicon: BaseLexicon | None = None  # built on the first lexical query (or warmed by a compaction)
        self._lexicon_lock = threading.Lock()
        self.lexicon_build_s: float | None = None  # how long building it took (None: not built)

    @property
    def payload(self) -> PayloadIndex:
        """The metadata columns, built on first use (one pass over docs.sqlite)."""
        if self._payload is None:
            with self._payload_lock:
                if self._payload is None:
                    self._payload = PayloadIndex(self.docstore.iter_metadata())
        return self._payload

    @property
    def lexicon(self) -> BaseLexicon:
        """The base's inverted index (index_shards.lexical), built on first use — or ahead of it
        (index_shards.lexical_warm, which also builds a large one in a child process) — in one
        pass over docs.sqlite: derived from the documents, so whatever carries them carries it."""
        if self._lexicon is None:
            with self._lexicon_lock:
                if self._lexicon is None:
                    started = time.perf_counter()
                    lexicon = build_base_lexicon(self.docstore, language=self.manifest.lexical_language)
                    self.lexicon_build_s = time.perf_counter() - started
                    logger.info("lexical index of %s: %d docs, %d terms, %.1f MiB, built in %.1f s", self.directory,
                                lexicon.count, len(lexicon.vocabulary), lexicon.nbytes / 2**20,
                                self.lexicon_build_s)
                    self._lexicon = lexicon
        return self._lexicon

    @property
    def has_lexicon(self) -> bool:
        return self._lexicon is not None

    @property
    def lexicon_state(self) -> str:
        """``built``, ``building`` (a query or a warm-up holds the build) or ``none``."""
        if self._lexicon is not None:
            return "built"
        return "building" if self._lexicon_lock.locked() else "none"

    @property
    def lexicon_bytes(self) -> int | None:
        """The built lexical index's arrays, in bytes (None: not built)."""
        lexicon = self._lexicon
        return lexicon.nbytes if lexicon is not None else None

    @classmethod
    def load(cls, directory: str | Path, *, device: str = "auto", mmap: bool = True) -> Shard:
        """Verify checksums, then load. Raises IndexIntegrityError naming the damaged file.
        ``mmap``: map the index file rather than copy it (replicas on a host share its pages;
        published files never change). An index bound for the GPU is always read: it is copied there."""
        directory = Path(directory)
        manifest = verify_shard_dir(directory)
        index = read_index(directory / INDEX_FILE, mmap=mmap and not wants_gpu(device))
        bare = np.sort(np.load(directory / BARE_FILE, allow_pickle=False).astype(np.int64)) \
            if BARE_FILE in manifest.files else None
        vectors = manifest.count - (bare.size if bare is not None else 0)
        if index.ntotal != vectors:
            raise IndexIntegrityError(f"{directory / INDEX_FILE} holds {index.ntotal} vectors, "
                                      f"manifest says {vectors}")
        if index.d != manifest.dim:
            raise IndexIntegrityError(f"{directory / INDEX_FILE} has dimension {index.d}, manifest says {manifest.dim}")
        regions = read_regions(directory / REGIONS_FILE, index, manifest.metric) \
            if REGIONS_FILE in manifest.files else None
        docstore = DocStore(directory / DOCSTORE_FILE)
        if docstore.count != manifest.count:
            raise IndexIntegrityError(f"{directory / DOCSTORE_FILE} holds {docstore.count} docs, "
                                      f"manifest says {manifest.count}")
        searchable = SearchableIndex.wrap(index, device)
        tuned = read_search_defaults(directory.parent)  # the version's `shardrag tune` result, if any
        if tuned is not None and tuned.params:
            try:
                searchable.set_defaults(tuned.params)
            except InvalidRequest as exc:
                raise IndexIntegrityError(f"{directory.parent}/search.json sets {exc.field}, which a "
                                          f"{manifest.factory} index does not have; re-run `shardrag tune`") from exc
        logger.info("loaded shard %s (%d docs, %s, gpu=%s, search defaults %s)", directory, manifest.count,
                    manifest.factory, searchable.on_gpu, searchable.defaults or "none")
        return cls(directory, manifest, searchable, docstore, bare, regions)

    def vectored_ids(self) -> np.ndarray:
        """The int ids of the documents the index holds (every one but the bare)."""
        if not self.bare.size:
            return self.payload.int_ids
        if self._vectored is None:
            self._vectored = np.setdiff1d(self.payload.int_ids, self.bare, assume_unique=True)
        return self._vectored

    @property
    def version_id(self) -> str:
        return self.manifest.embedding_version.id

    def search(
        self,
        queries: np.ndarray,
        k: int,
        *,
        nprobe: int | None = None,
        ef_search: int | None = None,
        with_text: bool = True,
        with_metadata: bool = False,
        filter_: Filter | None = None,
        exclude: np.ndarray | None = None,
    ) -> list[HitColumns]:
        """Per query row, its hits best first as parallel columns (compact on the wire). With a
        filter, only documents it selects (see ``filtered``); ``exclude``: int ids never returned
        (the tombstones of a shard taking writes); ``with_metadata`` adds their metadata."""
        if self.manifest.count == 0 or self.index.ntotal == 0:
            self._check_query(queries, k)
            return [_empty(with_metadata) for _ in range(len(queries))]
        scores, ids = self.search_ids(queries, k, nprobe=nprobe, ef_search=ef_search, filter_=filter_,
                                      exclude=exclude)
        docs = self.docstore.get_many(ids[ids >= 0].tolist(), with_text=with_text, with_metadata=with_metadata)
        results: list[HitColumns] = []
        for row_scores, row_ids in zip(scores.tolist(), ids.tolist(), strict=True):
            hits = _empty(with_metadata)
            for score, int_id in zip(row_scores, row_ids, strict=True):
                if int_id < 0:  # fewer than k results (approximate indexes)
                    continue
                doc = docs.get(int_id)
                if doc is None:
                    raise IndexIntegrityError(f"index id {int_id} has no document in {DOCSTORE_FILE}")
                hits["doc_ids"].append(doc.doc_id)
                hits["scores"].append(score)
                hits["titles"].append(doc.title)
                hits["texts"].append(doc.text)
                if with_metadata:
                    hits["metadata"].append(doc.metadata or {})
            results.append(hits)
        return results

    def _check_query(self, queries: np.ndarray, k: int) -> None:
        if queries.ndim != 2 or queries.shape[1] != self.manifest.dim:
            raise DimensionMismatch(
                f"query vectors have {queries.shape[-1]} dims, this shard has {self.manifest.dim}", field="vector"
            )
        if k < 1:
            raise InvalidRequest(f"k must be ≥ 1, got {k}", field="k")

    def search_ids(self, queries: np.ndarray, k: int, *, nprobe: int | None = None, ef_search: int | None = None,
                   filter_: Filter | None = None, exclude: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`search` without reading the documents: per query row its scores (higher is
        better) and int ids, best first (-1 past the hits found)."""
        self._check_query(queries, k)
        if self.manifest.count == 0 or self.index.ntotal == 0:
            return np.zeros((len(queries), 0), np.float32), np.zeros((len(queries), 0), np.int64)
        excluding = exclude is not None and exclude.size > 0
        if filter_ is not None and not filter_.empty:
            # the payload's mask less the documents without a vector and the tombstones, in the
            # shapes the planner's paths read (index_shards/selection.py)
            frame = self.filtered.frame(self.payload.int_ids, self.bare)
            selection = Selection.of(self.payload.mask(filter_), frame, exclude)
            field = self.manifest.partition_field
            scores, ids, plan = self.filtered.search(queries, min(k, self.manifest.count), selection,
                                                     nprobe=nprobe, ef_search=ef_search,
                                                     exact=field is not None and filter_.pins(field))
            self.filter_plans[plan.strategy] += 1
            if plan.region_rows:
                self.filter_plans["region rows"] += plan.region_rows
        elif excluding:
            assert exclude is not None
            scores, ids = self.filtered.search_excluding(queries, min(k, self.manifest.count), exclude,
                                                         self.vectored_ids(), nprobe=nprobe, ef_search=ef_search)
        else:
            scores, ids = self.index.search(queries, min(k, self.manifest.count), nprobe=nprobe,
                                            ef_search=ef_search)
        if not np.isfinite(scores[ids >= 0]).all():
            # float32 overflow (huge query components): such scores cannot be ranked or sent as JSON
            raise InvalidRequest("the query vector's scores overflow float32; scale the vector down", field="vector")
        if self._negate:
            scores = -scores
        return scores, ids


def _empty(with_metadata: bool = False) -> HitColumns:
    columns: HitColumns = {"doc_ids": [], "scores": [], "titles": [], "texts": []}
    if with_metadata:
        columns["metadata"] = []
    return columns
