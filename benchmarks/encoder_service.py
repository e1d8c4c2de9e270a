"""Text queries through the gateway's encoder service vs the same MiniLM in this process.

    python -m benchmarks.encoder_service            # ~6 min on 2 cores
    python -m benchmarks.encoder_service --quick    # shorter windows, fewer variants

Data: msmarco + dbpedia (10k passages, MiniLM vectors from the embedding cache), 4 shards (Flat,
hash) × 1 replica on 127.0.0.1, the 100 real queries sent as *text*. Baselines measured in this
run, in this process, before any cluster starts:
* the encoder's ceiling: batches of 32 queries, back to back (queries/s);
* one query at a time: encode, and encode + exact search over all 10k in one FAISS index (p50).
Gateway variants (the embedding cache off but in the last, so every query is encoded): ``thread``
(the encoder on a thread of the gateway process, as before the encoder service), ``process-1w``
(one worker process on every core), ``process`` (the default: one single-threaded worker per
core, batches wait up to 1 ms to fill while another is in flight), ``process-nowait`` (natural
batching only), ``default-cached`` (the defaults, cache on), ``process-onnx`` (the defaults on
ONNX Runtime: ``encoder.runtime onnx``). Each
at c = 1 / 8 / 32, closed loop (benchmarks/loadgen.py in its own process), with the CPU each
process used per query; for ``thread``, ``process`` and ``process-onnx`` also c=1 interleaved query by query with
the in-process encode + search (the machine's drift cancels out). JSON:
benchmarks/results/encoder_service.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import faiss

from benchmarks.common import (
    load_corpus,
    machine_info,
    percentiles_ms,
    query_texts,
    scratch_dir,
    write_result,
)
from benchmarks.query_latency import cluster_pids, run_load
from index_shards.build import BuildConfig, build_collection
from retrieval.encoders import load_encoder
from serving.encoding.settings import EncoderSettings
from serving.gateway.config import GatewayConfig
from serving.local.launcher import LocalCluster


def in_process(corpus: Any, texts: list[str], duration_s: float) -> dict[str, Any]:
    """The encoder in this process with torch on every core and on one thread; the better of
    the two is the baseline (a lone query is as fast on one thread here, a batch faster on all)."""
    import torch

    rows = {}
    for threads in sorted({len(os.sched_getaffinity(0)), 1}, reverse=True):
        torch.set_num_threads(threads)
        rows[threads] = in_process_at(corpus, texts, duration_s)
    best_ceiling = max(rows.values(), key=lambda r: r["batch32_ceiling_qps"])
    best_single = min(rows.values(), key=lambda r: r["encode_search"]["p50_ms"])
    return {"by_threads": rows, "batch32_ceiling_qps": best_ceiling["batch32_ceiling_qps"],
            "one_at_a_time_qps": best_single["one_at_a_time_qps"], "encode": best_single["encode"],
            "encode_search": best_single["encode_search"],
            "ceiling_threads": best_ceiling["threads"], "single_threads": best_single["threads"]}


def ceiling_qps(encoder: Any, texts: list[str], duration_s: float) -> float:
    """Batches of 32 queries back to back: the encoder's throughput ceiling, queries/s."""
    batches, started = 0, time.perf_counter()
    while time.perf_counter() - started < duration_s:
        start = (batches * 32) % len(texts)
        encoder.encode_queries((texts + texts)[start:start + 32])
        batches += 1
    return batches * 32 / (time.perf_counter() - started)


def in_process_at(corpus: Any, texts: list[str], duration_s: float) -> dict[str, Any]:
    import torch

    encoder = load_encoder(None, device="cpu")
    encoder.encode_queries(texts[:32])  # warm up
    ceiling = ceiling_qps(encoder, texts, duration_s)
    faiss.omp_set_num_threads(1)
    index = faiss.IndexFlatIP(corpus.vectors.shape[1])
    index.add(corpus.vectors)
    encode_only, encode_search = [], []
    for round_ in range(2):
        for text in texts:
            began = time.perf_counter()
            vector = encoder.encode_queries([text])
            encoded = time.perf_counter()
            index.search(vector, 10)
            if round_:  # the first round warms up
                encode_only.append(encoded - began)
                encode_search.append(time.perf_counter() - began)
    return {"batch32_ceiling_qps": ceiling, "one_at_a_time_qps": len(encode_only) / sum(encode_only),
            "encode": percentiles_ms(encode_only), "encode_search": percentiles_ms(encode_search),
            "threads": torch.get_num_threads()}


