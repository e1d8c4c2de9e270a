"""What tracing costs: query throughput with ``SHARDRAG_TRACING`` off vs on (no exporter: spans are
made, kept in each process's memory, sent nowhere), in one run (issue 37, acceptance 4: within 3 %).

    python -m benchmarks.tracing_overhead            # ~3 min on 2 cores

The 10k MiniLM passages (msmarco + dbpedia) on 4 Flat shards × 1 replica behind the gateway (a
real local cluster per phase: tracing is chosen when a process starts). Closed loop
(benchmarks/loadgen.py in its own process), vector queries (no encoder in the way), k=10, at
c=1 and c=16; phases alternate off, on, on, off, ... (``--pairs``) so that drift hits both
sides; each pair's QPS ratio (on ÷ off) is reported, with their median and worst. ``--sample``: the share
of queries traced while on (default 0.01, shardrag's default; ``--sample 1``: every query
traced). JSON: benchmarks/results/tracing_overhead[_sample<S>].json.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.common import closed_loop, load_corpus, machine_info, write_result
from index_shards.build import BuildConfig, build_collection
from retrieval import env
from serving.gateway.config import GatewayConfig
from serving.local.launcher import LocalCluster

SHARDS = 4
PAIR_ORDERS = (("off", "on"), ("on", "off"))


def phase(root: Path, work: Path, tracing: str, bodies: list[dict[str, Any]], concurrencies: list[int],
          duration_s: float, sample: str) -> dict[int, dict[str, Any]]:
    saved = env.read("SHARDRAG_TRACING")
    os.environ["SHARDRAG_TRACING"] = tracing
    os.environ["SHARDRAG_TRACING_SAMPLE"] = sample
    os.environ.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)  # on = spans made, exported nowhere
    try:
        config = GatewayConfig.from_dict({"encoder": {"load": False}})
        with LocalCluster(root, "bench", replicas=1, gateway=config, workdir=work / f"logs-{tracing}") as cluster:
            closed_loop(cluster.gateway_url, bodies, work, 4, 1.0)  # warm every connection and cache
            return {c: closed_loop(cluster.gateway_url, bodies, work, c, duration_s) for c in concurrencies}
    finally:
        if saved is None:
            os.environ.pop("SHARDRAG_TRACING", None)
        else:
            os.environ["SHARDRAG_TRACING"] = saved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=10.0, help="measured seconds per point (default 10)")
    parser.add_argument("--concurrency", default="1,16")
    parser.add_argument("--pairs", type=int, default=3, help="off/on pairs, alternating in order (default 3)")
    parser.add_argument("--sample", default="0.01",
                        help="SHARDRAG_TRACING_SAMPLE while on (default 0.01, the default; 1: every query traced)")
    args = parser.parse_args()
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    order = [mode for i in range(args.pairs) for mode in PAIR_ORDERS[i % 2]]
    corpus = load_corpus()
    bodies = [{"vector": v.tolist(), "k": 10, "with_text": True} for v in corpus.query_vectors]
    results: dict[str, Any] = {"machine": machine_info(), "shards": SHARDS, "docs": len(corpus.doc_ids),
                               "duration_s": args.duration, "sample": float(args.sample), "phases": []}
    with tempfile.TemporaryDirectory(prefix="shardrag-tracing-") as tmp:
        work = Path(tmp)
        build_collection(work / "root", corpus.documents, corpus.vectors, corpus.version,
                         BuildConfig("bench", SHARDS), show_progress=False)
        for tracing in order:
            print(f"tracing {tracing} ...", file=sys.stderr, flush=True)
            points = phase(work / "root", work, tracing, bodies, concurrencies, args.duration, args.sample)
            results["phases"].append({"tracing": tracing, "points": {str(c): p for c, p in points.items()}})
    pairs: dict[str, list[float]] = {}
    for c in concurrencies:
        qps = [(p["tracing"], p["points"][str(c)]["qps"]) for p in results["phases"]]
        # pairs in running order: (off, on), (on, off), (off, on)
        pairs[str(c)] = [qps[i + 1][1] / qps[i][1] if qps[i][0] == "off" else qps[i][1] / qps[i + 1][1]
                         for i in range(0, len(qps), 2)]
    results["ratio_on_over_off"] = {c: {"pairs": r, "median": statistics.median(r), "worst": min(r)}
                                    for c, r in pairs.items()}
    path = write_result("tracing_overhead" if args.sample == "0.01" else f"tracing_overhead_sample{args.sample}",
                        results)
    print(f"\n{'c':>4}  QPS in running order ({', '.join(order)})   on ÷ off per pair   median   worst")
    for c in concurrencies:
        qps_row = ", ".join(f"{p['points'][str(c)]['qps']:.0f}" for p in results["phases"])
        ratio = results["ratio_on_over_off"][str(c)]
        print(f"{c:>4}  {qps_row}   {', '.join(f'{r:.3f}' for r in ratio['pairs'])}   {ratio['median']:.3f}   "
              f"{ratio['worst']:.3f}")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
