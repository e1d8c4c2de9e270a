"""Which fusion of the dense and lexical legs could lift dbpedia to its dense ranking? nDCG@10 of
several fusion functions, each tried over its own parameter grid, on msmarco and dbpedia (issue 36,
acceptance 4: a hybrid at least the better single leg on both sets).

    python -m benchmarks.hybrid_fusions          # ~1–2 min on 2 cores

Offline and exact: per judged query, every document's cosine (the MiniLM vectors from the
embedding cache, float64) and its BM25 under the whole corpus's statistics (the shards' own
inverted index, ``index_shards.lexical``, and scorer) — the two full score matrices a sharded
cluster ranks from. The REST figures of the shipped fusions are ``benchmarks.hybrid_quality``'s;
this benchmark reproduces its dense, lexical and weighted numbers from the matrices (printed
beside them) and asks whether *another* fusion function would do better. Functions:

* ``weighted`` — shardrag's: w·(cos+1)/2 + (1−w)·BM25/bound (bound: the most BM25 can give);
* ``weighted-rrf`` — w/(60+rank_dense) + (1−w)/(60+rank_lexical), each leg's top 100;
* ``max-norm`` — BM25 divided by the query's best BM25 instead of its bound;
* ``z-score`` — each leg standardized over its top 100 (DBSF-like);
* ``min-max`` — each leg min-max scaled over its top 100 (the fusion shardrag had before);
* ``dense-rerank`` — the weighted score, but only the dense top N can rank (a lexical re-rank);
* ``bm25-threshold`` — BM25/bound counted only above t (a lexical match must be strong to count);
* three per-query gates on the weighted fusion's lexical weight, each from what a query's own
  lists say about the legs: ``gate-top`` (times the best document's BM25/bound over a: a query
  whose terms no document holds together leans on the vectors), ``gate-agree`` (times the overlap
  of the legs' top 10 over a) and ``gate-dense-gap`` (times 1 − (the best cosine − the 10th)/a: a
  confident dense leg is left alone).

For each the parameters best on msmarco are applied unchanged to dbpedia (as the acceptance asks),
and the best dbpedia figure any of its parameters reaches is shown too. Then BM25's own k1 and b
(the shards use Lucene's 1.2 and 0.75) over a grid, chosen together with the weighted fusion's
weight on msmarco, and the title counted 1–4 times in a document's BM25 (dbpedia's documents have
titles; msmarco's have none, so its figures and chosen weight stay). Last, pseudo-relevance
feedback (Rocchio on the query vector: the top m documents' mean vector added β times, by the
dense leg alone or by the weighted fusion), given to the dense ranking and to the hybrid alike, so
that what the lexical leg adds is compared with feedback on both sides. Finally, whether *any*
parameter meets acceptance 4 at all — chosen knowing both sets, a weaker test than the acceptance's
choose-on-one rule: every cell above, the weighted fusion's weight in steps of 0.01, and the
weighted RRF's k from 1 to 200 with each leg read 20 or 100 deep (``acceptance_4``). JSON:
benchmarks/results/hybrid_fusions.json.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from benchmarks.common import data_dir, machine_info, write_result
from index_shards.lexical import BaseLexicon, score
from retrieval.analysis import query_terms
from retrieval.bm25 import K1, B, CorpusStats, score_bound
from retrieval.datasets import load_beir
from retrieval.embedding_cache import CachingEncoder, EmbeddingCache, default_cache_dir
from retrieval.encoders import encode_documents, load_default_encoder
from retrieval.ir_metrics import ndcg_at_k

K = 10
TOP = 100  # how deep the list-normalized fusions look at each leg
WEIGHTS = (0.5, 0.6, 0.7, 0.8, 0.9, 0.95)
BM25_K1 = (0.4, 0.7, 0.9, 1.2, 1.6, 2.0, 3.0)  # BM25's own parameters tried beside the weight
BM25_B = (0.2, 0.4, 0.6, 0.75, 0.9, 1.0)
GATES = {"gate-top": (0.3, 0.5, 0.7, 0.9), "gate-agree": (0.2, 0.4, 0.6, 0.8), "gate-dense-gap": (0.1, 0.2, 0.3, 0.5)}
TITLE_COUNTS = (1, 2, 3, 4)  # how many times a title's terms count in its document's BM25
FEEDBACK_DEPTHS = (3, 5, 10)  # m: how many top documents feed back into the query vector
FEEDBACK_BETAS = (0.25, 0.5, 1.0, 2.0)  # β: their mean vector's weight beside the query's
FINE_WEIGHTS = tuple(round(0.5 + 0.01 * step, 2) for step in range(50))  # 0.50 … 0.99
RRF_WEIGHTS = tuple(round(0.5 + 0.025 * step, 3) for step in range(20))  # 0.500 … 0.975
RRF_KS = (1, 2, 5, 10, 20, 30, 40, 60, 100, 200)
RRF_DEPTHS = (20, 100)


@dataclass
class Matrices:
    """Per judged query (rows) and document (columns): cosine, BM25, and BM25's bound per query."""

    doc_ids: list[str]
    query_ids: list[str]
    cosine: np.ndarray
    bm25: np.ndarray
    bound: np.ndarray
    qrels: dict[str, dict[str, int]]

    @property
    def unit_bm25(self) -> np.ndarray:
        result: np.ndarray = self.bm25 / np.maximum(self.bound, 1e-12)[:, None]
        return result

    def ndcg(self, fused: np.ndarray) -> float:
        ids = np.asarray(self.doc_ids)
        rankings = {query: [str(ids[j]) for j in np.lexsort((ids, -fused[i]))[:K]]
                    for i, query in enumerate(self.query_ids)}
        return float(ndcg_at_k(rankings, self.qrels, K))


