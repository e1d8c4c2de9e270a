"""A lexical query on one live shard (``LiveShard.lexical_view`` gives the state it reads): its
BM25 top k under the collection's statistics, with the shard's own statistics for the query's
terms (which the gateway sums to check the ones it sent); the base and the segment scored by the
same code and merged the way the gateway merges shards (score, then doc id)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from index_shards.lexical import BaseLexicon, query_terms, score
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
        base = self.base.stats(self.holders, self.hidden_rows)
        return base + self.segment_stats if self.segment_stats.docs else base


@dataclass(slots=True)
class LexicalScores:
    """One query's BM25 over a live shard under given statistics: every live document the filter
    selects that holds a scored term — base rows (ascending) and segment documents — with the
    shard's own statistics for the query's terms."""

    own: CorpusStats
    term_weights: list[float]  # idf × count of each scored term, in query order
    base: BaseLexicon
    base_rows: np.ndarray
    base_scores: np.ndarray
    segment: list[tuple[float, str, SegmentDoc]]  # (score, doc id, document), any order
    all_base_scores: np.ndarray  # every base row's score (no filter, none hidden; 0: no term)
    segment_scores: dict[str, float]  # every segment document any term touched


def lexical_scores(live: LiveShard, text: str, corpus: CorpusStats | None,
                   filter_: Filter | None = None) -> LexicalScores:
    """BM25 of ``text`` under ``corpus`` (None: this shard's own statistics, the unsharded ranking
    of a one-shard collection) for every live document ``filter_`` selects, read at one applied
    seq. A term ``corpus`` does not count is not scored."""
    terms = query_terms(text, live.base.manifest.lexical_language)
    view = live.lexical_view([term for term, _ in terms])
    own = view.stats()
    stats = corpus if corpus is not None else own
    average = stats.average_length
    weights = [(term, stats.idf(term) * count) for term, count in terms]
    weights = [(term, w) for term, w in weights if w > 0]
    base = view.base
    if not weights or average <= 0:
        empty = np.zeros(0, np.int64), np.zeros(0, np.float64)
        return LexicalScores(own, [], base, *empty, [], empty[1], {})
    base_postings = []
    for term, weight in weights:
        rows, tfs = base.postings(term)
        if rows.size:
            base_postings.append((weight, rows, tfs))
    scored = score(base_postings, base.lengths, average, base.count)
    keep = np.ones(scored.rows.size, dtype=bool)
    if filter_ is not None and not filter_.empty:
        keep &= _allowed_rows(live.base, base, filter_)[scored.rows]
    if view.hidden_rows.size:
        keep &= ~np.isin(scored.rows, view.hidden_rows)
    segment_scores = _segment_scores(view, weights, average)
    segment = [(value, doc_id, view.docs[doc_id]) for doc_id, value in segment_scores.items()
               if filter_ is None or filter_.empty or filter_.matches(doc_id, view.docs[doc_id].metadata)]
    every = scored.by_row if scored.by_row is not None else np.zeros(base.count, np.float64)
    return LexicalScores(own, [w for _, w in weights], base, scored.rows[keep], scored.scores[keep], segment,
                         every, segment_scores)


def shard_search(live: LiveShard, text: str, corpus: CorpusStats | None, k: int, *, with_text: bool = True,
                 with_metadata: bool = False, filter_: Filter | None = None) -> tuple[HitColumns, CorpusStats]:
    """The top ``k`` of ``text`` by BM25 under ``corpus`` among the documents ``filter_`` selects
    (:func:`lexical_scores`), and this shard's statistics for the text's terms (what the gateway
    sums over shards), both read at one applied seq."""
    scores = lexical_scores(live, text, corpus, filter_)
    best = _base_top(live.base, scores.base, scores.base_rows, scores.base_scores, k, with_text, with_metadata)
    segment = sorted(scores.segment, key=lambda hit: (-hit[0], hit[1]))[:k]
    return _merge(best, segment, k, with_text, with_metadata), scores.own


def _allowed_rows(shard: Shard, base: BaseLexicon, filter_: Filter) -> np.ndarray:
    mask: np.ndarray = shard.payload.mask(filter_)
    if mask.size != base.count:  # both are the docstore in int-id order
        raise IndexIntegrityError(f"the payload index has {mask.size} rows, the lexical index {base.count}")
    return mask


def _base_top(shard: Shard, base: BaseLexicon, rows: np.ndarray, scores: np.ndarray, k: int, with_text: bool,
              with_metadata: bool) -> list[tuple[float, str, Any]]:
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


def _segment_scores(view: LexicalView, weights: list[tuple[str, float]], average: float) -> dict[str, float]:
    """Every segment document holding a scored term, with its BM25 (filters apply afterwards)."""
    if not view.docs:
        return {}
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
    return {doc_ids[row]: value for row, value in zip(scored.rows.tolist(), scored.scores.tolist(), strict=True)}


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
