"""Where one vector query's time goes (issue 14, part 2): a per-hop profile at c=1.

    python -m benchmarks.query_profile                      # Flat and HNSW32, 1 and 4 shards
    python -m benchmarks.query_profile --factories Flat --shards 4 --queries 1000

One query at a time, over a keep-alive connection (``http.client``: the cheapest client there
is, so the client's own cost stays out of the figures), the 100 real queries as vectors, k=10.
Every layer is measured in the same run, and each query's answer carries the gateway's and the
shards' own timings (``diagnostics``), so the medians split the round trip into:

* **FAISS** — the index alone, in this process, on one shard's slice (one thread);
* **shard search** — the replica's whole search (FAISS + records), as it reports (``server_ms``);
* **gateway → shard hop** — the gateway's timing of the shard call minus the replica's search:
  request writing, the shard server's HTTP handling, reply parsing;
* **fan-out** — from the first shard call sent to the merged top k, minus the slowest shard call:
  the coalescer, task wake-ups, the wait for the other shards, the merge;
* **gateway** — the query handler's own work (validation, snapshot, response dict);
* **client ↔ gateway** — the round trip minus the handler: the HTTP server, JSON in and out.

The direct shard hop (the same client straight to one shard) is measured too. Ratios are
against the fastest layer that has to be there (FAISS). JSON: benchmarks/results/query_profile.json.
"""

from __future__ import annotations

import argparse
import http.client
import os
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import faiss
import numpy as np
import orjson

from benchmarks.common import load_corpus, machine_busy_cpu_s, machine_info, process_cpu_s, scratch_dir, write_result
from index_shards.build import BuildConfig, build_collection
from retrieval.wire import encode_vectors
from serving.encoding.settings import EncoderSettings
from serving.gateway.config import GatewayConfig
from serving.local.launcher import LocalCluster

VECTORS_ONLY = GatewayConfig(encoder=EncoderSettings(load=False))


def median(values: list[float]) -> float:
    return float(np.median(values)) if values else float("nan")


def faiss_alone(index_path: Path, queries: np.ndarray, rounds: int) -> list[float]:
    """Per-query seconds of the shard's index searched in this process, one thread."""
    faiss.omp_set_num_threads(1)
    index = faiss.read_index(str(index_path))
    times = []
    for i in range(rounds):
        row = queries[i % len(queries)][None, :]
        started = time.perf_counter()
        index.search(row, 10)
        times.append(time.perf_counter() - started)
    return times


