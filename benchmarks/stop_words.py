"""Where should a lexical leg drop stop words: from documents and queries, from queries only, or
nowhere? Lexical nDCG@10 and the posting entries a query reads, on msmarco and dbpedia.

    python -m benchmarks.stop_words          # ~1 min on 2 cores

English collections drop Lucene's English stop words from documents and queries; a collection in
another Snowball language drops its language's stop words from *queries only*
(``retrieval.analysis.query_stop_words``: its indexes, built before the lists were used, stay
exact). This measures that choice on the one language the data has, with the shards' own
inverted index and scorer (``index_shards.lexical``) over each set's whole corpus, one index per
scheme:

* ``index+query`` — the stop words never indexed and never searched (English today);
* ``query only`` — indexed (they count in a document's length), never searched;
* ``none`` — indexed and searched.

Time is the statistics, postings and BM25 of a query (its analysis excluded: the same work in
every scheme), per query, in process. JSON: benchmarks/results/stop_words.json.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import numpy as np

import retrieval.analysis as analysis
from benchmarks.common import data_dir, machine_info, write_result
from index_shards.lexical import BaseLexicon, score
from retrieval.bm25 import CorpusStats
from retrieval.datasets import load_beir
from retrieval.ir_metrics import ndcg_at_k

K = 10
SCHEMES = ("index+query", "query only", "none")
ROUNDS = 7  # timed passes over the queries after an untimed one (which also ranks); the median is reported


def measure(name: str, scheme: str) -> dict[str, Any]:
    dataset = load_beir(data_dir() / name)
    documents = dataset.corpus
    lucene = analysis.STOP_WORDS
    # the English document analysis reads the module's set when called: emptied, documents keep them
    analysis.STOP_WORDS = lucene if scheme == "index+query" else frozenset()
    try:
        lexicon = BaseLexicon.build((row, d.title, d.text) for row, d in enumerate(documents))
    finally:
        analysis.STOP_WORDS = lucene
    stop = frozenset() if scheme == "none" else lucene
    judged = dataset.judged_queries()
    ids = np.asarray([d.doc_id for d in documents])
    terms_of = {query: list(Counter(analysis.analyze(text, "english", stop=stop)).items())
                for query, text in judged.items()}
    rankings: dict[str, list[str]] = {}
    passes, read = [], 0
    for round_ in range(ROUNDS + 1):
        spent = 0.0
        for query, terms in terms_of.items():
            started = time.perf_counter()
            stats = lexicon.stats([t for t, _ in terms], np.zeros(0, np.int64))
            corpus = CorpusStats(lexicon.count, lexicon.total_length, stats.df)
            postings = []
            for term, count in terms:
                weight = corpus.idf(term) * count
                if weight > 0:
                    rows, tfs = lexicon.postings(term)
                    postings.append((weight, rows, tfs))
                    read += len(rows) if round_ == 0 else 0
            scored = score(postings, lexicon.lengths, lexicon.total_length / lexicon.count, lexicon.count)
            spent += time.perf_counter() - started
            if round_ == 0:
                order = np.lexsort((ids[scored.rows], -scored.scores))[:K]
                rankings[query] = [str(ids[scored.rows][j]) for j in order]
        if round_ > 0:
            passes.append(spent / len(terms_of))
    return {"ndcg_at_10": round(float(ndcg_at_k(rankings, dataset.qrels, K)), 4),
            "postings_read_per_query": round(read / len(terms_of), 1),
            "ms_per_query": round(float(np.median(passes)) * 1e3, 4),
            "ms_per_query_worst_pass": round(max(passes) * 1e3, 4),
            "queries": len(terms_of), "documents": len(documents)}


def main() -> None:
    results: dict[str, dict[str, Any]] = {}
    for name in ("msmarco", "dbpedia"):
        results[name] = {}
        for scheme in SCHEMES:
            cell = results[name][scheme] = measure(name, scheme)
            print(f"{name:8s} {scheme:12s} nDCG@10 {cell['ndcg_at_10']:.4f}   postings read a query "
                  f"{cell['postings_read_per_query']:7.0f}   {cell['ms_per_query']:.3f} ms a query "
                  f"(worst pass {cell['ms_per_query_worst_pass']:.3f})", flush=True)
        ours, none = results[name]["query only"], results[name]["none"]
        postings = ours["postings_read_per_query"] / none["postings_read_per_query"]
        faster = ours["ms_per_query"] / none["ms_per_query"]
        gained = ours["ndcg_at_10"] - results[name]["index+query"]["ndcg_at_10"]
        print(f"{name:8s} query only ÷ none: postings {postings:.2f}×, time {faster:.2f}×;"
              f" nDCG@10 query only − index+query {gained:+.4f}", flush=True)
    path = write_result("stop_words", {"machine": machine_info(), "rounds": ROUNDS, "results": results})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
