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

from index_shards.lexical_search import LexicalScores, lexical_scores
from retrieval.bm25 import CorpusStats, LexicalQuery, score_bound
from retrieval.contract import HitColumns
from retrieval.errors import IndexIntegrityError
from retrieval.filters import Filter
from retrieval.fusion import DENSE, LEXICAL, dense_unit

if TYPE_CHECKING:
    from index_shards.segment import LiveShard

MAX_DEPTH = 4096  # how deep either leg is read at most (a shard's answer stays exact up to here)


@dataclass(slots=True)
class _Candidates:
    """The documents either leg found, with both legs' scores."""

    keys: list[tuple[bool, Any]]  # (in the segment?, doc id there / int id in the base)
    similarity: np.ndarray  # the dense leg's score (ip, or -L2²); NaN: stored without a vector
    bm25: np.ndarray  # 0: no term of the query
    segment: dict[str, Any]  # doc id → the segment's document


def fused_search(live: LiveShard, vectors: np.ndarray, queries: Sequence[LexicalQuery], k: int, *,
                 nprobe: int | None = None, ef_search: int | None = None, with_text: bool = True,
                 with_metadata: bool = False, filter_: Filter | None = None) -> list[tuple[HitColumns, CorpusStats]]:
    """Per query (one vector each): the fused top ``k`` (scores: fused; per hit each leg's own
    score, and the shard's best ``depth`` scores per leg for the gateway's leg ranks), and this
    shard's statistics for the query's terms (what the gateway sums, as for a lexical query). The
    batch's dense legs go in one index search and its documents in one read, as a dense batch's."""
    specs = [query.fuse for query in queries]
    assert all(spec is not None for spec in specs)  # the caller routes only weighted hybrid queries here
    first = max(max(spec.depth, k) for spec in specs if spec is not None)
    batch = live.dense_keys(vectors, first, nprobe=nprobe, ef_search=ef_search, filter_=filter_)
    chosen = []
    for vector, query, dense in zip(vectors, queries, batch, strict=True):
        chosen.append(_one(live, vector, query, dense, first, k, nprobe, ef_search, filter_))
    base_ids = [found.keys[i][1] for found, _, picked, _, _ in chosen for i in picked.tolist() if not found.keys[i][0]]
    stored = live.base.docstore.get_many(base_ids, with_text=with_text, with_metadata=with_metadata)
    answers = []
    for found, fused, picked, leg_tops, own in chosen:
        columns = _columns(found, fused, picked, stored, k, with_text, with_metadata)
        columns["leg_tops"] = leg_tops
        answers.append((columns, own))
    return answers


