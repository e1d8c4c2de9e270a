"""A shard that takes writes: the sealed base (the verified, immutable shard directory), a mutable
segment of documents written since, and tombstones over the base.

* **upsert** of id X: X's old copy is hidden (a tombstone when it is in the base, removed when it
  is in the segment) and the new one goes into the segment — an id is never duplicated;
* **delete** of X: the same, without the new copy;
* **search**: the base searched with its tombstones excluded (a FAISS ``IDSelectorNot``; with a
  filter, the payload index's matches minus the tombstones) and the segment searched exactly (it
  is small: compaction folds it into a new base), merged by score;
* **get**: the segment's copy, else the base's unless tombstoned.

A document may be stored **without a vector** (a ``no_vector`` write): it is in the segment's
documents (so BM25, filters, listings and reads find it) but not in its matrix, and a compaction
puts it in the base's docstore and payload index but not in its FAISS index (``Shard.bare``) —
a dense search never meets it.

Records are applied in sequence order; :attr:`applied_seq` is the last one applied. The WAL
(``index_shards.wal``) is written by the caller before :meth:`apply` — this class keeps no files.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from index_shards.ids import doc_int_id
from index_shards.lexical import SegmentLexicon
from index_shards.lexical_search import LexicalView
from index_shards.segment_rows import SegmentRows
from index_shards.shard import Shard, _empty
from retrieval.bm25 import CorpusStats
from retrieval.contract import HitColumns
from retrieval.errors import DimensionMismatch, InvalidRequest
from retrieval.filters import Filter
from retrieval.records import DELETE, NOOP, UPSERT, WalRecord, document_fingerprint

_NO_ROWS = np.zeros(0, dtype=np.int64)
_NO_STATS = CorpusStats(0, 0, {})


@dataclass(slots=True, frozen=True)
class DenseTop:
    """One query's dense top k without its documents: base hits by int id, segment ones by doc id
    (each in no particular order), how many hits in all, and the lowest score among them."""

    base_ids: np.ndarray  # int64
    segment_ids: list[str]
    count: int
    last: float  # -inf when there is none


@dataclass(slots=True, frozen=True)
class SegmentDoc:
    """A written document; its vector lives in the segment's matrix (SegmentRows), not here."""

    int_id: int
    doc_id: str
    title: str
    text: str
    metadata: dict[str, Any]
    seq: int


