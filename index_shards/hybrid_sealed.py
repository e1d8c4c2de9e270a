"""A batch of weighted hybrid queries on a shard with no writes since its base (no segment
documents, no tombstones: the steady state between compactions), in whole-batch NumPy passes.

``index_shards.hybrid_search`` defines the answer — each query's exact fused top k — and computes
it one query at a time, which costs ~40 small NumPy calls a query. Here the batch's BM25 is one
``bincount`` over every query's postings, its candidates one ``unique``, their vectors one
gather, their scores one pass, the k-th fused scores one partition — the same arithmetic element
by element, so the same bits. It follows the per-query path step for step: documents outside
both legs' first lists whose BM25 could lift them past the k-th are added, and a query with more
of them than a few times the dense leg's depth reads that leg 4× deeper (a second pass for those
queries, with their lexical leg as the first pass scored it). A call of fewer than
:data:`MIN_SEALED_BATCH` queries, a shard with writes since its base, or a base of more than
:data:`MAX_SEALED_ROWS` documents goes the per-query way (:func:`batch_pass_applies`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from index_shards.lexical import BaseLexicon, bm25_weights
from retrieval.analysis import query_terms
from retrieval.bm25 import CorpusStats, LexicalQuery, score_bound
from retrieval.errors import IndexIntegrityError
from retrieval.filters import Filter
from retrieval.fusion import DENSE, LEXICAL, dense_unit

if TYPE_CHECKING:
    from index_shards.segment import LiveShard

MAX_DEPTH = 4096  # how deep either leg is read at most (a shard's answer stays exact up to here)
# the batch pass costs ~60 NumPy calls whatever the batch: per query it beats the per-query path's ~40
# from about three queries (one 2.5k-document shard: 1 query 0.45 against 0.39 ms, 2 even, 3 0.30
# against 0.33, 7 0.23 against 0.30); c=1 traffic arrives one query a call
MIN_SEALED_BATCH = 3
# ... and only on a base of at most this many documents. The pass scores a queries × documents
# array and walks every touched (query, document) cell again for each deeper read of the dense
# leg; the per-query path walks one query's postings. Calls of 7 weighted queries, ms a query,
# batch pass against per-query path (benchmarks/hybrid_scale.py's shards; HNSW32 / IVF256,Flat /
# Flat): 10k 0.55/0.63, 0.45/0.50, 0.77/0.79; 30k 0.93/0.97, 0.88/0.88, 1.56/1.52; 50k
# 1.47/1.40, 1.48/1.42, 3.76/3.31; 100k 2.34/1.85, 2.25/1.95, 7.76/7.39 — the same answers.
MAX_SEALED_ROWS = 32_768
# how deep a weighted hybrid reads the dense leg first on a flat shard of n documents: n // 128, at
# most 512 (and at least the request's depth). The documents holding a query's terms grow with the
# shard, and with them those that could still reach the k-th past a shallow dense list: on a 100k
# Flat shard a first read 20 deep went on to read 80 and 320 (and 1,280) deep for almost every
# query — each a full scan again — where one read 512 deep finishes (docs/hybrid.md;
# benchmarks/hybrid_scale.py). Below 2,560 documents it is the request's depth (20 by default), as
# before; HNSW and IVF shards keep it (first_read says why).
FIRST_READ_SHARE = 128
FIRST_READ_MAX = 512
MAX_CELLS = 1 << 22  # queries × base documents scored in one pass (32 MiB of float64); a bigger batch is split
_NO_ROWS = np.zeros(0, dtype=np.int64)


@dataclass(slots=True, frozen=True)
class SealedAnswer:
    """One query's finished fused search: its candidates (base documents by int id, ascending)
    with both legs' scores and the fused one, the ones that can make its top k (every tie at the
    k-th), its leg tops and the shard's statistics for its terms."""

    base_ids: np.ndarray
    similarity: np.ndarray  # NaN: stored without a vector
    bm25: np.ndarray
    fused: np.ndarray
    picked: np.ndarray
    leg_tops: dict[str, list[float]]
    own: CorpusStats