@dataclass
class Corpus:
    """One dataset's documents, judged queries, vectors and lexicon: what the matrices come from."""

    name: str
    doc_ids: list[str]
    query_ids: list[str]
    texts: list[str]  # the judged queries' texts
    cosine: np.ndarray
    lexicon: BaseLexicon
    qrels: dict[str, dict[str, int]]
    vectors: np.ndarray  # the documents' (float64), for pseudo-relevance feedback
    query_vectors: np.ndarray


def load(name: str, encoder: CachingEncoder, title_count: int = 1) -> Corpus:
    """``title_count``: how many times a title's terms count in its document's BM25 (the shards: once)."""
    dataset = load_beir(data_dir() / name)
    documents = dataset.corpus
    vectors = encode_documents(encoder, documents, show_progress=True).astype(np.float64)
    judged = dataset.judged_queries()
    query_ids = list(judged)
    query_vectors = encoder.encode_queries([judged[q] for q in query_ids]).astype(np.float64)
    lexicon = BaseLexicon.build((row, "\n".join([d.title] * title_count) if d.title else "", d.text)
                                for row, d in enumerate(documents))
    return Corpus(name, [d.doc_id for d in documents], query_ids, [judged[q] for q in query_ids],
                  query_vectors @ vectors.T, lexicon, dataset.qrels, vectors, query_vectors)


def matrices(corpus: Corpus, k1: float = K1, b: float = B) -> Matrices:
    """The score matrices under BM25's ``k1`` and ``b`` (the shards use Lucene's 1.2 and 0.75)."""
    lexicon = corpus.lexicon
    stats_of_corpus = CorpusStats(lexicon.count, lexicon.total_length, {})
    bm25 = np.zeros((len(corpus.query_ids), lexicon.count))
    bound = np.zeros(len(corpus.query_ids))
    for i, text in enumerate(corpus.texts):
        terms = query_terms(text)
        stats = lexicon.stats([t for t, _ in terms], np.zeros(0, np.int64))
        postings, weights = [], []
        for term, count in terms:
            weight = CorpusStats(stats_of_corpus.docs, stats_of_corpus.length, stats.df).idf(term) * count
            if weight > 0:
                rows, tfs = lexicon.postings(term)
                postings.append((weight, rows, tfs))
                weights.append(weight)
        scored = score(postings, lexicon.lengths, lexicon.total_length / lexicon.count, lexicon.count, k1=k1, b=b)
        bm25[i, scored.rows] = scored.scores
        bound[i] = score_bound(weights, k1=k1)
    return Matrices(corpus.doc_ids, corpus.query_ids, corpus.cosine, bm25, bound, corpus.qrels)


