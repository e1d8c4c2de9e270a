"""Scale: 100k and 1M vectors over 4 shards × 2 replicas — build, memory, QPS, recall.

    python -m benchmarks.scale                                  # 100k and 1M; Flat, HNSW32, IVF-PQ
    python -m benchmarks.scale --sizes 100000 --factories Flat  # one cell
    python -m benchmarks.scale --sizes 1000000 --factories IVF-PQ-refine --out scale_1m_ivfpq_refine
    python -m benchmarks.scale --sizes 5000000 --factory 'IVF2048,PQ96x4fs,Refine(SQ8)' --out scale_5m_ivfpq_refine

The generator (deterministic, seed 0). The 10k real MiniLM passage vectors (msmarco + dbpedia,
through the embedding cache) are clustered with FAISS k-means into 256 clusters. Each synthetic
vector picks a cluster with probability equal to that cluster's share of the real vectors and is
drawn from a Gaussian with the cluster's mean and its empirical covariance (x = mean + z·D/√(n−1),
z ~ N(0, I_n), D the cluster's centred members: a Gaussian mixture fitted to the real vectors,
full covariance, so the synthetic points spread along the directions the real ones do), plus an
isotropic floor of 0.1× the real vectors' median per-dimension std, and is normalised. (A first
version drew each dimension independently — a diagonal mixture — which spreads points evenly in
all 384 dimensions, far harder for any ANN index than real embeddings: at 1M, HNSW32 reached
recall@10 0.892 at ef_search 1024.) The
10k real vectors themselves are the first 10k of every corpus and the 100 real queries are the
queries, so every query keeps its real neighbours and competes with synthetic ones. Exact top-10
ground truth (inner product over every vector) is computed once per size and cached under
~/.cache/shardrag/scale/.

Per factory and size: build time (all 4 shards: train, add, doc store, manifests), index bytes,
replica memory (RSS, and PSS — RSS counts a shared page once per process, PSS splits it, so PSS
is what two replicas really cost), QPS and p50/p99 at c=1 and c=32 through the gateway (vector
queries, closed loop, benchmarks/loadgen.py), and recall@10 through the gateway. Approximate
factories are tuned first (index_shards.tuning, on half of the real queries, target --recall;
the other half is held out) and served with the chosen nprobe / ef_search from search.json.
JSON: benchmarks/results/scale.json.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import faiss
import httpx
import numpy as np

from benchmarks.common import load_corpus, machine_info, write_result
from benchmarks.query_latency import VECTORS_ONLY, run_load
from index_shards.build import BuildConfig, build_collection
from index_shards.ids import doc_int_ids
from index_shards.layout import INDEX_FILE, resolve_version, shard_dir
from index_shards.search_defaults import SearchDefaults, write_search_defaults
from index_shards.synthetic import synthesize
from index_shards.tuning import ShardTask, evaluate_shard
from retrieval.tuning_choice import choose
from retrieval.types import Document
from serving.local.launcher import LocalCluster

CACHE = Path.home() / ".cache" / "shardrag" / "scale"
GENERATOR = "fullcov1"  # part of the ground-truth cache key: a new generator never reuses old answers
SHARDS, REPLICAS = 4, 2


def ground_truth(vectors: np.ndarray, queries: np.ndarray, key: str) -> np.ndarray:
    """Exact top-10 row numbers per query, computed once and cached."""
    path = CACHE / f"gt-{key}.npy"
    if path.exists():
        return np.load(path)
    # brute force straight over the array: an IndexFlatIP would copy it (7.7 GB at 5M)
    _, rows = faiss.knn(queries, vectors, 10, metric=faiss.METRIC_INNER_PRODUCT)
    CACHE.mkdir(parents=True, exist_ok=True)
    np.save(path, rows)
    return rows


def memory_of(pid: int) -> dict[str, int]:
    """Rss, Pss, Pss_Anon (bytes, smaps_rollup) and Pss_Index: the PSS of the process's mappings of
    an index.faiss file (its mmap'ed vectors, split between the processes sharing them)."""
    out = {"Pss_Index": 0}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name in ("Rss", "Pss", "Pss_Anon", "Pss_File"):
            out[name] = int(rest.split()[0]) * 1024
    in_index = False
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        fields = line.split()
        if fields and not fields[0].endswith(":"):  # a mapping's header line: address perms offset dev inode path
            in_index = len(fields) >= 6 and fields[-1].endswith(INDEX_FILE)
        elif in_index and fields[0] == "Pss:":
            out["Pss_Index"] += int(fields[1]) * 1024
    return out


def factory_for(name: str, per_shard: int) -> str:
    if name not in ("IVF-PQ", "IVF-PQ-refine"):
        return name
    nlist = 1 << max(6, int(round(np.log2(4 * np.sqrt(per_shard)))))  # ~4·√n lists, a power of two
    if name == "IVF-PQ-refine":
        # 4-bit PQ codes of 48 bytes, then the best k_factor·k re-ranked on 8-bit scalar codes
        # (384 bytes a vector, a quarter of Flat's): index_shards.faiss_index.REFINE_K_FACTOR
        return f"IVF{nlist},PQ96x4fs,Refine(SQ8)"
    return f"IVF{nlist},PQ48x4fs"  # 4-bit fast-scan PQ: 8-bit PQ48 trains ~100x slower here (73 s per 20k)


def tune_version(directory: Path, queries: np.ndarray, truth: np.ndarray, tune_rows: np.ndarray,
                 held_rows: np.ndarray, target: float) -> dict[str, Any] | None:
    """index_shards.tuning against the true top 10 (int ids), as `shardrag tune` does with shards' vectors."""
    tasks = [ShardTask(str(shard_dir(directory, i)), queries, np.full(len(queries), -1, dtype=np.int64), 10,
                       exact=False) for i in range(SHARDS)]
    started = time.perf_counter()
    report = choose([evaluate_shard(t) for t in tasks], target, 10, tune_rows, held_rows, truth=truth)
    faiss.omp_set_num_threads(2)
    if report.knob is None:
        return None
    chosen = report.chosen or max(report.candidates, key=lambda c: c.recall)  # unreachable: the best there is
    write_search_defaults(directory, SearchDefaults(**{report.knob: chosen.value}, recall_target=target,
                                                    recall=chosen.recall, k=10, queries=len(tune_rows)))
    return {"knob": report.knob, "value": chosen.value, "met": report.chosen is not None,
            "tuning_recall": chosen.recall, "holdout_recall": chosen.holdout_recall, "lossy": report.lossy,
            "tune_s": time.perf_counter() - started,
            "frontier": [{"value": c.value, "recall": c.recall, "qps_c1": c.qps} for c in report.candidates]}


def gateway_recall(url: str, queries: np.ndarray, truth_ids: list[list[str]]) -> float:
    recalls = []
    with httpx.Client(timeout=60) as client:
        for vector, expected in zip(queries, truth_ids, strict=True):
            hits = client.post(f"{url}/v1/query", json={"vector": vector.tolist(), "k": 10}).json()["hits"]
            recalls.append(len({h["doc_id"] for h in hits} & set(expected)) / 10)
    return float(np.mean(recalls))


def run_cell(work: Path, size: int, factory_name: str, vectors: np.ndarray, documents: list[Document],
             corpus: Any, truth_ids: list[list[str]], baseline: dict[str, int], args: argparse.Namespace
             ) -> dict[str, Any]:
    factory = factory_for(factory_name, size // SHARDS)
    collection = f"scale-{size}-" + "".join(c if c.isalnum() or c in "-_" else "_" for c in factory_name)
    print(f"[{size:,} × {factory}] building ...", file=sys.stderr, flush=True)
    faiss.omp_set_num_threads(2)
    started = time.perf_counter()
    build_collection(work, documents, vectors, corpus.version, BuildConfig(collection, SHARDS, "hash", factory),
                     show_progress=False)
    build_s = time.perf_counter() - started
    directory, _ = resolve_version(work, collection)
    index_bytes = [(shard_dir(directory, i) / INDEX_FILE).stat().st_size for i in range(SHARDS)]
    order = np.random.default_rng(1).permutation(len(corpus.query_vectors))
    truth = doc_int_ids(doc for row in truth_ids for doc in row).reshape(len(truth_ids), 10)
    tuned = tune_version(directory, corpus.query_vectors, truth, np.sort(order[:50]), np.sort(order[50:]),
                         args.recall) if factory_name != "Flat" else None
    cell: dict[str, Any] = {"size": size, "factory": factory, "build_s": build_s, "index_bytes": sum(index_bytes),
                            "index_bytes_per_shard": index_bytes, "tuned": tuned}
    print(f"[{size:,} × {factory}] built in {build_s:.0f} s, {sum(index_bytes) / 2**20:.0f} MiB; serving ...",
          file=sys.stderr, flush=True)
    for mmap in (True, False):  # ours, then the baseline: each replica reads its own copy (memory only)
        with LocalCluster(work, collection, replicas=REPLICAS, gateway=VECTORS_ONLY,
                          workdir=work / f"{collection}-logs-{mmap}", shard_args=() if mmap else ("--no-mmap",),
                          ready_timeout_s=900) as cluster:
            pids = {child.name: child.process.pid for child in cluster.children() if child.process}
            recall = gateway_recall(cluster.gateway_url, corpus.query_vectors, truth_ids)  # also warms every replica
            if mmap:
                cell["recall_at_10"] = recall
                bodies = work / "bodies.json"
                bodies.write_text(json.dumps([{"vector": v.tolist(), "k": 10} for v in corpus.query_vectors]))
                cell["load"] = {}
                for concurrency in (1, 32):
                    print(f"[{size:,} × {factory}] c={concurrency} ...", file=sys.stderr, flush=True)
                    load = run_load(f"{cluster.gateway_url}/v1/query", bodies, concurrency, args.duration, pids)
                    cell["load"][concurrency] = {"qps": load["qps"], "p50_ms": load["p50_ms"],
                                                 "p99_ms": load["p99_ms"], "errors": load["errors"]["count"]}
            memory = {name: memory_of(pid) for name, pid in pids.items() if name.startswith("shard")}
        cell["mmap" if mmap else "no_mmap"] = replica_memory(memory, index_bytes, baseline)
    return cell


def replica_memory(memory: dict[str, dict[str, int]], index_bytes: list[int], baseline: dict[str, int]
                   ) -> dict[str, Any]:
    """Per shard: its replicas' PSS and RSS, and what the index costs them: the PSS of their
    index.faiss mappings (shared pages split between them) plus their private memory beyond that
    of a replica serving a 1k-vector shard (Python, FastAPI, FAISS themselves). Shared libraries
    are left out on both sides: their PSS depends on how many processes the host runs."""
    per_shard = []
    for shard in range(SHARDS):
        mine = [m for name, m in memory.items() if name.startswith(f"shard-{shard}-")]
        index_memory = sum(m["Pss_Index"] + m["Pss_Anon"] - baseline["Pss_Anon"] for m in mine)
        per_shard.append({"replicas": len(mine), "rss_sum": sum(m["Rss"] for m in mine),
                          "pss_sum": sum(m["Pss"] for m in mine), "pss_anon_sum": sum(m["Pss_Anon"] for m in mine),
                          "pss_index_file_sum": sum(m["Pss_Index"] for m in mine),
                          "index_memory": index_memory, "index_bytes": index_bytes[shard]})
    return {"per_shard": per_shard,
            "index_memory_over_index_bytes": float(np.mean([s["index_memory"] / s["index_bytes"] for s in per_shard])),
            "pss_over_index_bytes": float(np.mean([s["pss_sum"] / s["index_bytes"] for s in per_shard]))}


def process_baseline(work: Path, corpus: Any) -> dict[str, int]:
    """Memory of one replica serving a 1k-vector Flat shard, warmed by the 100 queries."""
    build_collection(work, corpus.documents[:1000], corpus.vectors[:1000], corpus.version,
                     BuildConfig("scale-baseline", 1, "hash", "Flat"), show_progress=False)
    with LocalCluster(work, "scale-baseline", replicas=1, gateway=VECTORS_ONLY, workdir=work / "baseline-logs") \
            as cluster:
        gateway_recall(cluster.gateway_url, corpus.query_vectors, [[] for _ in corpus.query_vectors])
        pid = next(c.process.pid for c in cluster.children() if c.process and c.name.startswith("shard"))
        return memory_of(pid)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="100000,1000000", help="corpus sizes (default 100000,1000000)")
    parser.add_argument("--factories", default="Flat,HNSW32,IVF-PQ",
                        help="Flat, HNSW32, IVF-PQ (IVF ~4·√n lists per shard, PQ48 4-bit), IVF-PQ-refine (PQ96 "
                             "4-bit re-ranked on SQ8 codes) or any FAISS factory string")
    parser.add_argument("--factory", action="append", default=[], metavar="STRING",
                        help="a FAISS factory string to run as given, commas and all (repeatable; replaces "
                             "--factories), e.g. --factory 'IVF2048,PQ96x4fs,Refine(SQ8)'")
    parser.add_argument("--duration", type=float, default=8.0, help="measured seconds per load point (default 8)")
    parser.add_argument("--recall", type=float, default=0.95, help="tuning target for recall@10 (default 0.95)")
    parser.add_argument("--out", default="scale", help="results name under benchmarks/results (default scale)")
    args = parser.parse_args()
    corpus = load_corpus()
    real = np.ascontiguousarray(corpus.vectors, dtype=np.float32)
    fingerprint = hashlib.sha256(real.tobytes()).hexdigest()[:12]
    with tempfile.TemporaryDirectory(prefix="shardrag-scale-") as work:
        baseline = process_baseline(Path(work), corpus)
    results: dict[str, Any] = {"machine": machine_info(), "generator": __doc__.split("The generator")[1].split(
        "Per factory")[0].strip(), "shards": SHARDS, "replicas": REPLICAS, "process_baseline": baseline, "cells": []}
    for size in (int(s) for s in args.sizes.split(",")):
        vectors = synthesize(real, size)
        doc_ids = corpus.doc_ids + [f"syn-{i}" for i in range(len(corpus.doc_ids), size)]
        rows = ground_truth(vectors, corpus.query_vectors, f"{size}-{fingerprint}-{GENERATOR}")
        truth_ids = [[doc_ids[r] for r in row] for row in rows]
        documents = list(corpus.documents[:size]) + [Document(doc_ids[i], f"synthetic passage {i}")
                                                     for i in range(len(corpus.documents), size)]
        for factory_name in args.factory or args.factories.split(","):
            with tempfile.TemporaryDirectory(prefix="shardrag-scale-") as work:
                cell = run_cell(Path(work), size, factory_name, vectors, documents, corpus, truth_ids, baseline, args)
            results["cells"].append(cell)
            write_result(args.out, results)  # after every cell: a late failure loses nothing measured
            report([cell])
    print(f"\nwrote benchmarks/results/{args.out}.json")
    report(results["cells"])


def report(cells: list[dict[str, Any]]) -> None:
    print(f"\n{'size':>9} {'factory':18} {'build s':>7} {'idx MiB':>7} {'idx mem mmap':>12} {'no mmap':>7} "
          f"{'ratio':>5} {'c=1 QPS':>7} {'p99':>6} {'c=32 QPS':>8} {'p99':>6} {'recall':>6}  tuned")
    for c in cells:
        one, many = c["load"].get(1) or c["load"]["1"], c["load"].get(32) or c["load"]["32"]
        tuned = c["tuned"]
        knob = f"{tuned['knob']}={tuned['value']}{'' if tuned['met'] else ' (target not met)'}" if tuned else "-"
        ours, base = c["mmap"]["index_memory_over_index_bytes"], c["no_mmap"]["index_memory_over_index_bytes"]
        print(f"{c['size']:>9,} {c['factory']:18} {c['build_s']:7.0f} {c['index_bytes'] / 2**20:7.0f} "
              f"{ours:11.2f}x {base:6.2f}x {ours / base:5.2f} {one['qps']:7.0f} {one['p99_ms']:6.1f} "
              f"{many['qps']:8.0f} {many['p99_ms']:6.1f} {c['recall_at_10']:6.3f}  {knob}")
    print("idx mem: what 2 replicas of a shard spend on its index (PSS of their index.faiss mappings + private "
          "memory beyond a 1k-vector replica's), over the shard's index bytes (mmap: ours; no mmap: each replica "
          "reads its own copy); ratio = ours / no mmap")


if __name__ == "__main__":
    main()
