"""Query throughput and latency: in-process FAISS vs the gateway with 1, 2 and 4 shards.

    python -m benchmarks.query_latency            # full run (~5 min on 2 cores)
    python -m benchmarks.query_latency --quick    # smaller grid, shorter windows

Data: msmarco + dbpedia from ../shared/data (10k passages), MiniLM vectors from the embedding
cache, the 100 real queries as vectors. Baselines measured in the same run:
* in-process FAISS (one index over all 10k; c=1 one query per call, c>1 a batch of c per call);
* one direct HTTP hop to a shard server (to isolate the per-hop cost);
* the gateway without coalescing, and with aiohttp or httpx instead of our pooled client.
Load comes from benchmarks/loadgen.py in its own process; its CPU share is reported, as is the
CPU each process used per query (where the time goes). JSON: benchmarks/results/query_latency.json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import faiss
import httpx
import numpy as np

from benchmarks.common import (
    REPO,
    load_corpus,
    machine_busy_cpu_s,
    machine_info,
    percentiles_ms,
    process_cpu_s,
    scratch_dir,
    write_result,
)
from index_shards.build import BuildConfig, build_collection
from index_shards.faiss_index import build_index
from index_shards.ids import doc_int_ids
from retrieval.ir_metrics import overlap_at_k
from serving.encoding.settings import EncoderSettings
from serving.gateway.config import GatewayConfig
from serving.local.child import Child
from serving.local.launcher import LocalCluster
from serving.shardcall.fanout import FanOutSettings

VECTORS_ONLY = GatewayConfig(encoder=EncoderSettings(load=False))


def exact_top10(corpus) -> list[list[str]]:
    index = faiss.IndexFlatIP(corpus.vectors.shape[1])
    index.add(corpus.vectors)
    _, ids = index.search(corpus.query_vectors, 10)
    return [[corpus.doc_ids[i] for i in row] for row in ids]


def in_process(corpus, factory: str, concurrencies: list[int], duration_s: float, exact) -> dict[str, Any]:
    faiss.omp_set_num_threads(1)
    int_ids = doc_int_ids(corpus.doc_ids)
    by_int = dict(zip(int_ids.tolist(), corpus.doc_ids))
    index = build_index(corpus.vectors, int_ids, factory)
    _, ids = index.search(corpus.query_vectors, 10)
    recall = float(np.mean([overlap_at_k([by_int[i] for i in row], e, 10) for row, e in zip(ids, exact)]))
    queries = corpus.query_vectors
    rows = {}
    for concurrency in concurrencies:
        faiss.omp_set_num_threads(1 if concurrency == 1 else 2)  # a batch may use both cores
        latencies = []
        position = 0
        stop_at = time.perf_counter() + duration_s
        while time.perf_counter() < stop_at:
            batch = np.take(queries, range(position, position + concurrency), axis=0, mode="wrap")
            position += concurrency
            started = time.perf_counter()
            index.search(batch, 10)
            latencies.append(time.perf_counter() - started)
        elapsed = sum(latencies)
        rows[concurrency] = {"qps": len(latencies) * concurrency / elapsed, **percentiles_ms(latencies)}
    faiss.omp_set_num_threads(1)
    return {"recall_at_10": recall, "by_concurrency": rows}


def run_load(url: str, bodies_path: Path, concurrency: int, duration_s: float, pids: dict[str, int]) -> dict[str, Any]:
    cpu_before = {name: process_cpu_s(pid) for name, pid in pids.items()}
    busy_before = machine_busy_cpu_s()
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.loadgen", "--url", url, "--bodies", str(bodies_path),
         "--concurrency", str(concurrency), "--duration", str(duration_s), "--warmup", "1"],
        capture_output=True, text=True, cwd=REPO, check=True,
    )
    busy = machine_busy_cpu_s() - busy_before
    load = json.loads(result.stdout.strip().splitlines()[-1])
    requests = max(load["requests"], 1)
    cpu = {name: process_cpu_s(pid) - cpu_before[name] for name, pid in pids.items()}
    wall = load["wall_s"]
    load["cpu_ms_per_query"] = {name: 1000.0 * used * (load["requests"] / wall / max(load["qps"], 1e-9)) / requests
                                for name, used in cpu.items()}
    load["cpu_ms_per_query"]["loadgen"] = 1000.0 * load["loadgen_cpu_s"] / requests * (duration_s / wall)
    load["loadgen_cpu_share_of_busy"] = load["loadgen_cpu_s"] / busy if busy > 0 else None
    load["machine_busy_cores"] = busy / wall
    return load


def gateway_recall(url: str, corpus, exact) -> float:
    recalls = []
    with httpx.Client(timeout=30) as client:
        for vector, expected in zip(corpus.query_vectors, exact):
            hits = client.post(f"{url}/v1/query", json={"vector": vector.tolist(), "k": 10}).json()["hits"]
            recalls.append(overlap_at_k([h["doc_id"] for h in hits], expected, 10))
    return float(np.mean(recalls))


def cluster_pids(cluster: LocalCluster) -> dict[str, int]:
    return {child.name: child.process.pid for child in cluster.children() if child.process}


def summarise_pids(cpu: dict[str, float]) -> dict[str, float]:
    out = {"gateway": 0.0, "shards": 0.0, "loadgen": 0.0}
    for name, value in cpu.items():
        out["shards" if name.startswith("shard") else name] = out.get("shards" if name.startswith("shard") else name,
                                                                       0.0) + value
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=6.0, help="measured seconds per point (default 6)")
    parser.add_argument("--shards", default="1,2,4")
    parser.add_argument("--factories", default="Flat,HNSW32")
    parser.add_argument("--concurrency", default="1,8,32")
    parser.add_argument("--repeat", type=int, default=3,
                        help="trials of the headline point (most shards, highest concurrency); median reported")
    parser.add_argument("--quick", action="store_true", help="Flat only, 3 s windows")
    args = parser.parse_args()
    if args.quick:
        args.duration, args.factories = 3.0, "Flat"
    shard_counts = [int(x) for x in args.shards.split(",")]
    factories = args.factories.split(",")
    concurrencies = [int(x) for x in args.concurrency.split(",")]

    corpus = load_corpus()
    exact = exact_top10(corpus)
    work = scratch_dir("shardrag-bench-")
    bodies = work / "bodies.json"
    bodies.write_text(json.dumps([{"vector": v.tolist(), "k": 10} for v in corpus.query_vectors]))
    vectors_npy = work / "queries.npy"
    np.save(vectors_npy, corpus.query_vectors)
    results: dict[str, Any] = {"machine": machine_info(), "corpus_docs": len(corpus.doc_ids),
                               "queries": len(corpus.query_vectors), "duration_s": args.duration,
                               "in_process": {}, "gateway": [], "hop": {}, "variants": []}

    for factory in factories:
        print(f"in-process {factory} ...", file=sys.stderr, flush=True)
        results["in_process"][factory] = in_process(corpus, factory, concurrencies, args.duration, exact)

    def start(root: Path, collection: str, num_shards: int, gateway: GatewayConfig) -> LocalCluster:
        return LocalCluster(root, collection, replicas=1, gateway=gateway, workdir=work / f"{collection}-logs")

    for factory in factories:
        for num_shards in shard_counts:
            collection = f"bench-{factory.replace(',', '_')}-{num_shards}"
            build_collection(work / "root", corpus.documents, corpus.vectors, corpus.version,
                             BuildConfig(collection, num_shards, "hash", factory), show_progress=False)
            with start(work / "root", collection, num_shards, VECTORS_ONLY) as cluster:
                recall = gateway_recall(cluster.gateway_url, corpus, exact)
                if factory == factories[0] and num_shards == 1:
                    print("direct shard hop ...", file=sys.stderr, flush=True)
                    shard_url = cluster.shard_urls[0][0]
                    hop = run_load(f"{shard_url}/v1/search?k=10&version={corpus.version.id}", vectors_npy, 1,
                                   args.duration, cluster_pids(cluster))
                    results["hop"] = {"factory": factory, **hop}
                for concurrency in concurrencies:
                    print(f"gateway {factory} × {num_shards} shards, c={concurrency} ...", file=sys.stderr, flush=True)
                    headline = num_shards == max(shard_counts) and concurrency == max(concurrencies)
                    trials = [run_load(f"{cluster.gateway_url}/v1/query", bodies, concurrency, args.duration,
                                       cluster_pids(cluster)) for _ in range(args.repeat if headline else 1)]
                    trials.sort(key=lambda t: t["qps"])
                    load = trials[len(trials) // 2]  # the median trial
                    load["trials_qps"] = [t["qps"] for t in trials]
                    load["cpu_ms_per_query"] = summarise_pids(load["cpu_ms_per_query"])
                    results["gateway"].append({"factory": factory, "shards": num_shards, "concurrency": concurrency,
                                               "recall_at_10": recall, "transport": "pooled", "coalesce": True,
                                               **load})

    # Variants at 4 shards: no coalescing, and aiohttp / httpx for the gateway→shard hop (those
    # run as a second gateway process, benchmarks/transports.py, next to the cluster's own).
    largest = max(shard_counts)
    collection = f"bench-{factories[0].replace(',', '_')}-{largest}"
    no_coalescing = GatewayConfig(encoder=EncoderSettings(load=False), calls=FanOutSettings(coalesce=False))
    for label, gateway, client in (("no coalescing", no_coalescing, None),
                                   ("aiohttp transport", VECTORS_ONLY, "aiohttp"),
                                   ("httpx transport", VECTORS_ONLY, "httpx"),
                                   ("httpx, no coalescing", no_coalescing, "httpx")):
        with start(work / "root", collection, largest, gateway) as cluster:
            url, pids, other = cluster.gateway_url, cluster_pids(cluster), None
            if client is not None:
                other = Child(f"gateway-{client}", lambda port, c=client: [
                    sys.executable, "-m", "benchmarks.transports", "--client", c, "--cluster",
                    str(cluster.workdir / "cluster.json"), "--port", str(port)], work / f"gateway-{client}.log")
                other.start(dict(cluster.gateway_env))
                url = str(other.wait_ready(time.monotonic() + 120)["url"])
                assert other.process is not None
                pids = {**{n: p for n, p in pids.items() if n != "gateway"}, "gateway": other.process.pid}
            try:
                for concurrency in (1, max(concurrencies)):
                    print(f"variant {label}, c={concurrency} ...", file=sys.stderr, flush=True)
                    load = run_load(f"{url}/v1/query", bodies, concurrency, args.duration, pids)
                    load["cpu_ms_per_query"] = summarise_pids(load["cpu_ms_per_query"])
                    results["variants"].append({"variant": label, "factory": factories[0], "shards": largest,
                                                "concurrency": concurrency, **load})
            finally:
                if other is not None:
                    other.stop()

    written = write_result("query_latency", results)  # first: a report that fails loses no data
    report(results)
    print(f"\nwrote {written}")


def report(results: dict[str, Any]) -> None:
    print("\n== in-process FAISS (one index, 10k vectors) ==")
    print(f"{'factory':8} {'c':>3} {'QPS':>9} {'p50 ms':>8} {'p99 ms':>8} {'recall@10':>9}")
    for factory, data in results["in_process"].items():
        for concurrency, row in data["by_concurrency"].items():
            print(f"{factory:8} {concurrency:>3} {row['qps']:9.0f} {row['p50_ms']:8.3f} {row['p99_ms']:8.3f} "
                  f"{data['recall_at_10']:9.3f}")
    hop = results["hop"]
    base = results["in_process"][hop["factory"]]["by_concurrency"] if hop else {}
    base_c1 = base.get(1) or base.get("1")
    if hop and base_c1:  # measured only when the run includes 1 shard and c=1
        print(f"\nadded p50 of one HTTP hop (client → shard server, c=1): {hop['p50_ms'] - base_c1['p50_ms']:.3f} ms "
              f"(direct {hop['p50_ms']:.3f} ms vs in-process {base_c1['p50_ms']:.3f} ms)")
    print("\n== gateway (vector queries, 1 replica per shard, pooled transport + coalescing) ==")
    print(f"{'factory':8} {'shards':>6} {'c':>3} {'QPS':>7} {'p50 ms':>8} {'p99 ms':>8} {'QPS ratio':>9} "
          f"{'p50 ratio':>9} {'recall':>6} {'errors':>6} {'loadgen CPU':>11} {'CPU ms/q gw/shards/lg':>22}")
    for row in results["gateway"]:
        reference = results["in_process"][row["factory"]]["by_concurrency"]
        ref = reference.get(row["concurrency"]) or reference.get(str(row["concurrency"]))
        cpu = row["cpu_ms_per_query"]
        print(f"{row['factory']:8} {row['shards']:>6} {row['concurrency']:>3} {row['qps']:7.0f} {row['p50_ms']:8.2f} "
              f"{row['p99_ms']:8.2f} {row['qps'] / ref['qps']:9.3f} {row['p50_ms'] / ref['p50_ms']:9.1f} "
              f"{row['recall_at_10']:6.3f} {row['errors']['count']:>6} "
              f"{row['loadgen_cpu_share_of_busy'] or 0:11.0%} "
              f"{cpu['gateway']:7.3f}/{cpu['shards']:6.3f}/{cpu['loadgen']:6.3f}"
              + (f"  (median of {len(row['trials_qps'])}: {', '.join(f'{q:.0f}' for q in row['trials_qps'])})"
                 if len(row["trials_qps"]) > 1 else ""))
    print("\n== variants (ratios against the default gateway at the same shards and concurrency) ==")
    default = {(r["shards"], r["concurrency"], r["factory"]): r for r in results["gateway"]}
    for row in results["variants"]:
        ref = default.get((row["shards"], row["concurrency"], row["factory"]))
        ratio = f"QPS ×{row['qps'] / ref['qps']:.2f}, p50 ×{row['p50_ms'] / ref['p50_ms']:.2f}" if ref else ""
        print(f"{row['variant']:22} shards={row['shards']} c={row['concurrency']:>2}: {row['qps']:6.0f} QPS, "
              f"p50 {row['p50_ms']:.2f} ms, p99 {row['p99_ms']:.2f} ms  ({ratio})")


if __name__ == "__main__":
    main()