class WrittenVectors:
    """The original vectors of the written documents (seq > 0) a compacted base holds, by int id:
    for a compressed index (PQ, SQ) its codes are approximations, and a compaction or a snapshot
    that re-encoded decoded vectors would add quantization error every time."""

    def __init__(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        order = np.argsort(ids, kind="stable")
        self._ids = np.asarray(ids, dtype=np.int64)[order]
        self._order = order
        self._vectors = vectors

    def get(self, int_id: int) -> np.ndarray | None:
        slot = int(np.searchsorted(self._ids, int_id))
        if slot < len(self._ids) and self._ids[slot] == int_id:
            return np.asarray(self._vectors[self._order[slot]], dtype=np.float32)
        return None


@dataclass(slots=True, frozen=True)
class StoredDocument:
    """What ``GET /v1/documents/{id}`` returns."""

    doc_id: str
    title: str
    text: str
    metadata: dict[str, Any]
    seq: int  # the write that stored it (0: from the build)
    vector: np.ndarray | None = None


class LiveShard:
    def __init__(self, base: Shard, *, base_seq: int = 0, base_seqs: dict[int, int] | None = None,
                 written: WrittenVectors | None = None) -> None:
        self.base = base
        self.base_seq = base_seq  # writes up to this seq are inside the base already
        self._base_seqs = base_seqs or {}  # int id → seq of a base document (a compacted base)
        self._written = written  # original vectors of the base's written documents
        self.applied_seq = base_seq
        self.dim = base.manifest.dim
        self.metric = base.manifest.metric
        self._docs: dict[str, SegmentDoc] = {}
        self._bare: set[str] = set()  # ids of segment documents stored without a vector
        # the segment as one matrix for scoring, rebuilt on the first search after a write
        self._rows = SegmentRows(self.dim)  # the segment as an append-only matrix (index_shards.segment_rows)
        self._tombstones: set[int] = set()  # base int ids hidden by a later write
        self._tombstone_array = np.zeros(0, dtype=np.int64)
        self._lexicon: SegmentLexicon | None = None  # made on the first lexical query, then kept by every write
        self._lock = threading.RLock()
        self._row_table: tuple[np.ndarray, np.ndarray] | bool | None = None  # base_row_matrix's (False: none)

    @property
    def version_id(self) -> str:
        return self.base.version_id

    @property
    def manifest(self) -> Any:
        return self.base.manifest

    @property
    def segment_size(self) -> int:
        return len(self._docs)

    @property
    def tombstones(self) -> int:
        return len(self._tombstones)

    # -- writes ----------------------------------------------------------------------------------
    def apply(self, records: Sequence[WalRecord]) -> None:
        """Apply records in sequence order (each seq exactly once: older ones are skipped, so a
        replayed or re-sent record changes nothing)."""
        with self._lock:
            for record in records:
                if record.seq <= self.applied_seq:
                    continue
                if record.seq != self.applied_seq + 1:
                    raise InvalidRequest(f"write seq {record.seq} does not follow {self.applied_seq}", field="seq")
                if record.op == NOOP:  # a sequence number handed out but never written
                    self.applied_seq = record.seq
                    continue
                self._hide(record.doc_id)
                if record.op == UPSERT:
                    if record.vector is not None and record.vector.shape != (self.dim,):
                        raise DimensionMismatch(f"document {record.doc_id!r} has {record.vector.size} dims, the "
                                                f"shard {self.dim}", field="vector")
                    int_id = doc_int_id(record.doc_id)
                    doc = SegmentDoc(int_id, record.doc_id, record.title, record.text, dict(record.metadata),
                                     record.seq)
                    self._docs[record.doc_id] = doc
                    if record.vector is None:
                        self._bare.add(record.doc_id)
                    else:
                        self._rows.add(doc, np.ascontiguousarray(record.vector, dtype=np.float32))
                    if self._lexicon is not None:
                        self._lexicon.add(doc.doc_id, doc.title, doc.text)
                elif record.op != DELETE:
                    raise InvalidRequest(f"unknown write op {record.op}", field="op")
                self.applied_seq = record.seq
            self._tombstone_array = np.fromiter(self._tombstones, dtype=np.int64, count=len(self._tombstones))
            self._rows.maybe_rebuild()

    def _hide(self, doc_id: str) -> None:
        self._docs.pop(doc_id, None)
        self._bare.discard(doc_id)
        if self._lexicon is not None:
            self._lexicon.remove(doc_id)
        self._rows.remove(doc_id)
        int_id = doc_int_id(doc_id)
        if self.base.payload.contains(int_id):
            self._tombstones.add(int_id)

    # -- reads -----------------------------------------------------------------------------------
    def lexical_view(self, terms: Sequence[str]) -> LexicalView:
        """What a lexical query reads of the live state, taken at one applied seq: the base rows
        hidden by writes, and the segment's documents holding any of ``terms`` with its statistics."""
        base = self.base.lexicon  # built before the lock: writes are not held up by a first build
        if not self._docs and not self._tombstones:  # nothing written since the base: no segment to read
            return LexicalView(base, _NO_ROWS, {term: [] for term in terms}, {}, {}, _NO_STATS)
        with self._lock:
            if self._lexicon is None:
                self._lexicon = SegmentLexicon(base.language)
                for doc in self._docs.values():
                    self._lexicon.add(doc.doc_id, doc.title, doc.text)
            lexicon = self._lexicon
            holders = {t: list(lexicon.holders(t)) for t in terms}
            docs = {doc_id: self._docs[doc_id] for found in holders.values() for doc_id, _ in found}
            lengths = {doc_id: lexicon.length(doc_id) for doc_id in docs}
            return LexicalView(base, base.rows_of(self._tombstone_array), holders, docs, lengths,
                               lexicon.stats(terms))

    def get(self, doc_id: str, *, with_vector: bool = False) -> StoredDocument | None:
        with self._lock:
            doc = self._docs.get(doc_id)
            if doc is not None:
                return StoredDocument(doc.doc_id, doc.title, doc.text, doc.metadata, doc.seq,
                                      self._rows.vector(doc_id) if with_vector else None)
            int_id = doc_int_id(doc_id)
            if int_id in self._tombstones or not self.base.payload.contains(int_id):
                return None
        stored = self.base.docstore.get_many([int_id], with_metadata=True).get(int_id)
        if stored is None:
            return None
        vector = self.base_vectors(np.asarray([int_id], dtype=np.int64))[0] if with_vector else None
        return StoredDocument(stored.doc_id, stored.title, stored.text, stored.metadata or {},
                              self._base_seqs.get(int_id, 0), vector)

    def segment_members(self, doc_ids: Iterable[str]) -> dict[str, tuple[SegmentDoc, np.ndarray | None]]:
        """Those of ``doc_ids`` that live in the segment (not the base), with their vectors (None:
        stored without one)."""
        with self._lock:
            return {d: (self._docs[d], self._rows.vector(d)) for d in doc_ids if d in self._docs}

    def matching_ids(self, filter_: Filter, limit: int) -> list[str]:
        """The ids of live documents that ``filter_`` selects (delete by filter reads this), at most
        ``limit``."""
        with self._lock:
            segment = list(self._docs.values())
            hidden = set(self._tombstones) | {d.int_id for d in segment}
        found = [d.doc_id for d in segment if filter_.matches(d.doc_id, d.metadata)][:limit]
        room = max(0, limit - len(found))
        base_ids = [i for i in self.base.payload.select(filter_).tolist() if i not in hidden][:room]
        stored = self.base.docstore.get_many(base_ids, with_text=False)
        found.extend(stored[i].doc_id for i in base_ids if i in stored)
        return found

    def scan(self, filter_: Filter, after: str, limit: int) -> tuple[int, list[StoredDocument]]:
        """How many live documents ``filter_`` selects, and the first ``limit`` of them (with their
        vectors) in id order after ``after`` ("": from the first) — a page of a listing. The base's
        ids in order are sorted once (it never changes); a page costs a mask over the base."""
        with self._lock:
            segment = [d for d in self._docs.values() if filter_.matches(d.doc_id, d.metadata)]
            hidden = np.concatenate([self._tombstone_array,
                                     np.fromiter((d.int_id for d in self._docs.values()), dtype=np.int64)])
            vectors = {d.doc_id: self._rows.vector(d.doc_id) for d in segment if d.doc_id > after}
        payload = self.base.payload
        selected = payload.mask(filter_)
        if hidden.size:
            selected &= ~np.isin(payload.int_ids, hidden)
        total = int(selected.sum()) + len(segment)
        ordered_ids, positions = payload.ordered()
        start = bisect.bisect_right(ordered_ids, after) if after else 0
        picked = start + np.flatnonzero(selected[positions[start:]])[:limit]
        base_pairs = [(ordered_ids[i], int(payload.int_ids[positions[i]])) for i in picked.tolist()]
        later = sorted((d for d in segment if d.doc_id > after), key=lambda d: d.doc_id)[:limit]
        merged = heapq.merge(((doc_id, int_id, None) for doc_id, int_id in base_pairs),
                             ((d.doc_id, d.int_id, d) for d in later), key=lambda row: row[0])
        page = list(itertools.islice(merged, limit))
        base_ids = np.asarray([int_id for _, int_id, doc in page if doc is None], dtype=np.int64)
        stored = self.base.docstore.get_many(base_ids.tolist(), with_metadata=True) if base_ids.size else {}
        base_vectors = dict(zip(base_ids.tolist(), self.base_vectors(base_ids), strict=True))
        out: list[StoredDocument] = []
        for doc_id, int_id, doc in page:
            if doc is not None:
                out.append(StoredDocument(doc.doc_id, doc.title, doc.text, doc.metadata, doc.seq, vectors[doc_id]))
            else:
                base_doc = stored[int_id]
                out.append(StoredDocument(base_doc.doc_id, base_doc.title, base_doc.text, base_doc.metadata or {},
                                          self._base_seqs.get(int_id, 0), base_vectors[int_id]))
        return total, out

    def digest(self) -> dict[str, Any]:
        """A fingerprint of the live state: the count and a sha256 over every document's id, vector
        bytes (float32, little-endian), title, text and metadata (canonical JSON), in id order.
        Two replicas with equal digests hold the same documents bit for bit."""
        import hashlib

        seq, documents = self.frozen_documents()
        rows = sorted(documents, key=lambda d: d.doc_id)
        digest = hashlib.sha256()
        for doc in rows:
            digest.update(document_fingerprint(doc.doc_id, doc.vector, doc.title, doc.text, doc.metadata))
        return {"count": len(rows), "sha256": digest.hexdigest(), "applied_seq": seq}

    def documents(self) -> Iterable[StoredDocument]:
        """Every live document with its vector (replica comparisons read this)."""
        return self.frozen_documents()[1]

    def frozen_documents(self) -> tuple[int, Iterable[StoredDocument]]:
        """The applied seq and every live document as of that seq (compaction reads this; writes
        applied later do not show in the iterator)."""
        with self._lock:
            seq = self.applied_seq
            # rows below the view's count never change (appends go after them, a rebuild makes new
            # arrays): the view is the segment as of ``seq`` without a copy of its vectors
            view = self._rows.view()
            positions = np.flatnonzero(view.alive).tolist()
            segment: list[tuple[SegmentDoc, np.ndarray | None]] = [(view.rows[p], view.matrix[p]) for p in positions]
            segment.extend((self._docs[doc_id], None) for doc_id in sorted(self._bare))
            hidden = set(self._tombstones) | {doc.int_id for doc, _ in segment}
        return seq, self._iter_documents(segment, hidden)

    def _iter_documents(self, segment: list[tuple[SegmentDoc, np.ndarray | None]],
                        hidden: set[int]) -> Iterable[StoredDocument]:
        base_ids = np.asarray([i for i in self.base.payload.int_ids.tolist() if i not in hidden], dtype=np.int64)
        for start in range(0, base_ids.size, 1024):
            chunk = base_ids[start:start + 1024]
            vectors = self.base_vectors(chunk)
            stored = self.base.docstore.get_many(chunk.tolist(), with_metadata=True)
            for int_id, vector in zip(chunk.tolist(), vectors, strict=True):
                base_doc = stored[int_id]
                yield StoredDocument(base_doc.doc_id, base_doc.title, base_doc.text, base_doc.metadata or {},
                                     self._base_seqs.get(int_id, 0), vector)
        for written, vector in segment:
            yield StoredDocument(written.doc_id, written.title, written.text, written.metadata, written.seq, vector)

    def base_matrix(self, int_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Base documents' vectors as one matrix (rows of those stored without a vector are zero)
        and which rows hold one: :meth:`base_vectors` without a Python object per row."""
        bare = self.base.bare
        if not bare.size and self._written is None:  # every base document has its vector in the index
            if not int_ids.size:
                return np.zeros((0, self.dim), dtype=np.float32), np.zeros(0, dtype=bool)
            return self.base.filtered.vectors(int_ids), np.ones(int_ids.size, dtype=bool)
        present = ~np.isin(int_ids, bare) if bare.size else np.ones(int_ids.size, dtype=bool)
        matrix = np.zeros((int_ids.size, self.dim), dtype=np.float32)
        if present.any():
            matrix[present] = self.base.filtered.vectors(int_ids[present])
        if self._written is not None:
            for row, int_id in enumerate(int_ids.tolist()):
                original = self._written.get(int_id) if present[row] else None
                if original is not None:
                    matrix[row] = original
        return matrix, present

    def base_row_matrix(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`base_matrix` of base documents by lexicon row (rows are the base's documents in
        int-id order): the same floats, read through a row → storage position table made once
        where the storage is a flat array and no written document's original overrides it."""
        table = self._row_positions() if self._written is None else None
        if table is None:
            return self.base_matrix(self.base.lexicon.int_ids[rows])
        flat, positions = table
        at = positions[rows]
        present = at >= 0
        if present.all():
            return flat[at], present
        matrix = np.zeros((rows.size, self.dim), dtype=np.float32)
        matrix[present] = flat[at[present]]
        return matrix, present

    def _row_positions(self) -> tuple[np.ndarray, np.ndarray] | None:
        """(the flat storage, each lexicon row's position in it; -1: stored without a vector),
        made on first use (the base never changes under a LiveShard); None for other storages."""
        if self._row_table is None:
            storage = self.base.filtered.flat_storage()
            if storage is None:
                self._row_table = False
            else:
                flat, id_positions = storage
                int_ids = self.base.lexicon.int_ids
                vectored = ~np.isin(int_ids, self.base.bare) if self.base.bare.size else np.ones(int_ids.size, bool)
                positions = np.full(int_ids.size, -1, dtype=np.int64)
                positions[vectored] = id_positions.of(int_ids[vectored])
                self._row_table = (flat, positions)
        return self._row_table if isinstance(self._row_table, tuple) else None

    def base_vectors(self, int_ids: np.ndarray) -> list[np.ndarray | None]:
        """Base documents' vectors: a written one's original where the base kept it, else the
        index's (exact for Flat and HNSW; decoded from the build's own codes for PQ/SQ); None for
        one stored without a vector."""
        if int_ids.size == 0:
            return []
        bare = self.base.bare
        vectored = ~np.isin(int_ids, bare) if bare.size else np.ones(int_ids.size, dtype=bool)
        vectors = np.array(self.base.filtered.vectors(int_ids[vectored]), dtype=np.float32) if vectored.any() \
            else np.zeros((0, self.dim), dtype=np.float32)
        out: list[np.ndarray | None] = [None] * int(int_ids.size)
        for row, position in enumerate(np.flatnonzero(vectored).tolist()):
            out[position] = vectors[row]
        if self._written is not None:
            for row, int_id in enumerate(int_ids.tolist()):
                original = self._written.get(int_id) if out[row] is not None else None
                if original is not None:
                    out[row] = original
        return out

    def search(self, queries: np.ndarray, k: int, *, nprobe: int | None = None, ef_search: int | None = None,
               with_text: bool = True, with_metadata: bool = False,
               filter_: Filter | None = None) -> list[HitColumns]:
        """The base (tombstones excluded) and the segment, merged: per query its top k."""
        if not self._docs and not self._tombstones:  # no writes yet: the base alone, as before
            return self.base.search(queries, k, nprobe=nprobe, ef_search=ef_search, with_text=with_text,
                                    with_metadata=with_metadata, filter_=filter_)
        with self._lock:
            tombstones = self._tombstone_array
            view = self._rows.view()
            selected = self._rows.mask(filter_, view.count) if filter_ is not None and not filter_.empty else None
        base = self.base.search(queries, k, nprobe=nprobe, ef_search=ef_search, with_text=with_text,
                                with_metadata=with_metadata, filter_=filter_, exclude=tombstones)
        if view.count == 0:
            return base
        candidates = np.flatnonzero(view.alive & selected if selected is not None else view.alive)
        # matrix @ queries.T: BLAS on the contiguous matrix (queries @ matrix.T is ~8x slower here)
        scores = np.ascontiguousarray((view.matrix @ np.asarray(queries, dtype=np.float32).T).T)
        if self.metric == "l2":
            scores = -(np.sum(queries ** 2, axis=1)[:, None] - 2.0 * scores + view.norms[None, :])
        return [_merge(row, _top(scores[q], candidates, view.rows, k, with_text, with_metadata), k)
                for q, row in enumerate(base)]

    def dense_keys(self, queries: np.ndarray, k: int, *, nprobe: int | None = None, ef_search: int | None = None,
                   filter_: Filter | None = None) -> list[DenseTop]:
        """Per query row, its dense top k without reading a document (a weighted hybrid reads only
        its final k documents): base documents by int id, segment ones by doc id. One index
        search for the batch."""
        queries = np.asarray(queries, dtype=np.float32)
        tombstones: np.ndarray | None = None
        view = None
        if self._docs or self._tombstones:
            with self._lock:
                tombstones = self._tombstone_array
                view = self._rows.view()
                selected = self._rows.mask(filter_, view.count) if filter_ is not None and not filter_.empty \
                    else None
        scores, ids = self.base.search_ids(queries, k, nprobe=nprobe, ef_search=ef_search, filter_=filter_,
                                           exclude=tombstones)
        found = ids >= 0  # FAISS pads a short answer with -1, always after the hits
        if view is None or not view.count:
            return [DenseTop(row_ids[row_found], [], int(row_found.sum()),
                             float(row_scores[row_found][-1]) if row_found.any() else -np.inf)
                    for row_scores, row_ids, row_found in zip(scores, ids, found, strict=True)]
        pool = np.flatnonzero(view.alive & selected if selected is not None else view.alive)
        # matrix @ queries.T over the whole (contiguous) matrix beats gathering the pool's rows
        every = np.ascontiguousarray((view.matrix @ queries.T).T)[:, pool]
        if self.metric == "l2":
            every = -(np.sum(queries ** 2, axis=1)[:, None] - 2.0 * every + view.norms[pool][None, :])
        tops = []
        for q, row in enumerate(every):
            best = np.argpartition(-row, k - 1)[:k] if row.size > k else np.arange(row.size)
            base_ids = ids[q][found[q]]
            # base hits first, then the segment's, one stable order by score: the k best of both
            merged = np.concatenate([scores[q][found[q]].astype(np.float64), row[best].astype(np.float64)])
            order = np.argsort(-merged, kind="stable")[:k]
            in_base = order < base_ids.size
            segment_ids = [view.rows[int(pool[best[i - base_ids.size]])].doc_id for i in order[~in_base].tolist()]
            tops.append(DenseTop(base_ids[order[in_base]], segment_ids, int(order.size),
                                 float(merged[order[-1]]) if order.size else -np.inf))
        return tops


def _top(scores: np.ndarray, candidates: np.ndarray | None, segment: list[SegmentDoc], k: int, with_text: bool,
         with_metadata: bool) -> HitColumns:
    """The segment's best k for one query (among ``candidates`` when filtered), best first, ties by
    doc id as the gateway breaks them. Partitioned in NumPy; only the ≥ k-th scores reach Python."""
    columns = _empty(with_metadata)
    pool = candidates if candidates is not None else np.arange(scores.size)
    if pool.size == 0:
        return columns
    values = scores[pool]
    if pool.size > k:
        threshold = np.partition(values, pool.size - k)[pool.size - k]
        keep = values >= threshold  # every tie at the k-th score, so ties resolve by doc id below
        pool, values = pool[keep], values[keep]
    order = sorted(range(pool.size), key=lambda i: (-float(values[i]), segment[int(pool[i])].doc_id))[:k]
    for i in order:
        doc = segment[int(pool[i])]
        columns["doc_ids"].append(doc.doc_id)
        columns["scores"].append(float(values[i]))
        columns["titles"].append(doc.title if with_text else "")
        columns["texts"].append(doc.text if with_text else "")
        if with_metadata:
            columns["metadata"].append(doc.metadata)
    return columns


def _merge(a: HitColumns, b: HitColumns, k: int) -> HitColumns:
    """Two hit lists of one query, best first, into the top k (ties by doc id, like the gateway)."""
    rows = [(a, i) for i in range(len(a["doc_ids"]))] + [(b, i) for i in range(len(b["doc_ids"]))]
    rows.sort(key=lambda row: (-row[0]["scores"][row[1]], row[0]["doc_ids"][row[1]]))
    out = _empty("metadata" in a or "metadata" in b)
    for columns, i in rows[:k]:
        out["doc_ids"].append(columns["doc_ids"][i])
        out["scores"].append(columns["scores"][i])
        out["titles"].append(columns["titles"][i])
        out["texts"].append(columns["texts"][i])
        if "metadata" in out:
            out["metadata"].append(columns.get("metadata", [{}] * (i + 1))[i])
    return out