def bm25_grid(corpora: dict[str, Corpus]) -> list[dict[str, Any]]:
    """BM25's own parameters chosen together with the weighted fusion's weight on msmarco: per
    (k1, b), each set's lexical nDCG, the weight best on msmarco, dbpedia under it, and the best
    dbpedia any weight reaches."""
    rows = []
    weights = [round(w, 2) for w in np.arange(0.5, 0.951, 0.05)]
    for k1 in BM25_K1:
        for b in BM25_B:
            sets = {name: matrices(corpus, k1, b) for name, corpus in corpora.items()}
            cells = {w: {name: m.ndcg(fuse("weighted", m, w)) for name, m in sets.items()} for w in weights}
            chosen = max(weights, key=lambda w: (cells[w]["msmarco"], w))
            rows.append({"k1": k1, "b": b, "lexical": {name: round(m.ndcg(m.bm25), 4) for name, m in sets.items()},
                         "w": chosen, "msmarco": round(cells[chosen]["msmarco"], 4),
                         "dbpedia": round(cells[chosen]["dbpedia"], 4),
                         "best_dbpedia": round(max(c["dbpedia"] for c in cells.values()), 4)})
    return rows


def title_grid(corpora: dict[str, Corpus], encoder: CachingEncoder) -> list[dict[str, Any]]:
    """dbpedia's titles counted 1–4 times in BM25 (msmarco has no titles: its weight, chosen on it,
    stays): dbpedia's lexical nDCG, its weighted fusion under msmarco's weight, and its best."""
    weights = [round(w, 2) for w in np.arange(0.5, 0.951, 0.05)]
    msmarco = matrices(corpora["msmarco"])
    chosen = max(weights, key=lambda w: (msmarco.ndcg(fuse("weighted", msmarco, w)), w))
    rows = []
    for count in TITLE_COUNTS:
        dbpedia = matrices(corpora["dbpedia"] if count == 1 else load("dbpedia", encoder, count))
        cells = {w: dbpedia.ndcg(fuse("weighted", dbpedia, w)) for w in weights}
        rows.append({"title_count": count, "lexical": round(dbpedia.ndcg(dbpedia.bm25), 4), "w": chosen,
                     "dbpedia": round(cells[chosen], 4), "best_dbpedia": round(max(cells.values()), 4),
                     "best_w": max(cells, key=lambda w: cells[w])})
    return rows


def with_feedback(corpus: Corpus, m: Matrices, source: str, depth: int, beta: float) -> Matrices:
    """The matrices with every query's vector moved towards its top ``depth`` documents (Rocchio):
    q + β·mean, renormalized; ranked first by the dense leg (``source`` "dense") or by the
    weighted fusion at 0.8 ("fused": the lexical leg picks the feedback too)."""
    first = m.cosine if source == "dense" else fuse("weighted", m, 0.8)
    top = np.argsort(-first, axis=1, kind="stable")[:, :depth]
    moved = corpus.query_vectors + beta * corpus.vectors[top].mean(axis=1)
    moved /= np.linalg.norm(moved, axis=1, keepdims=True)
    return Matrices(m.doc_ids, m.query_ids, moved @ corpus.vectors.T, m.bm25, m.bound, m.qrels)