def first_read(live: LiveShard, depth: int) -> int:
    """How deep a weighted hybrid reads the dense leg first on ``live`` when the request asks for
    ``depth`` (:data:`FIRST_READ_SHARE`). On a flat index (an exact scan) a deeper first read only
    raises the bar an unseen document must clear, so fewer reads follow, and the answer is the
    same. An approximate index reads the request's depth: its list's last score does not bound
    what it missed, and the documents BM25 brings in past a shallow read find some of those — a
    deep first read agreed less with the exact fused top 10 (100k documents: HNSW32 at ef_search
    16 0.769 against 0.794, IVF256 0.725 against 0.739; benchmarks/hybrid_scale.py)."""
    if not live.base.filtered.scans_all:
        return depth
    documents = live.base.lexicon.count + live.segment_size
    return max(depth, min(documents // FIRST_READ_SHARE, FIRST_READ_MAX))


def sealed(live: LiveShard) -> bool:
    """Whether the shard is as its base was built: nothing written since."""
    return live.segment_size == 0 and live.tombstones == 0


def batch_pass_applies(live: LiveShard, queries: int) -> bool:
    """Whether a call of ``queries`` weighted queries goes through :func:`sealed_batch`: enough
    queries to pay for it, a :func:`sealed` shard, and a base small enough that it is the cheaper
    way (:data:`MAX_SEALED_ROWS`)."""
    return queries >= MIN_SEALED_BATCH and sealed(live) and live.base.lexicon.count <= MAX_SEALED_ROWS


def sealed_batch(live: LiveShard, vectors: np.ndarray, queries: Sequence[LexicalQuery], k: int, read: int, *,
                 nprobe: int | None, ef_search: int | None, filter_: Filter | None) -> list[SealedAnswer | None]:
    """Per query, its answer, or None where the per-query path must finish it. ``read``: how deep
    the dense leg is read (the batch's deepest ``depth``, at least k). ``live`` is :func:`sealed`."""
    step = max(1, MAX_CELLS // max(live.base.lexicon.count, 1))
    answers: list[SealedAnswer | None] = []
    for start in range(0, len(queries), step):
        part, asked = vectors[start:start + step], list(queries[start:start + step])
        if live.base.lexicon.count == 0:
            answers.extend([None] * len(asked))
            continue
        lexical = _LexicalLeg.score(live, asked, k, filter_)
        found = _pass(live, part, asked, k, read, nprobe, ef_search, filter_, lexical)
        depth = read
        while True:  # the queries that need the dense leg read deeper, 4× at a time, as the per-query path
            deeper = [i for i, answer in enumerate(found) if answer is _DEEPER]
            if not deeper or depth >= MAX_DEPTH:
                break
            depth = min(depth * 4, MAX_DEPTH)
            # their lexical leg as scored: no dense read changes it
            for i, answer in zip(deeper, _pass(live, part[deeper], [asked[i] for i in deeper], k, depth, nprobe,
                                               ef_search, filter_, lexical.of(deeper)), strict=True):
                found[i] = answer
        answers.extend(None if answer is _DEEPER else answer for answer in found)
    return answers


_DEEPER = SealedAnswer(np.zeros(0, np.int64), *(np.zeros(0),) * 4, {}, CorpusStats(0, 0, {}))  # read deeper


@dataclass(slots=True, frozen=True)
class _LexicalLeg:
    """A batch's lexical leg on the base: each query's statistics and BM25 weight in the fused
    score, every base row's BM25 (queries × rows), the (query, row) cells a term touched —
    ascending — with their scores, and which of those are each query's lexical best."""

    owns: list[CorpusStats]
    per_bm25: np.ndarray
    bm25: np.ndarray
    touched_q: np.ndarray
    touched_rows: np.ndarray
    touched: np.ndarray
    in_top: np.ndarray  # positions in ``touched``

    @classmethod
    def score(cls, live: LiveShard, queries: Sequence[LexicalQuery], k: int, filter_: Filter | None) -> _LexicalLeg:
        """Each query's term weights under its statistics, then every query's postings scored in
        one pass (bincount adds per document in array order: term by term, as per query)."""
        shard = live.base
        lexicon = shard.lexicon
        n, size = lexicon.count, len(queries)
        plan = term_plan(lexicon, queries)
        if plan.firsts:
            counts = np.asarray(plan.ends) - np.asarray(plan.firsts)
            total = int(counts.sum())
            # every term's postings in one gather: position = its term's first + its place in the run
            runs = np.cumsum(counts) - counts
            positions = np.arange(total) + np.repeat(np.asarray(plan.firsts) - runs, counts)
            rows = lexicon.rows[positions]
            cells = rows + np.repeat(np.asarray(plan.queries, dtype=np.int64) * n, counts)
            contributions = bm25_weights(np.repeat(np.asarray(plan.weights), counts), lexicon.tfs[positions],
                                         lexicon.lengths[rows], np.repeat(np.asarray(plan.averages), counts))
            bm25 = np.bincount(cells, weights=contributions, minlength=size * n).reshape(size, n)
        else:
            bm25 = np.zeros((size, n), dtype=np.float64)
        if filter_ is not None and not filter_.empty:
            bm25[:, ~shard.payload.mask(filter_)] = 0.0  # a document the filter leaves out is in neither leg

        # each query's lexical best `depth` (every tie at the last score too), from its scored
        # documents alone: a partition over a row's zeros too costs several times more
        touched_q, touched_rows = np.nonzero(bm25 > 0)
        touched = bm25[touched_q, touched_rows]
        bounds = np.searchsorted(touched_q, np.arange(size + 1)).tolist()
        bar = np.zeros(size, dtype=np.float64)
        for q, query in enumerate(queries):
            assert query.fuse is not None  # fused_search's callers send weighted queries only
            depth, values = max(query.fuse.depth, k), touched[bounds[q]:bounds[q + 1]]
            if values.size > depth:
                bar[q] = np.partition(values, values.size - depth)[values.size - depth]
        in_top = np.flatnonzero(touched >= bar[touched_q])
        return cls(plan.owns, plan.per_bm25, bm25, touched_q, touched_rows, touched, in_top)

    def of(self, chosen: list[int]) -> _LexicalLeg:
        """The queries at ``chosen`` (ascending) alone, numbered from 0 in that order: the same
        arrays as :meth:`score` gives those queries (each query's cells are its own)."""
        number = np.full(self.bm25.shape[0], -1, dtype=np.int64)
        number[chosen] = np.arange(len(chosen))
        kept = number[self.touched_q] >= 0
        place = np.cumsum(kept) - 1  # a kept cell's position among the kept ones
        top = self.in_top[kept[self.in_top]]
        return _LexicalLeg([self.owns[i] for i in chosen], self.per_bm25[chosen], self.bm25[chosen],
                           number[self.touched_q[kept]], self.touched_rows[kept], self.touched[kept], place[top])


def _pass(live: LiveShard, vectors: np.ndarray, queries: Sequence[LexicalQuery], k: int, read: int,
          nprobe: int | None, ef_search: int | None, filter_: Filter | None,
          lexical: _LexicalLeg) -> list[SealedAnswer | None]:
    """One pass with the dense leg read ``read`` deep, ``lexical`` the queries' lexical leg: each
    query's answer, :data:`_DEEPER` where it must be read deeper, or None."""
    shard, metric = live.base, live.metric
    lexicon = shard.lexicon
    n, size = lexicon.count, len(queries)
    specs = [query.fuse for query in queries]
    assert all(spec is not None for spec in specs)  # fused_search's callers send weighted queries only
    dense_weight = np.asarray([spec.dense for spec in specs if spec is not None], dtype=np.float64)
    dense_scores, dense_ids = shard.search_ids(vectors, read, nprobe=nprobe, ef_search=ef_search, filter_=filter_)
    if not dense_ids.shape[1]:  # nothing to read densely: the per-query path knows those cases
        return [None] * size
    owns, per_bm25, bm25 = lexical.owns, lexical.per_bm25, lexical.bm25
    touched_q, touched_rows, touched, in_top = lexical.touched_q, lexical.touched_rows, lexical.touched, lexical.in_top

    # the candidates: both legs' documents by (query, base row); rows are in int-id order
    found = dense_ids >= 0
    counted = found.sum(axis=1)
    dense_q = np.repeat(np.arange(size), counted)
    dense_rows = np.minimum(np.searchsorted(lexicon.int_ids, dense_ids[found]), n - 1)
    if not np.array_equal(lexicon.int_ids[dense_rows], dense_ids[found]):
        raise IndexIntegrityError("a dense hit of a hybrid query is not in the shard's document store")
    keys = distinct(np.concatenate([dense_q * n + dense_rows, touched_q[in_top] * n + touched_rows[in_top]]))
    queries64 = np.asarray(vectors, dtype=np.float64)
    scored = _Scored.of(live, queries64, keys, bm25, dense_weight, per_bm25, k)

    # a document outside both lists scores at most w_dense · unit(the dense leg's last) + its BM25
    # part: every one whose BM25 could reach the k-th is added, as the per-query path adds them; a
    # query with more than a few times `read` of them reads the dense leg deeper, which raises the bar
    last = dense_scores[np.arange(size), np.maximum(counted - 1, 0)].astype(np.float64)
    floor = np.where(counted >= read, dense_weight * dense_unit(last, metric), 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        threshold = (scored.kth - floor) / per_bm25
    threshold[~np.isfinite(threshold)] = -np.inf
    threshold[per_bm25 == 0.0] = np.inf  # BM25 adds nothing: the candidates' top k is the answer
    reaching = touched >= threshold[touched_q]
    deeper = np.zeros(size, dtype=bool)
    if reaching.any():
        wanted = touched_q[reaching] * n + touched_rows[reaching]
        slots = np.minimum(np.searchsorted(keys, wanted), max(keys.size - 1, 0))
        extra = wanted[keys[slots] != wanted] if keys.size else wanted
        if extra.size:
            extra_per_query = np.bincount(extra // n, minlength=size)
            deeper = (extra_per_query > max(4 * read, 64)) & (counted >= read) & (read < MAX_DEPTH)
            added = extra[~deeper[extra // n]]  # ascending and distinct, as the scored documents are
            if added.size:
                keys, scored = scored.plus(live, queries64, keys, added, bm25, dense_weight, per_bm25, k)

    # each query's picks (every tie at its k-th), its dense leg's best similarities (as recomputed)
    # and its lexical leg's best scores, best first, for the gateway's leg ranks
    picked = np.flatnonzero(scored.fused >= scored.kth[keys // n])
    picked_bounds = np.searchsorted(keys[picked] // n, np.arange(size + 1)).tolist()
    dense_sims = np.full(dense_ids.shape, -np.inf)
    dense_sims[found] = scored.similarity[np.searchsorted(keys, dense_q * n + dense_rows)]
    dense_best = (-np.sort(-dense_sims, axis=1)).tolist()
    top_q, top_scores = touched_q[in_top], touched[in_top]
    order = np.lexsort((-top_scores, top_q))
    lexical_best = top_scores[order].tolist()
    lexical_bounds = np.searchsorted(top_q[order], np.arange(size + 1)).tolist()
    starts = scored.starts.tolist()
    counted_list = counted.tolist()

    answers: list[SealedAnswer | None] = []
    for q, spec in enumerate(specs):
        assert spec is not None
        if deeper[q]:
            answers.append(_DEEPER)
            continue
        start, end = starts[q], starts[q + 1]
        best_dense = dense_best[q][:min(spec.depth, counted_list[q])]
        leg_tops = {DENSE: [value for value in best_dense if value == value],  # NaN: no vector, no rank
                    LEXICAL: lexical_best[lexical_bounds[q]:lexical_bounds[q + 1]][:spec.depth]}
        answers.append(SealedAnswer(scored.ids[start:end], scored.similarity[start:end], scored.bm25[start:end],
                                    scored.fused[start:end], picked[picked_bounds[q]:picked_bounds[q + 1]] - start,
                                    leg_tops, owns[q]))
    return answers


@dataclass(slots=True)
class TermPlan:
    """A batch's lexical work: per query the shard's own statistics for its terms and its BM25
    weight in the fused score (w_lexical / bound; 0: no term to score), and every scored term —
    query by query, in each query's term order — with its postings' bounds in the lexicon, its
    weight (idf × count) and the average length it is scored under, and its query."""

    owns: list[CorpusStats]
    per_bm25: np.ndarray
    firsts: list[int]
    ends: list[int]
    weights: list[float]
    averages: list[float]
    queries: list[int]


def term_plan(lexicon: BaseLexicon, queries: Sequence[LexicalQuery]) -> TermPlan:
    """Each query's terms under the statistics it carries (its own shard's when none), as the
    per-query path weighs them: a term no document holds, or with a zero weight, is not scored."""
    owns: list[CorpusStats] = []
    per_bm25 = np.zeros(len(queries), dtype=np.float64)
    firsts: list[int] = []
    ends: list[int] = []
    weights: list[float] = []
    averages: list[float] = []
    of_query: list[int] = []
    for q, query in enumerate(queries):
        spec = query.fuse
        assert spec is not None  # fused_search's callers send weighted queries only
        terms = query_terms(query.text, lexicon.language)
        names = [term for term, _ in terms]
        own = lexicon.stats(names, _NO_ROWS)
        owns.append(own)
        stats = query.corpus if query.corpus is not None else own
        average = stats.average_length
        weighted = [(span, stats.idf(term) * count) for (term, count), span in zip(terms, lexicon.spans(names))]
        weighted = [(span, weight) for span, weight in weighted if weight > 0]
        if not weighted or average <= 0:
            continue  # no term to score: BM25 0 everywhere, the fused score the dense leg's alone
        per_bm25[q] = spec.lexical / score_bound([weight for _, weight in weighted])
        for (first, end), weight in weighted:
            if end > first:
                firsts.append(first)
                ends.append(end)
                weights.append(weight)
                averages.append(average)
                of_query.append(q)
    return TermPlan(owns, per_bm25, firsts, ends, weights, averages, of_query)


def distinct(keys: np.ndarray) -> np.ndarray:
    """The distinct ``keys``, ascending (np.unique's hashing costs more on a few hundred)."""
    ordered = np.sort(keys)
    if ordered.size < 2:
        return ordered
    kept: np.ndarray = ordered[np.concatenate(([True], ordered[1:] != ordered[:-1]))]
    return kept


@dataclass(slots=True, frozen=True)
class _Scored:
    """A batch's candidates by (query, base row) key, ascending, with both legs' scores, the fused
    one, where each query's run starts, and each query's k-th fused score (-inf: fewer than k)."""

    ids: np.ndarray
    similarity: np.ndarray
    bm25: np.ndarray
    fused: np.ndarray
    starts: np.ndarray
    kth: np.ndarray

    @classmethod
    def of(cls, live: LiveShard, queries: np.ndarray, keys: np.ndarray, bm25: np.ndarray, dense_weight: np.ndarray,
           per_bm25: np.ndarray, k: int) -> _Scored:
        size = bm25.shape[0]
        ids, similarity, cand_bm25, fused, starts = _scores(live, queries, keys, bm25, dense_weight, per_bm25)
        kth = _kth(fused, keys // bm25.shape[1], starts, size, k)
        return cls(ids, similarity, cand_bm25, fused, starts, kth)

    def plus(self, live: LiveShard, queries: np.ndarray, keys: np.ndarray, added: np.ndarray, bm25: np.ndarray,
             dense_weight: np.ndarray, per_bm25: np.ndarray, k: int) -> tuple[np.ndarray, _Scored]:
        """These candidates (under ``keys``) and the ``added`` ones (none of them among these):
        the keys and the candidates in key order, only the added ones scored."""
        size, n = bm25.shape
        ids, similarity, cand_bm25, fused, _ = _scores(live, queries, added, bm25, dense_weight, per_bm25)
        merged = np.concatenate([keys, added])
        order = np.argsort(merged, kind="stable")

        def joined(mine: np.ndarray, theirs: np.ndarray) -> np.ndarray:
            return np.concatenate([mine, theirs])[order]

        merged = merged[order]
        joined_fused = joined(self.fused, fused)
        starts = np.searchsorted(merged // n, np.arange(size + 1))
        return merged, _Scored(joined(self.ids, ids), joined(self.similarity, similarity),
                               joined(self.bm25, cand_bm25), joined_fused, starts,
                               _kth(joined_fused, merged // n, starts, size, k))


def _scores(live: LiveShard, queries: np.ndarray, keys: np.ndarray, bm25: np.ndarray, dense_weight: np.ndarray,
            per_bm25: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The candidates under ``keys`` (ascending): their int ids, similarities (NaN: no vector), BM25
    and fused scores, and where each query's run starts."""
    size, n = bm25.shape
    cand_q, cand_rows = keys // n, keys % n
    ids = live.base.lexicon.int_ids[cand_rows]
    matrix, present = live.base_row_matrix(cand_rows)
    starts = np.searchsorted(cand_q, np.arange(size + 1))
    rows = matrix.astype(np.float64)
    # each query's rows against it in hybrid_search's own arithmetic (einsum's loop per query, not
    # BLAS, and not a pass over a gathered copy of the queries): a document scores the same bits
    # in either path, in any batch
    similarity = np.concatenate([similarity_f64(rows[a:b], queries[q], live.metric)
                                 for q, (a, b) in enumerate(zip(starts[:-1].tolist(), starts[1:].tolist()))
                                 if b > a] or [np.zeros(0)])
    similarity[~present] = np.nan
    cand_bm25 = bm25[cand_q, cand_rows]
    unit = dense_unit(similarity, live.metric)
    unit[np.isnan(unit)] = 0.0
    fused = dense_weight[cand_q] * unit + per_bm25[cand_q] * cand_bm25
    return ids, similarity, cand_bm25, fused, starts


def _kth(fused: np.ndarray, cand_q: np.ndarray, starts: np.ndarray, size: int, k: int) -> np.ndarray:
    """Each query's k-th best fused score (-inf: fewer than k candidates), from a (query ×
    candidate) table padded with -inf: one partition for the batch."""
    width = max(int(np.diff(starts).max()), k)
    table = np.full((size, width), -np.inf)
    table[cand_q, np.arange(fused.size) - starts[cand_q]] = fused
    kth: np.ndarray = np.partition(table, width - k, axis=1)[:, width - k]
    return kth


def similarity_f64(rows: np.ndarray, query: np.ndarray, metric: str) -> np.ndarray:
    """Each float64 row's score against the float64 ``query`` as the dense leg reports it (ip: the
    inner product; l2: -L2²). Both paths score candidates here, one query at a time: each row's
    products summed by einsum's own loop, not by BLAS's matrix-vector product — BLAS gives a row
    different last bits by where it sits in the matrix (its kernels treat a block's last rows
    apart), and the candidates differ from query to query and shard to shard."""
    out: np.ndarray = -np.sum((rows - query) ** 2, axis=1) if metric == "l2" else np.einsum("ij,j->i", rows, query)
    return out
