"""Hybrid search's cost against dense search, through the gateway, in one run (issue 36, acceptance 5).

    python -m benchmarks.hybrid_latency                  # ~5 min on 2 cores
    python -m benchmarks.hybrid_latency --repeat 1 --duration 5

Data: msmarco + dbpedia (10k passages, MiniLM vectors from the embedding cache), 4 shards, Flat,
1 replica each, the launcher's gateway. Queries: the 100 real query texts, k=10. The modes take
turns in each round (dense, hybrid rrf, hybrid weighted, lexical), closed loop from
benchmarks/loadgen.py in its own process, c=1 and c=32.

Two cases:
* **cached** — the gateway's query-embedding cache holds every text (warmed first): the dense
  leg costs the fan-out alone, so everything the lexical leg adds shows. The strict case, and
  the one the acceptance figures come from.
* **fresh** — every text unseen (a distinct suffix per request and mode): each query is
  embedded, as a first-time question is; the lexical leg runs meanwhile. As many rounds as the
  cached case (one 8-second cell per mode is noisy behind a ~14 ms embedding).

JSON: benchmarks/results/hybrid_latency.json.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import closed_loop, data_dir, load_corpus, machine_info, process_cpu_s, write_result
from index_shards.build import BuildConfig, build_collection
from retrieval.datasets import load_beir
from serving.local.launcher import LocalCluster

MODES: dict[str, dict[str, Any]] = {
    "dense": {},
    "hybrid rrf": {"mode": "hybrid", "fusion": "rrf"},
    "hybrid weighted": {"mode": "hybrid", "fusion": "weighted"},
    "lexical": {"mode": "lexical"},
}


def texts() -> list[str]:
    found = []
    for name in ("msmarco", "dbpedia"):
        dataset = load_beir(data_dir() / name)
        found.extend(dataset.queries[q] for q in sorted(dataset.queries))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--duration", type=float, default=8.0, help="seconds per cell")
    parser.add_argument("--repeat", type=int, default=2, help="rounds; each round runs every mode once")
    parser.add_argument("--concurrency", default="1,32")
    args = parser.parse_args()
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    corpus = load_corpus()
    queries = texts()
    results: dict[str, Any] = {"machine": machine_info(), "shards": args.shards, "docs": len(corpus.documents),
                               "duration_s": args.duration, "rounds": [], "fresh": []}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        build_collection(work / "root", corpus.documents, corpus.vectors, corpus.version,
                         BuildConfig("hybrid", args.shards, factory="Flat"), show_progress=False)
        with LocalCluster(work / "root", "hybrid", replicas=1, workdir=work / "logs") as cluster:
            import httpx

            pids = {child.name: child.process.pid for child in cluster.children() if child.process}
            with httpx.Client(base_url=cluster.gateway_url, timeout=60) as http:
                for text in queries:  # embeds every text once (the cache) and builds every lexical index
                    for extra in MODES.values():
                        http.post("/v1/query", json={"text": text, "k": 10, **extra}).raise_for_status()
            for round_number in range(args.repeat):
                for concurrency in concurrencies:
                    for mode, extra in MODES.items():
                        bodies = [{"text": text, "k": 10, **extra} for text in queries]
                        before = cpu_by_role(pids)
                        summary = closed_loop(cluster.gateway_url, bodies, work, concurrency, args.duration)
                        spent = cpu_by_role(pids)
                        requests = max(summary["qps"] * (args.duration + 1.0), 1.0)  # the warmup second too
                        cpu = {role: 1000.0 * (spent[role] - before[role]) / requests for role in spent}
                        row = {"round": round_number, "mode": mode, "concurrency": concurrency, **summary,
                               "cpu_ms_per_query": cpu}
                        results["rounds"].append(row)
                        print(f"round {round_number} c={concurrency:>2} {mode:16} {summary['qps']:7.0f} QPS  "
                              f"p50 {summary['p50_ms']:6.2f} ms  p99 {summary['p99_ms']:6.2f} ms  "
                              f"errors {summary['errors']['count']}  CPU ms/query gateway {cpu['gateway']:.2f} "
                              f"shards {cpu['shards']:.2f} encoders {cpu['encoders']:.2f}", flush=True)
            for round_number in range(args.repeat):  # fresh texts: every request's text is new, so embedded
                for concurrency in concurrencies:
                    for mode, extra in MODES.items():
                        stamp = time.time_ns()
                        bodies = [{"text": f"{text} q{stamp}x{i}", "k": 10, **extra}
                                  for i, text in enumerate(queries * 20)]
                        summary = closed_loop(cluster.gateway_url, bodies, work, concurrency, args.duration)
                        results["fresh"].append({"round": round_number, "mode": mode, "concurrency": concurrency,
                                                 **summary})
                        print(f"fresh  round {round_number} c={concurrency:>2} {mode:16} {summary['qps']:7.0f} QPS  "
                              f"p50 {summary['p50_ms']:6.2f} ms  p99 {summary['p99_ms']:6.2f} ms", flush=True)
    results["summary"] = summarise(results)
    written = write_result("hybrid_latency", results)
    print(f"\nwrote {written}")


def cpu_by_role(pids: dict[str, int]) -> dict[str, float]:
    """CPU seconds so far: the gateway process, the shard processes, the encoder workers (children
    of the gateway, found in /proc)."""
    totals = {"gateway": 0.0, "shards": 0.0, "encoders": 0.0}
    for name, pid in pids.items():
        totals["gateway" if name == "gateway" else "shards"] += process_cpu_s(pid)
    gateway = pids.get("gateway")
    for child in Path("/proc").glob("[0-9]*"):
        try:
            parent = int((child / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if gateway is not None and parent == gateway:
            totals["encoders"] += process_cpu_s(int(child.name))
    return totals


def summarise(results: dict[str, Any]) -> dict[str, Any]:
    """Per round, hybrid against dense measured beside it: p50 added at c=1, QPS ratio at c=32
    (cached texts; then fresh texts, as many rounds)."""
    out: dict[str, Any] = {"cached": _ratios(results["rounds"]),
                           "fresh": _ratios(results["fresh"], "fresh: ")}
    return out


def _ratios(rows: list[dict[str, Any]], label: str = "") -> dict[str, Any]:
    by = {(r["round"], r["mode"], r["concurrency"]): r for r in rows}
    rounds = sorted({r["round"] for r in rows})
    out: dict[str, Any] = {}
    for mode in ("hybrid rrf", "hybrid weighted", "lexical"):
        added = [by[(n, mode, 1)]["p50_ms"] - by[(n, "dense", 1)]["p50_ms"] for n in rounds if (n, mode, 1) in by]
        ratio = [by[(n, mode, 32)]["qps"] / by[(n, "dense", 32)]["qps"] for n in rounds if (n, mode, 32) in by]
        out[mode] = {"c1_p50_added_ms": added, "c32_qps_ratio": ratio}
        if added:
            print(f"{label}{mode:16} c=1 p50 added: {', '.join(f'{a:+.2f}' for a in added)} ms "
                  f"(median {statistics.median(added):+.2f}, worst {max(added):+.2f})  target ≤ +1.5")
        if ratio:
            print(f"{label}{mode:16} c=32 QPS ratio: {', '.join(f'{r:.2f}' for r in ratio)} "
                  f"(median {statistics.median(ratio):.2f}, worst {min(ratio):.2f})  target ≥ 0.70")
    return out


if __name__ == "__main__":
    main()
