"""One shard's own cost of a weighted hybrid against a dense search, in process (issue 36,
acceptance 5: where the c=32 gap comes from). What a shard server does per call, minus HTTP:
decode the body, ``ShardVersions.search``, encode the reply.

    python -m benchmarks.hybrid_shard                     # ~1 min on 2 cores
    python -m benchmarks.hybrid_shard --label before      # results/hybrid_shard_before.json

Data: msmarco + dbpedia (10k passages, MiniLM vectors from the embedding cache) built into 4
Flat shards; shard 0 (2.5k documents) answers the 100 real queries, k=10, in calls of 1 and of 7
queries (7: what a shard gets per call at c=32 through the gateway), with the collection's
statistics (as the gateway sends them) and the default weights (0.8 / 0.2, 20 candidates).
Modes take turns within each round; per cell the median and the worst of the rounds.

Run it on the commit before a change and after, in one sitting (a worktree for the before:
``PYTHONPATH=<worktree> python <this file> --label before``).

JSON: benchmarks/results/hybrid_shard[_<label>].json.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from benchmarks.common import Corpus, load_corpus, machine_info, write_result
from benchmarks.hybrid_latency import texts
from index_shards.build import BuildConfig, build_collection
from index_shards.layout import resolve_version, shard_dir
from index_shards.shard import Shard
from index_shards.versions import ShardVersions
from retrieval.analysis import query_terms
from retrieval.bm25 import CorpusStats, LexicalQuery, decode_lexical_queries, encode_lexical_queries
from retrieval.contract import SearchParams
from retrieval.fusion import WeightedFusion
from retrieval.wire import decode_vectors, encode_vectors

SHARDS = 4
SPEC = WeightedFusion(0.8, 0.2, 20)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=3, help="passes over the queries per cell")
    parser.add_argument("--label", default="", help="suffix of the result file (before / after)")
    args = parser.parse_args()
    corpus, queries, vectors = inputs()
    with tempfile.TemporaryDirectory() as tmp:
        replicas, stats = shards_and_statistics(Path(tmp), corpus, queries)
        replica = replicas[0]
        cells: dict[str, list[float]] = {}
        for _ in range(args.rounds):
            for batch in (1, 7):
                for mode in ("dense", "weighted"):
                    took = run(replica, vectors, queries, stats, mode, batch, args.repeat)
                    cells.setdefault(f"{mode} b{batch}", []).append(took)
    summary = report(cells, ("dense", "weighted"))
    written = write_result("hybrid_shard" + (f"_{args.label}" if args.label else ""),
                           {"machine": machine_info(), "docs_on_shard": replicas[0].get(None).base.lexicon.count,
                            "spec": SPEC.to_dict(), "cells": summary})
    print(f"wrote {written}")


def report(cells: dict[str, list[float]], names: tuple[str, str]) -> dict[str, dict[str, Any]]:
    """Print each cell's rounds (ms a query) for calls of 1 and 7, and the second name's ÷ the
    first's; the cells with their median and worst, for the JSON."""
    for batch in (1, 7):
        for name in names:
            runs = cells[f"{name} b{batch}"]
            print(f"{name:8} calls of {batch}: {', '.join(f'{t:.3f}' for t in runs)} ms a query "
                  f"(median {statistics.median(runs):.3f}, worst {max(runs):.3f})")
        ratio = [b / a for a, b in zip(cells[f"{names[0]} b{batch}"], cells[f"{names[1]} b{batch}"], strict=True)]
        print(f"{names[1]} ÷ {names[0]}, calls of {batch}: median {statistics.median(ratio):.2f}, "
              f"worst {max(ratio):.2f}")
    return {name: {"runs_ms": runs, "median_ms": statistics.median(runs), "worst_ms": max(runs)}
            for name, runs in cells.items()}


def inputs() -> tuple[Corpus, list[str], np.ndarray]:
    """The corpus, the 100 real query texts and their vectors."""
    corpus = load_corpus()
    return corpus, texts(), np.asarray(corpus.query_vectors, dtype=np.float32)


def shards_and_statistics(root: Path, corpus: Corpus, queries: list[str]) -> tuple[list[ShardVersions],
                                                                                    list[CorpusStats]]:
    """The corpus built into :data:`SHARDS` Flat shards under ``root``, loaded, and each query's
    statistics summed over them (what the gateway sends)."""
    build_collection(root, corpus.documents, corpus.vectors, corpus.version,
                     BuildConfig("c", SHARDS, factory="Flat"), show_progress=False)
    directory, _ = resolve_version(root, "c")
    replicas = [ShardVersions(Shard.load(shard_dir(directory, s), device="cpu"), data_dir=root / f"data-{s}")
                for s in range(SHARDS)]
    stats = [CorpusStats.total(replica.get(None).lexical_view([t for t, _ in query_terms(text)]).stats()
                               for replica in replicas) for text in queries]
    return replicas, stats


def run(replica: ShardVersions, vectors: np.ndarray, queries: list[str], stats: list[CorpusStats], mode: str,
        batch: int, repeat: int) -> float:
    """Milliseconds a query: every call's body decoded, searched, its reply encoded."""
    bodies = []
    for start in range(0, len(queries) - batch + 1, batch):
        chunk = slice(start, start + batch)
        if mode == "dense":
            bodies.append((SearchParams(10, None), encode_vectors(vectors[chunk])))
        else:
            lexical = [LexicalQuery(text, stats[start + i], SPEC) for i, text in enumerate(queries[chunk])]
            bodies.append((SearchParams(10, None, lexical=True),
                           encode_lexical_queries(lexical, encode_vectors(vectors[chunk]))))
    dim = vectors.shape[1]
    answered = 0
    started = time.perf_counter()
    for _ in range(repeat):
        for params, body in bodies:
            lexical_queries: list[LexicalQuery] = []
            if params.lexical:
                lexical_queries, vector_bytes = decode_lexical_queries(body, max_queries=64)
                asked = decode_vectors(vector_bytes, dim)
            else:
                asked = decode_vectors(body, dim)
            reply = replica.search(asked, params, lexical_queries)
            orjson.dumps(reply.to_dict())
            answered += len(asked)
    took: float = (time.perf_counter() - started) / answered * 1000.0
    return took


if __name__ == "__main__":
    main()
