"""``python -m training train|eval`` — also reached as ``shardrag train|eval``.

  train   fine-tune the retriever on a collection's slices with DDP (torchrun or Ray Train) and
          export the result as a new embedding version
  eval    nDCG@10, recall@10/100 and MRR@10 through the sharded index, one row per encoder;
          with --url, through a running gateway, one row per search mode and fusion weight
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from index_shards.layout import DEFAULT_ROOT, collections_root
from retrieval import env
from retrieval.cli_support import run_command
from retrieval.embedding_cache import default_cache_dir
from retrieval.encoders import Encoder
from retrieval.errors import ConfigError

if TYPE_CHECKING:
    from training.config import TrainConfig

DEFAULT_URL = "http://127.0.0.1:8000"


def _root(args: argparse.Namespace) -> Path:
    return collections_root(args.root)


def cmd_train(args: argparse.Namespace) -> int:
    from training.config import TrainConfig
    from training.launch import Nodes, launch_local, launch_ray

    if args.rollout and args.backend == "ray":
        raise ConfigError("--rollout runs the local launcher; train with --backend ray, then build and roll out",
                          field="backend")
    if args.nnodes > 1 and (args.rollout or args.backend == "ray"):
        raise ConfigError("--nnodes runs torchrun on each host; Ray places its own workers, and --rollout runs on "
                          "one host: train across hosts first, then build and roll out", field="nnodes")
    config = TrainConfig(
        root=str(_root(args)), collection=args.collection, version=args.version,
        model=args.model or ("" if args.rollout else "default"),
        out=args.out, export_name=args.export_name, train_queries=args.train_queries, train_qrels=args.train_qrels,
        max_steps=args.max_steps, batch_size=args.batch_size, grad_accum=args.grad_accum, lr=args.lr,
        warmup_steps=args.warmup_steps, max_length=args.max_length, scale=args.scale, learn_scale=args.learn_scale,
        gather_negatives=not args.local_negatives, comm_hook=args.comm_hook, amp=args.amp,
        checkpoint_every=args.checkpoint_every,
        refresh_every=args.refresh_every, negatives_depth=args.negatives_depth,
        synthetic_queries=args.synthetic_queries, synthetic_max=args.synthetic_max, round_trip_k=args.round_trip_k,
        seed=args.seed, threads=args.threads,
    ).validate()
    if args.rollout:
        return _train_and_roll_out(args, config)
    if args.backend == "ray":
        summary = launch_ray(config, args.nproc)
    else:
        nodes = Nodes(args.nnodes, args.node_rank, args.master_addr or "", args.master_port)
        launch_local(config, args.nproc, max_restarts=args.max_restarts, nodes=nodes)
        if args.node_rank > 0:  # node 0's rank 0 writes the summary and the export
            print(f"node {args.node_rank}: its ranks finished; node 0 has the export", file=sys.stderr)
            return 0
        summary = json.loads((Path(config.out) / "summary.json").read_text())
    exported = summary.get("exported", {})
    print(json.dumps({"exported": exported, "loss_first": summary.get("loss_first"),
                      "loss_last": summary.get("loss_last")}, indent=1))
    print(f"\nnext: shardrag build --collection {config.collection} --encoder {exported.get('path')}\n"
          f"      shardrag rollout stage {exported.get('version')} --model {exported.get('path')}", file=sys.stderr)
    return 0


def _train_and_roll_out(args: argparse.Namespace, config: TrainConfig) -> int:
    from training.flow import REFUSED_EXIT, FlowSettings, TrainFlow

    url = (args.url or env.read("SHARDRAG_URL", DEFAULT_URL) or DEFAULT_URL).rstrip("/")
    settings = FlowSettings(url=url, nproc=args.nproc, api_key=args.api_key, queries=args.queries, qrels=args.qrels,
                            max_restarts=args.max_restarts, ready_timeout_s=args.ready_timeout, name=args.flow_name,
                            retire_previous=args.retire_previous)
    flow = TrainFlow(config, settings, fresh=args.fresh and not args.dry_run)
    if args.dry_run:
        print("\n".join(flow.plan()))
        return 0
    state = flow.run()
    print(json.dumps(state.to_dict(), indent=1))
    if state.outcome == "refused":
        version = state.steps["activate"]["version"]
        print(f"\n{version} was refused by the quality gate and aborted; {state.base_version} stays active. "
              f"Change the recipe (or pass --fresh) to train again.", file=sys.stderr)
        return REFUSED_EXIT
    print(f"\n{state.steps['activate']['version']} is active; {state.base_version} stays loaded as the previous "
          f"version: `shardrag rollout rollback` to go back, `shardrag rollout retire {state.base_version}` "
          f"to free it.", file=sys.stderr)
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    if args.url is not None:
        return _eval_through_gateway(args)
    if args.collection is None:
        raise ConfigError("--collection names the collection on disk to evaluate (or --url a running gateway)",
                          field="collection")
    if args.modes is not None or args.weights is not None:
        raise ConfigError("--modes and --weights search through a running gateway: add --url", field="url")
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
    if args.json:  # the rows alone, so that the output parses
        print(json.dumps(rows, indent=1))
        return 0
    print(f"{'model':40} {'nDCG@10':>8} {'R@10':>7} {'R@100':>7} {'MRR@10':>7}  ({dataset.name}, "
          f"{rows[0]['queries']} judged queries)")
    for row in rows:
        print(f"{row['model'][-40:]:40} {row['ndcg@10']:8.4f} {row['recall@10']:7.4f} {row['recall@100']:7.4f} "
              f"{row['mrr@10']:7.4f}")
    return 0



def _eval_through_gateway(args: argparse.Namespace) -> int:
    """``shardrag eval --url``: the judged queries as text through a running gateway's
    ``/v1/query``, one row per search mode and dense weight (``retrieval.search_quality``)."""
    from retrieval.client import ShardragClient
    from retrieval.datasets import load_beir
    from retrieval.search_quality import MODES, best_weight, dense_weights_from, evaluate_settings, settings_for

    if args.models != "default":
        raise ConfigError("--models compares encoders built on disk; a gateway serves its active version: "
                          "drop --url, or --models", field="models")
    modes = [name.strip() for name in (args.modes or ",".join(MODES)).split(",") if name.strip()]
    settings = settings_for(modes, dense_weights_from(args.weights))
    dataset = load_beir(args.dataset)
    url = args.url.rstrip("/") or DEFAULT_URL
    with ShardragClient(url, timeout_s=args.timeout, api_key=args.api_key) as client:
        searched = client.collection(args.collection) if args.collection else client
        rows = evaluate_settings(searched, dataset, settings, k=args.k, show_progress=not args.json)
        # the collection the gateway was started with takes its query defaults from the gateway config
        created = bool(args.collection) and not client.get_collection(args.collection).get("default")
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    where = f"{url}, collection {args.collection}" if args.collection else url
    deep = f"recall@{args.k}" if args.k > 10 else None
    print(f"{'search':24} {'nDCG@10':>8} {'R@10':>7}" + (f" {'R@' + str(args.k):>7}" if deep else "")
          + f" {'MRR@10':>7}  ({dataset.name}, {rows[0]['queries']} judged queries, k={args.k}, {where})")
    for row in rows:
        print(f"{row['setting']:24} {row['ndcg@10']:8.4f} {row['recall@10']:7.4f}"
              + (f" {row[deep]:7.4f}" if deep else "") + f" {row['mrr@10']:7.4f}")
    top = max(rows, key=lambda row: row["ndcg@10"])  # the first listed among equals
    print(f"best by nDCG@10: {top['setting']} ({top['ndcg@10']:.4f})")
    best = best_weight(rows)
    if best is not None:
        w = best["dense_weight"]
        print(f"best weighted fusion by nDCG@10: dense {w:g}, lexical {1 - w:.4g} — query with "
              f"\"weights\": {{\"dense\": {w:g}, \"lexical\": {1 - w:.4g}}} "
              f"(`shardrag query --mode hybrid --weights {w:g},{1 - w:.4g}`)")
    print(_as_default(top, args.collection if created else None))
    return 0


def _as_default(row: dict[str, Any], collection: str | None) -> str:
    """How to make ``row``'s setting what the collection's queries get when they name none (``collection``:
    a created one; None: the one the gateway was started with)."""
    defaults: dict[str, Any] = {"mode": row["mode"]}
    flags = f"--mode {row['mode']}"
    if row["mode"] == "hybrid":
        defaults["fusion"] = row["fusion"]
        flags += f" --fusion {row['fusion']}"
    if (w := row.get("dense_weight")) is not None:
        defaults["weights"] = {"dense": w, "lexical": round(1 - w, 4)}
        flags += f" --weights {w:g},{1 - w:.4g}"
    if collection:
        return f"make it the collection's query default: shardrag collections defaults {collection} {flags}"
    return f"make it the query default: the gateway config's \"query_defaults\": {json.dumps(defaults)}"


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
    train.add_argument("--nproc", type=int, default=2, help="ranks on this host; all hosts' ranks = slices (default 2)")
    train.add_argument("--nnodes", type=int, default=1, help="hosts in the job: run this command on each with its "
                       "--node-rank (default 1: this host alone)")
    train.add_argument("--node-rank", type=int, default=0, help="this host's number, 0..nnodes-1 (0: the master)")
    train.add_argument("--master-addr", help="address of node 0, which every host can reach (with --nnodes > 1)")
    train.add_argument("--master-port", type=int, default=29500, help="rendezvous port on node 0 (default 29500)")
    train.add_argument("--threads", type=int, default=0, help="CPU threads per rank (default 0: this host's cores / "
                       "its ranks); the same on every host makes a run across hosts repeat a one-host run exactly")
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
    train.add_argument("--amp", choices=("auto", "off", "bf16", "fp16"), default="auto",
                       help="mixed precision: auto = bf16 autocast on GPUs with bf16, fp16 + GradScaler on older "
                            "GPUs, fp32 on CPU (default); bf16 forces it (CPU too); fp16 needs CUDA; off = fp32")
    train.add_argument("--synthetic-queries", metavar="GENERATOR",
                       help="train on queries the generator writes for each slice's passages: smollm2 (the answer "
                            "generator's model) or a Hugging Face causal-LM dir; cached, filtered by round trip")
    train.add_argument("--synthetic-max", type=int, default=0,
                       help="passages per slice that get a synthetic query (default 0: all)")
    train.add_argument("--round-trip-k", type=int, default=10,
                       help="keep a synthetic pair when its passage is in the encoder's top-k in the slice "
                            "(default 10)")
    train.add_argument("--refresh-every", type=int, default=0,
                       help="hard negatives from the slices, each rank re-encoding its own slice with the current "
                            "weights every N steps (ANCE-style; default 0: off)")
    train.add_argument("--negatives-depth", type=int, default=5,
                       help="with --refresh-every: candidates per query from each slice (default 5)")
    train.add_argument("--checkpoint-every", type=int, default=20)
    train.add_argument("--max-restarts", type=int, default=3, help="torchrun restarts after a rank dies (default 3)")
    train.add_argument("--seed", type=int, default=0)
    flow = train.add_argument_group(
        "one flow to an activated version (--rollout)",
        "train → export → build on the same slices → stage → activate behind the quality gate, through a "
        "running gateway; every step is journalled under <root>/<collection>/.train-flows/, so re-running the "
        "same command after a crash continues where it stopped (nothing is trained, built or staged twice). "
        "Exit status 3: the gate refused the new version (aborted; the active one keeps serving).")
    flow.add_argument("--rollout", action="store_true", help="run the whole flow (starts from the active version "
                                                             "and its model unless --version/--model say otherwise)")
    flow.add_argument("--url", help=f"gateway URL [env SHARDRAG_URL, default {DEFAULT_URL}]")
    flow.add_argument("--api-key", default=None, help="an admin API key [env SHARDRAG_API_KEY]")
    flow.add_argument("--queries", help="gate queries (BEIR queries.jsonl; default: the gateway's recent queries)")
    flow.add_argument("--qrels", help="gate qrels (BEIR tsv): nDCG@10 may not drop more than the gateway's "
                                      "gate.max_ndcg_drop")
    flow.add_argument("--retire-previous", action="store_true",
                      help="retire the previous version (kept for rollback) when staging needs its room")
    flow.add_argument("--dry-run", action="store_true", help="print the plan and what is done already; change nothing")
    flow.add_argument("--fresh", action="store_true", help="forget this recipe's earlier flow and start over")
    flow.add_argument("--flow-name", help="name the flow (default: a hash of the recipe)")
    flow.add_argument("--ready-timeout", type=float, default=900.0,
                      help="seconds for the staged version to load everywhere (default 900)")
    train.set_defaults(func=cmd_train)

    evaluate = commands.add_parser(
        "eval", help="nDCG@10, recall@10/100, MRR@10 through the sharded index",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="nDCG@10, recall@10, recall@100 and MRR@10 of a BEIR dataset's judged queries.\n\n"
                    "  on disk (default): each encoder of --models searches every shard of its version,\n"
                    "    merged as the gateway merges (dense search)\n"
                    "  --url: the queries as text through a running gateway, one row per search mode\n"
                    "    (--modes) and per dense weight of the weighted hybrid (--weights), to choose a\n"
                    "    collection's mode and fusion weights on its own judged queries\n\n"
                    "  shardrag eval --collection docs --dataset ./my-beir\n"
                    "  shardrag eval --url http://127.0.0.1:8000 --collection docs --dataset ./my-beir \\\n"
                    "      --weights 0.5:0.95:0.05")
    evaluate.add_argument("--collection",
                          help="the collection (on disk; with --url, on the gateway — default: its default one)")
    evaluate.add_argument("--root", help=f"where collections live [env SHARDRAG_ROOT, default ./{DEFAULT_ROOT}]")
    evaluate.add_argument("--dataset", required=True, help="BEIR folder with queries.jsonl and qrels/test.tsv")
    evaluate.add_argument("--models", default="default",
                          help="comma-separated encoders to compare, each built into the collection "
                               "(default: default = MiniLM; not with --url)")
    evaluate.add_argument("--url", help="evaluate through this running gateway instead of the files on disk")
    evaluate.add_argument("--modes", help="with --url: comma-separated search modes of dense, lexical, rrf, weighted "
                                          "(hybrid at the gateway's default weights) [default: all four]")
    evaluate.add_argument("--weights", help="with --url: the weighted hybrid at each of these dense weights "
                                            "(lexical 1 - w): 0.5,0.8,0.95 or start:stop:step, e.g. 0.5:0.95:0.05")
    evaluate.add_argument("--k", type=int, default=10,
                          help="with --url: hits each query asks for, as an application would (a hybrid's "
                               "lists depend on it); recall@k is shown too when k > 10 (default 10)")
    evaluate.add_argument("--api-key", default=None, help="with --url: API key [env SHARDRAG_API_KEY]")
    evaluate.add_argument("--timeout", type=float, default=60.0, help="with --url: seconds per query (default 60)")
    evaluate.add_argument("--device", default="auto", help="on disk: where the encoders run (default auto)")
    evaluate.add_argument("--cache-dir", type=Path, default=None,
                          help="on disk: the embedding cache [env SHARDRAG_CACHE_DIR]")
    evaluate.add_argument("--no-cache", action="store_true", help="on disk: embed the queries again")
    evaluate.add_argument("--json", action="store_true", help="print the rows as JSON (and no progress bar)")
    evaluate.set_defaults(func=cmd_eval)

    return parser


def main(argv: list[str] | None = None) -> int:
    return run_command(build_parser().parse_args(argv))