def feedback_grid(corpora: dict[str, Corpus], sets: dict[str, Matrices]) -> dict[str, Any]:
    """Dense with feedback (depth, β chosen on msmarco) against the weighted hybrid with feedback
    (depth, β, its source and weight chosen on msmarco): is the lexical leg still worth its place
    once the dense ranking has feedback too? Every cell, both choices and the best dbpedia cells."""
    cells: dict[str, dict[str, float]] = {}
    for depth in FEEDBACK_DEPTHS:
        for beta in FEEDBACK_BETAS:
            moved = {source: {name: with_feedback(corpora[name], m, source, depth, beta) for name, m in sets.items()}
                     for source in ("dense", "fused")}
            cells[f"dense m={depth} beta={beta}"] = {name: round(f.ndcg(f.cosine), 4)
                                                      for name, f in moved["dense"].items()}
            for source in ("dense", "fused"):
                for w in WEIGHTS:
                    cells[f"hybrid from={source} m={depth} beta={beta} w={w}"] = {
                        name: round(f.ndcg(fuse("weighted", f, w)), 4) for name, f in moved[source].items()}

    def chosen(prefix: str) -> str:
        return max((p for p in cells if p.startswith(prefix)), key=lambda p: (cells[p]["msmarco"], p))

    def best_dbpedia(prefix: str) -> str:
        return max((p for p in cells if p.startswith(prefix)), key=lambda p: cells[p]["dbpedia"])

    return {"cells": cells, "dense_chosen": chosen("dense"), "hybrid_chosen": chosen("hybrid"),
            "dense_best_dbpedia": best_dbpedia("dense"), "hybrid_best_dbpedia": best_dbpedia("hybrid")}


def meets_acceptance_4(cell: dict[str, float], legs: dict[str, dict[str, float]]) -> bool:
    """At least the better leg on both sets, and dense + 0.01 on at least one."""
    return (all(cell[name] >= max(legs[name].values()) for name in legs)
            and any(cell[name] >= legs[name]["dense"] + 0.01 for name in legs))


def acceptance_4(sets: dict[str, Matrices], legs: dict[str, dict[str, float]],
                 cells_of: dict[str, dict[str, dict[str, float]]]) -> dict[str, Any]:
    """Every cell of the grid above, a finer weighted grid and the weighted RRF's k: which meet
    acceptance 4 with parameters chosen knowing both sets, and the five nearest."""
    cells = {f"{family} {params}": cell for family, by_params in cells_of.items() for params, cell in by_params.items()}
    for w in FINE_WEIGHTS:
        cells[f"weighted w={w}"] = {name: round(m.ndcg(fuse("weighted", m, w)), 4) for name, m in sets.items()}
    leg_ranks = {name: (ranks(m.cosine), ranks(m.bm25)) for name, m in sets.items()}
    for k, w, depth in itertools.product(RRF_KS, RRF_WEIGHTS, RRF_DEPTHS):
        if (k, depth) == (60, TOP) and w in WEIGHTS:
            continue  # the grid's own weighted-rrf cell
        cell = {}
        for name, m in sets.items():
            dense, lexical = leg_ranks[name]
            fused = w / (k + dense) * (dense <= depth) + (1 - w) / (k + lexical) * ((lexical <= depth) & (m.bm25 > 0))
            cell[name] = round(m.ndcg(fused), 4)
        cells[f"weighted-rrf k={k} w={w} depth={depth}"] = cell

    def margin(label: str) -> float:  # the smaller of the two sets' gains over dense
        return min(cells[label][name] - legs[name]["dense"] for name in legs)

    nearest = sorted(cells, key=margin, reverse=True)[:5]
    return {"cells_tried": len(cells), "meeting": sorted(p for p in cells if meets_acceptance_4(cells[p], legs)),
            "nearest": [{"cell": label, **cells[label], "smaller_gain_over_dense": round(margin(label), 4)}
                        for label in nearest]}


def ranks(scores: np.ndarray) -> np.ndarray:
    order = np.argsort(-scores, axis=1, kind="stable")
    result = np.empty_like(order)
    np.put_along_axis(result, order, np.arange(1, scores.shape[1] + 1)[None, :], axis=1)
    return result


def dense_unit(m: Matrices) -> np.ndarray:
    result: np.ndarray = (m.cosine + 1) / 2
    return result


