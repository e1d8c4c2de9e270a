"""``python -m training train|eval`` — also reached as ``shardrag train|eval``.

  train   fine-tune the retriever on a collection's slices with DDP (torchrun or Ray Train) and
          export the result as a new embedding version
  eval    nDCG@10, recall@10/100 and MRR@10 through the sharded index, one row per encoder
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from index_shards.layout import DEFAULT_ROOT, collections_root
from retrieval.cli_support import run_command
from retrieval.embedding_cache import default_cache_dir
from retrieval.encoders import Encoder


def _root(args: argparse.Namespace) -> Path:
    return collections_root(args.root)


def cmd_train(args: argparse.Namespace) -> int:
    from training.config import TrainConfig
    from training.launch import launch_local, launch_ray

    config = TrainConfig(
        root=str(_root(args)), collection=args.collection, version=args.version, model=args.model or "default",
        out=args.out, export_name=args.export_name, train_queries=args.train_queries, train_qrels=args.train_qrels,
        max_steps=args.max_steps, batch_size=args.batch_size, grad_accum=args.grad_accum, lr=args.lr,
        warmup_steps=args.warmup_steps, max_length=args.max_length, scale=args.scale, learn_scale=args.learn_scale,
        gather_negatives=not args.local_negatives, comm_hook=args.comm_hook, checkpoint_every=args.checkpoint_every,
        seed=args.seed,
    ).validate()
    if args.backend == "ray":
        summary = launch_ray(config, args.nproc)
    else:
        launch_local(config, args.nproc, max_restarts=args.max_restarts)
        summary = json.loads((Path(config.out) / "summary.json").read_text())
    exported = summary.get("exported", {})
    print(json.dumps({"exported": exported, "loss_first": summary.get("loss_first"),
                      "loss_last": summary.get("loss_last")}, indent=1))
    print(f"\nnext: shardrag build --collection {config.collection} --encoder {exported.get('path')}\n"
          f"      shardrag rollout stage {exported.get('version')} --model {exported.get('path')}", file=sys.stderr)
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from index_shards.layout import list_versions
    from retrieval.datasets import load_beir
    from retrieval.embedding_cache import CachingEncoder, EmbeddingCache
    from retrieval.encoders import load_encoder
    from training.evaluate import evaluate_version

    dataset = load_beir(args.dataset)
    built = {m.embedding_version.id for m in list_versions(_root(args), args.collection)}
    rows = []
    for model in args.models.split(","):
        encoder: Encoder = load_encoder(None if model == "default" else model, device=args.device)
        if not args.no_cache:
            encoder = CachingEncoder(encoder, EmbeddingCache(args.cache_dir or default_cache_dir()))
        if encoder.version.id not in built:
            print(f"error: {args.collection} has no version {encoder.version.id} (encoder {model}); build it with "
                  f"`shardrag build --collection {args.collection} --encoder {model}`", file=sys.stderr)
            return 2
        rows.append({"model": model, **evaluate_version(_root(args), args.collection, encoder.version.id, encoder,
                                                        dataset)})
    print(f"{'model':40} {'nDCG@10':>8} {'R@10':>7} {'R@100':>7} {'MRR@10':>7}  ({dataset.name}, "
          f"{rows[0]['queries']} judged queries)")
    for row in rows:
        print(f"{row['model'][-40:]:40} {row['ndcg@10']:8.4f} {row['recall@10']:7.4f} {row['recall@100']:7.4f} "
              f"{row['mrr@10']:7.4f}")
    if args.json:
        print(json.dumps(rows, indent=1))
    return 0



def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="shardrag", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    train = commands.add_parser("train", help="fine-tune the retriever on the collection's slices (DDP, one rank each)",
                                description="Rank r trains on shard r of the collection (self-supervised pairs from "
                                            "the slice, or given query/positive pairs routed to their slice), "
                                            "in-batch negatives gathered across ranks; checkpoints every N steps; "
                                            "the result is exported as a new embedding version.")
    train.add_argument("--collection", required=True)
    train.add_argument("--root", help=f"where collections live [env SHARDRAG_ROOT, default ./{DEFAULT_ROOT}]")
    train.add_argument("--version", help="the collection version whose slices to read (default: newest)")
    train.add_argument("--nproc", type=int, default=2, help="ranks = slices (default 2)")
    train.add_argument("--backend", choices=("local", "ray"), default="local",
                       help="local: torchrun on this machine; ray: Ray Train TorchTrainer (pip install -e '.[ray]')")
    train.add_argument("--model", "--encoder", dest="model", help="initial encoder checkpoint (default MiniLM)")
    train.add_argument("--out", default="train-out", help="run dir: checkpoints, metrics, export (default train-out)")
    train.add_argument("--export-name", default="minilm-shardrag", help="name of the exported encoder")
    train.add_argument("--train-queries", help="given pairs: queries.jsonl (with --train-qrels)")
    train.add_argument("--train-qrels", help="given pairs: qrels tsv; positives route each pair to its slice")
    train.add_argument("--max-steps", type=int, default=100)
    train.add_argument("--batch-size", type=int, default=16, help="pairs per rank per micro-step (default 16)")
    train.add_argument("--grad-accum", type=int, default=1)
    train.add_argument("--lr", type=float, default=2e-5)
    train.add_argument("--warmup-steps", type=int, default=10)
    train.add_argument("--max-length", type=int, default=128, help="tokens per text (default 128)")
    train.add_argument("--scale", type=float, default=20.0, help="InfoNCE scale, 1/temperature (default 20)")
    train.add_argument("--learn-scale", action="store_true", help="learn the scale instead of fixing it")
    train.add_argument("--local-negatives", action="store_true", help="do not gather negatives across ranks")
    train.add_argument("--comm-hook", choices=("none", "fp16", "bf16", "powersgd"), default="none",
                       help="DDP gradient compression (default none)")
    train.add_argument("--checkpoint-every", type=int, default=20)
    train.add_argument("--max-restarts", type=int, default=3, help="torchrun restarts after a rank dies (default 3)")
    train.add_argument("--seed", type=int, default=0)
    train.set_defaults(func=cmd_train)

    evaluate = commands.add_parser("eval", help="nDCG@10, recall@10/100, MRR@10 through the sharded index")
    evaluate.add_argument("--collection", required=True)
    evaluate.add_argument("--root", help=f"where collections live [env SHARDRAG_ROOT, default ./{DEFAULT_ROOT}]")
    evaluate.add_argument("--dataset", required=True, help="BEIR folder with queries.jsonl and qrels/test.tsv")
    evaluate.add_argument("--models", default="default",
                          help="comma-separated encoders to compare, each built into the collection "
                               "(default: default = MiniLM)")
    evaluate.add_argument("--device", default="auto")
    evaluate.add_argument("--cache-dir", type=Path, default=None)
    evaluate.add_argument("--no-cache", action="store_true")
    evaluate.add_argument("--json", action="store_true")
    evaluate.set_defaults(func=cmd_eval)

    return parser


def main(argv: list[str] | None = None) -> int:
    return run_command(build_parser().parse_args(argv))
