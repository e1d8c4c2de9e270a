"""A weighted hybrid query on one live shard: the exact top k of every document the shard holds
(and the filter selects) by

    w_dense · dense_unit(similarity) + w_lexical · BM25 / bound

(``retrieval.fusion``: each leg on [0, 1] by the bounds it can take for the query; a leg that does
not find a document adds 0). Every document's fused score depends on the document alone — not on
which other documents a leg returned — so the shards' fused lists merge like dense ones and the
sharded answer is the unsharded one.

How it stays exact without scoring every document densely: the dense leg is read best first to
``depth`` (the request's ``candidates``); the lexical leg has scored every document holding a
term already (BM25 is cheap to compute for all of them). Every document the dense leg found, or
among the lexical leg's best ``depth``, gets both scores — its vector read back for the similarity
(the same float64 arithmetic whichever leg found it), its BM25 looked up. A document the dense
leg did not reach scores at most w_dense · unit(the dense leg's last) + w_lexical · its BM25 /
bound: every one whose BM25 could lift it to the k-th fused score is added the same way. Those
with no term cannot: the dense leg's own k-th already scores as much (Fagin's threshold algorithm,
with the lexical leg's scores all known). When that would add more than a few times ``depth``
documents (flat dense scores, a heavy lexical weight) the dense leg is read four times deeper
instead, which raises the bar (up to :data:`MAX_DEPTH`).

Only the top k documents are fetched (titles, texts), which is what makes a weighted hybrid cost
about one leg more than a dense query instead of two legs' lists of candidates with their texts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from index_shards.hybrid_sealed import (
    MAX_DEPTH,
    batch_pass_applies,
    distinct,
    first_read,
    sealed_batch,
    similarity_f64,
)
from index_shards.lexical_search import LexicalScores, lexical_scores
from retrieval.bm25 import CorpusStats, LexicalQuery, score_bound
from retrieval.contract import HitColumns
from retrieval.errors import IndexIntegrityError
from retrieval.filters import Filter
from retrieval.fusion import DENSE, LEXICAL, dense_unit

if TYPE_CHECKING:
    from index_shards.segment import DenseTop, LiveShard


@dataclass(slots=True)
class _Candidates:
    """The documents either leg found, with both legs' scores: base documents (by int id,
    ascending) first, then segment ones (by doc id)."""

    base_ids: np.ndarray  # int64, unique, ascending
    segment_ids: list[str]
    similarity: np.ndarray  # the dense leg's score (ip, or -L2²); NaN: stored without a vector
    bm25: np.ndarray  # 0: no term of the query
    segment: dict[str, Any]  # doc id → the segment's document

    def plus(self, other: _Candidates) -> _Candidates:
        """These and ``other``'s (none of which are among these), base ones first and ascending."""
        nb, mb = self.base_ids.size, other.base_ids.size
        base_ids = np.concatenate([self.base_ids, other.base_ids])
        order = np.argsort(base_ids, kind="stable")

        def joined(mine: np.ndarray, theirs: np.ndarray) -> np.ndarray:
            return np.concatenate([np.concatenate([mine[:nb], theirs[:mb]])[order], mine[nb:], theirs[mb:]])

        return _Candidates(base_ids[order], self.segment_ids + other.segment_ids,
                           joined(self.similarity, other.similarity), joined(self.bm25, other.bm25),
                           {**self.segment, **other.segment})

    def key(self, i: int) -> tuple[bool, Any]:
        """(in the segment?, its doc id there / its int id in the base) of candidate ``i``."""
        nb = self.base_ids.size
        return (False, int(self.base_ids[i])) if i < nb else (True, self.segment_ids[i - nb])


@dataclass(slots=True, frozen=True)
class _LexicalTop:
    """The lexical leg's best ``depth`` (every tie at the last score too)."""

    base_ids: np.ndarray
    segment_ids: list[str]
    scores: list[float]  # best first