def top_scaled(scores: np.ndarray, how: str) -> np.ndarray:
    """A leg's scores standardized (z) or min-max scaled over its top ``TOP`` per query."""
    top = -np.sort(-scores, axis=1)[:, :TOP]
    if how == "z":
        result: np.ndarray = (scores - top.mean(1)[:, None]) / (top.std(1)[:, None] + 1e-12)
    else:
        low, high = top[:, -1:], top[:, :1]
        result = np.clip((scores - low) / (high - low + 1e-12), 0, None)
    return result


def gate(family: str, m: Matrices, a: float) -> np.ndarray:
    """Per query (a column), the factor on the lexical weight of one of the gated fusions."""
    if family == "gate-top":
        factor = m.unit_bm25.max(1) / a
    elif family == "gate-agree":
        dense, lexical = np.argsort(-m.cosine, axis=1)[:, :K], np.argsort(-m.bm25, axis=1)[:, :K]
        factor = np.array([len(set(d.tolist()) & set(x.tolist())) / K for d, x in zip(dense, lexical, strict=True)]) / a
    else:
        assert family == "gate-dense-gap"
        best = -np.sort(-m.cosine, axis=1)
        factor = 1 - (best[:, 0] - best[:, K - 1]) / a
    result: np.ndarray = np.clip(factor, 0, 1)[:, None]
    return result


def fuse(family: str, m: Matrices, w: float, n: int = 0, t: float = 0.0, a: float = 0.0) -> np.ndarray:
    """The fused score matrix of one function (module docstring) at weight ``w`` (the dense leg's)."""
    if family in GATES:
        gated: np.ndarray = w * dense_unit(m) + (1 - w) * gate(family, m, a) * m.unit_bm25
        return gated
    if family == "weighted":
        return w * dense_unit(m) + (1 - w) * m.unit_bm25
    if family == "weighted-rrf":
        dense, lexical = ranks(m.cosine), ranks(m.bm25)
        return w / (60 + dense) * (dense <= TOP) + (1 - w) / (60 + lexical) * ((lexical <= TOP) & (m.bm25 > 0))
    if family == "max-norm":
        by_best: np.ndarray = m.bm25 / np.maximum(m.bm25.max(1), 1e-12)[:, None]
        return w * dense_unit(m) + (1 - w) * by_best
    if family in ("z-score", "min-max"):
        how = "z" if family == "z-score" else "min-max"
        return w * top_scaled(m.cosine, how) + (1 - w) * top_scaled(m.bm25, how)
    if family == "dense-rerank":
        nth = -np.sort(-m.cosine, axis=1)[:, n - 1:n]
        return np.where(m.cosine >= nth, w * dense_unit(m) + (1 - w) * m.unit_bm25, -1.0)
    assert family == "bm25-threshold"
    return w * dense_unit(m) + (1 - w) * np.maximum(m.unit_bm25 - t, 0)


