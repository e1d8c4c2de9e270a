"""The launched collection on nodes vs one process per replica: query throughput, latency and
memory of the two layouts of the local launcher.

    python -m benchmarks.node_layout        # ~3 min on 2 cores

Same collection (msmarco + dbpedia, 10k MiniLM vectors, Flat, 2 shards × 2 replicas), same gateway
code and settings, same closed-loop load (benchmarks.loadgen, vector queries k=10, each
concurrency for --duration seconds): ``layout="processes"`` runs 4 shard processes (and no node);
``layout="nodes"`` (the default of ``shardrag serve``/``demo`` and the Helm chart) runs 2 node
processes, each hosting one replica of each shard behind its ``/c/<collection>/<shard>`` prefix.
The layouts alternate (--runs pairs, in one sitting); memory is the summed RSS of the processes
that hold the replicas, after the load. JSON in benchmarks/results/node_layout.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

import psutil

from benchmarks.common import load_corpus, machine_info, scratch_dir, write_result
from benchmarks.ray_backend import _errors, load
from index_shards.build import BuildConfig, build_collection
from serving.gateway.config import GatewayConfig
from serving.local.launcher import LocalCluster

LAYOUTS = ("processes", "nodes")


def replica_rss_mib(cluster: LocalCluster) -> float:
    """Summed RSS of the processes that hold the collection's replicas (shard processes, or nodes)."""
    children = [c for group in cluster.shards for c in group] + cluster.nodes
    return sum(psutil.Process(c.process.pid).memory_info().rss for c in children if c.process) / 2**20


def run_layout(root: Path, layout: str, bodies: Path, concurrencies: list[int], duration_s: float,
               run: int) -> dict[str, Any]:
    vectors_only = GatewayConfig.from_dict({"encoder": {"load": False}})
    with LocalCluster(root, "bench", replicas=2, gateway=vectors_only, layout=layout,
                      nodes=0 if layout == "processes" else 2) as cluster:
        cells = {}
        for c in concurrencies:
            cells[str(c)] = load(cluster.gateway_url, bodies, c, duration_s)
            print(f"run {run} {layout:>9} c={c:<3} {cells[str(c)]['qps']:7.0f} QPS  p50 "
                  f"{cells[str(c)]['p50_ms']:6.2f} ms  p99 {cells[str(c)]['p99_ms']:6.2f} ms", flush=True)
        return {"cells": cells, "replica_rss_mib": replica_rss_mib(cluster),
                "processes": len(cluster.nodes) + sum(len(g) for g in cluster.shards)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=8.0, help="seconds per cell (default 8)")
    parser.add_argument("--concurrency", default="1,8,32", help="closed-loop clients (default 1,8,32)")
    parser.add_argument("--runs", type=int, default=2, help="pairs of runs, layouts alternating (default 2)")
    args = parser.parse_args()
    concurrencies = [int(c) for c in args.concurrency.split(",")]

    corpus = load_corpus()
    work = scratch_dir("node-layout-bench-")
    build_collection(work / "root", corpus.documents, corpus.vectors, corpus.version, BuildConfig("bench", 2),
                     show_progress=False)
    bodies = work / "bodies.json"
    bodies.write_text(json.dumps([{"vector": v.tolist(), "k": 10} for v in corpus.query_vectors[:200]]))

    runs: list[dict[str, dict[str, Any]]] = []
    for run in range(args.runs):
        order = LAYOUTS if run % 2 == 0 else LAYOUTS[::-1]
        runs.append({layout: run_layout(work / "root", layout, bodies, concurrencies, args.duration, run)
                     for layout in order})

    print(f"\n{'run':>3} {'clients':>7} {'proc QPS':>9} {'node QPS':>9} {'nodes/proc':>10} {'proc p50':>9} "
          f"{'node p50':>9} {'proc p99':>9} {'node p99':>9} {'errors':>7}")
    ratios: dict[str, list[float]] = {str(c): [] for c in concurrencies}
    for number, result in enumerate(runs):
        for c in concurrencies:
            p, n = result["processes"]["cells"][str(c)], result["nodes"]["cells"][str(c)]
            ratios[str(c)].append(n["qps"] / p["qps"])
            print(f"{number:>3} {c:>7} {p['qps']:>9.0f} {n['qps']:>9.0f} {n['qps'] / p['qps']:>9.2f}× "
                  f"{p['p50_ms']:>7.2f}ms {n['p50_ms']:>7.2f}ms {p['p99_ms']:>7.2f}ms {n['p99_ms']:>7.2f}ms "
                  f"{_errors(p) + _errors(n):>7}")
    for c in concurrencies:
        print(f"c={c}: node/process QPS median {statistics.median(ratios[str(c)]):.2f}×, worst "
              f"{min(ratios[str(c)]):.2f}×")
    for number, result in enumerate(runs):
        p, n = result["processes"], result["nodes"]
        share = n["replica_rss_mib"] / p["replica_rss_mib"]
        print(f"run {number}: replica memory {p['replica_rss_mib']:.0f} MiB in {p['processes']} processes vs "
              f"{n['replica_rss_mib']:.0f} MiB in {n['processes']} nodes ({share:.2f}×)")
    path = write_result("node_layout", {"machine": machine_info(), "settings": vars(args), "runs": runs,
                                        "qps_ratio_nodes_over_processes": ratios})
    print(f"\nwritten {path}")


if __name__ == "__main__":
    main()
