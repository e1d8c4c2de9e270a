"""Tail latency under faults: balancer policies and hedging, open-loop load.

    python -m benchmarks.tail_latency                    # full grid, 60 s per cell (~40 min)
    python -m benchmarks.tail_latency --duration 20 --topologies 4x2 --scenarios S1   # a quick look

Topologies: 4 shards × 2 replicas and 2 shards × 3 (10k real passages, Flat, vector queries).
Scenarios, injected through the shard servers' real fault injection (/admin/faults):
  S0  no fault (the machine's own tail: the floor any policy can reach; not in the default grid)
  S1  replica 0 of every shard stalls 100 ms on 5 % of requests
  S2  replica 0 of every shard is 5× slower in service time
  S3  replica 0 of shard 0 is killed (SIGKILL) half way through (the supervisor restarts it)
Policies: round_robin, random, least_outstanding, p2c_peak_ewma, and p2c_peak_ewma + hedging
(the baseline policies run without hedging). Each cell gets a fresh gateway process and an
open-loop load at a fixed rate from benchmarks/loadgen.py (latency counted from the scheduled
send time). Reported per cell: p50/p99/p99.9, extra requests (hedges + retries per shard call),
errors, partial answers, and p99 relative to round robin's. JSON in
benchmarks/results/tail_latency.json, latency CDFs in benchmarks/results/tail_latency_cdf.png.
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

from benchmarks.common import REPO, RESULTS, load_corpus, machine_info, write_result
from index_shards.build import BuildConfig, build_collection
from retrieval.atomic import atomic_write_bytes
from serving.gateway.config import ClusterSpec, GatewayConfig
from serving.local.launcher import Child, LocalCluster

POLICIES = {
    "round_robin": {"balancer": "round_robin", "hedging": False},
    "random": {"balancer": "random", "hedging": False},
    "least_outstanding": {"balancer": "least_outstanding", "hedging": False},
    "p2c_peak_ewma": {"balancer": "p2c_peak_ewma", "hedging": False},
    "p2c_peak_ewma+hedging": {"balancer": "p2c_peak_ewma", "hedging": True},
}
SCENARIOS = {
    "S0": "no fault: the machine's own tail",
    "S1": "replica 0 of every shard stalls 100 ms on 5% of requests",
    "S2": "replica 0 of every shard is 5x slower in service time",
    "S3": "replica 0 of shard 0 killed half way",
}


def set_faults(url: str, faults: dict[str, Any]) -> None:
    httpx.put(f"{url}/admin/faults", json=faults, timeout=10).raise_for_status()


def start_gateway(cluster: LocalCluster, policy: dict[str, Any], workdir: Path, name: str) -> Child:
    spec = ClusterSpec(cluster.collection, tuple(tuple(group) for group in cluster.shard_urls),
                       GatewayConfig.from_dict({"encoder": {"load": False}, "calls": {"balancer": policy["balancer"]},
                                                "hedging": {"enabled": policy["hedging"]}}))
    spec_path = workdir / f"{name}.json"
    atomic_write_bytes(spec_path, spec.to_json())
    child = Child(name, lambda port: [sys.executable, "-m", "serving", "gateway", "--cluster", str(spec_path),
                                      "--port", str(port)], workdir / f"{name}.log")
    child.start({**os.environ, "PYTHONUNBUFFERED": "1"})
    child.wait_ready(time.monotonic() + 60)
    return child


def hedging_stats(url: str) -> dict[str, Any]:
    return httpx.get(f"{url}/v1/cluster", timeout=10).json()["hedging"]


def run_cell(cluster: LocalCluster, scenario: str, policy_name: str, args: argparse.Namespace, bodies: Path,
             workdir: Path) -> dict[str, Any]:
    name = f"gw-{scenario}-{policy_name}".replace("+", "_")
    gateway = start_gateway(cluster, POLICIES[policy_name], workdir, name)
    url = gateway.ready["url"]  # type: ignore[index]
    try:
        before = hedging_stats(url)
        latencies_path = workdir / f"{name}.npy"
        command = [sys.executable, "-m", "benchmarks.loadgen", "--url", f"{url}/v1/query", "--bodies", str(bodies),
                   "--rate", str(args.rate), "--duration", str(args.duration), "--warmup", "3",
                   "--latencies-out", str(latencies_path)]
        killer = None
        if scenario == "S3":
            victim = cluster.shards[0][0]

            def kill() -> None:
                os.kill(victim.process.pid, signal.SIGKILL)  # type: ignore[union-attr]

            killer = threading.Timer(3 + args.duration / 2, kill)
            killer.start()
        output = subprocess.run(command, capture_output=True, text=True, cwd=REPO, check=True)
        if killer is not None:
            killer.join()
            _wait_restarted(cluster)
        load = json.loads(output.stdout.strip().splitlines()[-1])
        after = hedging_stats(url)
    finally:
        gateway.stop()
    calls = max(after["calls"] - before["calls"], 1)
    extra = (after["hedges_fired"] - before["hedges_fired"]) + (after["retries"] - before["retries"])
    return {"scenario": scenario, "policy": policy_name, **load, "shard_calls": calls, "extra_requests": extra,
            "extra_request_pct": 100.0 * extra / calls,
            "hedges_fired": after["hedges_fired"] - before["hedges_fired"],
            "hedges_won": after["hedges_won"] - before["hedges_won"],
            "budget_exhausted": after["budget_exhausted"] - before["budget_exhausted"],
            "latencies_file": str(latencies_path)}


def _wait_restarted(cluster: LocalCluster) -> None:
    victim = cluster.shards[0][0]
    deadline = time.monotonic() + 60
    while not (victim.process and victim.process.poll() is None and victim.ready):
        if time.monotonic() > deadline:
            raise RuntimeError("the killed replica did not come back")
        time.sleep(0.2)
    httpx.get(f"{victim.ready['url']}/healthz", timeout=10).raise_for_status()


def apply_scenario(cluster: LocalCluster, scenario: str) -> None:
    for group in cluster.shards:
        url = group[0].ready["url"]  # type: ignore[index]
        if scenario == "S1":
            set_faults(url, {"stall_probability": 0.05, "stall_ms": 100, "seed": 11})
        elif scenario == "S2":
            set_faults(url, {"slowdown": 5.0})
        else:
            set_faults(url, {})


def plot(rows: list[dict[str, Any]], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install -e '.[bench]'): no CDF plot", file=sys.stderr)
        return False
    panels = sorted({(r["topology"], r["scenario"]) for r in rows})
    figure, axes = plt.subplots(len(panels), 1, figsize=(9, 3.2 * len(panels)), squeeze=False)
    for axis, (topology, scenario) in zip(axes[:, 0], panels):
        for row in (r for r in rows if r["topology"] == topology and r["scenario"] == scenario):
            values = np.sort(np.load(row["latencies_file"]))
            if values.size == 0:
                continue
            tail = 1.0 - np.arange(1, values.size + 1) / values.size
            axis.plot(values, np.maximum(tail, 1e-5), label=f"{row['policy']} (p99 {row['p99_ms']:.1f} ms)")
        axis.set_xscale("log")
        axis.set_yscale("log")
        axis.set_xlabel("latency, ms")
        axis.set_ylabel("fraction slower (1 - CDF)")
        axis.set_title(f"{topology}: {scenario} — {SCENARIOS[scenario]}")
        axis.grid(True, which="both", alpha=0.3)
        axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=60.0, help="measured seconds per cell (default 60)")
    parser.add_argument("--rate", type=float, default=250.0, help="open-loop queries per second (default 250)")
    parser.add_argument("--topologies", default="4x2,2x3", help="SHARDSxREPLICAS list (default 4x2,2x3)")
    parser.add_argument("--scenarios", default="S1,S2,S3")
    parser.add_argument("--policies", default=",".join(POLICIES))
    args = parser.parse_args()
    corpus = load_corpus()
    work = Path(tempfile.mkdtemp(prefix="shardrag-tail-"))
    bodies = work / "bodies.json"
    bodies.write_text(json.dumps([{"vector": v.tolist(), "k": 10} for v in corpus.query_vectors]))
    rows: list[dict[str, Any]] = []
    for topology in args.topologies.split(","):
        num_shards, replicas = (int(x) for x in topology.split("x"))
        collection = f"tail-{num_shards}"
        build_collection(work / "root", corpus.documents, corpus.vectors, corpus.version,
                         BuildConfig(collection, num_shards, "hash", "Flat", overwrite=True), show_progress=False)
        vectors_only = GatewayConfig.from_dict({"encoder": {"load": False}})
        with LocalCluster(work / "root", collection, replicas=replicas, gateway=vectors_only,
                          workdir=work / f"{topology}-logs") as cluster:
            for scenario in args.scenarios.split(","):
                apply_scenario(cluster, scenario)
                for policy in args.policies.split(","):
                    print(f"{topology} {scenario} {policy} ...", file=sys.stderr, flush=True)
                    row = run_cell(cluster, scenario, policy, args, bodies, work / f"{topology}-logs")
                    row["topology"] = f"{num_shards} shards x {replicas} replicas"
                    rows.append(row)
                apply_scenario(cluster, "none")
    for row in rows:
        reference = next((r for r in rows if r["topology"] == row["topology"] and r["scenario"] == row["scenario"]
                          and r["policy"] == "round_robin"), None)
        row["p99_vs_round_robin"] = row["p99_ms"] / reference["p99_ms"] if reference else None
    report(rows, args)
    png = RESULTS / "tail_latency_cdf.png"
    RESULTS.mkdir(parents=True, exist_ok=True)
    plotted = plot(rows, png)
    payload = {"machine": machine_info(), "rate_qps": args.rate, "duration_s": args.duration,
               "scenarios": SCENARIOS, "cells": [{k: v for k, v in r.items() if k != "latencies_file"} for r in rows]}
    print(f"\nwrote {write_result('tail_latency', payload)}" + (f" and {png}" if plotted else ""))


def report(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    print(f"\n== open loop at {args.rate:.0f} QPS, {args.duration:.0f} s per cell ==")
    print(f"{'topology':24} {'sc':3} {'policy':22} {'p50':>7} {'p99':>8} {'p99.9':>8} {'p99/RR':>7} "
          f"{'extra %':>7} {'hedges':>6} {'won':>5} {'errors':>6} {'partial':>7}")
    for r in rows:
        ratio = f"{r['p99_vs_round_robin']:.3f}" if r["p99_vs_round_robin"] is not None else "-"
        print(f"{r['topology']:24} {r['scenario']:3} {r['policy']:22} {r['p50_ms']:7.2f} {r['p99_ms']:8.2f} "
              f"{r['p999_ms']:8.2f} {ratio:>7} {r['extra_request_pct']:7.2f} {r['hedges_fired']:6d} "
              f"{r['hedges_won']:5d} {r['errors']:6d} {r['partial']:7d}")


if __name__ == "__main__":
    main()