def fused_search(live: LiveShard, vectors: np.ndarray, queries: Sequence[LexicalQuery], k: int, *,
                 nprobe: int | None = None, ef_search: int | None = None, with_text: bool = True,
                 with_metadata: bool = False, filter_: Filter | None = None) -> list[tuple[HitColumns, CorpusStats]]:
    """Per query (one vector each): the fused top ``k`` (scores: fused; per hit each leg's own
    score, and the shard's best ``depth`` scores per leg for the gateway's leg ranks), and this
    shard's statistics for the query's terms (what the gateway sums, as for a lexical query). The
    batch's dense legs go in one index search and its documents in one read, as a dense batch's."""
    specs = [query.fuse for query in queries]
    assert all(spec is not None for spec in specs)  # the caller routes only weighted hybrid queries here
    first = first_read(live, max(max(spec.depth, k) for spec in specs if spec is not None))
    finished = sealed_batch(live, vectors, queries, k, first, nprobe=nprobe, ef_search=ef_search, filter_=filter_) \
        if batch_pass_applies(live, len(queries)) else [None] * len(queries)
    chosen: list[tuple[_Candidates, np.ndarray, np.ndarray, dict[str, list[float]], CorpusStats]] = []
    rest = [i for i, answer in enumerate(finished) if answer is None]
    if rest:  # a shard with writes since its base, or a query the batch pass could not finish
        batch = dict(zip(rest, live.dense_keys(vectors[rest], first, nprobe=nprobe, ef_search=ef_search,
                                               filter_=filter_), strict=True))
    for i, (vector, query, answer) in enumerate(zip(vectors, queries, finished, strict=True)):
        if answer is None:
            chosen.append(_one(live, vector, query, batch[i], first, k, nprobe, ef_search, filter_))
        else:
            chosen.append((_Candidates(answer.base_ids, [], answer.similarity, answer.bm25, {}), answer.fused,
                           answer.picked, answer.leg_tops, answer.own))
    base_ids = [i for found, _, picked, _, _ in chosen
                for i in found.base_ids[picked[picked < found.base_ids.size]].tolist()]
    stored = live.base.docstore.get_many(base_ids, with_text=with_text, with_metadata=with_metadata)
    answers = []
    for found, fused, picked, leg_tops, own in chosen:
        columns = _columns(found, fused, picked, stored, k, with_text, with_metadata)
        columns["leg_tops"] = leg_tops
        answers.append((columns, own))
    return answers


def _one(live: LiveShard, vector: np.ndarray, query: LexicalQuery, dense: DenseTop, read: int, k: int,
         nprobe: int | None, ef_search: int | None,
         filter_: Filter | None) -> tuple[_Candidates, np.ndarray, np.ndarray, dict[str, list[float]], CorpusStats]:
    """One query's candidates, their fused scores, the ones that can make its top k (every tie at
    the k-th), its leg tops and the shard's statistics. ``dense``: its dense leg read ``read`` deep."""
    spec = query.fuse
    assert spec is not None
    lexical = lexical_scores(live, query.text, query.corpus, filter_)
    bound = score_bound(lexical.term_weights)
    per_bm25 = spec.lexical / bound if bound > 0 else 0.0
    lexical_top = _lexical_top(lexical, max(spec.depth, k))
    depth = read  # the batch's depth: at least this query's (a deeper dense list only raises the bar)
    while True:
        found = _candidates(live, vector, np.concatenate([dense.base_ids, lexical_top.base_ids]),
                            dense.segment_ids + lexical_top.segment_ids, lexical)
        fused = _fused(found, spec.dense, per_bm25, live.metric)
        if per_bm25 == 0.0:  # the lexical leg adds nothing: the dense top k is the answer
            break
        dense_full = dense.count >= depth
        floor = spec.dense * float(dense_unit(np.asarray([dense.last]), live.metric)[0]) if dense_full else 0.0
        kth = float(np.partition(fused, fused.size - k)[fused.size - k]) if fused.size >= k else -np.inf
        extra_base, extra_segment = _lexical_reaching(lexical, (kth - floor) / per_bm25, found)
        extra = extra_base.size + len(extra_segment)
        if extra <= max(4 * depth, 64) or not dense_full or depth >= MAX_DEPTH:
            if extra:
                found = found.plus(_candidates(live, vector, extra_base, extra_segment, lexical))
                fused = _fused(found, spec.dense, per_bm25, live.metric)
            break
        depth = min(depth * 4, MAX_DEPTH)
        dense = live.dense_keys(vector[None, :], depth, nprobe=nprobe, ef_search=ef_search, filter_=filter_)[0]
    picked = np.arange(fused.size)
    if fused.size > k:  # every tie at the k-th score: ties resolve by doc id when the documents are read
        picked = np.flatnonzero(fused >= np.partition(fused, fused.size - k)[fused.size - k])
    leg_tops = {DENSE: _dense_top_scores(found, dense, spec.depth), LEXICAL: lexical_top.scores[:spec.depth]}
    return found, fused, picked, leg_tops, lexical.own


