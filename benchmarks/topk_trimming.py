"""Per-shard top-k trimming at k=100: the bytes each query moves from the shards and the time it
takes, trimmed (the default) vs the full-k fan-out (``exact: true``), at 4 and 8 shards.

    python -m benchmarks.topk_trimming            # ~3 min on 2 cores
    python -m benchmarks.topk_trimming --quick

Data: msmarco + dbpedia from ../shared/data (10k passages, MiniLM vectors), Flat shards, one
replica each, the 100 real queries as vectors, hits with their titles and texts (what a RAG
caller asks for). Shard reply bytes are measured by sending each query's shard calls directly
to one replica with the k the gateway used (k' for the first round, k for a second round);
latency and QPS come from benchmarks/loadgen.py against the gateway, closed loop at c=1 and c=8,
trimmed and exact alternating. JSON: benchmarks/results/topk_trimming.json.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from benchmarks.common import closed_loop as common_closed_loop
from benchmarks.common import load_corpus, machine_info, write_result
from index_shards.build import BuildConfig, build_collection
from serving.local.launcher import LocalCluster
from serving.shardcall.fanout import trimmed_k

K = 100


def closed_loop(url: str, bodies: list[dict], work: Path, concurrency: int, duration_s: float) -> dict[str, Any]:
    summary = common_closed_loop(url, bodies, work, concurrency, duration_s)
    return {key: summary[key] for key in ("qps", "p50_ms", "p99_ms")}


def shard_bytes(cluster: LocalCluster, client: httpx.Client, queries: np.ndarray, shards: int) -> dict[str, Any]:
    """Bytes of shard replies per query, trimmed (as the gateway asked: k' per shard, k again for
    the shards of a second round) and exact (k per shard)."""
    replicas = [row[0] for row in cluster.shard_urls]
    trimmed, exact, second = [], [], 0
    with httpx.Client(timeout=30) as direct:  # the local cluster runs without an internal token
        def reply_bytes(shard: int, query: np.ndarray, k: int) -> int:
            response = direct.post(f"{replicas[shard]}/v1/search", params={"k": k},
                                   content=query.astype("<f4").tobytes())
            response.raise_for_status()
            return len(response.content)

        for query in queries:
            answer = client.post("/v1/query", json={"vector": query.tolist(), "k": K}).json()
            asked, again = answer["diagnostics"]["shard_k"], answer["diagnostics"]["second_round"]
            second += len(again)
            trimmed.append(sum(reply_bytes(s, query, asked) for s in range(shards))
                           + sum(reply_bytes(s, query, K) for s in again))
            exact.append(sum(reply_bytes(s, query, K) for s in range(shards)))
    return {"shard_k": trimmed_k(K, shards, 0.9999), "second_round_calls": second,
            "trimmed_bytes_per_query": round(float(np.mean(trimmed))), "exact_bytes_per_query":
            round(float(np.mean(exact))), "bytes_ratio": round(float(np.mean(trimmed) / np.mean(exact)), 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="4 shards only, shorter windows")
    args = parser.parse_args()
    duration = 3.0 if args.quick else 6.0
    corpus = load_corpus()
    result: dict[str, Any] = {"machine": machine_info(), "k": K, "data": "msmarco + dbpedia, 10k MiniLM vectors, Flat"}
    lines = []
    for shards in (4,) if args.quick else (4, 8):
        with tempfile.TemporaryDirectory() as scratch:
            work = Path(scratch)
            build_collection(work / "root", corpus.documents, corpus.vectors, corpus.version,
                             BuildConfig("trim", shards), show_progress=False)
            with LocalCluster(work / "root", "trim", replicas=1, workdir=work / "run") as cluster, \
                    httpx.Client(base_url=cluster.gateway_url, timeout=30) as client:
                row: dict[str, Any] = shard_bytes(cluster, client, corpus.query_vectors, shards)
                bodies = [{"vector": q.tolist(), "k": K} for q in corpus.query_vectors]
                for concurrency in (1, 8):
                    runs: dict[str, list[dict[str, Any]]] = {"trimmed": [], "exact": []}
                    for _ in range(2):  # alternating pairs
                        runs["trimmed"].append(closed_loop(cluster.gateway_url, bodies, work, concurrency, duration))
                        runs["exact"].append(closed_loop(cluster.gateway_url, [{**b, "exact": True} for b in bodies],
                                                         work, concurrency, duration))
                    for name, trials in runs.items():
                        row[f"{name}_c{concurrency}"] = {key: float(np.median([t[key] for t in trials]))
                                                         for key in ("qps", "p50_ms", "p99_ms")}
            result[f"{shards}_shards"] = row
            print(shards, json.dumps(row), flush=True)
            line = (f"{shards} shards, k={K}: each shard asked for {row['shard_k']} "
                    f"({row['second_round_calls']} second-round calls over 100 queries); shard reply bytes per query "
                    f"{row['trimmed_bytes_per_query']:,} vs {row['exact_bytes_per_query']:,} exact "
                    f"(x{row['bytes_ratio']:.2f})")
            for concurrency in (1, 8):
                t, e = row[f"trimmed_c{concurrency}"], row[f"exact_c{concurrency}"]
                line += (f"; c={concurrency}: {t['qps']:.0f} vs {e['qps']:.0f} QPS (x{t['qps'] / e['qps']:.2f}), "
                         f"p50 {t['p50_ms']:.2f} vs {e['p50_ms']:.2f} ms (x{t['p50_ms'] / e['p50_ms']:.2f})")
            lines.append(line)
    result["summary"] = lines
    print("\n".join(lines))
    print(write_result("topk_trimming", result))


if __name__ == "__main__":
    main()