def interleaved_c1(url: str, corpus: Any, texts: list[str]) -> dict[str, float]:
    """c=1 without the machine's drift: for each query, encode + search in this process (one
    thread), then the same text through the gateway, then its vector through the gateway; medians
    of the second round. Separates the encoder service's cost from the vector path's."""
    import httpx
    import numpy as np
    import torch

    torch.set_num_threads(1)
    faiss.omp_set_num_threads(1)
    encoder = load_encoder(None, device="cpu")
    index = faiss.IndexFlatIP(corpus.vectors.shape[1])
    index.add(corpus.vectors)
    rows = []
    with httpx.Client(base_url=url, timeout=30) as client:
        for round_ in range(2):
            for text in texts:
                began = time.perf_counter()
                vector = encoder.encode_queries([text])
                index.search(vector, 10)
                local = time.perf_counter()
                answer = client.post("/v1/query", json={"text": text, "k": 10}).json()
                through_text = time.perf_counter()
                client.post("/v1/query", json={"vector": vector[0].tolist(), "k": 10}).raise_for_status()
                through_vector = time.perf_counter()
                if round_:
                    rows.append((local - began, through_text - local, answer["diagnostics"]["encode_ms"] / 1000,
                                 through_vector - through_text))
    medians = np.median(np.array(rows), axis=0) * 1000.0
    return {"in_process_encode_search_ms": float(medians[0]), "text_query_ms": float(medians[1]),
            "gateway_encode_ms": float(medians[2]), "vector_query_ms": float(medians[3]),
            "ratio": float(medians[1] / medians[0])}


def child_pids(pid: int) -> list[int]:
    children: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            children += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return children


def measure(cluster: LocalCluster, bodies: Path, concurrencies: list[int], duration_s: float) -> list[dict[str, Any]]:
    pids = cluster_pids(cluster)
    for n, child in enumerate(child_pids(pids["gateway"])):
        pids[f"encoder-worker-{n}"] = child
    rows = []
    for concurrency in concurrencies:
        print(f"  c={concurrency} ...", file=sys.stderr, flush=True)
        load = run_load(f"{cluster.gateway_url}/v1/query", bodies, concurrency, duration_s, pids)
        cpu = load.pop("cpu_ms_per_query")
        grouped: dict[str, float] = {}
        for name, value in cpu.items():
            group = "shards" if name.startswith("shard") else "encoder_workers" if name.startswith("encoder") else name
            grouped[group] = grouped.get(group, 0.0) + value
        rows.append({"concurrency": concurrency, "qps": load["qps"], "p50_ms": load["p50_ms"],
                     "p99_ms": load["p99_ms"], "errors": load["errors"], "cpu_ms_per_query": grouped,
                     "machine_busy_cores": load["machine_busy_cores"]})
    return rows