class Connection:
    """One keep-alive HTTP/1.1 connection, timed per request."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)

    def post(self, path: str, body: bytes, content_type: str) -> tuple[float, bytes]:
        started = time.perf_counter()
        self.conn.request("POST", path, body=body, headers={"content-type": content_type})
        response = self.conn.getresponse()
        payload = response.read()
        elapsed = time.perf_counter() - started
        if response.status != 200:
            raise RuntimeError(f"{path}: HTTP {response.status}: {payload[:300]!r}")
        return elapsed, payload

    def close(self) -> None:
        self.conn.close()


def direct_shard(url: str, version: str, queries: np.ndarray, rounds: int) -> dict[str, float]:
    conn = Connection(url)
    bodies = [encode_vectors(q[None, :]) for q in queries]
    rtt, server = [], []
    try:
        for i in range(rounds + 50):
            elapsed, payload = conn.post(f"/v1/search?k=10&version={version}", bodies[i % len(bodies)],
                                         "application/octet-stream")
            if i >= 50:  # warm-up
                rtt.append(elapsed * 1000.0)
                server.append(orjson.loads(payload)["took_ms"])
    finally:
        conn.close()
    return {"rtt_ms": median(rtt), "server_ms": median(server),
            "hop_ms": median([a - b for a, b in zip(rtt, server)])}


def through_gateway(url: str, queries: np.ndarray, rounds: int) -> dict[str, Any]:
    conn = Connection(url)
    bodies = [orjson.dumps({"vector": q.tolist(), "k": 10}) for q in queries]
    rows: dict[str, list[float]] = {name: [] for name in (
        "rtt_ms", "client_gateway_ms", "gateway_ms", "fanout_overhead_ms", "hop_ms", "shard_search_ms",
        "slowest_call_ms", "median_call_ms", "fanout_ms", "took_ms")}
    try:
        for i in range(rounds + 50):
            elapsed, payload = conn.post("/v1/query", bodies[i % len(bodies)], "application/json")
            if i < 50:
                continue
            diagnostics = orjson.loads(payload)["diagnostics"]
            calls = diagnostics["per_shard"]
            slowest = max(calls, key=lambda c: c["latency_ms"])
            rtt = elapsed * 1000.0
            rows["rtt_ms"].append(rtt)
            rows["took_ms"].append(diagnostics["took_ms"])
            rows["fanout_ms"].append(diagnostics["fanout_ms"])
            rows["client_gateway_ms"].append(rtt - diagnostics["took_ms"])
            rows["gateway_ms"].append(diagnostics["took_ms"] - diagnostics["fanout_ms"] - diagnostics["encode_ms"])
            rows["fanout_overhead_ms"].append(diagnostics["fanout_ms"] - slowest["latency_ms"])
            rows["hop_ms"].append(slowest["latency_ms"] - slowest["server_ms"])
            rows["shard_search_ms"].append(slowest["server_ms"])
            rows["slowest_call_ms"].append(slowest["latency_ms"])
            rows["median_call_ms"].append(float(np.median([c["latency_ms"] for c in calls])))
    finally:
        conn.close()
    out: dict[str, Any] = {name: median(values) for name, values in rows.items()}
    out["p99_rtt_ms"] = float(np.percentile(rows["rtt_ms"], 99))
    out["qps"] = 1000.0 / float(np.mean(rows["rtt_ms"]))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--factories", default="Flat,HNSW32", help="FAISS factories, comma-separated")
    parser.add_argument("--shards", default="1,4", help="shard counts, comma-separated (default 1,4)")
    parser.add_argument("--queries", type=int, default=2000, help="measured queries per point (default 2000)")
    parser.add_argument("--name", default="query_profile", help="results file name (benchmarks/results/NAME.json)")
    args = parser.parse_args()
    factories = args.factories.split(",")
    shard_counts = [int(x) for x in args.shards.split(",")]

    corpus = load_corpus()
    queries = corpus.query_vectors
    work = scratch_dir("shardrag-profile-")
    results: dict[str, Any] = {"machine": machine_info(), "corpus_docs": len(corpus.doc_ids),
                               "queries_measured": args.queries, "points": []}
    for factory in factories:
        for num_shards in shard_counts:
            collection = f"profile-{factory.replace(',', '_')}-{num_shards}"
            build_collection(work / "root", corpus.documents, corpus.vectors, corpus.version,
                             BuildConfig(collection, num_shards, "hash", factory), show_progress=False)
            index_path = work / "root" / collection / corpus.version.id / "shard-0" / "index.faiss"
            print(f"{factory} × {num_shards} shards ...", file=sys.stderr, flush=True)
            faiss_ms = median([t * 1000.0 for t in faiss_alone(index_path, queries, args.queries)])
            with LocalCluster(work / "root", collection, replicas=1, gateway=VECTORS_ONLY,
                              workdir=work / f"{collection}-logs") as cluster:
                direct = direct_shard(cluster.shard_urls[0][0], corpus.version.id, queries, args.queries)
                pids = {child.name: child.process.pid for child in cluster.children() if child.process}
                cpu_before = {name: process_cpu_s(pid) for name, pid in pids.items()}
                busy_before, wall_before = machine_busy_cpu_s(), time.perf_counter()
                gateway = through_gateway(cluster.gateway_url, queries, args.queries)
                measured = args.queries + 50  # the warm-up queries ran inside the CPU window too
                gateway["cpu_ms_per_query"] = {
                    "gateway": (process_cpu_s(pids["gateway"]) - cpu_before["gateway"]) * 1000.0 / measured,
                    "shards": sum(process_cpu_s(pid) - cpu_before[name] for name, pid in pids.items()
                                  if name.startswith("shard")) * 1000.0 / measured,
                    "machine": (machine_busy_cpu_s() - busy_before) * 1000.0 / measured}
                gateway["wall_ms_per_query"] = (time.perf_counter() - wall_before) * 1000.0 / measured
            results["points"].append({"factory": factory, "shards": num_shards, "faiss_ms": faiss_ms,
                                      "direct_shard": direct, "gateway": gateway})
            written = write_result(args.name, results)  # after every point: a crash loses nothing measured
    report(results)
    print(f"\nwrote {written}")


LAYERS = (("client ↔ gateway (HTTP server, JSON in/out)", "client_gateway_ms"),
          ("gateway handler (validate, snapshot, response)", "gateway_ms"),
          ("fan-out (coalescer, wake-ups, other shards, merge)", "fanout_overhead_ms"),
          ("gateway → shard hop (slowest shard)", "hop_ms"),
          ("shard search (slowest shard, as reported)", "shard_search_ms"))


def report(results: dict[str, Any]) -> None:
    for point in results["points"]:
        gateway, direct = point["gateway"], point["direct_shard"]
        print(f"\n== {point['factory']} × {point['shards']} shards, c=1: p50 {gateway['rtt_ms']:.3f} ms "
              f"(p99 {gateway['p99_rtt_ms']:.3f} ms, {gateway['qps']:.0f} QPS) ==")
        for label, key in LAYERS:
            share = gateway[key] / gateway["rtt_ms"]
            print(f"  {label:52} {gateway[key]:7.3f} ms  {share:5.0%}")
        print(f"  {'(sum of the medians)':52} {sum(gateway[k] for _, k in LAYERS):7.3f} ms")
        print(f"  slowest shard call {gateway['slowest_call_ms']:.3f} ms vs the median shard call "
              f"{gateway['median_call_ms']:.3f} ms (×{gateway['slowest_call_ms'] / gateway['median_call_ms']:.2f})")
        print(f"  FAISS alone on one shard's slice: {point['faiss_ms']:.3f} ms; the round trip is "
              f"×{gateway['rtt_ms'] / point['faiss_ms']:.1f} of it")
        cpu = gateway["cpu_ms_per_query"]
        print(f"  CPU per query: gateway {cpu['gateway']:.3f} ms, shard processes {cpu['shards']:.3f} ms, "
              f"whole machine {cpu['machine']:.3f} ms (client included) in {gateway['wall_ms_per_query']:.3f} ms "
              f"of wall: {cpu['machine'] / gateway['wall_ms_per_query']:.2f} of {os.cpu_count()} cores busy")
        print(f"  direct to one shard: {direct['rtt_ms']:.3f} ms = search {direct['server_ms']:.3f} + hop "
              f"{direct['hop_ms']:.3f} ms")


if __name__ == "__main__":
    main()
