"""Which training signal lifts quality, and what stale negatives cost — run through
``python -m benchmarks.training --signal`` (or this module directly).

Every run: 2 gloo ranks on the 2 slices of msmarco + dbpedia (10k passages), MiniLM-L6, the same
step budget, batch and learning rate; evaluated through a sharded index built with the trained
encoder on both datasets' judged queries (nDCG@10, recall@100), and put through the rollout's
quality gate (``serving.versions.gate.quality_gate``, the gateway's default settings, against
the base model's rankings of the same queries with their qrels), and through the same gate with
``max_ndcg_drop: 0`` (no loss of nDCG@10 allowed — what a training rollout should run with).
Training never reads the evaluation queries or qrels.

  self-supervised        title→text and crop pairs from the slices (the previous recipe)
  synthetic              SmolLM2 queries for N passages per slice, round-trip filtered
  + refresh every R      synthetic + hard negatives from the slices re-encoded every R steps
  + never refreshed      synthetic + hard negatives from the slices encoded once at step 0
  + serving index        synthetic + hard negatives mined through a gateway over the base index

JSON in benchmarks/results/training_signal.json; generation and training times per run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.common import data_dir, machine_info, write_result
from benchmarks.training import evaluate_encoder, two_slices
from retrieval.datasets import load_beir
from retrieval.embedding_cache import CachingEncoder, EmbeddingCache, default_cache_dir
from retrieval.encoders import SentenceTransformerEncoder, default_model_dir
from training.config import TrainConfig
from training.launch import launch_local


def _train(root: Path, out: Path, **overrides: Any) -> dict[str, Any]:
    config = TrainConfig(root=str(root), collection="both-2", out=str(out), **overrides)
    started = time.perf_counter()
    launch_local(config, 2, max_restarts=0, capture=True)
    summary: dict[str, Any] = json.loads((out / "summary.json").read_text())
    summary["wall_s"] = time.perf_counter() - started
    return summary


def _evaluate(encoder: Any, work: Path) -> dict[str, Any]:
    return evaluate_encoder(encoder, work, with_rankings=True)


def _gate(base: dict[str, Any], trained: dict[str, Any], max_ndcg_drop: float | None = None) -> dict[str, Any]:
    """The rollout gate's verdict per dataset, on every judged query with its qrels (the gateway's
    default settings, or ``max_ndcg_drop`` — 0: a trained model may not lose any nDCG@10)."""
    from serving.versions.gate import GateSettings, quality_gate

    verdicts = {}
    for name in ("msmarco", "dbpedia"):
        dataset = load_beir(data_dir() / name)
        queries = {q: t for q, t in dataset.judged_queries().items()}
        by_text = {text: q for q, text in queries.items()}
        rankings = {"old": base[name]["rankings"], "new": trained[name]["rankings"]}

        async def search(text: str, version: str, k: int, rankings: dict[str, Any] = rankings,
                         by_text: dict[str, str] = by_text) -> list[str]:
            return list(rankings[version][by_text[text]][:k])

        settings = GateSettings(sample=len(queries))
        if max_ndcg_drop is not None:
            settings = GateSettings(sample=len(queries), max_ndcg_drop=max_ndcg_drop)
        verdict = asyncio.run(quality_gate("old", "new", queries, dataset.qrels, search=search, settings=settings,
                                           recent=[], encoders_loaded=True))
        verdicts[name] = {k: verdict[k] for k in ("passed", "reason", "overlap_at_10", "ndcg_at_10") if k in verdict}
    return {"passed": all(v["passed"] for v in verdicts.values()), "datasets": verdicts}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=2e-5)
    parser.add_argument("--synthetic-max", type=int, default=300, help="passages per slice given a query")
    parser.add_argument("--refresh-every", type=int, default=25)
    parser.add_argument("--generator", default="smollm2")
    parser.add_argument("--runs", default="self-supervised,synthetic,refresh,never,serving")
    parser.add_argument("--name", default="training_signal")
    args = parser.parse_args(argv)
    work, root = two_slices("shardrag-signal-")
    common: dict[str, Any] = dict(batch_size=args.batch_size, max_length=128, lr=args.lr, warmup_steps=5,
                                  checkpoint_every=1000, max_steps=args.steps)
    synthetic = dict(synthetic_queries=args.generator, synthetic_max=args.synthetic_max)
    recipes: dict[str, dict[str, Any]] = {
        "self-supervised": {},
        "synthetic": synthetic,
        "refresh": {**synthetic, "refresh_every": args.refresh_every},
        "never": {**synthetic, "refresh_every": 10 * args.steps},
        "serving": {**synthetic, "hard_negatives_every": args.refresh_every},
    }
    labels = {"self-supervised": "self-supervised pairs", "synthetic": "synthetic queries",
              "refresh": f"synthetic + slice negatives refreshed every {args.refresh_every}",
              "never": "synthetic + slice negatives never refreshed",
              "serving": "synthetic + negatives mined from the serving index"}
    eval_root = work / "eval"
    base_encoder = CachingEncoder(SentenceTransformerEncoder(default_model_dir(), name="all-MiniLM-L6-v2",
                                                             device="cpu"), EmbeddingCache(default_cache_dir()))
    base = _evaluate(base_encoder, eval_root)
    runs: dict[str, Any] = {}
    for key in args.runs.split(","):
        print(f"run {key} ...", file=sys.stderr, flush=True)
        overrides = {**common, **recipes[key], "export_name": f"minilm-{key}"}
        if key == "serving":
            from serving.gateway.config import GatewayConfig
            from serving.local.launcher import LocalCluster

            with LocalCluster(root, "both-2", replicas=1, workdir=work / "cluster",
                              gateway=GatewayConfig.from_dict({})) as cluster:
                summary = _train(root, work / key, hard_negatives_url=cluster.gateway_url, **overrides)
        else:
            summary = _train(root, work / key, **overrides)
        encoder = SentenceTransformerEncoder(Path(summary["exported"]["path"]), device="cpu")
        quality = _evaluate(encoder, eval_root)
        runs[key] = {"label": labels[key], "recipe": recipes[key], "train_wall_s": round(summary["wall_s"], 1),
                     "step_s_median": sorted(summary["history"]["step_s"])[len(summary["history"]["step_s"]) // 2],
                     "synthetic": summary.get("synthetic"), "hard_negatives": summary.get("hard_negatives"),
                     "loss": [summary["loss_first"], summary["loss_last"]],
                     "quality": {n: {m: quality[n][m] for m in ("ndcg@10", "recall@100", "mrr@10")} for n in quality},
                     "delta_ndcg_points": {n: round(100 * (quality[n]["ndcg@10"] - base[n]["ndcg@10"]), 2)
                                           for n in quality},
                     "gate": _gate(base, quality), "gate_no_drop": _gate(base, quality, max_ndcg_drop=0.0)}
        print(json.dumps({key: runs[key]["delta_ndcg_points"], "gate": runs[key]["gate"]["passed"]}), file=sys.stderr,
              flush=True)
        result = {"machine": machine_info(), "settings": {**common, **vars(args), "ranks": 2,
                                                          "collection": "msmarco + dbpedia corpora, 10k passages, "
                                                                        "2 slices",
                                                          "evaluation": "judged queries of each dataset; never trained "
                                                                        "on"},
                  "base": {n: {m: base[n][m] for m in ("ndcg@10", "recall@100", "mrr@10")} for n in base},
                  "runs": runs}
        write_result(args.name, result)  # after every run: a late failure keeps the earlier figures
    print(f"\n== training signal ({args.steps} steps, 2 ranks × {args.batch_size} pairs, lr {args.lr}) ==")
    print(f"{'run':52} {'msmarco nDCG':>12} {'Δ':>6} {'dbpedia nDCG':>12} {'Δ':>6}  gate (default / no drop)")
    print(f"{'base MiniLM':52} {base['msmarco']['ndcg@10']:12.4f} {'':6} {base['dbpedia']['ndcg@10']:12.4f}")
    for run in runs.values():
        q, d = run["quality"], run["delta_ndcg_points"]
        print(f"{run['label']:52} {q['msmarco']['ndcg@10']:12.4f} {d['msmarco']:+6.2f} {q['dbpedia']['ndcg@10']:12.4f} "
              f"{d['dbpedia']:+6.2f}  {'passes' if run['gate']['passed'] else 'REFUSED'} / "
              f"{'passes' if run['gate_no_drop']['passed'] else 'REFUSED'}")
    print(f"\nwrote {write_result(args.name, result)}")


if __name__ == "__main__":
    main()
