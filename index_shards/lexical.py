"""The lexical leg of a shard: an inverted index over its documents' titles and texts, scored
with BM25 under statistics the caller supplies (``retrieval.bm25``: the whole collection's, so a
sharded ranking equals the unsharded one).

* the text analysis is ``retrieval.analysis`` (one function for documents and queries, and the
  gateway's guess at a query's terms);
* :class:`BaseLexicon` — the sealed base's postings in CSR form (NumPy arrays: term → rows and
  term frequencies, per-row lengths), built in one pass over the base's document store. It is
  derived from the documents, never stored: every path that carries documents (a build, a
  compaction, a snapshot install, a rollout's fill, a catch-up) carries the lexical index with
  them, and it cannot disagree with them.
* :class:`SegmentLexicon` — the documents written since the base, kept by every write applied.
* :func:`bm25_weights` — a term's contribution to each document's score, the same NumPy code
  for base and segment so that a document scores the same bits wherever it lives.

Why our own index rather than tantivy or bm25s: scoring must take the collection's statistics
from outside (no engine we could embed lets a query override document frequencies), and the
segment must follow every write in sequence order — bm25s has no updates, and tantivy keeps
its own segments and commit cycle beside ours. ``benchmarks/lexical_engines.py`` measures
ingest, memory and query time against bm25s on the same documents.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from retrieval.analysis import DEFAULT_LANGUAGE, document_terms, query_terms
from retrieval.bm25 import K1, B, CorpusStats

__all__ = ["BaseLexicon", "Scored", "SegmentLexicon", "bm25_weights", "document_terms", "query_terms", "score"]


def bm25_weights(weight: float | np.ndarray, tf: np.ndarray, lengths: np.ndarray,
                 average_length: float | np.ndarray, *,
                 k1: float = K1, b: float = B) -> np.ndarray:
    """BM25's contribution of a term with ``weight`` (idf × its count in the query; or one weight
    per posting) to documents holding it ``tf`` times with ``lengths`` tokens:
    weight · tf·(k1+1) / (tf + k1·(1 − b + b·len/avg)). Element by element, so a document's
    contribution has the same bits whether it is computed alone or among others (``weight`` and
    ``average_length`` may be one per posting: a batch of queries scored in one pass)."""
    tf = tf.astype(np.float64, copy=False)
    norm = k1 * (1.0 - b + b * (lengths.astype(np.float64, copy=False) / average_length))
    result: np.ndarray = weight * (tf * (k1 + 1.0)) / (tf + norm)
    return result


@dataclass(slots=True, frozen=True)
class Scored:
    """Rows (of a base or a segment) with their BM25 scores, unordered."""

    rows: np.ndarray
    scores: np.ndarray
    by_row: np.ndarray | None = None  # every row's score (0: no term), when the rows were scored in one array


def score(postings: Sequence[tuple[float, np.ndarray, np.ndarray]], lengths: np.ndarray,
          average_length: float, size: int, *, k1: float = K1, b: float = B) -> Scored:
    """Sum each term's contributions per row. ``postings``: per query term in query order,
    (weight, rows holding it, their tfs). Rows no term touches are left out. (``k1``, ``b``:
    Lucene's defaults, which the shards use; other values for the offline study of
    ``benchmarks/hybrid_fusions.py``.)"""
    if not postings:
        return Scored(np.zeros(0, np.int64), np.zeros(0, np.float64))
    # every term's postings in one array (query order), each posting with its term's weight: one
    # NumPy pass instead of one per term, the same arithmetic per element
    rows = np.concatenate([p[1] for p in postings])
    tfs = np.concatenate([p[2] for p in postings])
    weights = np.repeat(np.asarray([p[0] for p in postings], dtype=np.float64), [p[1].size for p in postings])
    contributions = bm25_weights(weights, tfs, lengths[rows], average_length, k1=k1, b=b)
    # bincount adds in array order (term by term, as the query orders them): the same additions,
    # in the same order, for a document in a base or in a segment, on any shard.
    totals = np.bincount(rows, weights=contributions, minlength=size)
    touched = np.flatnonzero(totals > 0)  # every weight is positive (idf > 0 for a term any document holds)
    return Scored(touched, totals[touched], totals)


class BaseLexicon:
    """The sealed base's postings. Rows are the base's documents in int-id order (the payload
    index's order, so a filter's mask applies as is)."""

    def __init__(self, int_ids: np.ndarray, lengths: np.ndarray, vocabulary: dict[str, int], starts: np.ndarray,
                 rows: np.ndarray, tfs: np.ndarray, language: str = DEFAULT_LANGUAGE) -> None:
        self.language = language  # how its documents were analysed, and so how queries must be
        self.int_ids = int_ids  # row → int id (ascending)
        self.lengths = lengths  # row → tokens
        self.vocabulary = vocabulary  # term → term number
        self.starts = starts  # term number → first posting; starts[-1] = postings
        self.rows = rows  # postings: rows, grouped by term
        self.tfs = tfs  # postings: term frequencies
        self.total_length = int(lengths.sum())
        self._starts: list[int] | None = None  # starts as Python ints, made on the first lookup

    @classmethod
    def build(cls, documents: Iterable[tuple[int, str, str]], language: str = DEFAULT_LANGUAGE) -> BaseLexicon:
        """From (int id, title, text) in ascending int-id order, analysed in ``language``."""
        vocabulary: dict[str, int] = {}
        int_ids: list[int] = []
        lengths: list[int] = []
        chunks: list[np.ndarray] = []
        for int_id, title, text in documents:
            terms = document_terms(title, text, language)
            int_ids.append(int_id)
            lengths.append(len(terms))
            setdefault = vocabulary.setdefault
            chunks.append(np.fromiter((setdefault(t, len(vocabulary)) for t in terms), dtype=np.int64,
                                      count=len(terms)))
        n = len(int_ids)
        length_array = np.asarray(lengths, dtype=np.int32)
        term_of_token = np.concatenate(chunks) if chunks else np.zeros(0, np.int64)
        row_of_token = np.repeat(np.arange(n, dtype=np.int64), length_array)
        # one (term, row) key per token: sorting groups the postings by term, rows ascending
        keys, counts = np.unique(term_of_token * max(n, 1) + row_of_token, return_counts=True)
        terms = keys // max(n, 1)
        starts = np.searchsorted(terms, np.arange(len(vocabulary) + 1)).astype(np.int64)
        return cls(np.asarray(int_ids, dtype=np.int64), length_array, vocabulary, starts,
                   (keys % max(n, 1)).astype(np.int32), np.minimum(counts, 65535).astype(np.uint16), language)

    @property
    def count(self) -> int:
        return int(self.int_ids.size)

    @property
    def nbytes(self) -> int:
        """The arrays' memory (the vocabulary dict's is measured in benchmarks/lexical_engines.py)."""
        return sum(a.nbytes for a in (self.int_ids, self.lengths, self.starts, self.rows, self.tfs))

    def spans(self, terms: Iterable[str]) -> list[tuple[int, int]]:
        """Each term's postings as [first, end) positions in ``rows`` and ``tfs`` ((0, 0): no
        document holds it); end − first is its document count."""
        if self._starts is None:  # Python ints: a term's bounds without NumPy scalars
            self._starts = self.starts.tolist()
        starts, vocabulary = self._starts, self.vocabulary
        spans = []
        for term in terms:
            number = vocabulary.get(term)
            spans.append((0, 0) if number is None else (starts[number], starts[number + 1]))
        return spans

    def postings(self, term: str) -> tuple[np.ndarray, np.ndarray]:
        number = self.vocabulary.get(term)
        if number is None:
            return np.zeros(0, np.int32), np.zeros(0, np.uint16)
        start, end = self.starts[number], self.starts[number + 1]
        return self.rows[start:end], self.tfs[start:end]

    def rows_of(self, int_ids: np.ndarray) -> np.ndarray:
        """The rows of those of ``int_ids`` that are in the base, ascending."""
        if not int_ids.size:
            return np.zeros(0, dtype=np.int64)
        slots = np.searchsorted(self.int_ids, int_ids)
        inside = slots < self.int_ids.size
        slots, wanted = slots[inside], int_ids[inside]
        return np.sort(slots[self.int_ids[slots] == wanted])

    def stats(self, terms: Iterable[str], hidden_rows: np.ndarray) -> CorpusStats:
        """Statistics of the base's live documents (all but ``hidden_rows``, sorted) for ``terms``."""
        df: dict[str, int] = {}
        if not hidden_rows.size:  # every base document live: a term's count is its postings' length
            terms = list(terms)
            return CorpusStats(self.count, self.total_length,
                               {term: end - first for term, (first, end) in zip(terms, self.spans(terms), strict=True)})
        for term in terms:
            rows, _ = self.postings(term)
            df[term] = int(rows.size) - int(np.isin(rows, hidden_rows, assume_unique=True).sum())
        hidden_length = int(self.lengths[hidden_rows].sum())
        return CorpusStats(self.count - int(hidden_rows.size), self.total_length - hidden_length, df)


