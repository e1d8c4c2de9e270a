"""Chaos benchmark: kill -9 a random shard replica every 5 s under steady load, with an
embedding-version rollout in the middle, vs the same load without chaos.

    python -m benchmarks.chaos                     # ~5 min on 2 cores
    python -m benchmarks.chaos --chaos-s 60 --no-rollout

Local cluster: msmarco (5k passages), 4 shards × 2 replicas, gateway with real encoders.
Load: 3 closed-loop clients sending *text* queries (k=10, timeout 3 s), so answers go through
the encoder of whichever version is active. Baseline: the load alone. Chaos: the same load
while `serving.chaos.ChaosMonkey` kill -9s a random replica (of a shard whose replicas are all
up) every --every-s; the launcher's supervisor restarts each with back-off. With --rollout
(default), V2 (a perturbed MiniLM, corpus re-embedded, vectors cached) is staged, activated
through the quality gate and V1 retired while the monkey runs. Reported: full answers %,
partial % (each naming its missing shards), errors, wrong-version answers (a hit of another
version, or a version neither V1 nor V2), p50/p99 vs the baseline, kills and restarts.
Targets: ≥ 99.9 % full answers, 0 errors, 0 wrong-version answers.
JSON in benchmarks/results/chaos.json.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from benchmarks.common import REPO, data_dir, machine_info, scratch_dir, write_result
from index_shards.build import BuildConfig, build_collection
from retrieval.datasets import load_beir
from retrieval.embedding_cache import CachingEncoder, EmbeddingCache, default_cache_dir
from retrieval.encoders import SentenceTransformerEncoder, default_model_dir, encode_documents, load_default_encoder
from serving.gateway.config import GatewayConfig
from serving.local.chaos import ChaosMonkey, QueryLoad
from serving.local.launcher import LocalCluster


def rollout(url: str, v1: str, v2: str, model_dir: Path, queries: list[str], log: dict[str, Any]) -> None:
    """stage → wait ready → activate (quality gate) → drain → retire, logging each step's time."""
    started = time.monotonic()
    try:
        httpx.post(f"{url}/admin/rollout/stage", json={"version": v2, "model": str(model_dir)},
                   timeout=300).raise_for_status()
        while True:
            status = httpx.get(f"{url}/admin/rollout", timeout=30).json()
            rows = [row for shard in status["replicas"].get(v2, {}).values() for row in shard]
            if rows and all(r["state"] == "ready" for r in rows) and status["encoders"][v2]["state"] == "ready":
                break
            time.sleep(0.2)
        log["ready_s"] = time.monotonic() - started
        # Activation needs every replica ready; a replica the monkey just killed reloads both
        # versions when it comes back (the registry reconciles it), so retry until it is.
        while True:
            response = httpx.post(f"{url}/admin/rollout/activate", json={"version": v2, "queries": queries[:50]},
                                  timeout=300)
            if response.status_code == 200:
                break
            log.setdefault("activate_retries", []).append(response.json().get("error", {}).get("message", "")[:200])
            time.sleep(1.0)
        log["activated_s"] = time.monotonic() - started
        time.sleep(3.0)
        httpx.post(f"{url}/admin/rollout/retire", json={"version": v1}, timeout=300).raise_for_status()
        log["retired_s"] = time.monotonic() - started
    except Exception as exc:  # noqa: BLE001 - reported, the benchmark goes on
        log["error"] = repr(exc)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline-s", type=float, default=40.0, help="load without chaos (default 40)")
    parser.add_argument("--chaos-s", type=float, default=130.0, help="load with chaos (default 130, ≥ 120)")
    parser.add_argument("--every-s", type=float, default=5.0, help="seconds between kills (default 5)")
    parser.add_argument("--clients", type=int, default=3, help="closed-loop clients (default 3)")
    parser.add_argument("--no-rollout", action="store_true", help="chaos only, no version rollout in parallel")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()

    work = scratch_dir("shardrag-chaos-")
    dataset = load_beir(data_dir() / "msmarco")
    cache = EmbeddingCache(default_cache_dir())
    v1_encoder = CachingEncoder(load_default_encoder(device="cpu"), cache)
    encoders = [v1_encoder]
    model_dir = work / "minilm-tuned"
    if not args.no_rollout:
        sys.path.insert(0, str(REPO))
        from tests.helpers.checkpoints import perturbed_checkpoint

        perturbed_checkpoint(default_model_dir(), model_dir, seed=1, scale=0.02)  # same as benchmarks.rollout
        encoders.append(CachingEncoder(SentenceTransformerEncoder(model_dir, device="cpu"), cache))
    root = work / "root"
    for encoder in encoders:
        vectors = encode_documents(encoder, dataset.corpus, show_progress=True)
        build_collection(root, dataset.corpus, vectors, encoder.version, BuildConfig("msmarco", 4), show_progress=False)
    v1 = v1_encoder.version.id
    v2 = encoders[-1].version.id if len(encoders) > 1 else None
    queries = [dataset.queries[q] for q in sorted(dataset.queries)]
    bodies = [{"text": q, "k": 10, "timeout_ms": 3000} for q in queries]
    expected = {v1} | ({v2} if v2 else set())
    config = GatewayConfig.from_dict({"rollout": {"poll_interval_s": 0.5, "drain_s": 2.0}, "gate": {"sample": 50},
                                      "ejection": {"base_s": 0.5, "probe_interval_s": 0.2}})

    with LocalCluster(root, "msmarco", version=v1, replicas=2, gateway=config, workdir=work / "logs") as cluster:
        url = cluster.gateway_url
        print(f"baseline: {args.baseline_s:.0f} s of load, no chaos ...", flush=True)
        with QueryLoad(url, bodies, clients=args.clients, expected_versions={v1}) as load:
            time.sleep(args.baseline_s)
        baseline = load.report()
        print(f"chaos: {args.chaos_s:.0f} s, a kill every {args.every_s:.0f} s"
              + ("" if args.no_rollout else f", rollout {v1} → {v2}") + " ...", flush=True)
        rollout_log: dict[str, Any] = {}
        with ChaosMonkey(cluster, every_s=args.every_s, seed=args.seed) as monkey, \
                QueryLoad(url, bodies, clients=args.clients, expected_versions=expected) as load:
            worker = None
            if v2:
                time.sleep(min(20.0, args.chaos_s / 4))
                worker = threading.Thread(target=rollout, args=(url, v1, v2, model_dir, queries, rollout_log))
                worker.start()
            time.sleep(args.chaos_s - (min(20.0, args.chaos_s / 4) if v2 else 0.0))
            if worker is not None:
                worker.join(300)
        chaos = load.report(monkey)
        view = httpx.get(f"{url}/v1/cluster", timeout=30).json()
        chaos["restarts"] = view["supervision"]["total_restarts"] if view.get("supervision") else None
        chaos["active_after"] = view["rollout"].get("active")

    print(f"\n{'run':9} {'queries':>8} {'full %':>8} {'partial':>8} {'errors':>7} {'wrong ver':>9} "
          f"{'p50 ms':>7} {'p99 ms':>7} {'kills':>6} {'restarts':>8}")
    for name, r in (("baseline", baseline), ("chaos", chaos)):
        print(f"{name:9} {r['requests']:>8} {r['full_pct']:>8.3f} {r['partial']:>8} {r['errors']:>7} "
              f"{r['wrong_version']:>9} {r['p50_ms']:>7.1f} {r['p99_ms']:>7.1f} {r.get('kills', 0):>6} "
              f"{r.get('restarts') if r.get('restarts') is not None else '-':>8}")
    print(f"p50 ×{chaos['p50_ms'] / baseline['p50_ms']:.2f}, p99 ×{chaos['p99_ms'] / baseline['p99_ms']:.2f} vs "
          f"baseline; partial answers flagged with their shards: {chaos['partial_unflagged'] == 0} "
          f"(missing shards seen: {chaos['partial_missing_shards']}); rollout: {rollout_log or 'off'}; "
          f"active after: {chaos['active_after']}")
    path = write_result("chaos", {"machine": machine_info(), "settings": vars(args), "v1": v1, "v2": v2,
                                  "baseline": baseline, "chaos": chaos, "rollout": rollout_log})
    print(f"\nwritten {path}")


if __name__ == "__main__":
    main()
