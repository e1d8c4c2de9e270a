"""A weighted hybrid on one shard as the shard grows (issue 36, acceptance 5 at real shard sizes):
what a shard server does per call, minus HTTP — ``ShardVersions.search``, the reply encoded — for
dense, lexical and weighted hybrid queries, in calls of 1 and of 7 queries, on one Flat, one
HNSW32 and one IVF256,Flat shard of 10k and 100k documents.

    python -m benchmarks.hybrid_scale                          # ~6 min on 2 cores
    python -m benchmarks.hybrid_scale --sizes 100000 --factories Flat "IVF256,Flat"
    PYTHONPATH=<worktree> python benchmarks/hybrid_scale.py --label before   # the commit before

Documents: texts grown from the 10k real passages (``benchmarks.lexical_engines.synthesize``:
the first half of one passage's words joined to the second half of another's), vectors from the
real MiniLM vectors' Gaussian mixture (``index_shards.synthetic``, as ``benchmarks.scale``); the
100 real query texts with their real vectors, k=10, the default weights (0.8 / 0.2, 20
candidates), the shard's own statistics (a one-shard collection). HNSW32 at FAISS's ef_search
(16), IVF at shardrag's default nprobe. Modes take turns within each round; per cell the median
and the worst of the rounds, and a digest of the answers' doc ids (two runs that answer alike have
the same digest: on a flat index a weighted hybrid's answer does not depend on how its dense leg is
read). An approximate index's weighted answers are compared with the flat index's of the same
size — the exact fused top 10.

Also counted: the index searches a weighted call makes (FAISS calls, through ``Shard.search_ids``)
and how deep each reads — a shard reads its dense leg again, 4× deeper, while a document outside
both legs' first lists could still reach the k-th.

JSON: benchmarks/results/hybrid_scale[_<label>].json.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from benchmarks.common import load_corpus, machine_info, write_result
from benchmarks.hybrid_latency import texts
from benchmarks.lexical_engines import synthesize as synthesize_texts
from index_shards.build import BuildConfig, build_collection
from index_shards.layout import resolve_version, shard_dir
from index_shards.shard import Shard
from index_shards.synthetic import synthesize as synthesize_vectors
from index_shards.versions import ShardVersions
from retrieval.analysis import query_terms
from retrieval.bm25 import LexicalQuery
from retrieval.contract import SearchParams
from retrieval.fusion import WeightedFusion
from retrieval.types import Document

SPEC = WeightedFusion(0.8, 0.2, 20)
MODES = ("dense", "lexical", "weighted")
BATCHES = (1, 7)


class SearchCounter:
    """Every ``Shard.search_ids`` call's depth while counting (the real search, wrapped)."""

    def __init__(self) -> None:
        self.depths: list[int] = []
        self.counting = False
        original = Shard.search_ids

        def counted(shard: Shard, queries: np.ndarray, k: int, **kwargs: Any) -> Any:
            if self.counting:
                self.depths.append(k)
            return original(shard, queries, k, **kwargs)

        Shard.search_ids = counted  # type: ignore[method-assign]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000], help="documents on the shard")
    parser.add_argument("--factories", nargs="+", default=["Flat", "HNSW32", "IVF256,Flat"], help="FAISS factories")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--label", default="", help="suffix of the result file (before / after)")
    args = parser.parse_args()
    corpus = load_corpus()
    queries, query_vectors = texts(), np.asarray(corpus.query_vectors, dtype=np.float32)
    counter = SearchCounter()
    cells: list[dict[str, Any]] = []
    for size in args.sizes:
        vectors = synthesize_vectors(np.asarray(corpus.vectors, dtype=np.float32), size)
        bodies, _ = synthesize_texts(size)
        documents = [Document(f"d{i}", text) for i, text in enumerate(bodies)]
        for factory in args.factories:
            with tempfile.TemporaryDirectory() as tmp:
                root = Path(tmp)
                started = time.perf_counter()
                build_collection(root, documents, vectors, corpus.version, BuildConfig("c", 1, factory=factory),
                                 show_progress=False)
                directory, _ = resolve_version(root, "c")
                replica = ShardVersions(Shard.load(shard_dir(directory, 0), device="cpu"), data_dir=root / "data")
                live = replica.get(None)
                print(f"{size:,} documents, {factory}: built in {time.perf_counter() - started:.1f} s, lexicon "
                      f"{live.base.lexicon.count:,} rows", flush=True)
                own = [live.lexical_view([t for t, _ in query_terms(text)]).stats() for text in queries]
                cell = measure(replica, queries, query_vectors, own, args.rounds, counter)
                cell.update(size=size, factory=factory)
                cells.append(cell)
                report(cell)
    agreement(cells)
    written = write_result("hybrid_scale" + (f"_{args.label}" if args.label else ""),
                           {"machine": machine_info(), "spec": SPEC.to_dict(), "cells": cells})
    print(f"wrote {written}")