VARIANTS: dict[str, EncoderSettings] = {
    "thread": EncoderSettings(backend="thread", cache_size=0),  # the encoder on a gateway thread
    "process-1w": EncoderSettings(backend="process", workers=1, threads=0, cache_size=0),  # on every core
    "process": EncoderSettings(backend="process", cache_size=0),  # the default: a 1-thread worker per core
    "process-nowait": EncoderSettings(backend="process", cache_size=0, max_wait_ms=0.0),  # natural batching only
    "default-cached": EncoderSettings(),  # the defaults, the (version, text) cache on
    # the default workers on ONNX Runtime (the same embedding version; exported on first use)
    "process-onnx": EncoderSettings(backend="process", cache_size=0, runtime="onnx"),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=6.0, help="measured seconds per point (default 6)")
    parser.add_argument("--concurrency", default="1,8,32")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated, from: "
                        + ", ".join(VARIANTS))
    parser.add_argument("--quick", action="store_true", help="3 s windows; thread vs process only")
    args = parser.parse_args()
    names = [n for n in args.variants.split(",") if n]
    if args.quick:
        args.duration, names = 3.0, ["thread", "process"]
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        parser.error(f"unknown variants {unknown}; choose from {list(VARIANTS)}")
    concurrencies = [int(c) for c in args.concurrency.split(",")]

    corpus = load_corpus()
    texts = query_texts()
    print("in-process baselines ...", file=sys.stderr, flush=True)
    baseline = in_process(corpus, texts, args.duration)
    work = scratch_dir("shardrag-encbench-")
    build_collection(work / "root", corpus.documents, corpus.vectors, corpus.version,
                     BuildConfig("enc", 4, "hash", "Flat"), show_progress=False)
    bodies = work / "bodies.json"
    bodies.write_text(json.dumps([{"text": t, "k": 10} for t in texts]))
    results: dict[str, Any] = {"machine": machine_info(), "corpus_docs": len(corpus.doc_ids), "shards": 4,
                               "factory": "Flat", "queries": len(texts), "duration_s": args.duration,
                               "in_process": baseline, "variants": {}}
    import torch

    reference = load_encoder(None, device="cpu")
    for name in names:
        print(f"gateway, {name} ...", file=sys.stderr, flush=True)
        gateway = GatewayConfig(encoder=VARIANTS[name])
        with LocalCluster(work / "root", "enc", replicas=1, gateway=gateway, workdir=work / "logs") as cluster:
            # The ceiling again, next to this variant (the cluster idle): this machine's speed drifts
            # by tens of percent within minutes, so each variant's ratio uses its own.
            torch.set_num_threads(baseline["ceiling_threads"])
            results.setdefault("ceiling_next_to", {})[name] = ceiling_qps(reference, texts, args.duration)
            results["variants"][name] = measure(cluster, bodies, concurrencies, args.duration)
            if name in ("thread", "process", "process-onnx"):
                print("  c=1 interleaved with in-process ...", file=sys.stderr, flush=True)
                results.setdefault("interleaved_c1", {})[name] = interleaved_c1(cluster.gateway_url, corpus, texts)
    results["summary"] = summarise(results)
    written = write_result("encoder_service", results)
    print("\n".join(results["summary"]))
    print(f"\nwrote {written}")


def summarise(results: dict[str, Any]) -> list[str]:
    base = results["in_process"]
    lines = [f"in-process MiniLM: batch-32 ceiling {base['batch32_ceiling_qps']:.0f} queries/s "
             f"({base['ceiling_threads']} threads); one at a time ({base['single_threads']} thread(s)) "
             f"{base['one_at_a_time_qps']:.0f}/s, "
             f"encode p50 {base['encode']['p50_ms']:.2f} ms, "
             f"encode + search p50 {base['encode_search']['p50_ms']:.2f} ms"]
    for name, row in results.get("interleaved_c1", {}).items():
        lines.append(f"c=1 interleaved, {name}: text query p50 {row['text_query_ms']:.2f} ms vs in-process encode + "
                     f"search {row['in_process_encode_search_ms']:.2f} ms (x{row['ratio']:.2f}); the gateway's "
                     f"encode {row['gateway_encode_ms']:.2f} ms, the same vector alone {row['vector_query_ms']:.2f} ms")
    for name, rows in results["variants"].items():
        ceiling = results["ceiling_next_to"][name]
        for row in rows:
            cpu = ", ".join(f"{k} {v:.2f}" for k, v in row["cpu_ms_per_query"].items())
            ratio = (f"x{row['qps'] / ceiling:.2f} of the ceiling measured next to it ({ceiling:.0f}/s)"
                     if row["concurrency"] > 1
                     else f"p50 x{row['p50_ms'] / base['encode_search']['p50_ms']:.2f} of in-process encode + search")
            lines.append(f"{name:18s} c={row['concurrency']:<3d} {row['qps']:7.1f} QPS  "
                         f"p50 {row['p50_ms']:6.2f} ms  p99 {row['p99_ms']:6.2f} ms  errors {row['errors']['count']}  "
                         f"({ratio}; CPU ms/query: {cpu})")
    return lines


if __name__ == "__main__":
    main()
