"""One truth for many gateways, measured: failover time, etcd round trips per write, and queries
through one gateway against three.

    python -m benchmarks.cluster_state                 # ~6 min on 2 cores
    python -m benchmarks.cluster_state --kills 5 --quick

A 2 shards × 3 replicas cluster (msmarco, MiniLM vectors) whose cluster state is a real 3-member
etcd on 127.0.0.1 (Debian's etcd-server), shard leases 3 s (the default):

* **failover**: a writer sends one-document writes to shard 0 back to back; a nemesis SIGKILLs the
  shard's primary (``--kills`` times, each once every replica is back in sync); the figure is the
  time from the kill to the first acknowledged write sent after it — p50 / p99 / worst;
* **etcd round trips per write**: etcd's own counters of gRPC calls handled
  (``grpc_server_handled_total``, every method) over a window of steady writes, minus an idle
  window of the same length (leases and watches run in both), divided by the writes;
* **1 vs 3 gateways**: the same open-loop query load (``benchmarks.loadgen``, ``--rate``) to one
  gateway, then spread over three gateways (request i to gateway i mod 3), in alternating pairs.

JSON: benchmarks/results/cluster_state.json.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from benchmarks.common import load_corpus, machine_info, write_result
from index_shards.build import BuildConfig, build_collection
from retrieval.routing import hash_shard
from serving.gateway.config import GatewayConfig
from serving.local.launcher import LocalCluster


def etcd_handled(urls: list[str]) -> float:
    """Sum over the members of etcd's grpc_server_handled_total (every RPC, the JSON gateway's too)."""
    total = 0.0
    for url in urls:
        for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
            if line.startswith("grpc_server_handled_total{"):
                total += float(line.rsplit(" ", 1)[1])
    return total


def wait_in_sync(urls: list[str], timeout_s: float = 120.0) -> None:
    from tests.helpers.roles import wait_all_in_sync

    wait_all_in_sync(urls, timeout_s)


def shard0_ids(prefix: str):
    n = 0
    while True:
        n += 1
        doc_id = f"{prefix}-{n}"
        if hash_shard(doc_id, 2) == 0:
            yield doc_id


def failover(cluster: LocalCluster, kills: int, dim: int) -> dict[str, Any]:
    from tests.helpers.roles import primary_index

    urls = cluster.shard_urls[0]
    rng = np.random.default_rng(0)
    ids = shard0_ids("failover")
    times: list[float] = []
    with httpx.Client(base_url=cluster.gateway_url, timeout=60) as http:
        for kill in range(kills):
            wait_in_sync(urls)
            victim = primary_index(urls)
            stop = threading.Event()
            first_ok: list[float] = []
            killed_at: list[float] = []

            def writer(stop: threading.Event = stop, killed_at: list[float] = killed_at,
                       first_ok: list[float] = first_ok) -> None:
                while not stop.is_set():
                    sent = time.monotonic()
                    vector = rng.standard_normal(dim).astype(np.float32)
                    body = {"documents": [{"id": next(ids), "vector": (vector / np.linalg.norm(vector)).tolist()}]}
                    try:
                        ok = http.post("/v1/documents", json=body).status_code == 200
                    except httpx.HTTPError:
                        ok = False
                    if ok and killed_at and sent >= killed_at[0]:
                        first_ok.append(time.monotonic())
                        return

            thread = threading.Thread(target=writer)
            thread.start()
            time.sleep(0.5)  # writes flowing before the kill
            killed_at.append(time.monotonic())
            os.kill(cluster.shards[0][victim].process.pid, signal.SIGKILL)
            thread.join(120)
            stop.set()
            took = first_ok[0] - killed_at[0]
            times.append(took)
            print(f"  kill {kill + 1}/{kills}: first acknowledged write {took:.2f} s after the kill", flush=True)
    values = np.asarray(times)
    return {"kills": kills, "lease_s": 3.0, "p50_s": float(np.percentile(values, 50)),
            "p99_s": float(np.percentile(values, 99)), "worst_s": float(values.max()), "all_s": times}


def etcd_trips(cluster: LocalCluster, etcd_urls: list[str], dim: int, window_s: float) -> dict[str, Any]:
    rng = np.random.default_rng(1)
    idle_before = etcd_handled(etcd_urls)
    time.sleep(window_s)
    idle = etcd_handled(etcd_urls) - idle_before
    writes = 0
    started = time.monotonic()
    busy_before = etcd_handled(etcd_urls)
    with httpx.Client(base_url=cluster.gateway_url, timeout=60) as http:
        while time.monotonic() - started < window_s:
            vector = rng.standard_normal(dim).astype(np.float32)
            body = {"documents": [{"id": f"trips-{writes}", "vector": (vector / np.linalg.norm(vector)).tolist()}]}
            if http.post("/v1/documents", json=body).status_code == 200:
                writes += 1
    busy = etcd_handled(etcd_urls) - busy_before
    elapsed = time.monotonic() - started
    idle_scaled = idle * elapsed / window_s
    return {"window_s": round(elapsed, 2), "writes": writes, "etcd_rpcs_idle": idle_scaled,
            "etcd_rpcs_with_writes": busy, "etcd_rpcs_per_write": (busy - idle_scaled) / max(writes, 1)}


def gateways_p99(cluster: LocalCluster, extra: list[str], queries: np.ndarray, rate: float, duration_s: float,
                 pairs: int, work: Path) -> dict[str, Any]:
    bodies = work / "queries.json"
    bodies.write_text(json.dumps([{"vector": q.tolist(), "k": 10} for q in queries[:200]]))

    def load(urls: list[str]) -> dict[str, Any]:
        command = [sys.executable, "-m", "benchmarks.loadgen", "--bodies", str(bodies), "--rate", str(rate),
                   "--duration", str(duration_s), "--warmup", "2"]
        for url in urls:
            command += ["--url", f"{url}/v1/query"]
        output = subprocess.run(command, capture_output=True, text=True, check=True).stdout
        return json.loads(output.strip().splitlines()[-1])

    one, three = [], []
    for _ in range(pairs):
        one.append(load([cluster.gateway_url]))
        three.append(load([cluster.gateway_url, *extra]))
    p99_one = [r["p99_ms"] for r in one]
    p99_three = [r["p99_ms"] for r in three]
    return {"rate": rate, "duration_s": duration_s, "pairs": pairs,
            "one_gateway_p99_ms": p99_one, "three_gateways_p99_ms": p99_three,
            "one_gateway_p50_ms": [r["p50_ms"] for r in one], "three_gateways_p50_ms": [r["p50_ms"] for r in three],
            "p99_ratio_median": float(np.median(p99_three) / np.median(p99_one)),
            "errors": sum(int(r.get("errors") or 0) for r in one + three)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kills", type=int, default=20, help="primaries SIGKILLed (default 20)")
    parser.add_argument("--rate", type=float, default=200.0, help="query rate of the gateway comparison (default 200)")
    parser.add_argument("--quick", action="store_true", help="shorter windows")
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.helpers.etcd import EtcdCluster

    corpus = load_corpus(("msmarco",))
    dim = corpus.vectors.shape[1]
    result: dict[str, Any] = {"machine": machine_info(),
                              "cluster": "2 shards x 3 replicas, etcd x3, lease 3 s, write_ack=majority"}
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        build_collection(work / "root", corpus.documents, corpus.vectors, corpus.version, BuildConfig("bench", 2),
                         show_progress=False)
        with EtcdCluster(work, members=3) as etcd:
            config = GatewayConfig.from_dict({"encoder": {"load": False}, "writes": {"timeout_s": 60},
                                              "cluster": {"coordinator": etcd.spec}})
            with LocalCluster(work / "root", "bench", replicas=3, gateway=config, workdir=work / "run") as cluster:
                extra_processes, extra = [], []
                for _ in range(2):
                    process = subprocess.Popen([sys.executable, "-m", "serving", "gateway", "--cluster",
                                                str(cluster.workdir / "cluster.json"), "--port", "0"],
                                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
                    extra_processes.append(process)
                    extra.append(json.loads(process.stdout.readline().split(" ", 1)[1])["url"])
                try:
                    print("etcd round trips per write ...", flush=True)
                    result["etcd_trips"] = etcd_trips(cluster, etcd.client_urls, dim, 5.0 if args.quick else 15.0)
                    print(json.dumps(result["etcd_trips"]), flush=True)
                    print("queries through 1 vs 3 gateways ...", flush=True)
                    result["gateways"] = gateways_p99(cluster, extra, corpus.query_vectors, args.rate,
                                                      8.0 if args.quick else 15.0, 2 if args.quick else 3, work)
                    print(json.dumps(result["gateways"]), flush=True)
                    print(f"failover over {args.kills} primary kills ...", flush=True)
                    result["failover"] = failover(cluster, args.kills, dim)
                    print(json.dumps({k: v for k, v in result["failover"].items() if k != "all_s"}), flush=True)
                finally:
                    for process in extra_processes:
                        process.terminate()
                        process.wait(30)
    f, t, g = result["failover"], result["etcd_trips"], result["gateways"]
    result["summary"] = [
        f"failover (SIGKILL of a primary → first acknowledged write on its shard, lease 3 s, {f['kills']} kills): "
        f"p50 {f['p50_s']:.2f} s, p99 {f['p99_s']:.2f} s, worst {f['worst_s']:.2f} s",
        f"etcd round trips per write (steady state, no primary change): {t['etcd_rpcs_per_write']:.3f} "
        f"({t['etcd_rpcs_with_writes']:.0f} RPCs with {t['writes']} writes vs {t['etcd_rpcs_idle']:.0f} idle "
        f"in {t['window_s']:.0f} s)",
        f"query p99 at {g['rate']:.0f}/s: 1 gateway {g['one_gateway_p99_ms']} ms, 3 gateways "
        f"{g['three_gateways_p99_ms']} ms (median ratio x{g['p99_ratio_median']:.2f})"]
    print("\n".join(result["summary"]))
    print(write_result("cluster_state", result))


if __name__ == "__main__":
    main()
