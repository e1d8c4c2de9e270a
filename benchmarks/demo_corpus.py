"""Does the demo answer common questions? The rank of the right module for 20 of them, and 20 more
held out.

    python -m benchmarks.demo_corpus              # ~2 min on 2 cores the first time, seconds after
    python -m benchmarks.demo_corpus --variants   # + three ways of ranking that are not served

The whole demo corpus (``serving.local.demo_corpus``, what ``shardrag demo`` indexes) is encoded
with MiniLM (vectors from the embedding cache after the first run) and searched exactly (inner
product, as the demo's Flat shards do). For each question: the rank of the first passage from a
module that answers it (``shardrag demo --check`` asserts the first four in the top 3) and the top
hit. Prints the count at rank 1 and in the top 3, and the mean reciprocal rank.

Two sets: ``QUESTIONS`` shaped the corpus (its rework was judged on them); ``HELD_OUT`` was written
on 2026-12-03 before anything was measured on it, and nothing has been tuned on it since.

``--variants`` ranks the same passages three more ways, to see whether a choice the demo does not
make would put the right module first (none is served):

* ``bm25``: dense and BM25 (k1 1.2, b 0.75, over title and text) fused by reciprocal rank
  (1/(60 + rank), BM25's share weighted 0.3), the usual hybrid of RAG stacks;
* ``title``: 0.8 × the passage's score + 0.2 × its title's own vector;
* ``overview``: one more passage per module: its summary and its public names, each with the
  first line of its docstring (a module's table of contents).

JSON: benchmarks/results/demo_corpus.json.
"""

from __future__ import annotations

import argparse
import ast
import math
import re
import sys
import sysconfig
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import machine_info, write_result
from retrieval.embedding_cache import CachingEncoder, EmbeddingCache, default_cache_dir
from retrieval.encoders import encode_documents, load_encoder
from retrieval.types import DocId, Document
from serving.cli.cluster import DEMO_QUERIES, answers_question
from serving.local.demo_corpus import python_docs_corpus, stdlib_modules

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

HELD_OUT: dict[str, tuple[str, ...]] = {
    "download a file from a URL": ("urllib.request",),
    "create a temporary file": ("tempfile",),
    "extract a zip archive": ("zipfile", "shutil.unpack_archive"),
    "compute a sha256 hash": ("hashlib",),
    "parse an XML document": ("xml",),
    "encode data as base64": ("base64",),
    "parse a URL into its parts": ("urllib.parse",),
    "read an ini config file": ("configparser",),
    "generate a unique identifier": ("uuid",),
    "pretty print a nested data structure": ("pprint",),
    "count how often each item occurs": ("collections.Counter",),
    "make a deep copy of an object": ("copy",),
    "run coroutines concurrently": ("asyncio",),
    "find files matching a wildcard pattern": ("glob", "fnmatch", "pathlib"),
    "send data over a TCP socket": ("socket", "socketserver"),
    "read a tar archive": ("tarfile",),
    "format text to a fixed width": ("textwrap",),
    "compare two text files and show differences": ("difflib", "filecmp"),
    "cache the results of a function": ("functools",),
    "start a process in parallel": ("multiprocessing", "subprocess", "concurrent.futures"),
}

RRF_K, BM25_WEIGHT, TITLE_WEIGHT = 60, 0.3, 0.2
_STOPWORDS = frozenset("a an the of to in on for by and or is are be with as at from it this that".split())

Ranker = Callable[[str, np.ndarray], np.ndarray]  # (question, its vector) -> passage order, best first


def _tokens(text: str) -> list[str]:
    return [t for t in re.findall(r"[a-z0-9]+", text.lower()) if t not in _STOPWORDS]


class BM25:
    """Okapi BM25 over title and text: the lexical half of the hybrid variant."""

    def __init__(self, documents: list[Document], k1: float = 1.2, b: float = 0.75) -> None:
        self.k1, self.b = k1, b
        tokenised = [_tokens(f"{d.title} {d.text}") for d in documents]
        self.lengths = np.array([len(t) for t in tokenised], dtype=np.float64)
        self.postings: dict[str, list[tuple[int, int]]] = {}
        for row, tokens in enumerate(tokenised):
            for term, count in Counter(tokens).items():
                self.postings.setdefault(term, []).append((row, count))

    def scores(self, query: str) -> np.ndarray:
        n, mean_length = len(self.lengths), float(self.lengths.mean())
        out = np.zeros(n)
        for term in set(_tokens(query)):
            postings = self.postings.get(term, [])
            if not postings:
                continue
            idf = math.log(1 + (n - len(postings) + 0.5) / (len(postings) + 0.5))
            rows = np.array([r for r, _ in postings])
            tf = np.array([c for _, c in postings], dtype=np.float64)
            norm = self.k1 * (1 - self.b + self.b * self.lengths[rows] / mean_length)
            out[rows] += idf * tf * (self.k1 + 1) / (tf + norm)
        return out


def _fused(first: np.ndarray, second: np.ndarray, weight: float, depth: int = 100) -> np.ndarray:
    """Reciprocal-rank fusion of two orders (their top ``depth`` each), ``weight`` on the second."""
    score: Counter[int] = Counter()
    for rank, row in enumerate(first[:depth]):
        score[int(row)] += 1.0 / (RRF_K + rank + 1)
    for rank, row in enumerate(second[:depth]):
        score[int(row)] += weight / (RRF_K + rank + 1)
    return np.array([row for row, _ in score.most_common()])


