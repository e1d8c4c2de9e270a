"""The bm25s half of benchmarks/lexical_engines.py, run by the interpreter of a virtualenv holding
bm25s==0.3.16 and PyStemmer (it imports nothing of shardrag). Reads ``docs.jsonl`` and
``queries.json`` from ``--work``; indexes the documents (bm25s' English stop words, the same
Snowball stemmer, Lucene's BM25 variant with k1=1.2, b=0.75); answers every query's top k.
Writes ``bm25s.json`` there: index seconds, resident memory added and the index arrays' bytes,
per-query latencies and ids."""

from __future__ import annotations

import argparse
import gc
import json
import time
from pathlib import Path


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--work", required=True)
    parser.add_argument("--k", type=int, default=10)
    args = parser.parse_args()
    import bm25s
    import Stemmer

    work = Path(args.work)
    texts = [json.loads(line)["text"] for line in (work / "docs.jsonl").open()]
    queries = json.loads((work / "queries.json").read_text())
    stemmer = Stemmer.Stemmer("english")
    gc.collect()
    before = rss_bytes()
    started = time.perf_counter()
    tokens = bm25s.tokenize(texts, stopwords="en", stemmer=stemmer, show_progress=False)
    retriever = bm25s.BM25(method="lucene", k1=1.2, b=0.75)
    retriever.index(tokens, show_progress=False)
    index_s = time.perf_counter() - started
    del tokens  # its intermediate (ours frees its own); the texts stay loaded, as they do beside ours
    gc.collect()
    memory = rss_bytes() - before
    arrays = sum(getattr(value, "nbytes", 0) for value in retriever.scores.values())
    latencies, answers = [], []
    for query in queries:
        began = time.perf_counter()
        found, scores = retriever.retrieve(bm25s.tokenize([query], stopwords="en", stemmer=stemmer,
                                                          show_progress=False),
                                           k=args.k, show_progress=False, n_threads=1)
        latencies.append(time.perf_counter() - began)
        answers.append([int(i) for i in found[0]])
    (work / "bm25s.json").write_text(json.dumps({"index_s": index_s, "memory_bytes": memory, "array_bytes": arrays,
                                                 "latencies_s": latencies, "answers": answers}))


if __name__ == "__main__":
    main()