class SegmentLexicon:
    """The written documents' terms, by doc id, with an inverted map for lookups."""

    def __init__(self, language: str = DEFAULT_LANGUAGE) -> None:
        self.language = language  # the collection's (its base's), so written documents are analysed alike
        self._terms: dict[str, Counter[str]] = {}  # doc id → term frequencies
        self._lengths: dict[str, int] = {}
        self._postings: dict[str, dict[str, int]] = {}  # term → doc id → tf
        self.total_length = 0

    def add(self, doc_id: str, title: str, text: str) -> None:
        self.remove(doc_id)
        terms = document_terms(title, text, self.language)
        counts = Counter(terms)
        self._terms[doc_id] = counts
        self._lengths[doc_id] = len(terms)
        self.total_length += len(terms)
        for term, tf in counts.items():
            self._postings.setdefault(term, {})[doc_id] = tf

    def remove(self, doc_id: str) -> None:
        counts = self._terms.pop(doc_id, None)
        if counts is None:
            return
        self.total_length -= self._lengths.pop(doc_id)
        for term in counts:
            holders = self._postings[term]
            del holders[doc_id]
            if not holders:
                del self._postings[term]

    def __len__(self) -> int:
        return len(self._terms)

    def stats(self, terms: Iterable[str]) -> CorpusStats:
        return CorpusStats(len(self._terms), self.total_length,
                           {t: len(self._postings.get(t, ())) for t in terms})

    def holders(self, term: str) -> Iterator[tuple[str, int]]:
        """(doc id, tf) of the documents holding ``term``."""
        yield from self._postings.get(term, {}).items()

    def length(self, doc_id: str) -> int:
        return self._lengths[doc_id]
