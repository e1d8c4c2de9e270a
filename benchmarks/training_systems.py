"""Training systems measured, not just switched on — run through
``python -m benchmarks.training --systems`` (or this module directly).

Every run: 2 gloo ranks × 1 thread on the 2 slices of msmarco + dbpedia (10k passages),
all-MiniLM-L6-v2, self-supervised pairs, the same steps, batch (16 pairs per rank, 128 tokens),
learning rate and seed; only the one setting named changes. Baseline: fp32, no gradient hook.

  gradient compression   DDP comm hooks fp16 and PowerSGD (rank 2, from step 2) vs none:
                         step time, bytes all-reduced per step, loss parity, final nDCG@10
  precision              bf16 autocast vs fp32 on this CPU (the GPU path — bf16 autocast, or fp16
                         + GradScaler — is the same code, chosen by ``--amp auto``; measure it with
                         ``python -m benchmarks.gpu`` on a GPU machine): step time, loss parity
  stragglers             per-rank local step times of every run summarised (median, p95, slowest
                         over fastest), and one run with rank 1 slowed by the fault injection
                         (SHARDRAG_TRAIN_SLOW_RANK) to show it is detected and named

Loss parity: the mean absolute difference between a run's per-step loss and the baseline's, and
both final losses (the mean of the last 10 steps). JSON in benchmarks/results/training_systems.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from benchmarks.common import machine_info, write_result
from benchmarks.training import _base_dir, evaluate, steady_step_s, train, two_slices
from retrieval.embedding_cache import CachingEncoder, EmbeddingCache, default_cache_dir
from retrieval.encoders import SentenceTransformerEncoder
from training.config import TrainConfig
from training.launch import launch_local

RUNS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("fp32, no hook (baseline)", {}),
    ("fp32, fp16 compression hook", {"comm_hook": "fp16"}),
    ("fp32, PowerSGD rank-2 hook", {"comm_hook": "powersgd"}),
    ("bf16 autocast (CPU), no hook", {"amp": "bf16"}),
)


def gradient_bytes() -> dict[str, int]:
    """Bytes each rank all-reduces per step for MiniLM-L6's gradients under each hook (PowerSGD:
    the P and Q factors of every matrix, 1-D tensors uncompressed, as torch's hook does)."""
    from training.model import BiEncoder

    totals = {"none": 0, "fp16": 0, "powersgd": 0}
    for parameter in BiEncoder.from_checkpoint("default").parameters():
        if not parameter.requires_grad:
            continue
        totals["none"] += parameter.numel() * 4
        totals["fp16"] += parameter.numel() * 2
        if parameter.dim() >= 2:
            rows, cols = parameter.shape[0], parameter[0].numel()
            totals["powersgd"] += (rows + cols) * min(2, rows, cols) * 4
        else:
            totals["powersgd"] += parameter.numel() * 4
    return totals