def _one(live: LiveShard, vector: np.ndarray, query: LexicalQuery, dense: list[tuple[float, tuple[bool, Any]]],
         read: int, k: int, nprobe: int | None, ef_search: int | None,
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
        found = _candidates(live, vector, [key for _, key in dense] + [key for _, key in lexical_top], lexical)
        fused = _fused(found, spec.dense, per_bm25, live.metric)
        if per_bm25 == 0.0:  # the lexical leg adds nothing: the dense top k is the answer
            break
        dense_full = len(dense) >= depth
        floor = spec.dense * float(dense_unit(np.asarray([dense[-1][0]]), live.metric)[0]) if dense_full else 0.0
        kth = float(np.partition(fused, fused.size - k)[fused.size - k]) if fused.size >= k else -np.inf
        extra = _lexical_reaching(lexical, (kth - floor) / per_bm25, found.keys)
        if len(extra) <= max(4 * depth, 64) or not dense_full or depth >= MAX_DEPTH:
            if extra:
                found = _candidates(live, vector, found.keys + extra, lexical)
                fused = _fused(found, spec.dense, per_bm25, live.metric)
            break
        depth = min(depth * 4, MAX_DEPTH)
        dense = live.dense_keys(vector[None, :], depth, nprobe=nprobe, ef_search=ef_search, filter_=filter_)[0]
    picked = np.arange(fused.size)
    if fused.size > k:  # every tie at the k-th score: ties resolve by doc id when the documents are read
        picked = np.flatnonzero(fused >= np.partition(fused, fused.size - k)[fused.size - k])
    position = {key: i for i, key in enumerate(found.keys)}
    similarities = np.sort(found.similarity[[position[key] for _, key in dense if key in position]])[::-1]
    leg_tops = {DENSE: [float(s) for s in similarities[:spec.depth] if not np.isnan(s)],
                LEXICAL: [score for score, _ in lexical_top[:spec.depth]]}
    return found, fused, picked, leg_tops, lexical.own


def _fused(found: _Candidates, dense_weight: float, per_bm25: float, metric: str) -> np.ndarray:
    fused: np.ndarray = dense_weight * np.nan_to_num(dense_unit(found.similarity, metric), nan=0.0) + \
        per_bm25 * found.bm25
    return fused


def _lexical_reaching(lexical: LexicalScores, threshold: float, seen: list[tuple[bool, Any]]) -> list[tuple[bool, Any]]:
    """The keys of documents whose BM25 is at least ``threshold`` and that are not ``seen``."""
    if not np.isfinite(threshold):
        threshold = -np.inf
    seen_keys = set(seen)
    rows = lexical.base_rows[lexical.base_scores >= threshold]
    keys: list[tuple[bool, Any]] = [key for key in ((False, int_id) for int_id in lexical.base.int_ids[rows].tolist())
                                    if key not in seen_keys]
    keys += [key for key in ((True, doc_id) for value, doc_id, _ in lexical.segment if value >= threshold)
             if key not in seen_keys]
    return keys


def _lexical_top(lexical: LexicalScores, depth: int) -> list[tuple[float, tuple[bool, Any]]]:
    """The lexical leg's best ``depth`` (every tie at the last score too), best first, as (score, key)."""
    rows, scores = lexical.base_rows, lexical.base_scores
    if rows.size > depth:
        threshold = np.partition(scores, rows.size - depth)[rows.size - depth]
        keep = scores >= threshold
        rows, scores = rows[keep], scores[keep]
    found: list[tuple[float, tuple[bool, Any]]] = [
        (value, (False, int_id)) for value, int_id in zip(scores.tolist(), lexical.base.int_ids[rows].tolist(),
                                                          strict=True)]
    found += [(value, (True, doc_id)) for value, doc_id, _ in lexical.segment]
    found.sort(key=lambda item: -item[0])
    if len(found) > depth:
        last = found[depth - 1][0]
        found = [item for item in found if item[0] >= last]
    return found


def _candidates(live: LiveShard, vector: np.ndarray, keys: list[tuple[bool, Any]],
                lexical: LexicalScores) -> _Candidates:
    """The documents under ``keys`` (each once, in first-seen order; a segment one written away
    since is left out), each with both scores: the similarity from its vector read back (the same
    float64 arithmetic for every document, whichever leg found it and on whichever shard it
    lives), the BM25 looked up."""
    unique = list(dict.fromkeys(keys))
    segment = live.segment_members([key for in_segment, key in unique if in_segment])
    unique = [key for key in unique if not key[0] or key[1] in segment]
    in_segment = np.asarray([key[0] for key in unique], dtype=bool)
    base_ids = np.asarray([key for inside, key in unique if not inside], dtype=np.int64)
    matrix = np.zeros((len(unique), live.dim), dtype=np.float32)
    present = np.zeros(len(unique), dtype=bool)
    bm25 = np.zeros(len(unique), dtype=np.float64)
    base_rows = np.flatnonzero(~in_segment)
    if base_rows.size:
        matrix[base_rows], present[base_rows] = live.base_matrix(base_ids)
        bm25[base_rows] = lexical.base_score_of(base_ids)
    for row in np.flatnonzero(in_segment).tolist():
        doc_id = unique[row][1]
        doc_vector = segment[doc_id][1]
        if doc_vector is not None:
            matrix[row], present[row] = doc_vector, True
        bm25[row] = lexical.segment_scores.get(doc_id, 0.0)
    return _Candidates(unique, _similarity(matrix, present, vector, live.metric), bm25,
                       {doc_id: doc for doc_id, (doc, _) in segment.items()})


def _similarity(matrix: np.ndarray, present: np.ndarray, query: np.ndarray, metric: str) -> np.ndarray:
    """Each row's score against ``query`` as the dense leg reports it (ip: the inner product;
    l2: -L2²), in float64; NaN for a document stored without a vector."""
    rows = matrix.astype(np.float64)
    q = np.asarray(query, dtype=np.float64)
    out: np.ndarray = -np.sum((rows - q) ** 2, axis=1) if metric == "l2" else rows @ q
    out[~present] = np.nan
    return out


def _columns(found: _Candidates, fused: np.ndarray, picked: np.ndarray, stored: dict[int, Any], k: int,
             with_text: bool, with_metadata: bool) -> HitColumns:
    """The best ``k`` of ``picked`` by fused score (ties by doc id), with their documents (base
    ones from ``stored``) and each leg's score."""
    columns: HitColumns = {"doc_ids": [], "scores": [], "titles": [], "texts": []}
    if with_metadata:
        columns["metadata"] = []
    columns["legs"] = {DENSE: [], LEXICAL: []}
    rows = []
    for i in picked.tolist():
        in_segment, key = found.keys[i]
        doc = found.segment.get(key) if in_segment else stored.get(key)
        if doc is None:
            raise IndexIntegrityError(f"a hybrid candidate ({key!r}) has no document in the shard")
        rows.append((-float(fused[i]), doc.doc_id, i, doc))
    rows.sort(key=lambda row: (row[0], row[1]))
    for negated, doc_id, i, doc in rows[:k]:
        columns["doc_ids"].append(doc_id)
        columns["scores"].append(-negated)
        columns["titles"].append(doc.title if with_text else "")
        columns["texts"].append(doc.text if with_text else "")
        if with_metadata:
            columns["metadata"].append(dict(doc.metadata or {}))
        similarity, bm25 = float(found.similarity[i]), float(found.bm25[i])
        columns["legs"][DENSE].append(None if np.isnan(similarity) else similarity)
        columns["legs"][LEXICAL].append(bm25 if bm25 > 0 else None)
    return columns
