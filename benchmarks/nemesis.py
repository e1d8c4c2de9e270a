"""The long checked run across hosts (issue 34, acceptance 4): 2 shards × 3 replicas, 2 gateways
and 3 etcd members, each in a network namespace of its own, under a seeded nemesis schedule
(partitions of a primary both ways and one way, a gateway cut from etcd, an etcd minority, a link
down, kills, pauses, latency) with a rollout V1 → V2 in the middle; 3 clients write, read their
writes and query through both gateways; the Jepsen-style checker reads the history afterwards.

    sudo .venv/bin/python -m benchmarks.nemesis --minutes 10 --seed 34

Prints and writes benchmarks/results/nemesis.json: operations, acknowledged, unknown, lost (the
checker's lost writes: must be 0), anomalies (must be 0), and per fault kind the availability of
writes and of reads while it was held — side by side with the quiet windows between faults (the
baseline) — and the recovery time: from the fault's start to the first acknowledged write
invoked after it. Needs root (network namespaces) and etcd (scripts/install-system-deps.sh).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from benchmarks.common import data_dir, machine_info, write_result
from index_shards.build import BuildConfig, build_collection
from serving.gateway.config import GatewayConfig
from serving.local.history import History, Op, check
from serving.local.lab import Lab
from serving.local.nemesis import Nemesis, plan
from serving.local.workload import Workload, roll_out

WRITES, READS = ("upsert", "delete"), ("read", "query")


def availability(ops: list[Op]) -> float | None:
    return round(sum(op.outcome == "ok" for op in ops) / len(ops), 4) if ops else None


def per_fault(history: History, nemesis: Nemesis) -> dict[str, Any]:
    """Availability of writes and reads while each kind of fault was held vs the quiet windows, and
    the recovery times (fault start → first acknowledged write invoked after it)."""
    windows = [(step.kind, began, healed) for step, _, began, healed in nemesis.done]
    in_fault: dict[str, list[Op]] = defaultdict(list)
    quiet: list[Op] = []
    for op in history.ops:
        kinds = [kind for kind, began, healed in windows if began <= op.invoked <= healed]
        for kind in kinds:
            in_fault[kind].append(op)
        if not kinds:
            quiet.append(op)
    rows: dict[str, Any] = {"quiet (baseline)": {"writes": availability([o for o in quiet if o.kind in WRITES]),
                                                 "reads": availability([o for o in quiet if o.kind in READS]),
                                                 "operations": len(quiet)}}
    for kind in sorted(in_fault):
        recoveries = []
        for fault, began, _ in windows:
            if fault == kind:
                first = min((o.completed for o in history.ops if o.kind in WRITES and o.outcome == "ok"
                             and o.invoked >= began), default=None)
                recoveries.append(round(first - began, 2) if first is not None else None)
        ops = in_fault[kind]
        rows[kind] = {"writes": availability([o for o in ops if o.kind in WRITES]),
                      "reads": availability([o for o in ops if o.kind in READS]), "operations": len(ops),
                      "faults": len(recoveries), "recovery_s": recoveries}
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=10.0, help="length of the run (default 10)")
    parser.add_argument("--seed", type=int, default=34, help="seed of the schedule and the clients (default 34)")
    parser.add_argument("--docs", type=int, default=300, help="documents in the collection (default 300)")
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from retrieval.datasets import load_beir
    from retrieval.embedding_cache import CachingEncoder, EmbeddingCache, default_cache_dir
    from retrieval.encoders import SentenceTransformerEncoder, default_model_dir, encode_documents, load_default_encoder
    from tests.helpers.checkpoints import perturbed_checkpoint

    duration = args.minutes * 60
    dataset = load_beir(data_dir() / "msmarco")
    documents = dataset.corpus[:args.docs]
    queries = [dataset.queries[q] for q in sorted(dataset.queries)[:10]]
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        cache = EmbeddingCache(default_cache_dir())
        v1 = CachingEncoder(load_default_encoder(device="cpu"), cache)
        build_collection(work / "root", documents, encode_documents(v1, documents, show_progress=False), v1.version,
                         BuildConfig("bench", 2), show_progress=False)
        model = perturbed_checkpoint(default_model_dir(), work / "minilm-v2", seed=3, scale=0.02)
        v2 = CachingEncoder(SentenceTransformerEncoder(model, device="cpu"), cache)
        build_collection(work / "root", documents, encode_documents(v2, documents, show_progress=False), v2.version,
                         BuildConfig("bench", 2), show_progress=False)
        config = GatewayConfig.from_dict({"writes": {"timeout_s": 20.0},
                                          "rollout": {"poll_interval_s": 0.3, "drain_s": 1.0},
                                          "gate": {"min_overlap": 0.3, "sample": 10, "busy_share": 1.0}})
        started_at = time.time()
        with Lab(work / "root", "bench", version=v1.version.id, replicas=3, gateways=2, etcd_members=3,
                 workdir=work / "lab", gateway=config, shard_args=("--lease-s", "2")) as lab:
            history = History()
            steps = plan(args.seed, duration - 10, shards=2, gateways=2, etcd_members=3)
            nemesis = Nemesis(lab, history, steps, seed=args.seed)
            print(nemesis.plan_text(), flush=True)
            workload = Workload(lambda: lab.gateway_urls, history, clients=3, seed=args.seed).start()
            nemesis.start()
            began = time.monotonic()
            try:
                time.sleep(duration / 3)
                rollout = roll_out(lambda: lab.gateway_urls, history, v2.version.id, str(model), queries,
                                   deadline=began + duration)
                time.sleep(max(0.0, began + duration - time.monotonic()))
            finally:
                nemesis.stop()
                workload.stop()
            assert lab.etcd is not None
            lab.etcd.wait_healthy(60)
            report = check(history, workload.final_state(lab.serving_gateway(0)), lab.digests())
        shutil.rmtree(work / "lab", ignore_errors=True)
    counts = report.counts
    result = {
        "machine": machine_info(), "started": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started_at)),
        "cluster": "2 shards x 3 replicas, 2 gateways, 3 etcd members; each in its own network namespace",
        "seed": args.seed, "minutes": args.minutes, "rollout": rollout, "faults": len(nemesis.done),
        "operations": counts.get("operations", 0),
        "acknowledged": counts.get("ok", 0), "unknown": counts.get("unknown", 0), "refused": counts.get("fail", 0),
        "writes_acknowledged": counts.get("upsert:ok", 0) + counts.get("delete:ok", 0),
        "lost": sum(a.kind in ("lost-write", "resurrected-delete") for a in report.anomalies),
        "anomalies": len(report.anomalies), "anomaly_kinds": sorted({a.kind for a in report.anomalies}),
        "per_fault": per_fault(history, nemesis), "counts": counts,
    }
    path = write_result("nemesis", result)
    print(f"\n{result['operations']} operations, {result['acknowledged']} acknowledged "
          f"({result['writes_acknowledged']} writes), {result['unknown']} unknown, {result['refused']} refused; "
          f"lost {result['lost']}, anomalies {result['anomalies']}; rollout: {rollout}; {result['faults']} faults")
    quiet = result["per_fault"]["quiet (baseline)"]
    print(f"{'window':<20} {'writes ok':>10} {'vs quiet':>9} {'reads ok':>10} {'vs quiet':>9}  recovery s")
    for kind, row in result["per_fault"].items():
        shown = {k: "-" if row[k] is None else str(row[k]) for k in ("writes", "reads")}
        ratio = {k: f"x{row[k] / quiet[k]:.2f}" if row[k] is not None and quiet[k] else "-" for k in shown}
        print(f"{kind:<20} {shown['writes']:>10} {ratio['writes']:>9} {shown['reads']:>10} {ratio['reads']:>9}  "
              f"{row.get('recovery_s', '')}")
    if not report.ok:
        print(report.text(), flush=True)
    print(f"written to {path}")
    sys.exit(0 if report.ok and rollout == "done" else 1)


if __name__ == "__main__":
    main()
