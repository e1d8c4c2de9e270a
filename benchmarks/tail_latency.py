"""Tail latency under faults: balancer policies and hedging, open-loop load.

    python -m benchmarks.tail_latency                    # full grid, 60 s per cell (~40 min)
    python -m benchmarks.tail_latency --duration 20 --topologies 4x2 --scenarios S1   # a quick look
    python -m benchmarks.tail_latency --rounds 5 --duration 10 --policies p2c_peak_ewma,p2c_peak_ewma+hedging
                                                         # policies interleaved, 5 rounds pooled per cell

Topologies: 4 shards × 2 replicas and 2 shards × 3 (10k real passages, Flat, vector queries).
Scenarios, injected through the shard servers' real fault injection (/admin/faults):
  S0  no fault (the machine's own tail: the floor any policy can reach; not in the default grid)
  S1  replica 0 of every shard stalls 100 ms on 5 % of requests
  S2  replica 0 of every shard is 5× slower in service time
  S3  replica 0 of shard 0 is killed (SIGKILL) half way through (the supervisor restarts it)
Policies: round_robin, random, least_outstanding, p2c_peak_ewma, and p2c_peak_ewma + hedging
(the baseline policies run without hedging); ``p2c_again``, on request, is p2c_peak_ewma under a
second name — an A/A control that shows how far two identical policies differ in one run. Each
cell gets a fresh gateway process and an open-loop load at a fixed rate from benchmarks/loadgen.py
(latency counted from the scheduled send time). Reported per cell: p50/p99/p99.9, extra requests
(hedges + retries per shard call), errors, partial answers, and p99 relative to round robin's. JSON in
benchmarks/results/tail_latency.json, latency CDFs in benchmarks/results/tail_latency_cdf.png.

``--rounds N`` splits every cell into N runs of ``--duration`` seconds and interleaves the policies
(round 1 in the given order, round 2 reversed, ...), then pools each cell's latencies: on a shared
2-core box one 20-second cell moved by ×2 between identical runs, and a slow minute then lands on
one policy alone; interleaved, the machine's drift falls on every policy alike. The per-round p99s
are kept in the JSON to show the spread. ``--paired`` goes further: each round starts every
policy's gateway at once, over the same shard replicas, and one load generator sends request i to
gateway i mod n (each at rate/n), so the policies are compared in the same instants — a slow
second falls on all of them. (Hedges and retries of one gateway load the replicas the other uses
too: at the ≤ 0.3 % extra calls hedging sends, that is noise; a policy that added much load would
need the sequential runs.)
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from benchmarks.common import REPO, RESULTS, load_corpus, machine_info, scratch_dir, write_result
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
    # p2c_peak_ewma again under another name: an A/A control. Two identical policies differ only by
    # the machine's noise, which is the resolution of any comparison in the same run.
    "p2c_again": {"balancer": "p2c_peak_ewma", "hedging": False},
}
DEFAULT_POLICIES = "round_robin,random,least_outstanding,p2c_peak_ewma,p2c_peak_ewma+hedging"
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


def run_cells(cluster: LocalCluster, scenario: str, policy_names: list[str], args: argparse.Namespace,
              bodies: Path, workdir: Path, round_no: int = 0) -> list[dict[str, Any]]:
    """One run: a fresh gateway per policy, all over the same shard replicas, and one open-loop
    load; with several policies (``--paired``) request i goes to gateway i mod n, so every policy
    is measured in the same instants, each at rate/n."""
    names = [f"gw-{scenario}-{policy}-r{round_no}".replace("+", "_") for policy in policy_names]
    gateways: list[Child] = []
    try:
        for policy, name in zip(policy_names, names, strict=True):
            gateways.append(start_gateway(cluster, POLICIES[policy], workdir, name))
        urls = [gateway.ready["url"] for gateway in gateways]  # type: ignore[index]
        before = [hedging_stats(url) for url in urls]
        timeline_path = workdir / f"{names[0]}-timeline.npy"
        command = [sys.executable, "-m", "benchmarks.loadgen", "--bodies", str(bodies),
                   "--rate", str(args.rate), "--duration", str(args.duration), "--warmup", str(args.warmup),
                   "--timeline-out", str(timeline_path)]
        for url in urls:
            command += ["--url", f"{url}/v1/query"]
        killer = None
        if scenario == "S3":
            victim = cluster.shards[0][0]

            def kill() -> None:
                os.kill(victim.process.pid, signal.SIGKILL)  # type: ignore[union-attr]

            killer = threading.Timer(args.warmup + args.duration / 2, kill)
            killer.start()
        output = subprocess.run(command, capture_output=True, text=True, cwd=REPO, check=True)
        if killer is not None:
            killer.join()
            _wait_restarted(cluster)
        load = json.loads(output.stdout.strip().splitlines()[-1])
        after = [hedging_stats(url) for url in urls]
    finally:
        for gateway in gateways:
            gateway.stop()
    timeline = np.load(timeline_path)
    cells = []
    for n, (policy, name) in enumerate(zip(policy_names, names, strict=True)):
        own = load["per_url"][n] if len(urls) > 1 else load
        latencies_path = workdir / f"{name}.npy"
        np.save(latencies_path, timeline[timeline[:, 3] == n, 1] * 1000.0 if len(urls) > 1 else timeline[:, 1] * 1000.0)
        calls = max(after[n]["calls"] - before[n]["calls"], 1)
        counts = {key: after[n].get(key, 0) - before[n].get(key, 0)
                  for key in ("hedges_fired", "hedges_won", "budget_exhausted", "hedges_not_worth", "retries")}
        extra = counts["hedges_fired"] + counts["retries"]
        cells.append({"scenario": scenario, "policy": policy, **load, **own, "rate": args.rate / len(urls),
                      "qps": own["requests"] / args.duration, "shard_calls": calls, "extra_requests": extra,
                      "extra_request_pct": 100.0 * extra / calls, **counts, "latencies_file": str(latencies_path)})
        cells[-1].pop("per_url", None)
    return cells


def pool_rounds(cells: list[dict[str, Any]], pooled_file: Path) -> dict[str, Any]:
    """One cell from its rounds: percentiles over every round's latencies together, counts summed,
    and each round's p99 for the spread. ``pooled_file`` receives the pooled latencies (ms)."""
    if len(cells) == 1:
        return cells[0]
    values = np.concatenate([np.load(cell["latencies_file"]) for cell in cells])
    np.save(pooled_file, values)
    summed = {key: sum(cell[key] for cell in cells)
              for key in ("requests", "errors", "partial", "shard_calls", "extra_requests", "hedges_fired",
                          "hedges_won", "budget_exhausted", "hedges_not_worth", "retries")}
    seconds = sum(cell["requests"] / cell["qps"] for cell in cells if cell["qps"])
    return {"scenario": cells[0]["scenario"], "policy": cells[0]["policy"], **summed,
            "rate": cells[0]["rate"], "qps": summed["requests"] / seconds if seconds else 0.0,
            "p50_ms": float(np.percentile(values, 50)), "p99_ms": float(np.percentile(values, 99)),
            "p999_ms": float(np.percentile(values, 99.9)), "max_ms": float(values.max()),
            "extra_request_pct": 100.0 * summed["extra_requests"] / max(summed["shard_calls"], 1),
            "rounds": len(cells), "round_p99_ms": [cell["p99_ms"] for cell in cells],
            "latencies_file": str(pooled_file)}


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
    parser.add_argument("--policies", default=DEFAULT_POLICIES,
                        help=f"comma list of {', '.join(POLICIES)} (default: all but the A/A control p2c_again)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="runs per cell, the policies interleaved, latencies pooled (default 1)")
    parser.add_argument("--paired", action="store_true",
                        help="run the policies' gateways at once, request i to gateway i mod n (rate split)")
    parser.add_argument("--warmup", type=float, default=3.0, help="unmeasured seconds at the start of each run")
    parser.add_argument("--name", default="tail_latency", help="results file name (default tail_latency)")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    unknown = set(args.policies.split(",")) - set(POLICIES)
    if unknown:
        parser.error(f"unknown policy {sorted(unknown)}; use {', '.join(POLICIES)}")
    corpus = load_corpus()
    work = scratch_dir("shardrag-tail-")
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
                policies = args.policies.split(",")
                rounds: dict[str, list[dict[str, Any]]] = {policy: [] for policy in policies}
                for round_no in range(args.rounds):
                    order = policies if round_no % 2 == 0 else policies[::-1]
                    for group in [order] if args.paired else [[policy] for policy in order]:
                        print(f"{topology} {scenario} {' + '.join(group)} (round {round_no + 1}/{args.rounds}) ...",
                              file=sys.stderr, flush=True)
                        for cell in run_cells(cluster, scenario, group, args, bodies, work / f"{topology}-logs",
                                              round_no):
                            rounds[cell["policy"]].append(cell)
                for policy in policies:
                    pooled = work / f"{topology}-logs" / f"pooled-{scenario}-{policy}.npy".replace("+", "_")
                    row = pool_rounds(rounds[policy], pooled)
                    row["topology"] = f"{num_shards} shards x {replicas} replicas"
                    rows.append(row)
                apply_scenario(cluster, "none")
    for row in rows:
        reference = next((r for r in rows if r["topology"] == row["topology"] and r["scenario"] == row["scenario"]
                          and r["policy"] == "round_robin"), None)
        row["p99_vs_round_robin"] = row["p99_ms"] / reference["p99_ms"] if reference else None
    report(rows, args)
    png = RESULTS / f"{args.name}_cdf.png"
    RESULTS.mkdir(parents=True, exist_ok=True)
    plotted = plot(rows, png)
    payload = {"machine": machine_info(), "rate_qps": args.rate, "duration_s": args.duration, "rounds": args.rounds,
               "paired": args.paired,
               "scenarios": SCENARIOS, "cells": [{k: v for k, v in r.items() if k != "latencies_file"} for r in rows]}
    print(f"\nwrote {write_result(args.name, payload)}" + (f" and {png}" if plotted else ""))


def report(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    print(f"\n== open loop at {args.rate:.0f} QPS, {args.duration:.0f} s per cell"
          + (f" x {args.rounds} interleaved rounds, pooled" if args.rounds > 1 else "") + " ==")
    print(f"{'topology':24} {'sc':3} {'policy':22} {'p50':>7} {'p99':>8} {'p99.9':>8} {'p99/RR':>7} "
          f"{'extra %':>7} {'hedges':>6} {'won':>5} {'errors':>6} {'partial':>7}")
    for r in rows:
        ratio = f"{r['p99_vs_round_robin']:.3f}" if r["p99_vs_round_robin"] is not None else "-"
        print(f"{r['topology']:24} {r['scenario']:3} {r['policy']:22} {r['p50_ms']:7.2f} {r['p99_ms']:8.2f} "
              f"{r['p999_ms']:8.2f} {ratio:>7} {r['extra_request_pct']:7.2f} {r['hedges_fired']:6d} "
              f"{r['hedges_won']:5d} {r['errors']:6d} {r['partial']:7d}")
    for control in ("p2c_peak_ewma+hedging", "p2c_again"):
        pairs = [(r, h) for r in rows for h in rows
                 if (r["policy"], h["policy"]) == ("p2c_peak_ewma", control)
                 and (r["topology"], r["scenario"]) == (h["topology"], h["scenario"])]
        if not pairs:
            continue
        print("\np2c + hedging vs p2c alone (target: p99 <= 1.1x in every scenario)" if control != "p2c_again" else
              "\nA/A control: p2c_again vs p2c_peak_ewma, the same policy twice (the run's resolution)")
        for plain, hedged in pairs:
            spread = ""
            if "round_p99_ms" in plain:
                spread = (f"   per round p99: p2c {', '.join(f'{v:.0f}' for v in plain['round_p99_ms'])}"
                          f" | {hedged['policy']} {', '.join(f'{v:.0f}' for v in hedged['round_p99_ms'])}")
            print(f"{plain['topology']:24} {plain['scenario']:3} p99 x{hedged['p99_ms'] / plain['p99_ms']:.2f}  "
                  f"p99.9 x{hedged['p999_ms'] / plain['p999_ms']:.2f}{spread}")


if __name__ == "__main__":
    main()