def module_overviews() -> Iterator[Document]:
    """Per stdlib module of the demo corpus: its summary and its public names with their
    docstrings' first lines, as one passage (at most 120 words)."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for module, path in stdlib_modules(stdlib):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, OSError):
            continue
        summary = (ast.get_docstring(tree) or "").strip().split("\n")[0].strip(" .")[:100]
        names = [f"{node.name}: {(ast.get_docstring(node) or '').strip().splitlines()[0].strip(' .')}"
                 for node in tree.body
                 if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                 and not node.name.startswith("_") and (ast.get_docstring(node) or "").strip()]
        if names:
            text = " ".join(f"{summary}. Provides {'; '.join(names)}.".split()[:120])
            yield Document(DocId(f"py/{module}#overview"), text, f"{module} module: {summary}" if summary else module,
                           {"source": "stdlib", "module": module})


@dataclass
class SetScore:
    """One question set under one way of ranking."""

    at_rank_1: int
    in_top_3: int
    mrr: float
    rows: list[dict[str, Any]]

    def summary(self) -> dict[str, Any]:
        return {"at_rank_1": self.at_rank_1, "in_top_3": self.in_top_3, "mrr": self.mrr}


def evaluate(documents: list[Document], rank: Ranker, encoder: CachingEncoder, questions: dict[str, tuple[str, ...]],
             *, show: bool) -> SetScore:
    rows = []
    for (question, expected), vector in zip(questions.items(), encoder.encode_queries(list(questions)), strict=True):
        order = rank(question, vector)
        found = next((r for r, i in enumerate(order, start=1) if answers_question(documents[i].doc_id, expected)), None)
        top = documents[order[0]]
        rows.append({"question": question, "expected": list(expected), "rank": found, "top_hit": top.doc_id,
                     "top_title": top.title, "in_demo_check": question in DEMO_QUERIES})
        if show:
            print(f"{found if found is not None else '-':>5}  {question:<44} {top.doc_id}  ({top.title[:40]})")
    ranks = [r["rank"] or len(documents) for r in rows]
    score = SetScore(sum(r == 1 for r in ranks), sum(r <= 3 for r in ranks),
                     round(float(np.mean([1.0 / r for r in ranks])), 3), rows)
    if show:
        print(f"  at rank 1: {score.at_rank_1} of {len(rows)}; in the top 3: {score.in_top_3}; MRR {score.mrr}\n")
    return score


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--name", default="demo_corpus", help="results file name (default demo_corpus)")
    parser.add_argument("--variants", action="store_true",
                        help="also rank with BM25 fusion, title vectors and module overview passages (not served)")
    args = parser.parse_args(argv)
    documents = python_docs_corpus()
    encoder = CachingEncoder(load_encoder(None), EmbeddingCache(default_cache_dir()))
    vectors = encode_documents(encoder, documents, show_progress=True)

    def dense(_: str, query: np.ndarray) -> np.ndarray:
        return np.argsort(-(vectors @ query))

    print(f"{len(documents)} passages; rank of the first passage from a module that answers the question\n")
    print(f"{'rank':>5}  {'question':<44} top hit")
    served = evaluate(documents, dense, encoder, QUESTIONS, show=True)
    print("held out:")
    held_out = evaluate(documents, dense, encoder, HELD_OUT, show=True)
    result: dict[str, Any] = {"passages": len(documents), "python": sys.version.split()[0], **served.summary(),
                              "questions": served.rows, "held_out": {**held_out.summary(), "rows": held_out.rows},
                              "machine": machine_info()}
    if args.variants:
        result["variants"] = run_variants(documents, vectors, encoder, dense)
    path = write_result(args.name, result)
    print(f"wrote {path}")
    return 0


def run_variants(documents: list[Document], vectors: np.ndarray, encoder: CachingEncoder, dense: Ranker
                 ) -> dict[str, Any]:
    bm25 = BM25(documents)
    titles = encode_documents(encoder, [Document(d.doc_id, d.title, "") for d in documents], show_progress=True)
    overviews = list(module_overviews())
    with_overviews = np.vstack([vectors, encode_documents(encoder, overviews, show_progress=True)])
    variants: dict[str, tuple[list[Document], Ranker]] = {
        "dense (served)": (documents, dense),
        "bm25": (documents, lambda text, q: _fused(dense(text, q), np.argsort(-bm25.scores(text)), BM25_WEIGHT)),
        "title": (documents,
                  lambda _, q: np.argsort(-((1 - TITLE_WEIGHT) * (vectors @ q) + TITLE_WEIGHT * (titles @ q)))),
        "overview": (documents + overviews, lambda _, q: np.argsort(-(with_overviews @ q))),
    }
    table: dict[str, Any] = {}
    print(f"\n{'variant':<16} {'rank 1':>7} {'top 3':>6} {'MRR':>6} | held out: {'rank 1':>7} {'top 3':>6} {'MRR':>6}"
          " | the demo's four at rank")
    for name, (corpus, rank) in variants.items():
        asked = evaluate(corpus, rank, encoder, QUESTIONS, show=False)
        held_out = evaluate(corpus, rank, encoder, HELD_OUT, show=False)
        demo = [row["rank"] for row in asked.rows if row["in_demo_check"]]
        table[name] = {"passages": len(corpus), "questions": asked.summary(), "held_out": held_out.summary(),
                       "demo_ranks": demo}
        print(f"{name:<16} {asked.at_rank_1:>7} {asked.in_top_3:>6} {asked.mrr:>6} | held out: "
              f"{held_out.at_rank_1:>7} {held_out.in_top_3:>6} {held_out.mrr:>6} | {demo}")
    return table


if __name__ == "__main__":
    raise SystemExit(main())