def measure(replica: ShardVersions, queries: list[str], vectors: np.ndarray, own: list[Any], rounds: int,
            counter: SearchCounter) -> dict[str, Any]:
    """Per mode and call size: ms a query each round, the answers' digest, and for weighted calls
    the index searches a query made and their depths."""
    times: dict[str, list[float]] = collections.defaultdict(list)
    digests: dict[str, str] = {}
    searches: dict[str, dict[str, Any]] = {}
    for batch in BATCHES:  # once untimed: the lexicon, the row tables and the caches warm
        for mode in MODES:
            run(replica, queries, vectors, own, mode, batch)
    answered: list[list[str]] = []
    for round_ in range(rounds):
        for batch in BATCHES:
            for mode in MODES:
                name = f"{mode} b{batch}"
                counter.depths.clear()
                counter.counting = round_ == 0
                took, answers = run(replica, queries, vectors, own, mode, batch)
                counter.counting = False
                times[name].append(took)
                digests[name] = hashlib.sha256(orjson.dumps(answers)).hexdigest()[:16]
                if name == "weighted b1":
                    answered = answers
                if round_ == 0:
                    depths = collections.Counter(counter.depths)
                    searches[name] = {"calls": len(counter.depths), "depths": dict(sorted(depths.items()))}
    return {"ms_a_query": {name: {"rounds": runs, "median": statistics.median(runs), "worst": max(runs)}
                           for name, runs in times.items()},
            "answers_digest": digests, "index_searches_first_round": searches, "weighted_answers": answered}


def agreement(cells: list[dict[str, Any]]) -> None:
    """Each approximate index's weighted answers against the flat index's of the same size (the
    exact fused top 10 over every document): the mean share of the 10 it returns, and the worst."""
    exact = {cell["size"]: cell["weighted_answers"] for cell in cells if cell["factory"] == "Flat"}
    for cell in cells:
        if cell["factory"] == "Flat" or cell["size"] not in exact:
            continue
        shares = [len(set(got) & set(want)) / max(len(want), 1)
                  for got, want in zip(cell["weighted_answers"], exact[cell["size"]], strict=True)]
        cell["weighted_recall_vs_flat"] = {"mean": statistics.mean(shares), "worst": min(shares)}
        print(f"{cell['size']:,} documents, {cell['factory']}: weighted top 10 against the exact (Flat) one: "
              f"mean {statistics.mean(shares):.3f}, worst query {min(shares):.1f}", flush=True)


def run(replica: ShardVersions, queries: list[str], vectors: np.ndarray, own: list[Any], mode: str,
        batch: int) -> tuple[float, list[list[str]]]:
    """Milliseconds a query over the 100 queries in calls of ``batch``, and each query's doc ids."""
    answers: list[list[str]] = []
    answered = 0
    started = time.perf_counter()
    for start in range(0, len(queries) - batch + 1, batch):
        chunk = slice(start, start + batch)
        if mode == "dense":
            reply = replica.search(vectors[chunk], SearchParams(10, None))
        else:
            fuse = SPEC if mode == "weighted" else None
            asked = [LexicalQuery(text, own[start + i], fuse) for i, text in enumerate(queries[chunk])]
            reply = replica.search(vectors[chunk] if fuse else vectors[chunk][:0],
                                   SearchParams(10, None, lexical=True), asked)
        orjson.dumps(reply.to_dict())
        answers.extend(list(result["doc_ids"]) for result in reply.results)
        answered += batch
    return (time.perf_counter() - started) / answered * 1000.0, answers


def report(cell: dict[str, Any]) -> None:
    timing = cell["ms_a_query"]
    for batch in BATCHES:
        dense = timing[f"dense b{batch}"]["median"]
        parts = []
        for mode in MODES:
            row = timing[f"{mode} b{batch}"]
            parts.append(f"{mode} {row['median']:.3f} (worst {row['worst']:.3f})")
        weighted = timing[f"weighted b{batch}"]["median"]
        searches = cell["index_searches_first_round"][f"weighted b{batch}"]
        print(f"  calls of {batch}: {', '.join(parts)} ms a query; weighted ÷ dense {weighted / dense:.2f}; "
              f"weighted index searches {searches['calls']} (depths {searches['depths']}); "
              f"answers {cell['answers_digest'][f'weighted b{batch}']}", flush=True)


if __name__ == "__main__":
    main()
