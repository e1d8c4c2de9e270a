"""GPU against CPU (issue 14, part 7): FAISS search at batch 1 / 32 / 256, a shard served from the
GPU, and the query encoder on CUDA. Run it on a machine with a GPU (one prepared run: ~5 min on
an H200 at the default size); anywhere else it records that no GPU was there and measures nothing.

    pip install faiss-gpu==1.15.1            # in place of faiss-cpu, on the GPU machine
    python -m benchmarks.gpu                 # 1M vectors, Flat and IVF4096,Flat
    python -m benchmarks.gpu --size 100000 --seconds 1 --no-serve   # a quick look

Vectors: a seeded Gaussian mixture (4,096 clusters, 384 dims, normalised) — the comparison is the
same index searched by both devices, so the figures do not depend on where the vectors came from;
queries are 1,000 further points of the mixture. Per factory (Flat, IVF4096,Flat with nprobe 32 on
both sides; the IVF index is trained once and the same trained index is searched by both): QPS at
batch 1 / 32 / 256 over ``--seconds`` each (CPU: FAISS's OpenMP over every core), and whether the
GPU's top 10 equals the CPU's (Flat: the same ids, scores within 1e-3). ``--serve``: a 1-shard
collection of the vectors is built and served by a real shard server with ``--device gpu`` behind
the gateway; its ``/v1/info`` must say ``on_gpu`` and its answers must equal the CPU index's. Encoder:
all-MiniLM-L6-v2 on CUDA vs CPU, queries/s at batch 1 and 32, and the largest vector difference.
JSON: benchmarks/results/gpu_search.json (machine, versions, every figure; or why nothing ran).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from benchmarks.common import machine_info, scratch_dir, write_result
from index_shards.faiss_index import gpu_count

BATCHES = (1, 32, 256)
DIM = 384


def mixture(total: int, queries: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``total`` + ``queries`` normalised points of a seeded Gaussian mixture, float32."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((4096, DIM)).astype(np.float32)
    out = np.empty((total + queries, DIM), dtype=np.float32)
    for start in range(0, len(out), 100_000):  # in chunks: 1M × 384 float64 noise would be 3 GiB
        rows = min(100_000, len(out) - start)
        out[start:start + rows] = centres[rng.integers(0, 4096, rows)] + 0.6 * rng.standard_normal((rows, DIM))
    out /= np.linalg.norm(out, axis=1, keepdims=True)
    return out[:total], out[total:]


def qps(search: Callable[[np.ndarray], Any], queries: np.ndarray, batch: int, seconds: float) -> dict[str, float]:
    """Queries per second of ``search`` on batches of ``batch`` queries, for about ``seconds``."""
    search(queries[:batch])  # warm-up (GPU kernels, OpenMP pool)
    done, position, latencies = 0, 0, []
    stop_at = time.perf_counter() + seconds
    while time.perf_counter() < stop_at or not latencies:
        rows = np.take(queries, range(position, position + batch), axis=0, mode="wrap")
        position += batch
        started = time.perf_counter()
        search(rows)
        latencies.append(time.perf_counter() - started)
        done += batch
    return {"qps": done / sum(latencies), "batch_p50_ms": float(np.median(latencies) * 1000.0),
            "batches": len(latencies)}


def build_cpu_index(factory: str, vectors: np.ndarray, resources: Any) -> faiss.Index:
    index = faiss.index_factory(DIM, factory, faiss.METRIC_INNER_PRODUCT)
    if not index.is_trained:
        sample = vectors[np.random.default_rng(1).choice(len(vectors), min(len(vectors), 200_000), replace=False)]
        # k-means on the GPU when there is one (minutes on the CPU at 4,096 lists), the same index either way
        trainer = faiss.index_cpu_to_gpu(resources, 0, index) if resources is not None else index
        trainer.train(sample)
        index = faiss.index_gpu_to_cpu(trainer) if resources is not None else trainer
    index.add(vectors)
    return index


def compare_factory(factory: str, vectors: np.ndarray, queries: np.ndarray, seconds: float,
                    resources: Any) -> dict[str, Any]:
    started = time.perf_counter()
    cpu = build_cpu_index(factory, vectors, resources)
    row: dict[str, Any] = {"factory": factory, "build_s": time.perf_counter() - started, "cpu": {}, "gpu": {}}
    if factory.startswith("IVF"):
        faiss.extract_index_ivf(cpu).nprobe = 32
        row["nprobe"] = 32
    print(f"{factory}: CPU ...", file=sys.stderr, flush=True)
    for batch in BATCHES:
        row["cpu"][batch] = qps(lambda rows: cpu.search(rows, 10), queries, batch, seconds)
    if resources is None:
        return row
    gpu = faiss.index_cpu_to_gpu(resources, 0, cpu)
    if factory.startswith("IVF"):
        faiss.GpuParameterSpace().set_index_parameter(gpu, "nprobe", 32)
    print(f"{factory}: GPU ...", file=sys.stderr, flush=True)
    for batch in BATCHES:
        row["gpu"][batch] = qps(lambda rows: gpu.search(rows, 10), queries, batch, seconds)
        row["gpu"][batch]["vs_cpu"] = row["gpu"][batch]["qps"] / row["cpu"][batch]["qps"]
    cpu_scores, cpu_ids = cpu.search(queries[:200], 10)
    gpu_scores, gpu_ids = gpu.search(queries[:200], 10)
    row["same_top10_share"] = float(np.mean([set(a) == set(b) for a, b in zip(cpu_ids, gpu_ids, strict=True)]))
    row["max_score_diff"] = float(np.abs(cpu_scores - gpu_scores).max())
    return row


def serve_on_gpu(vectors: np.ndarray, queries: np.ndarray, work: Path) -> dict[str, Any]:
    """A real shard server with --device gpu behind the gateway; its answers against the CPU index."""
    import httpx

    from index_shards.build import BuildConfig, build_collection
    from retrieval.types import Document, EmbeddingVersion
    from serving.encoding.settings import EncoderSettings
    from serving.gateway.config import GatewayConfig
    from serving.local.launcher import LocalCluster

    version = EmbeddingVersion("synthetic-mixture", "0" * 64, DIM)
    documents = [Document(f"d{i}", f"passage {i}") for i in range(len(vectors))]
    started = time.perf_counter()
    build_collection(work / "root", documents, vectors, version, BuildConfig("gpu", 1, "hash", "Flat"),
                     show_progress=True)
    build_s = time.perf_counter() - started
    exact = faiss.IndexFlatIP(DIM)
    exact.add(vectors)
    _, truth = exact.search(queries[:100], 10)
    gateway = GatewayConfig(encoder=EncoderSettings(load=False))
    with LocalCluster(work / "root", "gpu", replicas=1, gateway=gateway, workdir=work / "logs",
                      shard_args=("--device", "gpu"), ready_timeout_s=600) as cluster, \
            httpx.Client(base_url=cluster.gateway_url, timeout=60) as client:
        info = httpx.get(f"{cluster.shard_urls[0][0]}/v1/info", timeout=30).json()
        on_gpu = [v.get("on_gpu") for v in info.get("versions", [])]
        same, latencies = 0, []
        for query, expected in zip(queries[:100], truth, strict=True):
            t = time.perf_counter()
            hits = client.post("/v1/query", json={"vector": query.tolist(), "k": 10}).json()["hits"]
            latencies.append(time.perf_counter() - t)
            same += {h["doc_id"] for h in hits} == {f"d{i}" for i in expected}
    return {"vectors": len(vectors), "build_s": build_s, "on_gpu": on_gpu, "same_top10_share": same / 100,
            "gateway_p50_ms": float(np.median(latencies) * 1000.0),
            "ok": bool(on_gpu) and all(on_gpu) and same == 100}


def encoder_on_cuda(seconds: float) -> dict[str, Any]:
    from retrieval.encoders import load_default_encoder

    texts = [f"what is the best way to learn topic number {i} quickly" for i in range(512)]
    out: dict[str, Any] = {}
    encoders = {"cpu": load_default_encoder(device="cpu"), "cuda": load_default_encoder(device="cuda")}
    vectors = {name: encoder.encode_queries(texts[:64]) for name, encoder in encoders.items()}
    out["max_abs_diff_vs_cpu"] = float(np.abs(vectors["cpu"] - vectors["cuda"]).max())
    for name, encoder in encoders.items():
        out[name] = {}
        for batch in (1, 32):
            position, done, stop_at = 0, 0, time.perf_counter() + seconds
            encoder.encode_queries(texts[:batch])
            started = time.perf_counter()
            while time.perf_counter() < stop_at or done == 0:
                encoder.encode_queries(texts[position % 480:position % 480 + batch])
                position += batch
                done += batch
            out[name][batch] = {"queries_per_s": done / (time.perf_counter() - started)}
    for batch in (1, 32):
        out["cuda"][batch]["vs_cpu"] = out["cuda"][batch]["queries_per_s"] / out["cpu"][batch]["queries_per_s"]
    return out


def environment() -> dict[str, Any]:
    info: dict[str, Any] = {**machine_info(), "faiss": faiss.__version__, "faiss_gpus": gpu_count()}
    try:
        import torch

        info["torch"] = torch.__version__
        info["cuda"] = torch.cuda.is_available()
        info["gpu"] = torch.cuda.get_device_name(0) if info["cuda"] else None
    except ImportError:
        info["torch"], info["cuda"], info["gpu"] = None, False, None
    return info


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=int, default=1_000_000, help="vectors (default 1,000,000)")
    parser.add_argument("--factories", nargs="+", default=["Flat", "IVF4096,Flat"],
                        help="FAISS factory strings, space-separated (default: Flat IVF4096,Flat)")
    parser.add_argument("--seconds", type=float, default=3.0, help="seconds per (factory, device, batch) (default 3)")
    parser.add_argument("--serve", action=argparse.BooleanOptionalAction, default=True,
                        help="also serve the vectors from a real shard server with --device gpu (default on)")
    parser.add_argument("--cpu-only", action="store_true",
                        help="measure the CPU side even without a GPU (a dry run of this script; nothing is "
                        "written to the results)")
    parser.add_argument("--name", default="gpu_search", help="results file: benchmarks/results/NAME.json")
    args = parser.parse_args()
    result: dict[str, Any] = {"machine": environment(), "size": args.size, "seconds": args.seconds}
    has_gpu = result["machine"]["faiss_gpus"] > 0
    if not has_gpu and not args.cpu_only:
        why = ("no CUDA device" if not result["machine"]["cuda"] else
               "CUDA is present but this FAISS has no GPU support (pip install faiss-gpu==1.15.1)")
        result["ran"] = False
        result["why_not"] = f"{why}: nothing measured, nothing claimed"
        written = write_result(args.name, result)
        print(f"{result['why_not']}\nwrote {written}")
        return 1
    vectors, queries = mixture(args.size, 1000)
    resources = faiss.StandardGpuResources() if has_gpu else None
    result["ran"] = has_gpu
    result["factories"] = [compare_factory(f, vectors, queries, args.seconds, resources) for f in args.factories]
    if has_gpu and args.serve:
        result["serve"] = serve_on_gpu(vectors, queries, scratch_dir("shardrag-gpu-"))
    if result["machine"]["cuda"]:
        result["encoder"] = encoder_on_cuda(args.seconds)
    report(result)
    if has_gpu:
        print(f"\nwrote {write_result(args.name, result)}")
    return 0


def report(result: dict[str, Any]) -> None:
    machine = result["machine"]
    print(f"\n{machine.get('gpu') or 'no GPU'} · {os.cpu_count()} CPU cores · faiss {machine['faiss']} · "
          f"{result['size']:,} vectors × {DIM}")
    print(f"{'factory':16} {'batch':>5} {'CPU QPS':>10} {'GPU QPS':>10} {'GPU/CPU':>8}")
    for row in result["factories"]:
        for batch in BATCHES:
            cpu, gpu = row["cpu"][batch], row["gpu"].get(batch)
            print(f"{row['factory']:16} {batch:>5} {cpu['qps']:10.0f} "
                  + (f"{gpu['qps']:10.0f} {gpu['vs_cpu']:7.1f}×" if gpu else f"{'—':>10} {'—':>8}"))
        if "same_top10_share" in row:
            print(f"{'':16} top 10 equal on {row['same_top10_share']:.0%} of 200 queries, "
                  f"scores within {row['max_score_diff']:.1e}")
    if "serve" in result:
        serve = result["serve"]
        print(f"served from the GPU: on_gpu={serve['on_gpu']}, top 10 equal to exact on "
              f"{serve['same_top10_share']:.0%}, gateway p50 {serve['gateway_p50_ms']:.2f} ms "
              f"({'ok' if serve['ok'] else 'FAILED'})")
    if "encoder" in result:
        encoder = result["encoder"]
        for batch in (1, 32):
            print(f"encoder batch {batch:>2}: CPU {encoder['cpu'][batch]['queries_per_s']:.0f}/s, CUDA "
                  f"{encoder['cuda'][batch]['queries_per_s']:.0f}/s (×{encoder['cuda'][batch]['vs_cpu']:.1f}); "
                  f"max |Δ| {encoder['max_abs_diff_vs_cpu']:.1e}")


if __name__ == "__main__":
    raise SystemExit(main())
