"""Does the demo answer common questions? The rank of the right module for 20 of them.

    python -m benchmarks.demo_corpus        # ~2 min on 2 cores the first time, seconds after

The whole demo corpus (``serving.local.demo_corpus``, what ``shardrag demo`` indexes) is encoded
with MiniLM (vectors from the embedding cache after the first run) and searched exactly (inner
product, as the demo's Flat shards do). For each question: the rank of the first passage from a
module that answers it (``shardrag demo --check`` asserts the first four in the top 3) and the top
hit. Prints the count at rank 1 and in the top 3. JSON: benchmarks/results/demo_corpus.json.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from benchmarks.common import machine_info, write_result
from retrieval.embedding_cache import CachingEncoder, EmbeddingCache, default_cache_dir
from retrieval.encoders import encode_documents, load_encoder
from serving.cli.cluster import DEMO_QUERIES, answers_question
from serving.local.demo_corpus import python_docs_corpus

# question -> the modules (or built-ins) whose passages answer it
QUESTIONS: dict[str, tuple[str, ...]] = {
    **DEMO_QUERIES,
    "sort a list of dictionaries by key": ("builtins.sorted", "builtins.list.sort", "operator.itemgetter"),
    "open a file": ("builtins.open", "io"),
    "run a shell command": ("subprocess", "os.system"),
    "parse json": ("json",),
    "current date and time": ("datetime", "time"),
    "regular expression match": ("re",),
    "copy a directory tree": ("shutil",),
    "read environment variables": ("os.getenv", "os.environ"),
    "send an email": ("smtplib", "email"),
    "random number": ("random", "secrets"),
    "compress a file with gzip": ("gzip",),
    "unit tests": ("unittest", "doctest"),
    "measure execution time": ("timeit", "time.perf_counter"),
    "serialize python objects": ("pickle", "marshal", "shelve"),
    "thread pool": ("concurrent.futures", "multiprocessing.pool"),
    "sqlite database": ("sqlite3",),
    "log messages to a file": ("logging",),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--name", default="demo_corpus", help="results file name (default demo_corpus)")
    args = parser.parse_args(argv)
    documents = python_docs_corpus()
    encoder = CachingEncoder(load_encoder(None), EmbeddingCache(default_cache_dir()))
    vectors = encode_documents(encoder, documents, show_progress=True)
    queries = encoder.encode_queries(list(QUESTIONS))
    rows = []
    print(f"{len(documents)} passages; rank of the first passage from a module that answers the question\n")
    print(f"{'rank':>5}  {'question':<38} top hit")
    for (question, expected), query in zip(QUESTIONS.items(), queries, strict=True):
        order = np.argsort(-(vectors @ query))
        rank = next((r for r, i in enumerate(order, start=1) if answers_question(documents[i].doc_id, expected)),
                    None)
        top = documents[order[0]]
        rows.append({"question": question, "expected": list(expected), "rank": rank, "top_hit": top.doc_id,
                     "top_title": top.title, "in_demo_check": question in DEMO_QUERIES})
        print(f"{rank if rank is not None else '-':>5}  {question:<38} {top.doc_id}  ({top.title[:50]})")
    at_1 = sum(r["rank"] == 1 for r in rows)
    in_3 = sum(r["rank"] is not None and r["rank"] <= 3 for r in rows)
    print(f"\nat rank 1: {at_1} of {len(rows)}; in the top 3: {in_3} of {len(rows)}")
    path = write_result(args.name, {"passages": len(documents), "python": sys.version.split()[0],
                                    "at_rank_1": at_1, "in_top_3": in_3, "questions": rows,
                                    "machine": machine_info()})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
