"""Index-sharded training: scaling, quality, and gathered vs local negatives.

    python -m benchmarks.training              # ~30 min on 2 CPU cores
    python -m benchmarks.training --steps 60   # shorter
    python -m benchmarks.training --signal     # which training signal pays (benchmarks/training_signal.py)
    python -m benchmarks.training --systems    # comm hooks, bf16, stragglers (benchmarks/training_systems.py)

1. Step time and samples/s of real all-MiniLM-L6-v2 training at the same per-rank batch:
   1 rank (1 thread, and 2 threads), 2 ranks (1 thread each) — the ratio 2-rank / 1-rank step.
2. Quality: the base model vs the model trained by `shardrag train` on self-supervised pairs
   from the slices of a collection of both corpora (msmarco + dbpedia, 10k passages, 2 slices;
   the corpus only — judged queries are evaluation only), each evaluated through the sharded
   index on msmarco and dbpedia: nDCG@10, recall@100.
3. The same training with local-only negatives, at the same step count.
JSON in benchmarks/results/training.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.common import data_dir, load_corpus, machine_info, write_result
from index_shards.build import BuildConfig, build_collection
from retrieval.datasets import load_beir
from retrieval.embedding_cache import CachingEncoder, EmbeddingCache, default_cache_dir
from retrieval.encoders import SentenceTransformerEncoder, encode_documents
from training.config import TrainConfig
from training.evaluate import evaluate_version
from training.launch import launch_local


def train(root: Path, collection: str, out: Path, nproc: int, **overrides: Any) -> dict[str, Any]:
    config = TrainConfig(root=str(root), collection=collection, out=str(out), **overrides)
    launch_local(config, nproc, max_restarts=0, capture=True)
    return json.loads((out / "summary.json").read_text())


def two_slices(prefix: str) -> tuple[Path, Path]:
    """A work dir and, under it, a collections root holding ``both-2``: msmarco + dbpedia's
    10k passages (MiniLM vectors, cached) in 2 slices — what the training benchmarks train on."""
    work = Path(tempfile.mkdtemp(prefix=prefix))
    corpus = load_corpus()
    build_collection(work / "root", corpus.documents, corpus.vectors, corpus.version, BuildConfig("both-2", 2),
                     show_progress=False)
    return work, work / "root"


def steady_step_s(summary: dict[str, Any], skip: int = 2) -> float:
    return statistics.median(summary["history"]["step_s"][skip:])


def evaluate(model_dir: Path | None, base, work: Path) -> dict[str, dict[str, float]]:
    """nDCG@10 / recall@100 on both datasets through a sharded index built with the model."""
    cache = EmbeddingCache(default_cache_dir())
    encoder = base if model_dir is None else CachingEncoder(SentenceTransformerEncoder(model_dir, device="cpu"), cache)
    return {name: {"ndcg@10": result["ndcg@10"], "recall@100": result["recall@100"], "mrr@10": result["mrr@10"]}
            for name, result in evaluate_encoder(encoder, work).items()}


def evaluate_encoder(encoder: Any, work: Path, *, with_rankings: bool = False) -> dict[str, dict[str, Any]]:
    """Both datasets embedded with ``encoder`` into a 2-shard index under ``work``, evaluated
    through it (``with_rankings``: each query's ranked doc ids too, for the quality gate)."""
    rows = {}
    for name in ("msmarco", "dbpedia"):
        dataset = load_beir(data_dir() / name)
        vectors = encode_documents(encoder, dataset.corpus, show_progress=True)
        build_collection(work, dataset.corpus, vectors, encoder.version, BuildConfig(name, 2, overwrite=True),
                         show_progress=False)
        rows[name] = evaluate_version(work, name, encoder.version.id, encoder, dataset, with_rankings=with_rankings)
    return rows


def main() -> None:
    if "--signal" in sys.argv[1:]:  # the training-signal ablations (benchmarks/training_signal.py)
        from benchmarks.training_signal import main as signal_main

        signal_main([a for a in sys.argv[1:] if a != "--signal"])
        return
    if "--systems" in sys.argv[1:]:  # comm hooks, precision, stragglers (benchmarks/training_systems.py)
        from benchmarks.training_systems import main as systems_main

        systems_main([a for a in sys.argv[1:] if a != "--systems"])
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=120, help="training steps for the quality runs (default 120)")
    parser.add_argument("--batch-size", type=int, default=16, help="pairs per rank (default 16)")
    parser.add_argument("--lr", type=float, default=2e-5)
    parser.add_argument("--quality-only", action="store_true",
                        help="skip the scaling runs and the local-negatives run (a longer quality run)")
    parser.add_argument("--name", default="training", help="results file name (default training)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="shardrag-train-bench-"))
    corpus = load_corpus()  # msmarco + dbpedia, MiniLM vectors (cached)
    root = work / "root"
    for shards in (1, 2):
        build_collection(root, corpus.documents, corpus.vectors, corpus.version, BuildConfig(f"both-{shards}", shards),
                         show_progress=False)
    common = dict(batch_size=args.batch_size, max_length=128, lr=args.lr, warmup_steps=10, checkpoint_every=1000)

    print("scaling runs ...", file=sys.stderr, flush=True)
    scaling = {}
    scaling_runs = () if args.quality_only else (("1 rank x 1 thread", 1, 1, 1), ("1 rank x 2 threads", 1, 1, 2),
                                                 ("2 ranks x 1 thread", 2, 2, 1))
    for label, shards, nproc, threads in scaling_runs:
        summary = train(root, f"both-{shards}", work / f"scale-{nproc}-{threads}", nproc, max_steps=12,
                        threads=threads, **common)
        step_s = steady_step_s(summary)
        scaling[label] = {"step_s": step_s, "samples_per_s": summary["samples_per_step"] / step_s,
                          "samples_per_step": summary["samples_per_step"]}

    print("quality runs ...", file=sys.stderr, flush=True)
    gathered = train(root, "both-2", work / "gathered", 2, max_steps=args.steps, export_name="minilm-gathered",
                     **common)
    local = None if args.quality_only else train(root, "both-2", work / "local", 2, max_steps=args.steps,
                                                 export_name="minilm-local", gather_negatives=False, **common)
    eval_root = work / "eval"
    base = CachingEncoder(SentenceTransformerEncoder(_base_dir(), name="all-MiniLM-L6-v2", device="cpu"),
                          EmbeddingCache(default_cache_dir()))
    quality = {
        "base": evaluate(None, base, eval_root),
        "trained (gathered negatives)": evaluate(Path(gathered["exported"]["path"]), None, eval_root),
    }
    if local is not None:
        quality["trained (local negatives)"] = evaluate(Path(local["exported"]["path"]), None, eval_root)
    result = {"machine": machine_info(), "settings": {**common, "steps": args.steps, "ranks": 2,
                                                      "pairs": "self-supervised from the slices (title→text, crops)",
                                                      "collection": "msmarco + dbpedia corpora, 10k passages"},
              "scaling": scaling, "quality": quality,
              "loss": {"gathered": [gathered["loss_first"], gathered["loss_last"]],
                       "local": [local["loss_first"], local["loss_last"]] if local else None}}
    if scaling:
        one, two = scaling["1 rank x 1 thread"], scaling["2 ranks x 1 thread"]
        print("\n== step time at the same per-rank batch (MiniLM, batch 16 pairs/rank, 128 tokens) ==")
        for label, row in scaling.items():
            print(f"{label:20} step {row['step_s']:.2f} s  {row['samples_per_s']:.1f} pairs/s")
        print(f"2 ranks / 1 rank step time: ×{two['step_s'] / one['step_s']:.2f} (target ≤ 1.3), "
              f"throughput ×{two['samples_per_s'] / one['samples_per_s']:.2f}")
    print(f"\n== quality through the sharded index ({args.steps} steps, 2 ranks × {args.batch_size} pairs) ==")
    print(f"{'model':32} {'msmarco nDCG@10':>15} {'R@100':>7} {'dbpedia nDCG@10':>15} {'R@100':>7}")
    for label, rows in quality.items():
        print(f"{label:32} {rows['msmarco']['ndcg@10']:15.4f} {rows['msmarco']['recall@100']:7.4f} "
              f"{rows['dbpedia']['ndcg@10']:15.4f} {rows['dbpedia']['recall@100']:7.4f}")
    base = quality["base"]
    for label in (name for name in quality if name != "base"):
        deltas = {name: 100 * (quality[label][name]["ndcg@10"] - base[name]["ndcg@10"]) for name in base}
        print(f"{label}: nDCG@10 points vs base: " + ", ".join(f"{n} {d:+.2f}" for n, d in deltas.items()))
    print(f"\nwrote {write_result(args.name, result)}")


def _base_dir() -> Path:
    from retrieval.encoders import default_model_dir

    return default_model_dir()


if __name__ == "__main__":
    main()
