"""A weighted hybrid query on one live shard: the exact top k of every document the shard holds
(and the filter selects) by

    w_dense · dense_unit(similarity) + w_lexical · BM25 / bound

(``retrieval.fusion``: each leg on [0, 1] by the bounds it can take for the query; a leg that does
not find a document adds 0). Every document's fused score depends on the document alone — not on
which other documents a leg returned — so the shards' fused lists merge like dense ones and the
sharded answer is the unsharded one.

How it stays exact without scoring every document densely: both legs are read best first, to
``depth`` each (the request's ``candidates``); every document either leg found gets both scores
(its vector read back for the similarity, its BM25 looked up); a document neither found scores at
most w_dense · unit(the dense leg's last) + w_lexical · (the lexical leg's last) / bound (Fagin's
threshold algorithm). When the k-th fused score reaches that, the top k is final; otherwise both
legs are read four times deeper (up to :data:`MAX_DEPTH`, past which the answer is the best of
what was read — only on a shard of tens of thousands of near-ties).

Only the top k documents are fetched (titles, texts), which is what makes a weighted hybrid cost
about one leg more than a dense query instead of two legs' lists of candidates with their texts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from index_shards.lexical_search import LexicalScores, lexical_scores
from retrieval.bm25 import CorpusStats, LexicalQuery, score_bound
from retrieval.contract import HitColumns
from retrieval.errors import IndexIntegrityError
from retrieval.filters import Filter
from retrieval.fusion import DENSE, LEXICAL, dense_unit
from retrieval.routing import doc_int_id

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


def fused_search(live: LiveShard, vector: np.ndarray, query: LexicalQuery, k: int, *, nprobe: int | None = None,
                 ef_search: int | None = None, with_text: bool = True, with_metadata: bool = False,
                 filter_: Filter | None = None) -> tuple[HitColumns, CorpusStats]:
    """The fused top ``k`` (scores: fused; per hit each leg's own score, and the shard's best
    ``depth`` scores per leg for the gateway's leg ranks), and this shard's statistics for the
    query's terms (what the gateway sums, as for a lexical query)."""
    spec = query.fuse
    assert spec is not None  # the caller routes only weighted hybrid queries here
    lexical = lexical_scores(live, query.text, query.corpus, filter_)
    bound = score_bound(lexical.term_weights)
    weight_lexical = spec.lexical / bound if bound > 0 else 0.0
    depth = max(spec.depth, k)
    while True:
        dense = live.search(np.asarray(vector, dtype=np.float32)[None, :], depth, nprobe=nprobe, ef_search=ef_search,
                            with_text=False, filter_=filter_)[0]
        lexical_top, lexical_full = _lexical_top(lexical, depth)
        found = _candidates(live, vector, dense["doc_ids"], lexical_top, lexical)
        fused = spec.dense * np.nan_to_num(dense_unit(found.similarity, live.metric), nan=0.0) + \
            weight_lexical * found.bm25
        dense_full = len(dense["doc_ids"]) >= depth
        if not (dense_full or lexical_full) or depth >= MAX_DEPTH:
            break
        unseen = (spec.dense * float(dense_unit(np.asarray(dense["scores"][-1:]), live.metric)[0])
                  if dense_full else 0.0) + (weight_lexical * lexical_top[-1][0] if lexical_full else 0.0)
        if fused.size >= k and float(np.partition(fused, fused.size - k)[fused.size - k]) >= unseen:
            break
        depth = min(depth * 4, MAX_DEPTH)
    columns = _top(live, found, fused, k, with_text, with_metadata)
    similarities = np.sort(found.similarity[:len(dense["doc_ids"])])[::-1]
    columns["leg_tops"] = {DENSE: [float(s) for s in similarities[:spec.depth] if not np.isnan(s)],
                           LEXICAL: [score for score, _ in lexical_top[:spec.depth]]}
    return columns, lexical.own


def _lexical_top(lexical: LexicalScores, depth: int) -> tuple[list[tuple[float, tuple[bool, Any]]], bool]:
    """The lexical leg's best ``depth`` (every tie at the last score too), best first, as (score,
    key); and whether documents scored below them were left out."""
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
    total = lexical.base_rows.size + len(lexical.segment)
    if len(found) > depth:
        last = found[depth - 1][0]
        found = [item for item in found if item[0] >= last]
    return found, total > len(found)


def _candidates(live: LiveShard, vector: np.ndarray, dense_ids: list[str],
                lexical_top: list[tuple[float, tuple[bool, Any]]], lexical: LexicalScores) -> _Candidates:
    """Both legs' finds (the dense leg's first, in its order), each with both scores: the
    similarity from its vector read back (the same arithmetic for every document, whichever leg
    found it and on whichever shard it lives), the BM25 looked up."""
    segment = live.segment_members(dense_ids + [key for _, (in_segment, key) in lexical_top if in_segment])
    keys: list[tuple[bool, Any]] = []
    seen: set[tuple[bool, Any]] = set()
    for doc_id in dense_ids:
        key = (True, doc_id) if doc_id in segment else (False, doc_int_id(doc_id))
        if key not in seen:
            seen.add(key)
            keys.append(key)
    for _, key in lexical_top:
        if key not in seen and (not key[0] or key[1] in segment):
            seen.add(key)
            keys.append(key)
    base_ids = np.asarray([key for in_segment, key in keys if not in_segment], dtype=np.int64)
    base_vectors = iter(live.base_vectors(base_ids))
    base_bm25 = iter(lexical.base_score_of(base_ids).tolist())
    vectors: list[np.ndarray | None] = []
    bm25: list[float] = []
    for in_segment, key in keys:
        if in_segment:
            vectors.append(segment[key][1])
            bm25.append(lexical.segment_scores.get(key, 0.0))
        else:
            vectors.append(next(base_vectors))
            bm25.append(next(base_bm25))
    return _Candidates(keys, _similarity(vectors, vector, live.metric), np.asarray(bm25, dtype=np.float64),
                       {doc_id: doc for doc_id, (doc, _) in segment.items()})


def _similarity(vectors: list[np.ndarray | None], query: np.ndarray, metric: str) -> np.ndarray:
    """Each vector's score against ``query`` as the dense leg reports it (ip: the inner product;
    l2: -L2²), in float64; NaN for a document stored without a vector."""
    out = np.full(len(vectors), np.nan, dtype=np.float64)
    present = [i for i, v in enumerate(vectors) if v is not None]
    if present:
        matrix = np.stack([vectors[i] for i in present]).astype(np.float64)  # type: ignore[misc]
        q = np.asarray(query, dtype=np.float64)
        out[present] = -np.sum((matrix - q) ** 2, axis=1) if metric == "l2" else matrix @ q
    return out


def _top(live: LiveShard, found: _Candidates, fused: np.ndarray, k: int, with_text: bool,
         with_metadata: bool) -> HitColumns:
    """The best ``k`` by fused score (ties by doc id), with their documents and each leg's score."""
    columns: HitColumns = {"doc_ids": [], "scores": [], "titles": [], "texts": []}
    if with_metadata:
        columns["metadata"] = []
    columns["legs"] = {DENSE: [], LEXICAL: []}
    if fused.size == 0:
        return columns
    picked = np.arange(fused.size)
    if fused.size > k:  # every tie at the k-th score: ties resolve by doc id below
        picked = np.flatnonzero(fused >= np.partition(fused, fused.size - k)[fused.size - k])
    base_ids = [found.keys[i][1] for i in picked.tolist() if not found.keys[i][0]]
    stored = live.base.docstore.get_many(base_ids, with_text=with_text, with_metadata=with_metadata)
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