def grid() -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(family, parameters as text, fuse's keyword arguments) for every function and parameter tried."""
    for w in WEIGHTS:
        for family in ("weighted", "weighted-rrf", "max-norm", "z-score", "min-max"):
            yield family, f"w={w}", {"w": w}
        for n in (10, 20, 50):
            yield "dense-rerank", f"w={w} N={n}", {"w": w, "n": n}
        for t in (0.2, 0.3, 0.4):
            yield "bm25-threshold", f"w={w} t={t}", {"w": w, "t": t}
        for family, values in GATES.items():
            for a in values:
                yield family, f"w={w} a={a}", {"w": w, "a": a}


def main() -> None:
    encoder = CachingEncoder(load_default_encoder(device="cpu"), EmbeddingCache(default_cache_dir()))
    corpora = {name: load(name, encoder) for name in ("msmarco", "dbpedia")}
    sets = {name: matrices(corpus) for name, corpus in corpora.items()}
    legs = {name: {"dense": m.ndcg(m.cosine), "lexical": m.ndcg(m.bm25)} for name, m in sets.items()}
    cells_of: dict[str, dict[str, dict[str, float]]] = {}
    for family, params, knobs in grid():
        cells_of.setdefault(family, {})[params] = {name: round(m.ndcg(fuse(family, m, **knobs)), 4)
                                                   for name, m in sets.items()}
    print(f"legs: {legs}")
    print(f"\n{'fusion':>15} {'chosen on msmarco':>20} {'msmarco':>8} {'dbpedia':>8} {'best dbpedia':>13}"
          f"   (dbpedia dense {legs['dbpedia']['dense']:.4f})")
    summary = {}
    for family, cells in cells_of.items():
        chosen = max(cells, key=lambda p: (cells[p]["msmarco"], p))
        best = max(cells, key=lambda p: cells[p]["dbpedia"])
        summary[family] = {"chosen": chosen, **cells[chosen], "best_dbpedia": cells[best]["dbpedia"],
                           "best_dbpedia_params": best}
        print(f"{family:>15} {chosen:>20} {cells[chosen]['msmarco']:8.4f} {cells[chosen]['dbpedia']:8.4f} "
              f"{cells[best]['dbpedia']:8.4f} ({best})")
    print("\nBM25's k1 and b chosen with the weight on msmarco (weighted fusion):")
    print(f"{'k1':>4} {'b':>5} {'lexical ms':>10} {'lexical db':>10} {'w':>5} {'msmarco':>8} {'dbpedia':>8} "
          f"{'best dbpedia':>12}")
    parameters = bm25_grid(corpora)
    for row in parameters:
        print(f"{row['k1']:4.1f} {row['b']:5.2f} {row['lexical']['msmarco']:10.4f} {row['lexical']['dbpedia']:10.4f} "
              f"{row['w']:5.2f} {row['msmarco']:8.4f} {row['dbpedia']:8.4f} {row['best_dbpedia']:12.4f}")
    chosen_row = max(parameters, key=lambda row: row["msmarco"])
    print(f"chosen on msmarco: k1 {chosen_row['k1']}, b {chosen_row['b']}, w {chosen_row['w']}: msmarco "
          f"{chosen_row['msmarco']:.4f}, dbpedia {chosen_row['dbpedia']:.4f}; the best dbpedia any (k1, b, w) reaches: "
          f"{max(row['best_dbpedia'] for row in parameters):.4f}")
    print("\ndbpedia's titles counted several times in BM25 (weighted fusion, the weight chosen on msmarco):")
    titles = title_grid(corpora, encoder)
    for row in titles:
        print(f"title ×{row['title_count']}: lexical {row['lexical']:.4f}, w {row['w']:.2f} → dbpedia "
              f"{row['dbpedia']:.4f}; best {row['best_dbpedia']:.4f} (w {row['best_w']:.2f})")
    print("\npseudo-relevance feedback on both sides (Rocchio; choices on msmarco, applied to dbpedia):")
    feedback = feedback_grid(corpora, sets)
    for label in ("dense_chosen", "hybrid_chosen", "dense_best_dbpedia", "hybrid_best_dbpedia"):
        cell = feedback[label]
        print(f"{label:>20}: {cell:<40} msmarco {feedback['cells'][cell]['msmarco']:.4f}, "
              f"dbpedia {feedback['cells'][cell]['dbpedia']:.4f}")
    search = acceptance_4(sets, legs, cells_of)
    print(f"\nacceptance 4 with any parameter (chosen knowing both sets): {len(search['meeting'])} of "
          f"{search['cells_tried']} cells meet it; the nearest (the smaller gain over dense of the two sets):")
    for row in search["nearest"]:
        print(f"  {row['cell']:<40} msmarco {row['msmarco']:.4f}, dbpedia {row['dbpedia']:.4f} "
              f"({row['smaller_gain_over_dense']:+.4f})")
    results: dict[str, Any] = {"machine": machine_info(), "k": K, "legs": legs, "summary": summary, "grid": cells_of,
                               "bm25_parameters": parameters, "title_counts": titles, "feedback": feedback,
                               "acceptance_4": search}
    print(f"\nwrote {write_result('hybrid_fusions', results)}")


if __name__ == "__main__":
    main()
