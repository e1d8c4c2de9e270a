"""Would a compiled kernel close the weighted hybrid's gap? (issue 36, acceptance 5.) The shard's
batch pass (``index_shards.hybrid_sealed``) against the same pass written as one numba kernel,
in process, on the data of ``benchmarks.hybrid_shard``.

    .venv/bin/pip install numba==0.68.0          # once: numba is not a shardrag dependency
    python -m benchmarks.hybrid_kernel           # ~1 min on 2 cores

The kernel is a measuring prototype, not shipped code: per query it scores the postings into a
scratch array (bincount's order, the same BM25 expression), takes the lexical leg's best, the
candidates (the dense leg's keys from the same FAISS search, and the lexical best), their
similarities (an 8-accumulator float64 dot: not einsum's order, so the last bits differ), the
k-th fused score, the documents whose BM25 could reach it, the picks and both legs' tops, as the
NumPy pass does. The Python around it is the shipped one's (terms, statistics, the FAISS search,
the documents, the columns). It answers the same documents as the shipped path (checked on every
query; scores may differ in the last bits). Calls of 7 (c=32 through the gateway) and of 1 (c=1:
the shipped path sends these to the per-query path; here the kernel takes them too).

JSON: benchmarks/results/hybrid_kernel.json.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

import index_shards.hybrid_search as hybrid_search
from benchmarks.common import machine_info, write_result
from benchmarks.hybrid_shard import SPEC, inputs, report, shards_and_statistics
from index_shards.hybrid_sealed import MAX_DEPTH, SealedAnswer, sealed, sealed_batch, term_plan
from index_shards.segment import LiveShard
from retrieval.bm25 import K1, B, CorpusStats, LexicalQuery
from retrieval.filters import Filter
from retrieval.fusion import DENSE, LEXICAL

try:
    import numba
    from numba import njit
except ImportError:  # the message is the point
    raise SystemExit("numba is not installed: .venv/bin/pip install numba==0.68.0 (not a shardrag dependency)") \
        from None



@njit(cache=True)
def _dot(flat: Any, position: int, query: Any) -> float:
    """A stored row against the float64 query: eight accumulators (a sequential sum is a chain of
    dependent adds, ~0.5 µs a row), combined in a fixed order."""
    if position < 0:
        return np.nan
    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = 0.0
    dim, j = query.size, 0
    while j + 8 <= dim:
        a0 += np.float64(flat[position, j]) * query[j]
        a1 += np.float64(flat[position, j + 1]) * query[j + 1]
        a2 += np.float64(flat[position, j + 2]) * query[j + 2]
        a3 += np.float64(flat[position, j + 3]) * query[j + 3]
        a4 += np.float64(flat[position, j + 4]) * query[j + 4]
        a5 += np.float64(flat[position, j + 5]) * query[j + 5]
        a6 += np.float64(flat[position, j + 6]) * query[j + 6]
        a7 += np.float64(flat[position, j + 7]) * query[j + 7]
        j += 8
    while j < dim:
        a0 += np.float64(flat[position, j]) * query[j]
        j += 1
    return ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7))


@njit(cache=True)
def _fuse(rows: Any, tfs: Any, lengths: Any, term_start: Any, first: Any, end: Any, weight: Any, average: Any,
          per_bm25: Any, dense_weight: Any, dense_rows: Any, counted: Any, dense_last: Any, read: int, k: int,
          depth: Any, flat: Any, positions: Any, queries: Any, scratch: Any, stamp: Any, out_rows: Any, out_sim: Any,
          out_bm25: Any, out_fused: Any, out_count: Any, dense_top: Any, lexical_top: Any, lexical_count: Any,
          deeper: Any) -> None:
    n = scratch.size
    touched = np.empty(n, np.int64)
    candidates = np.empty(n, np.int64)
    similarity = np.empty(n, np.float64)
    fused = np.empty(n, np.float64)
    for q in range(queries.shape[0]):
        held = 0  # BM25, term by term in posting order (bincount's order)
        for t in range(term_start[q], term_start[q + 1]):
            for p in range(first[t], end[t]):
                r = rows[p]
                tf = np.float64(tfs[p])
                norm = K1 * (1.0 - B + B * (np.float64(lengths[r]) / average[t]))
                if scratch[r] == 0.0:
                    touched[held] = r
                    held += 1
                scratch[r] += weight[t] * (tf * (K1 + 1.0)) / (tf + norm)
        best = max(depth[q], k)  # the lexical leg's best `depth` (every tie at the last too)
        bar = 0.0
        if held > best:
            values = np.empty(held, np.float64)
            for i in range(held):
                values[i] = scratch[touched[i]]
            bar = np.partition(values, held - best)[held - best]
        mark, count = q + 1, 0  # candidates: the dense leg's keys, then the lexical best, each once
        for i in range(counted[q]):
            r = dense_rows[q, i]
            if stamp[r] != mark:
                stamp[r] = mark
                candidates[count] = r
                count += 1
        for i in range(held):
            r = touched[i]
            if scratch[r] >= bar and stamp[r] != mark:
                stamp[r] = mark
                candidates[count] = r
                count += 1
        for i in range(count):
            s = _dot(flat, positions[candidates[i]], queries[q])
            similarity[i] = s
            fused[i] = dense_weight[q] * (0.0 if s != s else (s + 1.0) / 2.0) + per_bm25[q] * scratch[candidates[i]]
        kth = -np.inf
        if count >= k:
            kth = np.partition(fused[:count].copy(), count - k)[count - k]
        floor = dense_weight[q] * (dense_last[q] + 1.0) / 2.0 if counted[q] >= read else 0.0
        if per_bm25[q] > 0:  # the documents past both lists whose BM25 could reach the k-th
            threshold = (kth - floor) / per_bm25[q]
            if not np.isfinite(threshold):
                threshold = -np.inf
            extra = 0
            for i in range(held):
                if scratch[touched[i]] >= threshold and stamp[touched[i]] != mark:
                    extra += 1
            if extra > max(4 * read, 64) and counted[q] >= read and read < MAX_DEPTH:
                deeper[q] = True
            elif extra:
                for i in range(held):
                    r = touched[i]
                    if scratch[r] >= threshold and stamp[r] != mark:
                        stamp[r] = mark
                        s = _dot(flat, positions[r], queries[q])
                        candidates[count], similarity[count] = r, s
                        fused[count] = dense_weight[q] * (0.0 if s != s else (s + 1.0) / 2.0) + per_bm25[q] * scratch[r]
                        count += 1
                if count >= k:
                    kth = np.partition(fused[:count].copy(), count - k)[count - k]
        picked = 0
        for i in range(count):
            if fused[i] >= kth and picked < out_rows.shape[1]:
                out_rows[q, picked], out_sim[q, picked] = candidates[i], similarity[i]
                out_bm25[q, picked], out_fused[q, picked] = scratch[candidates[i]], fused[i]
                picked += 1
        out_count[q] = picked
        dense_sims = np.empty(counted[q], np.float64)  # the dense leg's best, as recomputed
        for i in range(counted[q]):
            dense_sims[i] = similarity[i] if i < count and candidates[i] == dense_rows[q, i] else \
                _dot(flat, positions[dense_rows[q, i]], queries[q])
        dense_sims = np.sort(dense_sims)
        for i in range(min(depth[q], counted[q])):
            dense_top[q, i] = dense_sims[counted[q] - 1 - i]
        kept = 0
        values = np.empty(held, np.float64)
        for i in range(held):
            if scratch[touched[i]] >= bar:
                values[kept] = scratch[touched[i]]
                kept += 1
        values = np.sort(values[:kept])
        lexical_count[q] = min(kept, depth[q])
        for i in range(lexical_count[q]):
            lexical_top[q, i] = values[kept - 1 - i]
        for i in range(held):
            scratch[touched[i]] = 0.0


class KernelPass:
    """``hybrid_sealed.sealed_batch``'s signature, answered by the kernel (flat storages, ip, no
    filter); ``seconds`` and ``queries`` count the kernel's own time."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.queries = 0
        self._scratch: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def __call__(self, live: LiveShard, vectors: np.ndarray, queries: Sequence[LexicalQuery], k: int, read: int, *,
                 nprobe: int | None, ef_search: int | None, filter_: Filter | None) -> list[SealedAnswer | None]:
        table = live._row_positions()
        if table is None or live.metric != "ip" or (filter_ is not None and not filter_.empty):
            raise SystemExit("the prototype kernel covers flat storages, ip, no filter")
        flat, positions = table
        lexicon, size = live.base.lexicon, len(queries)
        specs = [query.fuse for query in queries]
        dense_scores, dense_ids = live.base.search_ids(vectors, read, nprobe=nprobe, ef_search=ef_search)
        found = dense_ids >= 0
        counted = found.sum(axis=1)
        dense_rows = np.searchsorted(lexicon.int_ids, np.where(found, dense_ids, 0))
        last = dense_scores[np.arange(size), np.maximum(counted - 1, 0)].astype(np.float64)
        plan = term_plan(lexicon, queries)
        term_start = np.searchsorted(np.asarray(plan.queries, np.int64), np.arange(size + 1))
        n = lexicon.count
        scratch, stamp = self._scratch.setdefault(id(live), (np.zeros(n), np.zeros(n, np.int64)))
        stamp[:] = 0
        width = 4 * max(read, k) + 64
        out_rows, out_count = np.zeros((size, width), np.int64), np.zeros(size, np.int64)
        out_sim, out_bm25, out_fused = np.zeros((size, width)), np.zeros((size, width)), np.zeros((size, width))
        depth = np.asarray([spec.depth for spec in specs if spec is not None], np.int64)
        dense_top, lexical_top = np.zeros((size, int(depth.max()))), np.zeros((size, int(depth.max())))
        lexical_count, deeper = np.zeros(size, np.int64), np.zeros(size, np.bool_)
        started = time.perf_counter()
        _fuse(lexicon.rows, lexicon.tfs, lexicon.lengths, term_start, np.asarray(plan.firsts, np.int64),
              np.asarray(plan.ends, np.int64), np.asarray(plan.weights, np.float64),
              np.asarray(plan.averages, np.float64), plan.per_bm25,
              np.asarray([spec.dense for spec in specs if spec is not None], np.float64), dense_rows, counted,
              last, read, k, depth, flat, positions, np.asarray(vectors, np.float64), scratch, stamp, out_rows,
              out_sim, out_bm25, out_fused, out_count, dense_top, lexical_top, lexical_count, deeper)
        self.seconds += time.perf_counter() - started
        self.queries += size
        answers: list[SealedAnswer | None] = []
        for q in range(size):
            if deeper[q]:
                answers.append(None)  # the per-query path reads deeper
                continue
            picked = int(out_count[q])
            order = np.argsort(out_rows[q, :picked])
            kept = min(int(depth[q]), int(counted[q]))
            answers.append(SealedAnswer(lexicon.int_ids[out_rows[q, :picked][order]], out_sim[q, :picked][order],
                                        out_bm25[q, :picked][order], out_fused[q, :picked][order], np.arange(picked),
                                        {DENSE: dense_top[q, :kept].tolist(),
                                         LEXICAL: lexical_top[q, :int(lexical_count[q])].tolist()}, plan.owns[q]))
        return answers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=3, help="passes over the queries per cell")
    args = parser.parse_args()
    corpus, queries, vectors = inputs()
    with tempfile.TemporaryDirectory() as tmp:
        replicas, stats = shards_and_statistics(Path(tmp), corpus, queries)
        live, kernel = replicas[0].get(None), KernelPass()
        started = time.perf_counter()
        kernel_answers = run(live, vectors, queries, stats, 7, 1, kernel)
        first_call_s = time.perf_counter() - started
        shipped_answers = run(live, vectors, queries, stats, 7, 1, sealed_batch)
        same = sum(a[0]["doc_ids"] == b[0]["doc_ids"] for a, b in zip(kernel_answers, shipped_answers, strict=True))
        drift = max(abs(x - y) for a, b in zip(kernel_answers, shipped_answers, strict=True)
                    for x, y in zip(a[0]["scores"], b[0]["scores"], strict=True))
        print(f"the kernel answers the same documents as the shipped pass on {same} of {len(queries)} queries "
              f"(scores within {drift:.1e}); its first call, compiling or loading numba's cache, {first_call_s:.2f} s")
        cells: dict[str, list[float]] = {}
        for _ in range(args.rounds):
            for batch in (1, 7):
                for name, fuse in (("shipped", sealed_batch), ("kernel", kernel)):
                    began = time.perf_counter()
                    answered = sum(len(run(live, vectors, queries, stats, batch, 1, fuse)) for _ in range(args.repeat))
                    cells.setdefault(f"{name} b{batch}", []).append((time.perf_counter() - began) / answered * 1000.0)
        kernel.seconds, kernel.queries = 0.0, 0
        for _ in range(args.repeat):
            run(live, vectors, queries, stats, 7, 1, kernel)
        kernel_alone_us = kernel.seconds / kernel.queries * 1e6
    summary = report(cells, ("shipped", "kernel"))
    print(f"the kernel's own time, calls of 7: {kernel_alone_us:.1f} µs a query")
    written = write_result("hybrid_kernel", {
        "machine": machine_info(), "numba": numba.__version__, "spec": SPEC.to_dict(), "same_documents": same,
        "queries": len(queries),
        "score_drift": drift, "first_call_s": first_call_s, "kernel_alone_us_per_query_b7": kernel_alone_us,
        "cells": summary})
    print(f"wrote {written}")


def run(live: LiveShard, vectors: np.ndarray, queries: list[str], stats: list[CorpusStats], batch: int, repeat: int,
        fuse: Callable[..., list[SealedAnswer | None]]) -> list[Any]:
    """Every query in calls of ``batch`` through ``hybrid_search.fused_search`` (its documents and
    columns included), the batch pass being ``fuse`` — for calls of every size."""
    saved = hybrid_search.sealed_batch, hybrid_search.batch_pass_applies
    hybrid_search.sealed_batch = fuse
    if fuse is not sealed_batch:  # the kernel answers calls of every size
        hybrid_search.batch_pass_applies = lambda live, _: sealed(live)
    answers: list[Any] = []
    try:
        for _ in range(repeat):
            for start in range(0, len(queries), batch):
                chunk = slice(start, start + batch)
                lexical = [LexicalQuery(text, stats[start + i], SPEC) for i, text in enumerate(queries[chunk])]
                answers.extend(hybrid_search.fused_search(live, vectors[chunk], lexical, 10))
    finally:
        hybrid_search.sealed_batch, hybrid_search.batch_pass_applies = saved
    return answers


if __name__ == "__main__":
    main()
