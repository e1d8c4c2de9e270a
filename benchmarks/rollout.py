"""Latency and memory during an embedding-version rollout under load.

    python -m benchmarks.rollout            # ~3 min (plus ~2 min to embed V2 the first time)
    python -m benchmarks.rollout --encoder-runtime onnx --name rollout_onnx

Local cluster: msmarco (5k passages), 2 shards × 2 replicas, a gateway with real encoders.
V1 = all-MiniLM-L6-v2; V2 = the same model with perturbed weights (a real second version, the
corpus re-embedded with it; vectors cached). Open-loop *text* queries at a fixed rate run the
whole time; meanwhile: stage V2 → wait until every replica and the V2 encoder are ready →
activate (quality gate on the queries) → drain → retire V1. Reported: p50/p99/p99.9 and errors
before, during and after the rollout (the phases before and after are the no-rollout baseline),
time from stage to activate-ready, activation time, and each replica's resident memory holding
one version vs two. JSON in benchmarks/results/rollout.json.

One rollout lasts a few seconds: at 40 QPS its "loading" phase holds ~20 queries, so its "p99"
is the slowest of them. ``--cycles N`` rolls N times (V1 → V2, then back to V1 — staged,
gated and retired the same way — and so on, a few quiet seconds between) and pools each phase's
queries over all of them, so the phase p99s are percentiles of a few hundred to a few thousand
queries; the first rollout's own figures are kept beside them, and "quiet" pools every query sent
outside a rollout (before, between, after) as the baseline the ratios are best read against.

    python -m benchmarks.rollout --encoder-runtime onnx --cycles 10 --name rollout_cycles_onnx
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from benchmarks.common import REPO, data_dir, machine_info, scratch_dir, write_result
from index_shards.build import BuildConfig, build_collection
from retrieval.datasets import load_beir
from retrieval.embedding_cache import CachingEncoder, EmbeddingCache, default_cache_dir
from retrieval.encoders import SentenceTransformerEncoder, default_model_dir, encode_documents, load_default_encoder
from serving.gateway.config import GatewayConfig
from serving.local.launcher import LocalCluster


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def replica_rss(cluster: LocalCluster) -> list[float]:
    return [rss_mib(child.process.pid) for group in cluster.shards for child in group]  # type: ignore[union-attr]


def perturbed(target: Path) -> Path:
    sys.path.insert(0, str(REPO))
    from tests.helpers.checkpoints import perturbed_checkpoint

    return perturbed_checkpoint(default_model_dir(), target, seed=1, scale=0.02)


def phase_stats(timeline: np.ndarray, start: float, end: float) -> dict[str, Any]:
    return pooled_stats(timeline, [(start, end)])


def pooled_stats(timeline: np.ndarray, windows: list[tuple[float, float]]) -> dict[str, Any]:
    """Latency percentiles of the queries sent in any of ``windows`` ((start, end) wall-clock
    seconds); "seconds" is their total length."""
    inside = np.zeros(len(timeline), dtype=bool)
    for start, end in windows:
        inside |= (timeline[:, 0] >= start) & (timeline[:, 0] < end)
    rows = timeline[inside]
    if rows.size == 0:
        return {"requests": 0}
    latencies = rows[:, 1] * 1000.0
    return {"requests": int(len(rows)), "errors": int((rows[:, 2] == 0).sum()),
            "p50_ms": float(np.percentile(latencies, 50)), "p99_ms": float(np.percentile(latencies, 99)),
            "p999_ms": float(np.percentile(latencies, 99.9)),
            "seconds": float(sum(end - start for start, end in windows))}


def roll(url: str, target: str, model: str, retiring: str, queries: list[str], config: GatewayConfig,
         rss: Callable[[], list[float]]) -> tuple[dict[str, float], Any, list[float]]:
    """One rollout from ``retiring`` to ``target``: stage, wait until every replica and the
    encoder are ready, activate behind the quality gate, drain, retire. Returns the wall-clock
    marks, the gate's report and the replicas' RSS while both versions are loaded."""
    marks: dict[str, float] = {"stage": time.time()}
    httpx.post(f"{url}/admin/rollout/stage", json={"version": target, "model": model}, timeout=300).raise_for_status()
    while True:
        status = httpx.get(f"{url}/admin/rollout", timeout=30).json()
        rows = [row for shard in status["replicas"][target].values() for row in shard]
        if all(r["state"] == "ready" for r in rows) and status["encoders"][target]["state"] == "ready":
            break
        if any(r["state"] == "failed" for r in rows):
            raise RuntimeError(f"staging failed: {rows}")
        if status["encoders"][target]["state"] == "failed":
            raise RuntimeError(f"the encoder of {target} failed to load: {status['encoders'][target]['error']}")
        time.sleep(0.1)
    marks["ready"] = time.time()
    rss_staged = rss()
    activated = httpx.post(f"{url}/admin/rollout/activate", json={"version": target, "queries": queries},
                           timeout=300)
    activated.raise_for_status()
    marks["activated"] = time.time()
    time.sleep(config.rollout.drain_s + 0.5)
    httpx.post(f"{url}/admin/rollout/retire", json={"version": retiring}, timeout=300).raise_for_status()
    marks["retired"] = time.time()
    return marks, activated.json().get("gate"), rss_staged


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=40.0, help="open-loop text queries per second (default 40)")
    parser.add_argument("--cache", action="store_true", help="keep the query-embedding cache on (default off)")
    parser.add_argument("--baseline", type=float, default=25.0, help="seconds before and after the rollout")
    parser.add_argument("--encoder-runtime", choices=("torch", "onnx"), default="torch",
                        help="what runs the gateway's encoders (onnx: fp32 ONNX Runtime, the same embedding "
                             "versions; both exports are made before the measurement, as `shardrag build "
                             "--runtime onnx` makes them at build time)")
    parser.add_argument("--gate-busy-share", type=float, default=None,
                        help="the gateway's gate.busy_share (default: the config default, 0.5)")
    parser.add_argument("--cycles", type=int, default=1,
                        help="rollouts in a row, alternating V1 → V2 → V1 ...; their phases are pooled (default 1)")
    parser.add_argument("--quiet", type=float, default=4.0, help="seconds between two rollouts (default 4)")
    parser.add_argument("--name", default="rollout", help="results file name (default rollout)")
    args = parser.parse_args()
    work = scratch_dir("shardrag-rollout-")
    dataset = load_beir(data_dir() / "msmarco")
    cache = EmbeddingCache(default_cache_dir())
    v1_encoder = CachingEncoder(load_default_encoder(device="cpu"), cache)
    model_dir = perturbed(work / "minilm-tuned")
    v2_encoder = CachingEncoder(SentenceTransformerEncoder(model_dir, device="cpu"), cache)
    root = work / "root"
    for encoder in (v1_encoder, v2_encoder):
        vectors = encode_documents(encoder, dataset.corpus, show_progress=True)
        build_collection(root, dataset.corpus, vectors, encoder.version, BuildConfig("msmarco", 2),
                         show_progress=False)
    v1, v2 = v1_encoder.version.id, v2_encoder.version.id
    if args.encoder_runtime == "onnx":
        from retrieval.onnx_export import cached_export

        for source in (None, model_dir):  # what the encoder workers will load, exported once per machine
            cached_export(source)
    queries = [dataset.queries[q] for q in sorted(dataset.queries)]
    bodies = work / "bodies.json"
    bodies.write_text(json.dumps([{"text": q, "k": 10} for q in queries]))
    # The query-embedding cache off unless asked for: the 100 queries repeat, and with it on
    # nearly every query would skip the encoder whose loading this measures.
    gate_settings: dict[str, Any] = {"sample": 50}
    if args.gate_busy_share is not None:
        gate_settings["busy_share"] = args.gate_busy_share
    config = GatewayConfig.from_dict({"rollout": {"poll_interval_s": 0.5, "drain_s": 2.0}, "gate": gate_settings,
                                      "encoder": {"cache_size": 10_000 if args.cache else 0,
                                                  "runtime": args.encoder_runtime}})
    with LocalCluster(root, "msmarco", version=v1, replicas=2, gateway=config, workdir=work / "logs") as cluster:
        url = cluster.gateway_url
        total_s = 2 * args.baseline + 60.0 + (args.cycles - 1) * (args.quiet + 15.0)
        timeline_path = work / "timeline.npy"
        load = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.loadgen", "--url", f"{url}/v1/query", "--bodies", str(bodies),
             "--rate", str(args.rate), "--duration", str(total_s), "--warmup", "2",
             "--timeline-out", str(timeline_path)],
            cwd=REPO, stdout=subprocess.PIPE, text=True)
        time.sleep(2 + args.baseline)
        rss_one = replica_rss(cluster)
        models = {v1: "default", v2: str(model_dir)}  # V1 as the gateway started with it: the packaged model
        cycles: list[dict[str, float]] = []
        rss_two: list[float] = []
        rss_after: list[float] = []
        gates: list[Any] = []
        current, target = v1, v2
        for cycle in range(args.cycles):
            if cycle:
                time.sleep(args.quiet)  # a quiet gap: the rollouts' tails do not run into each other
            marks, gate, rss_staged = roll(url, target, models[target], current, queries, config,
                                               lambda: replica_rss(cluster))
            cycles.append(marks)
            gates.append(gate)
            if cycle == 0:
                rss_two = rss_staged
                time.sleep(2.0)
                rss_after = replica_rss(cluster)
            current, target = target, current
        cycles_end = time.time()
        summary = json.loads(load.communicate(timeout=total_s + 120)[0].strip().splitlines()[-1])
        timeline = np.load(timeline_path)
    start, end = timeline[0, 0], timeline[-1, 0] + 1e-6
    first = cycles[0]
    after_start = max(cycles_end, first["retired"])
    gaps = [(a["retired"] + 1.0, b["stage"]) for a, b in zip(cycles, cycles[1:])]  # between two rollouts

    def windows(opened: str, closed: str) -> list[tuple[float, float]]:
        return [(cycle[opened], cycle[closed]) for cycle in cycles]

    # the first rollout alone (as before --cycles), then every rollout's queries pooled
    phases = {
        "before": phase_stats(timeline, start, first["stage"]),
        "during": phase_stats(timeline, first["stage"], first["retired"]),
        "loading": phase_stats(timeline, first["stage"], first["ready"]),  # V2 on replicas + its encoder
        "activating": phase_stats(timeline, first["ready"], first["activated"]),  # readiness + quality gate
        "after": phase_stats(timeline, after_start, end),
    }
    if args.cycles > 1:
        phases |= {
            "between": pooled_stats(timeline, gaps),
            "during_all": pooled_stats(timeline, windows("stage", "retired")),
            "loading_all": pooled_stats(timeline, windows("stage", "ready")),
            "activating_all": pooled_stats(timeline, windows("ready", "activated")),
            # every query outside the rollouts: a baseline of thousands of queries, where "before"
            # alone (~1,000) moves by a third between runs with one slow burst
            "quiet": pooled_stats(timeline, [(start, first["stage"]), *gaps, (after_start, end)]),
        }
    result = {
        "machine": machine_info(), "rate_qps": args.rate, "embedding_cache": args.cache,
        "encoder_runtime": args.encoder_runtime, "v1": v1, "v2": v2,
        "phases": phases,
        "stage_to_ready_s": first["ready"] - first["stage"],
        "activate_s": first["activated"] - first["ready"],
        "gate": gates[0], "cycles": len(cycles),
        "gates_passed": [bool(g and g.get("passed")) for g in gates],
        "cycle_marks": [{k: v - first["stage"] for k, v in m.items()} for m in cycles],
        "replica_rss_mib": {"one_version": rss_one, "two_versions": rss_two, "after_retire": rss_after},
        "load": summary,
    }
    print(f"\n== rollout under {args.rate:.0f} QPS of text queries (2 shards x 2 replicas, 5k docs, "
          f"encoders on {args.encoder_runtime}) ==")
    quiet = phases.get("quiet", phases["before"])
    print(f"{'phase':14} {'requests':>8} {'errors':>6} {'p50 ms':>8} {'p99 ms':>8} {'p99.9 ms':>9} "
          f"{'p99 vs before':>13} {'vs quiet':>8}")
    for name, row in phases.items():
        ratio = row["p99_ms"] / phases["before"]["p99_ms"] if row.get("requests") else float("nan")
        to_quiet = row["p99_ms"] / quiet["p99_ms"] if row.get("requests") else float("nan")
        print(f"{name:14} {row['requests']:8d} {row.get('errors', 0):6d} {row.get('p50_ms', 0):8.2f} "
              f"{row.get('p99_ms', 0):8.2f} {row.get('p999_ms', 0):9.2f} {ratio:13.2f} {to_quiet:8.2f}")
    print(f"stage → activate-ready: {result['stage_to_ready_s']:.2f} s (replicas load + V2 encoder); "
          f"activate (readiness + quality gate): {result['activate_s']:.2f} s; gate: {result['gate']}")
    rss = result["replica_rss_mib"]
    print("replica RSS MiB, one version → two → after retire: "
          + ", ".join(f"{a:.0f}→{b:.0f}→{c:.0f}" for a, b, c in zip(rss["one_version"], rss["two_versions"],
                                                                   rss["after_retire"]))
          + f"  (mean ×{np.mean(rss['two_versions']) / np.mean(rss['one_version']):.2f} with two)")
    print(f"\nwrote {write_result(args.name, result)}")


if __name__ == "__main__":
    main()