def _dense_top_scores(found: _Candidates, dense: DenseTop, depth: int) -> list[float]:
    """The best ``depth`` similarities (as recomputed for the candidates) of the documents the
    dense leg found, best first."""
    nb = found.base_ids.size
    rows = np.searchsorted(found.base_ids[:nb], dense.base_ids) if dense.base_ids.size else np.zeros(0, np.int64)
    if dense.segment_ids:  # a segment document written away since is not a candidate
        where = {doc_id: nb + i for i, doc_id in enumerate(found.segment_ids)}
        rows = np.concatenate([rows, [where[d] for d in dense.segment_ids if d in where]]).astype(np.int64)
    best = np.sort(found.similarity[rows])[::-1][:depth]  # NaN (no vector) sorts last, so comes first here
    top: list[float] = best[~np.isnan(best)].tolist()
    return top


def _fused(found: _Candidates, dense_weight: float, per_bm25: float, metric: str) -> np.ndarray:
    unit = dense_unit(found.similarity, metric)
    unit[np.isnan(unit)] = 0.0  # stored without a vector: the dense leg's minimum
    fused: np.ndarray = dense_weight * unit + per_bm25 * found.bm25
    return fused


def _lexical_reaching(lexical: LexicalScores, threshold: float, seen: _Candidates) -> tuple[np.ndarray, list[str]]:
    """Documents whose BM25 is at least ``threshold`` and that are not ``seen``: base int ids and
    segment doc ids."""
    if not np.isfinite(threshold):
        threshold = -np.inf
    int_ids = lexical.base.int_ids[lexical.base_rows[lexical.base_scores >= threshold]]
    known = seen.base_ids
    if known.size and int_ids.size:  # membership by binary search: the candidates' ids are sorted
        slots = np.minimum(np.searchsorted(known, int_ids), known.size - 1)
        int_ids = int_ids[known[slots] != int_ids]
    base = int_ids
    seen_segment = set(seen.segment_ids)
    segment = [doc_id for value, doc_id, _ in lexical.segment if value >= threshold and doc_id not in seen_segment]
    return base, segment


def _lexical_top(lexical: LexicalScores, depth: int) -> _LexicalTop:
    """The lexical leg's best ``depth`` (every tie at the last score too)."""
    rows, scores = lexical.base_rows, lexical.base_scores
    if rows.size > depth:
        threshold = np.partition(scores, rows.size - depth)[rows.size - depth]
        keep = scores >= threshold
        rows, scores = rows[keep], scores[keep]
    if not lexical.segment:  # no written document holds a term: the base's best are the leg's
        return _LexicalTop(lexical.base.int_ids[rows], [], np.sort(scores)[::-1].tolist())
    segment_scores = np.asarray([value for value, _, _ in lexical.segment], dtype=np.float64)
    segment_ids = [doc_id for _, doc_id, _ in lexical.segment]
    values = np.concatenate([scores, segment_scores])
    if values.size > depth:
        last = np.partition(values, values.size - depth)[values.size - depth]
        rows = rows[scores >= last]
        segment_ids = [doc_id for doc_id, value in zip(segment_ids, segment_scores.tolist(), strict=True)
                       if value >= last]
        values = values[values >= last]
    return _LexicalTop(lexical.base.int_ids[rows], segment_ids, np.sort(values)[::-1].tolist())


