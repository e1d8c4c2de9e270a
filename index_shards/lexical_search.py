"""A lexical query on one live shard (``LiveShard.lexical_view`` gives the state it reads): its
BM25 top k under the collection's statistics, with the shard's own statistics for the query's
terms (which the gateway sums to check the ones it sent); the base and the segment scored by the
same code and merged the way the gateway merges shards (score, then doc id)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from index_shards.lexical import BaseLexicon, Scored, query_terms, score
from retrieval.bm25 import CorpusStats
from retrieval.contract import HitColumns
from retrieval.errors import IndexIntegrityError
from retrieval.filters import Filter

if TYPE_CHECKING:
    from index_shards.segment import LiveShard, SegmentDoc
    from index_shards.shard import Shard


@dataclass(slots=True, frozen=True)
class LexicalView:
    base: BaseLexicon
    hidden_rows: np.ndarray  # base rows a later write replaced or deleted, ascending
    holders: dict[str, list[tuple[str, int]]]  # term → (segment doc id, tf)
    docs: dict[str, SegmentDoc]  # the segment documents holding any term
    lengths: dict[str, int]  # their lengths in tokens
    segment_stats: CorpusStats

    def stats(self) -> CorpusStats:
        """The shard's statistics (live documents only) for the view's terms."""
        return self.base.stats(self.holders, self.hidden_rows) + self.segment_stats


def shard_search(live: LiveShard, text: str, corpus: CorpusStats | None, k: int, *, with_text: bool = True,
                 with_metadata: bool = False, filter_: Filter | None = None) -> tuple[HitColumns, CorpusStats]:
    """The top ``k`` of ``text`` by BM25 under ``corpus`` (None: this shard's own statistics, the
    unsharded ranking of a one-shard collection), among the documents ``filter_`` selects; and
    this shard's statistics for the text's terms (what the gateway sums over shards), both read
    at one applied seq. A term ``corpus`` does not count is not scored."""
    terms = query_terms(text)
    view = live.lexical_view([term for term, _ in terms])
    own = view.stats()
    stats = corpus if corpus is not None else own
    average = stats.average_length
    weights = [(term, stats.idf(term) * count) for term, count in terms]
    weights = [(term, w) for term, w in weights if w > 0]
    if not weights or average <= 0:
        return _columns(with_metadata), own
    base = view.base
    base_postings = []
    for term, weight in weights:
        rows, tfs = base.postings(term)
        if rows.size:
            base_postings.append((weight, rows, tfs))
    scored = score(base_postings, base.lengths, average, base.count)
    allowed = _allowed_rows(live.base, base, filter_) if filter_ is not None and not filter_.empty else None
    best = _base_top(live.base, base, scored, allowed, view.hidden_rows, k, with_text, with_metadata)
    segment = _segment_top(view, weights, average, k, with_text, with_metadata, filter_)
    return _merge(best, segment, k, with_text, with_metadata), own


def _allowed_rows(shard: Shard, base: BaseLexicon, filter_: Filter) -> np.ndarray:
    mask: np.ndarray = shard.payload.mask(filter_)
    if mask.size != base.count:  # both are the docstore in int-id order
        raise IndexIntegrityError(f"the payload index has {mask.size} rows, the lexical index {base.count}")
    return mask


def _base_top(shard: Shard, base: BaseLexicon, scored: Scored, allowed: np.ndarray | None, hidden: np.ndarray,
              k: int, with_text: bool, with_metadata: bool) -> list[tuple[float, str, Any]]:
    rows, scores = scored.rows, scored.scores
    keep = np.ones(rows.size, dtype=bool)
    if allowed is not None:
        keep &= allowed[rows]
    if hidden.size:
        keep &= ~np.isin(rows, hidden)
    rows, scores = rows[keep], scores[keep]
    rows, scores = _with_ties(rows, scores, k)
    int_ids = base.int_ids[rows].tolist()
    docs = shard.docstore.get_many(int_ids, with_text=with_text, with_metadata=with_metadata)
    found = []
    for int_id, value in zip(int_ids, scores.tolist(), strict=True):
        doc = docs.get(int_id)
        if doc is None:
            raise IndexIntegrityError(f"lexical row of int id {int_id} has no document in the docstore")
        found.append((value, doc.doc_id, doc))
    found.sort(key=lambda hit: (-hit[0], hit[1]))
    return found[:k]


def _segment_top(view: LexicalView, weights: list[tuple[str, float]], average: float, k: int, with_text: bool,
                 with_metadata: bool, filter_: Filter | None) -> list[tuple[float, str, Any]]:
    if not view.docs:
        return []
    doc_ids = list(view.docs)
    position = {doc_id: i for i, doc_id in enumerate(doc_ids)}
    lengths = np.asarray([view.lengths[d] for d in doc_ids], dtype=np.int32)
    postings = []
    for term, weight in weights:
        holders = view.holders.get(term, [])
        if holders:
            postings.append((weight, np.asarray([position[d] for d, _ in holders], dtype=np.int64),
                             np.asarray([tf for _, tf in holders], dtype=np.uint16)))
    scored = score(postings, lengths, average, len(doc_ids))
    found = []
    for row, value in zip(scored.rows.tolist(), scored.scores.tolist(), strict=True):
        doc = view.docs[doc_ids[row]]
        if filter_ is not None and not filter_.empty and not filter_.matches(doc.doc_id, doc.metadata):
            continue
        found.append((value, doc.doc_id, doc))
    found.sort(key=lambda hit: (-hit[0], hit[1]))
    return found[:k]


def _with_ties(rows: np.ndarray, scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The rows scoring at least the k-th best score (every tie at it: ties resolve by doc id)."""
    if rows.size <= k:
        return rows, scores
    threshold = np.partition(scores, rows.size - k)[rows.size - k]
    keep = scores >= threshold
    return rows[keep], scores[keep]


def _merge(base: list[tuple[float, str, Any]], segment: list[tuple[float, str, Any]], k: int, with_text: bool,
           with_metadata: bool) -> HitColumns:
    columns = _columns(with_metadata)
    for value, doc_id, doc in sorted(base + segment, key=lambda hit: (-hit[0], hit[1]))[:k]:
        columns["doc_ids"].append(doc_id)
        columns["scores"].append(value)
        columns["titles"].append(doc.title if with_text else "")
        columns["texts"].append(doc.text if with_text else "")
        if with_metadata:
            columns["metadata"].append(dict(doc.metadata or {}))
    return columns


def _columns(with_metadata: bool) -> HitColumns:
    columns: HitColumns = {"doc_ids": [], "scores": [], "titles": [], "texts": []}
    if with_metadata:
        columns["metadata"] = []
    return columns