def loss_parity(run: list[float], baseline: list[float]) -> dict[str, float]:
    return {"mean_abs_diff": statistics.fmean(abs(a - b) for a, b in zip(run, baseline)),
            "final": statistics.fmean(run[-10:]), "baseline_final": statistics.fmean(baseline[-10:])}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.training --systems", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=40, help="training steps per run (default 40)")
    parser.add_argument("--batch-size", type=int, default=16, help="pairs per rank (default 16)")
    parser.add_argument("--straggler-steps", type=int, default=20, help="steps of the slowed-rank run (default 20)")
    parser.add_argument("--slow-s", type=float, default=1.5,
                        help="seconds rank 1 sleeps per step (default 1.5: about 1.7× its compute)")
    parser.add_argument("--no-eval", action="store_true", help="skip the nDCG@10 evaluation of each trained model")
    parser.add_argument("--name", default="training_systems", help="results file name (default training_systems)")
    args = parser.parse_args(argv)
    work, root = two_slices("shardrag-train-systems-")
    common = dict(batch_size=args.batch_size, max_length=128, lr=2e-5, warmup_steps=10, checkpoint_every=1000,
                  threads=1)
    runs: dict[str, dict[str, Any]] = {}
    for index, (label, overrides) in enumerate(RUNS):
        print(f"[{index + 1}/{len(RUNS) + 1}] {label} ...", file=sys.stderr, flush=True)
        summary = train(root, "both-2", work / f"run-{index}", 2, max_steps=args.steps, export_name=f"sys{index}",
                        **common, **overrides)
        runs[label] = {"settings": overrides, "summary": summary}
    print(f"[{len(RUNS) + 1}/{len(RUNS) + 1}] straggler: rank 1 sleeps {args.slow_s} s per step ...",
          file=sys.stderr, flush=True)
    slowed_out = work / "slowed"
    launch_local(TrainConfig(root=str(root), collection="both-2", out=str(slowed_out), max_steps=args.straggler_steps,
                             export=False, straggler_window=5, **common), 2, max_restarts=0, capture=True,
                 env={"SHARDRAG_TRAIN_SLOW_RANK": "1", "SHARDRAG_TRAIN_SLOW_S": str(args.slow_s)})
    slowed = json.loads((slowed_out / "summary.json").read_text())

    baseline = runs[RUNS[0][0]]["summary"]
    quality: dict[str, Any] = {}
    if not args.no_eval:
        base = CachingEncoder(SentenceTransformerEncoder(_base_dir(), name="all-MiniLM-L6-v2", device="cpu"),
                              EmbeddingCache(default_cache_dir()))
        quality["base (untrained)"] = evaluate(None, base, work / "eval")
        for label, row in runs.items():
            print(f"evaluating {label} ...", file=sys.stderr, flush=True)
            quality[label] = evaluate(Path(row["summary"]["exported"]["path"]), None, work / "eval")
    table = {}
    bytes_per_hook = gradient_bytes()
    for label, row in runs.items():
        summary = row["summary"]
        step_s = steady_step_s(summary)
        hook = row["settings"].get("comm_hook", "none")
        table[label] = {"step_s": step_s, "x_baseline_step": step_s / steady_step_s(baseline),
                        "samples_per_s": summary["samples_per_step"] / step_s, "precision": summary["precision"],
                        "comm_hook": summary["comm_hook"], "gradient_bytes_per_step": bytes_per_hook[hook],
                        "loss": loss_parity(summary["history"]["loss"], baseline["history"]["loss"]),
                        "rank_spread": summary["rank_spread"], "quality": quality.get(label)}
    result = {"machine": machine_info(), "settings": {**common, "steps": args.steps, "ranks": 2, "backend": "gloo",
                                                      "model": "all-MiniLM-L6-v2",
                                                      "pairs": "self-supervised from the slices"},
              "runs": table, "base_quality": quality.get("base (untrained)"),
              "straggler": {"slow_rank": 1, "slow_s": args.slow_s, "steps": args.straggler_steps,
                            "rank_spread": slowed["rank_spread"], "events": slowed["history"].get("stragglers", [])}}
    print(f"\n== training systems: 2 gloo ranks × 1 thread, MiniLM, {args.batch_size} pairs/rank, "
          f"{args.steps} steps ==")
    print(f"{'run':30} {'step s':>7} {'× base':>7} {'grad MB/step':>12} {'loss Δ':>7} {'final loss':>10} "
          f"{'rank spread':>11} {'msmarco':>8} {'dbpedia':>8}")
    for label, row in table.items():
        scores = row["quality"] or {}
        ndcg = [f"{100 * scores[name]['ndcg@10']:8.2f}" if name in scores else f"{'-':>8}"
                for name in ("msmarco", "dbpedia")]
        print(f"{label:30} {row['step_s']:7.2f} {row['x_baseline_step']:7.2f} "
              f"{row['gradient_bytes_per_step'] / 1e6:12.2f} {row['loss']['mean_abs_diff']:7.4f} "
              f"{row['loss']['final']:10.4f} {row['rank_spread'].get('slowest_over_fastest') or 0:11.2f} "
              + " ".join(ndcg))
    if quality:
        print(f"{'base (untrained)':30} {'':7} {'':7} {'':12} {'':7} {'':10} {'':11} "
              + " ".join(f"{100 * quality['base (untrained)'][n]['ndcg@10']:8.2f}" for n in ("msmarco", "dbpedia")))
        print("(nDCG@10 × 100 through a 2-shard index built with each model)")
    spread = slowed["rank_spread"]
    named = sorted({rank for event in slowed["history"].get("stragglers", []) for rank in event["ranks"]})
    print(f"\nstraggler run (rank 1 +{args.slow_s} s/step, {args.straggler_steps} steps): per-rank median local step "
          f"{spread['median_s']} s, slowest/fastest ×{spread['slowest_over_fastest']}, "
          f"{spread['straggler_events']} detection events naming ranks {named}")
    print(f"\nwrote {write_result(args.name, result)}")


if __name__ == "__main__":
    main()