def _candidates(live: LiveShard, vector: np.ndarray, base_ids: np.ndarray, segment_ids: list[str],
                lexical: LexicalScores) -> _Candidates:
    """The documents under ``base_ids`` and ``segment_ids`` (each once; a segment one written away
    since is left out), each with both scores: the similarity from its vector read back (the
    same float64 arithmetic for every document, whichever leg found it and on whichever shard it
    lives), the BM25 looked up."""
    base = distinct(np.asarray(base_ids, dtype=np.int64))
    segment = live.segment_members(dict.fromkeys(segment_ids)) if segment_ids else {}
    in_segment = [doc_id for doc_id in dict.fromkeys(segment_ids) if doc_id in segment]
    rows = np.searchsorted(lexical.base.int_ids, base)  # base documents: the lexicon holds a row for each
    if rows.size and not np.array_equal(lexical.base.int_ids[np.minimum(rows, lexical.base.count - 1)], base):
        raise IndexIntegrityError("a hybrid candidate is not in the shard's base")
    matrix, present = live.base_row_matrix(rows)
    bm25 = lexical.all_base_scores[rows] if lexical.all_base_scores.size else np.zeros(rows.size, dtype=np.float64)
    if in_segment:
        vectors = [segment[doc_id][1] for doc_id in in_segment]
        matrix = np.concatenate([matrix, np.asarray([v if v is not None else np.zeros(live.dim, np.float32)
                                                     for v in vectors], dtype=np.float32)])
        present = np.concatenate([present, [v is not None for v in vectors]])
        bm25 = np.concatenate([bm25, [lexical.segment_scores.get(doc_id, 0.0) for doc_id in in_segment]])
    return _Candidates(base, in_segment, _similarity(matrix, present, vector, live.metric), bm25,
                       {doc_id: doc for doc_id, (doc, _) in segment.items()})


def _similarity(matrix: np.ndarray, present: np.ndarray, query: np.ndarray, metric: str) -> np.ndarray:
    """Each row's score against ``query`` in float64 (``similarity_f64``); NaN for a document
    stored without a vector."""
    out = similarity_f64(matrix.astype(np.float64), np.asarray(query, dtype=np.float64), metric)
    out[~present] = np.nan
    return out


def _columns(found: _Candidates, fused: np.ndarray, picked: np.ndarray, stored: dict[int, Any], k: int,
             with_text: bool, with_metadata: bool) -> HitColumns:
    """The best ``k`` of ``picked`` by fused score (ties by doc id), with their documents (base
    ones from ``stored``) and each leg's score."""
    nb = found.base_ids.size
    base_ids = found.base_ids[picked[picked < nb]].tolist()  # picked is ascending: base ones first
    rows = []
    for j, (i, value) in enumerate(zip(picked.tolist(), fused[picked].tolist(), strict=True)):
        key: Any = base_ids[j] if i < nb else found.segment_ids[i - nb]
        doc = stored.get(key) if i < nb else found.segment.get(key)
        if doc is None:
            raise IndexIntegrityError(f"a hybrid candidate ({key!r}) has no document in the shard")
        rows.append((-value, doc.doc_id, j, doc))
    rows.sort()  # (fused score, doc id); j is unique, so documents are never compared
    best = rows[:k]
    chosen = picked[[j for _, _, j, _ in best]]
    columns: HitColumns = {"doc_ids": [], "scores": [], "titles": [], "texts": []}
    doc_ids, scores, titles, texts = columns["doc_ids"], columns["scores"], columns["titles"], columns["texts"]
    for negated, doc_id, _, doc in best:
        doc_ids.append(doc_id)
        scores.append(-negated)
        titles.append(doc.title if with_text else "")
        texts.append(doc.text if with_text else "")
    if with_metadata:
        columns["metadata"] = [dict(doc.metadata or {}) for *_, doc in best]
    columns["legs"] = {DENSE: [None if similarity != similarity else similarity  # NaN: no vector
                               for similarity in found.similarity[chosen].tolist()],
                       LEXICAL: [bm25 if bm25 > 0 else None for bm25 in found.bm25[chosen].tolist()]}
    return columns
