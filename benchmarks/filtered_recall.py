"""Filtered recall, latency and QPS by kind of filter, beside unfiltered and beside Chroma's `where`.

    python -m benchmarks.filtered_recall                          # 1M vectors, HNSW32 and IVF, with Chroma
    python -m benchmarks.filtered_recall --size 100000 --out filtered_recall_100k
    python -m benchmarks.filtered_recall --no-chroma              # shardrag only
    python -m benchmarks.filtered_recall --no-chroma --hnsw-only --ef-construction 100   # a better-linked graph

The data: ``--size`` vectors grown from the 10k real MiniLM passage vectors (msmarco + dbpedia)
by ``index_shards.synthetic.synthesize`` (as benchmarks/scale.py), 40 real queries (20 of each
corpus), and per query 15 filters from ``index_shards.synthetic.TopicFilters`` — correlated
(the topics nearest the query), anti-correlated (the farthest) and uncorrelated (a uniform
field), each at selectivity 0.1 %, 1 %, 10 %, 50 % and 90 %, cut exactly. Truth: the exact
filtered top 10 (inner product over every vector the filter keeps).

shardrag: one shard of each factory, searched in process (``Shard.search``: the payload index,
the filter planner, FAISS), one query at a time: recall@10 mean and min, p50 / p99 latency and
QPS (queries over the seconds they took, c=1). HNSW32 at ef_search 256 and IVF (4·√n lists) at
nprobe 32 — the breadths at which unfiltered recall@10 is ≥ 0.95 over these queries at 100k
(tests/unit/index_shards/test_filtered_recall.py).

Chroma 1.5.9 (``--chroma-python``: a virtualenv's interpreter holding it, as for
benchmarks/collections_memory.py), embedded, in its own process: the same vectors and metadata
in one collection (HNSW, inner product, M 32, construction_ef as our HNSW32's — FAISS's 40 unless
``--ef-construction`` says otherwise — and our ``--ef-search``), the same queries under the same filters written as
Chroma ``where`` clauses. Like with like: both single-process, in-process
calls, one query at a time, on this machine. JSON: benchmarks/results/<out>.json.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import load_corpus, machine_info, percentiles_ms, write_result
from index_shards.build import BuildConfig, build_collection
from index_shards.layout import resolve_version, shard_dir
from index_shards.shard import Shard
from index_shards.synthetic import KINDS, TopicFilters, synthesize
from retrieval.filters import parse_filter
from retrieval.types import Document

K = 10
SELECTIVITIES = (0.001, 0.01, 0.1, 0.5, 0.9)
QUERIES = 40


def chroma_where(filter_: dict[str, Any]) -> dict[str, Any]:
    """One of TopicFilters' filters in Chroma's ``where`` language."""
    def condition(item: dict[str, Any]) -> dict[str, Any]:
        if "must" in item or "should" in item:
            return chroma_where(item)
        if "range" in item:
            return {item["key"]: {"$lt": item["range"]["lt"]}}
        match = item["match"]
        return {item["key"]: {"$in": match["any"]} if "any" in match else {"$eq": match["value"]}}

    occur, items = next(iter(filter_.items()))
    clauses = [condition(i) for i in items]
    return clauses[0] if len(clauses) == 1 else {"$and" if occur == "must" else "$or": clauses}


def truth(vectors: np.ndarray, queries: np.ndarray, topics: TopicFilters) -> tuple[list, list]:
    """Per query: its filters ((kind, selectivity), filter) and the exact top-k rows, unfiltered first."""
    plans, tops = [], []
    for query in queries:
        scores = vectors @ query  # one product per query, every filter picks from it
        plan: list[tuple[tuple[str, float], dict[str, Any] | None]] = [(("unfiltered", 1.0), None)]
        top = [np.argsort(-scores, kind="stable")[:K]]
        for kind in KINDS:
            for selectivity in SELECTIVITIES:
                data, mask = topics.filter(kind, query, selectivity)
                kept = np.flatnonzero(mask)
                plan.append(((kind, selectivity), data))
                top.append(kept[np.argsort(-scores[kept], kind="stable")[:K]])
        plans.append(plan)
        tops.append(top)
    return plans, tops


def summarize(label: tuple[str, float], rows: list[tuple[float, float]]) -> dict[str, Any]:
    recalls = [r for r, _ in rows]
    seconds = [s for _, s in rows]
    return {"kind": label[0], "selectivity": label[1], "recall_mean": round(float(np.mean(recalls)), 4),
            "recall_min": round(float(min(recalls)), 2), **percentiles_ms(seconds),
            "qps": round(len(seconds) / max(sum(seconds), 1e-9), 1)}


def run_shardrag(work: Path, factory: str, knobs: dict[str, int], vectors: np.ndarray, topics: TopicFilters,
                 queries: np.ndarray, plans: list, tops: list, version: Any,
                 ef_construction: int | None = None) -> dict[str, Any]:
    documents = [Document(f"d{i}", "", "", topics.metadata(i)) for i in range(len(vectors))]
    started = time.perf_counter()
    build_collection(work, documents, vectors, version,
                     BuildConfig("bench", 1, factory=factory, ef_construction=ef_construction), show_progress=True)
    build_s = time.perf_counter() - started
    directory, _ = resolve_version(work, "bench")
    shard = Shard.load(shard_dir(directory, 0), device="cpu")
    parsed = [[parse_filter(data) if data else None for _, data in plan] for plan in plans]
    shard.search(queries[:1], K, filter_=parsed[0][1], with_text=False, **knobs)  # warm (lazy maps)
    rows: dict[tuple[str, float], list[tuple[float, float]]] = {}

    def timed(query: np.ndarray, label: tuple[str, float], filter_: Any, want: np.ndarray) -> None:
        began = time.perf_counter()
        got = shard.search(query[None, :], K, filter_=filter_, with_text=False, **knobs)[0]["doc_ids"]
        took = time.perf_counter() - began
        rows.setdefault(label, []).append((len({int(d[1:]) for d in got} & set(want.tolist())) / K, took))

    # the unfiltered queries in a pass of their own, after an untimed one (the memory-mapped index
    # paged in): between filtered ones each was timed on the caches the previous query's filters
    # left (an exact scan sweeps the whole storage out of them)
    for query in queries:
        shard.search(query[None, :], K, with_text=False, **knobs)
    for query, plan, filters, top in zip(queries, plans, parsed, tops, strict=True):
        timed(query, plan[0][0], filters[0], top[0])
    for query, plan, filters, top in zip(queries, plans, parsed, tops, strict=True):
        for (label, _), filter_, want in zip(plan[1:], filters[1:], top[1:], strict=True):
            timed(query, label, filter_, want)
    return {"factory": factory, "knobs": knobs, "build_s": round(build_s, 1), "plans": dict(shard.filter_plans),
            **({"ef_construction": ef_construction} if ef_construction is not None else {}),
            "cells": [summarize(label, r) for label, r in rows.items()]}


def run_chroma(python: str, work: Path, vectors: np.ndarray, topics: TopicFilters, queries: np.ndarray,
               plans: list, tops: list, ef_search: int, ef_construction: int) -> dict[str, Any]:
    np.save(work / "vectors.npy", vectors)
    np.savez(work / "metadata.npz", topic=topics.topic, rank=topics.rank, u=topics.uniform)
    np.save(work / "queries.npy", queries)
    (work / "filters.json").write_text(json.dumps(
        [[[f"{kind}@{sel}", chroma_where(data) if data else None] for (kind, sel), data in plan] for plan in plans]))
    side = Path(__file__).with_name("chroma_filtered_side.py")
    subprocess.run([python, str(side), "--work", str(work), "--k", str(K), "--m", "32", "--ef-search", str(ef_search),
                    "--ef-construction", str(ef_construction)], check=True)
    answers = json.loads((work / "chroma.json").read_text())
    rows: dict[tuple[str, float], list[tuple[float, float]]] = {}
    for qi, plan in enumerate(plans):
        for ((kind, sel), _), want in zip(plan, tops[qi], strict=True):
            answer = answers["answers"][f"{kind}@{sel}"][qi]
            found = {int(d[1:]) for d in answer["ids"]}
            rows.setdefault((kind, sel), []).append((len(found & set(want.tolist())) / K, answer["s"]))
    return {"factory": f"chroma 1.5.9 (HNSW M32, construction_ef {ef_construction}, search_ef {ef_search})",
            "add_s": round(answers["add_s"], 1),
            "cells": [summarize(label, r) for label, r in rows.items()]}


def report(runs: list[dict[str, Any]]) -> None:
    for run in runs:
        breadth = f" efConstruction {run['ef_construction']}" if "ef_construction" in run else ""
        print(f"\n{run['factory']}{breadth} {run.get('knobs', '')}  build/add {run.get('build_s', run.get('add_s'))} s")
        print(f"  {'filter':>22} {'recall':>7} {'min':>5} {'p50 ms':>8} {'p99 ms':>8} {'QPS':>8}")
        for c in run["cells"]:
            print(f"  {c['kind'] + ' ' + str(c['selectivity']):>22} {c['recall_mean']:7.3f} {c['recall_min']:5.1f} "
                  f"{c['p50_ms']:8.2f} {c['p99_ms']:8.2f} {c['qps']:8.1f}")
    chroma = next((r for r in runs if r["factory"].startswith("chroma")), None)
    if chroma is None:
        return
    theirs = {(c["kind"], c["selectivity"]): c for c in chroma["cells"]}
    for run in runs:
        if run is chroma or not run["factory"].startswith("HNSW"):
            continue
        print(f"\n{run['factory']} vs {chroma['factory']} (ratios shardrag / chroma)")
        print(f"  {'filter':>22} {'recall':>15} {'p50 ms':>17} {'QPS':>21}")
        for c in run["cells"]:
            o = theirs[(c["kind"], c["selectivity"])]
            print(f"  {c['kind'] + ' ' + str(c['selectivity']):>22} {c['recall_mean']:6.3f}/{o['recall_mean']:6.3f}"
                  f"  {c['p50_ms']:7.2f}/{o['p50_ms']:7.2f}  {c['qps']:8.1f}/{o['qps']:8.1f} "
                  f"({c['qps'] / max(o['qps'], 1e-9):.2f}×)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=int, default=1_000_000, help="vectors in the shard (default 1,000,000)")
    parser.add_argument("--ef-search", type=int, default=256, help="HNSW32's ef_search (default 256)")
    parser.add_argument("--nprobe", type=int, default=32, help="IVF's nprobe (default 32)")
    parser.add_argument("--chroma-python", default=".venv-chroma/bin/python",
                        help="the interpreter of a virtualenv holding chromadb==1.5.9")
    parser.add_argument("--no-chroma", action="store_true", help="shardrag only")
    parser.add_argument("--ef-construction", type=int, default=None,
                        help="HNSW32's build breadth (default FAISS's 40)")
    parser.add_argument("--hnsw-only", action="store_true", help="skip the IVF shard")
    parser.add_argument("--chroma-ef-construction", type=int, default=None,
                        help="Chroma's construction_ef (default: HNSW32's, --ef-construction or 40)")
    parser.add_argument("--out", default="filtered_recall", help="results name under benchmarks/results")
    args = parser.parse_args()
    corpus = load_corpus()
    vectors = synthesize(np.ascontiguousarray(corpus.vectors, dtype=np.float32), args.size)
    topics = TopicFilters.fit(vectors)
    picks = np.linspace(0, len(corpus.query_vectors) - 1, QUERIES).astype(int)
    queries = np.ascontiguousarray(corpus.query_vectors[picks], dtype=np.float32)
    print(f"{args.size:,} vectors, {QUERIES} queries × {1 + len(KINDS) * len(SELECTIVITIES)} filters; exact truth …")
    plans, tops = truth(vectors, queries, topics)
    nlist = 1 << round(math.log2(4 * math.sqrt(args.size)))
    runs: list[dict[str, Any]] = []
    results: dict[str, Any] = {"machine": machine_info(), "size": args.size, "queries": QUERIES, "k": K, "runs": runs}
    factories = [("HNSW32", {"ef_search": args.ef_search})] + \
        ([] if args.hnsw_only else [(f"IVF{nlist},Flat", {"nprobe": args.nprobe})])
    for factory, knobs in factories:
        with tempfile.TemporaryDirectory(prefix="shardrag-filtered-") as work:
            runs.append(run_shardrag(Path(work), factory, knobs, vectors, topics, queries, plans, tops,
                                     corpus.version, args.ef_construction if factory.startswith("HNSW") else None))
        write_result(args.out, results)
    if not args.no_chroma:
        if not Path(args.chroma_python).exists():
            sys.exit(f"{args.chroma_python} not found: python -m venv .venv-chroma && .venv-chroma/bin/pip install "
                     "chromadb==1.5.9 numpy (or --no-chroma)")
        with tempfile.TemporaryDirectory(prefix="shardrag-filtered-chroma-") as work:
            runs.append(run_chroma(args.chroma_python, Path(work), vectors, topics, queries, plans, tops,
                                   args.ef_search, args.chroma_ef_construction or args.ef_construction or 40))
        write_result(args.out, results)
    report(runs)
    print(f"\nwrote benchmarks/results/{args.out}.json")


if __name__ == "__main__":
    main()
