"""Query throughput and latency: the Ray backend vs the HTTP (process) backend.

    python -m benchmarks.ray_backend        # ~3 min on 2 cores

Same collection (msmarco + dbpedia, 10k MiniLM vectors, Flat, 2 shards × 2 replicas), same
gateway code and settings, same closed-loop load (benchmarks.loadgen, vector queries k=10,
concurrency 1, 8 and 32, 10 s each): the process backend runs each replica as an HTTP shard
server; the Ray backend (`shardrag serve --backend ray`) runs them as Ray actors on a local
Ray and the gateway calls them through RayTransport. JSON in benchmarks/results/ray_backend.json.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.common import REPO, load_corpus, machine_info, scratch_dir, write_result
from index_shards.build import BuildConfig, build_collection
from serving.gateway.config import GatewayConfig
from serving.local.launcher import LocalCluster


def load(url: str, bodies: Path, concurrency: int, duration_s: float) -> dict[str, Any]:
    result = subprocess.run([sys.executable, "-m", "benchmarks.loadgen", "--url", f"{url}/v1/query", "--bodies",
                             str(bodies), "--concurrency", str(concurrency), "--duration", str(duration_s),
                             "--warmup", "1"], capture_output=True, text=True, cwd=REPO, check=True)
    return json.loads(result.stdout.strip().splitlines()[-1])


def _errors(result: dict[str, Any]) -> int:
    errors = result["errors"]
    return int(errors["count"] if isinstance(errors, dict) else errors)


def start_ray_gateway(root: Path) -> tuple[subprocess.Popen[str], str]:
    process = subprocess.Popen([sys.executable, "-m", "serving", "serve", "--backend", "ray", "--collection", "bench",
                                "--root", str(root), "--replicas", "2", "--port", "0", "--no-encoder", "--open"],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                               env={**os.environ, "PYTHONUNBUFFERED": "1"}, start_new_session=True)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        line = process.stdout.readline()  # type: ignore[union-attr]
        if line.startswith("SHARDRAG_READY "):
            return process, json.loads(line.split(" ", 1)[1])["url"]
        if not line and process.poll() is not None:
            break
    process.kill()
    raise RuntimeError("the Ray-backed gateway did not start")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per cell (default 10)")
    parser.add_argument("--concurrency", default="1,8,32", help="closed-loop clients (default 1,8,32)")
    args = parser.parse_args()
    concurrencies = [int(c) for c in args.concurrency.split(",")]

    corpus = load_corpus()
    work = scratch_dir("ray-bench-")
    build_collection(work / "root", corpus.documents, corpus.vectors, corpus.version, BuildConfig("bench", 2),
                     show_progress=False)
    bodies = work / "bodies.json"
    bodies.write_text(json.dumps([{"vector": v.tolist(), "k": 10} for v in corpus.query_vectors[:200]]))

    results: dict[str, dict[str, Any]] = {"http": {}, "ray": {}}
    vectors_only = GatewayConfig.from_dict({"encoder": {"load": False}})
    with LocalCluster(work / "root", "bench", replicas=2, gateway=vectors_only) as cluster:
        for c in concurrencies:
            results["http"][str(c)] = load(cluster.gateway_url, bodies, c, args.duration)
            print(f"http c={c}: {results['http'][str(c)]['qps']:.0f} QPS", flush=True)
    process, url = start_ray_gateway(work / "root")
    try:
        for c in concurrencies:
            results["ray"][str(c)] = load(url, bodies, c, args.duration)
            print(f"ray  c={c}: {results['ray'][str(c)]['qps']:.0f} QPS", flush=True)
    finally:
        os.killpg(process.pid, signal.SIGINT)
        process.wait(60)

    print(f"\n{'clients':>7} {'HTTP QPS':>9} {'Ray QPS':>8} {'Ray/HTTP':>9} {'HTTP p50':>9} {'Ray p50':>8} "
          f"{'HTTP p99':>9} {'Ray p99':>8} {'errors':>7}")
    for c in concurrencies:
        h, r = results["http"][str(c)], results["ray"][str(c)]
        print(f"{c:>7} {h['qps']:>9.0f} {r['qps']:>8.0f} {r['qps'] / h['qps']:>8.2f}× {h['p50_ms']:>7.2f}ms "
              f"{r['p50_ms']:>6.2f}ms {h['p99_ms']:>7.2f}ms {r['p99_ms']:>6.2f}ms {_errors(h) + _errors(r):>7}")
    path = write_result("ray_backend", {"machine": machine_info(), "settings": vars(args), "results": results})
    print(f"\nwritten {path}")


if __name__ == "__main__":
    main()
