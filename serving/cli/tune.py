"""``shardrag tune``: the cheapest nprobe / ef_search that meets a recall target, written into the
version's ``search.json`` so that every replica uses it for queries that set none.

The shards are evaluated where their files are, in parallel: worker processes on this machine
(``--backend local``) or Ray tasks (``--backend ray``, on a running Ray cluster with ``--ray-address``).
The measuring itself lives in ``index_shards.tuning``.

``--rebuild`` searches the structure as well (nlist, M, PQ code size, an HNSW graph's build
breadth; for Flat, the approximate indexes that could replace it): every candidate is built from
each shard's stored vectors inside the workers and tuned like the published index. A published
version's files never change, so when another structure wins the command prints the build that
makes it (then tune that build); when the published structure wins, its knob is written as
without ``--rebuild``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

from index_shards.layout import resolve_version, shard_dir
from index_shards.manifest import CollectionManifest, read_shard_manifest
from index_shards.search_defaults import SearchDefaults, read_search_defaults, write_search_defaults
from index_shards.tuning import (
    ShardTask,
    StructureReport,
    choose_structure,
    evaluate_shard,
    sample_queries,
    structures_to_try,
)
from retrieval.errors import ConfigError, InvalidRequest
from retrieval.tuning_choice import ShardTuning, TuneReport, choose, split_holdout
from retrieval.types import check_ef_construction
from serving.cli.common import root_of
from serving.cli.task_runners import Runner, local_runner, ray_runner
from serving.cli.tune_report import best_of, breadth_flag, plot_frontier, print_report, print_structures


def _query_vectors(args: argparse.Namespace, version_id: str) -> np.ndarray:
    """The texts of ``--queries`` (BEIR queries.jsonl, or one query per line) embedded by ``--model``."""
    from retrieval.datasets import load_queries
    from retrieval.encoders import load_encoder

    path = Path(args.queries)
    if not path.is_file():
        raise InvalidRequest(f"--queries: no file at {path}", field="queries")
    texts = list(load_queries(path).values()) if path.suffix == ".jsonl" else \
        [line.strip() for line in path.read_text().splitlines() if line.strip()]
    if len(texts) < 10:
        raise InvalidRequest(f"--queries: {len(texts)} queries in {path}; tuning needs at least 10", field="queries")
    encoder = load_encoder(args.model, device="cpu")
    if encoder.version.id != version_id:
        raise ConfigError(f"--model encodes embedding version {encoder.version.id}, the collection's version is "
                          f"{version_id}; pass the model this version was built with", field="model")
    return np.asarray(encoder.encode_queries(texts), dtype=np.float32)


def _tuning_queries(args: argparse.Namespace, runner: Runner, shards: list[str],
                    version_id: str) -> tuple[np.ndarray, np.ndarray, str]:
    """(queries, the id each one leaves out of its answers or -1, a description)."""
    if args.queries:
        queries = _query_vectors(args, version_id)
        return queries, np.full(len(queries), -1, dtype=np.int64), f"{len(queries)} queries from {args.queries}"
    per_shard = -(-args.sample // len(shards))
    sampled = runner(sample_queries, [(d, per_shard, args.seed + i) for i, d in enumerate(shards)])
    queries = np.concatenate([vectors for vectors, _ in sampled])
    return (queries, np.concatenate([ids for _, ids in sampled]),
            f"{len(queries)} stored documents as pseudo-queries (each left out of its own answers)")


def run_tuning(args: argparse.Namespace, runner: Runner) -> tuple[TuneReport, Path]:
    directory, manifest = resolve_version(root_of(args), args.collection, args.version)
    shards = [str(shard_dir(directory, i)) for i in range(manifest.num_shards)]
    queries, exclude, source = _tuning_queries(args, runner, shards, manifest.embedding_version.id)
    print(f"tuning {args.collection} version {manifest.embedding_version.id} ({manifest.num_shards} shards, "
          f"{manifest.factory}) on {source}, recall@{args.k} target {args.recall}", file=sys.stderr, flush=True)
    tasks = [(ShardTask(d, queries, exclude, args.k, args.max_value),) for d in shards]
    results: list[ShardTuning] = runner(evaluate_shard, tasks)
    tune_rows, holdout_rows = split_holdout(len(queries), args.holdout, args.seed)
    return choose(results, args.recall, args.k, tune_rows, holdout_rows), directory


def run_rebuild(args: argparse.Namespace, runner: Runner) -> tuple[list[StructureReport], StructureReport | None,
                                                                   Path, CollectionManifest]:
    """Every candidate structure built in the workers from each shard's stored vectors and tuned
    (each HNSW candidate at the published version's ``ef_construction`` and at a wider one)."""
    directory, manifest = resolve_version(root_of(args), args.collection, args.version)
    shards = [str(shard_dir(directory, i)) for i in range(manifest.num_shards)]
    min_count = min(read_shard_manifest(d).count for d in shards)
    structures = structures_to_try(manifest.factory, manifest.embedding_version.dim, min_count,
                                   manifest.ef_construction, args.ef_construction)  # PQ/SQ: refused
    queries, exclude, source = _tuning_queries(args, runner, shards, manifest.embedding_version.id)
    print(f"rebuilding {args.collection} version {manifest.embedding_version.id} ({manifest.num_shards} shards of "
          f"≥{min_count:,} vectors) as {len(structures)} structures ({', '.join(s.label for s in structures)}), "
          f"each tuned on {source}, recall@{args.k} target {args.recall}", file=sys.stderr, flush=True)
    tasks = [(ShardTask(d, queries, exclude, args.k, args.max_value, exact=structure == structures[0],
                        rebuild_as=structure.factory, ef_construction=structure.ef_construction),)
             for structure in structures for d in shards]
    results: list[ShardTuning] = runner(evaluate_shard, tasks)
    by_structure = {structure: results[i * len(shards):(i + 1) * len(shards)] for i, structure in enumerate(structures)}
    tune_rows, holdout_rows = split_holdout(len(queries), args.holdout, args.seed)
    reports, best = choose_structure(by_structure, args.recall, args.k, tune_rows, holdout_rows)
    return reports, best, directory, manifest


def breadths(text: str) -> list[int]:
    """``--ef-construction``'s comma-separated list (each within the build's range)."""
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: a comma-separated list of integers, e.g. 40,100") from None
    if not values:
        raise argparse.ArgumentTypeError("at least one breadth, e.g. 40,100")
    for value in values:
        try:
            check_ef_construction(value)
        except ConfigError as exc:
            raise argparse.ArgumentTypeError(exc.message) from None
    return values


def cmd_tune(args: argparse.Namespace) -> int:
    if args.k < 1:
        raise InvalidRequest("--k must be ≥ 1", field="k")
    if not 0.0 < args.recall <= 1.0:  # checked before any shard is read, not after the evaluation
        raise InvalidRequest(f"--recall must be in (0, 1], not {args.recall}", field="recall")
    if not 0.0 < args.holdout < 0.9:
        raise InvalidRequest("--holdout must be between 0 and 0.9", field="holdout")
    if args.max_value is not None and args.max_value < 1:
        raise InvalidRequest("--max-value must be ≥ 1", field="max_value")
    if args.sample < 10:
        raise InvalidRequest("--sample must be ≥ 10", field="sample")
    if args.ef_construction is not None and not args.rebuild:
        raise InvalidRequest("--ef-construction lists the build breadths --rebuild links HNSW candidates with; "
                             "add --rebuild (tuning the published index never rebuilds it)", field="ef_construction")
    if args.live:
        return _tune_live(args)
    runner = ray_runner(args.ray_address) if args.backend == "ray" else \
        local_runner(args.workers or len(os.sched_getaffinity(0)))
    if args.rebuild:
        return _rebuild(args, runner)
    report, directory = run_tuning(args, runner)
    print_report(report)
    if args.json:
        Path(args.json).write_text(json.dumps(report.to_dict(), indent=1))
    if args.plot and report.knob is not None:
        print(f"plot: {args.plot}" if plot_frontier(report, Path(args.plot))
              else "no plot: matplotlib is not installed (pip install 'shardrag[bench]')")
    if report.knob is None:
        return 0
    if report.chosen is None:
        best = max(report.candidates, key=lambda c: c.recall)
        print(f"\nno {report.knob} reaches recall@{report.k} {report.target} with 95 % confidence (best: "
              f"{best.recall:.4f} at {report.knob}={best.value}"
              + (", the --max-value cap); raise the cap, or rebuild" if args.max_value else
                 "); the index itself is the limit: rebuild")
              + " with more lists, a larger M or --ef-construction (HNSW), or finer codes. Nothing written.",
              file=sys.stderr)
        return 1
    return _write_choice(args, report, directory)


def _rebuild(args: argparse.Namespace, runner: Runner) -> int:
    reports, best, directory, manifest = run_rebuild(args, runner)
    published = reports[0]
    print_structures(reports, best)
    if args.json:
        Path(args.json).write_text(json.dumps({"structures": [
            {"factory": s.factory, "ef_construction": s.ef_construction, "label": s.label, "build_s": s.build_s,
             "index_bytes": s.index_bytes, **s.report.to_dict()} for s in reports],
            "chosen": best.factory if best else None,
            "chosen_ef_construction": best.ef_construction if best else None}, indent=1))
    tuned = [s for s in reports if s.report.knob is not None]
    if args.plot and tuned:  # exact structures have no frontier to draw
        print(f"plot: {args.plot}" if plot_frontier(tuned[0].report, Path(args.plot), [s.report for s in tuned[1:]],
                                                    [s.label for s in tuned])
              else "no plot: matplotlib is not installed (pip install 'shardrag[bench]')")
    if best is None:
        print(f"\nno structure reaches recall@{args.k} {args.recall} with 95 % confidence; nothing written.",
              file=sys.stderr)
        return 1
    if best is not published:
        root = f" --root {args.root}" if args.root else ""
        chosen = best.report.chosen
        assert chosen is not None
        print(f"\nchosen: {best.label}"
              + (f" with {best.report.knob}={chosen.value}" if best.report.knob else "")
              + f" ({chosen.qps:.0f} QPS per replica at c=1; the published {published.label}: {best_of(published)}). "
              "A published version's files never change: build it, then tune that build —\n"
              f"  shardrag build --collection {args.collection}{root} --from-version {directory.name} "
              f"--factory '{best.factory}'{breadth_flag(best.ef_construction)} --overwrite    # plus --model DIR if "
              "this version's encoder is not "
              "the default; replicas pick it up when they load the version again\n"
              f"  shardrag tune --collection {args.collection}{root} --recall {args.recall}\nNothing written.")
        return 0
    if best.report.knob is None:  # an exact index is the cheapest at this target (small shards)
        print(f"\nchosen: the published {published.label}, exact — no approximate structure is faster at "
              f"recall@{args.k} {args.recall}. Nothing to write.")
        return 0
    return _write_choice(args, best.report, directory)


def _write_choice(args: argparse.Namespace, report: TuneReport, directory: Path) -> int:
    """Write the chosen knob value into the version's search.json (unless --dry-run)."""
    chosen = report.chosen
    assert chosen is not None and report.knob is not None
    held = "-" if chosen.holdout_recall is None else f"{chosen.holdout_recall:.4f}"
    print(f"\nchosen: {report.knob}={chosen.value} (recall@{report.k} {chosen.recall:.4f}, 95 % low "
          f"{chosen.recall_low:.4f}, held-out {held}, {chosen.qps:.0f} QPS per replica at c=1)")
    if args.dry_run:
        print("--dry-run: search.json not written")
        return 0
    previous = read_search_defaults(directory)
    path = write_search_defaults(directory, SearchDefaults(
        **{report.knob: chosen.value}, recall_target=report.target, recall=round(chosen.recall, 5), k=report.k,
        queries=report.tune_queries))
    was = f" (was {previous.params})" if previous and previous.params else ""
    print(f"wrote {path}{was}: replicas use it for queries without {report.knob} from their next load of the "
          "version (a restart, or staging it again)")
    return 0


def _tune_live(args: argparse.Namespace) -> int:
    """``--live``: the running replicas measured and set through the gateway (POST
    /v1/collections/NAME/tune, serving.gateway.collection_tune)."""
    import httpx

    from serving.cli.common import auth_headers, gateway_url

    if args.queries or args.rebuild or args.version:
        raise InvalidRequest("--live measures the running active version on stored pseudo-queries: drop --queries, "
                             "--rebuild and --version", field="live")
    body = {"recall": args.recall, "k": args.k, "sample": args.sample, "holdout": args.holdout, "seed": args.seed,
            "dry_run": args.dry_run, **({"max_value": args.max_value} if args.max_value else {})}
    print(f"tuning {args.collection} on its running replicas through {gateway_url(args)} ...", file=sys.stderr,
          flush=True)
    response = httpx.post(f"{gateway_url(args)}/v1/collections/{args.collection}/tune", json=body, timeout=600,
                          headers=auth_headers(args))
    answer = response.json()
    if response.status_code != 200:
        print(f"error: {answer.get('error', {}).get('message', response.text)}", file=sys.stderr)
        return 2
    report = answer["report"]
    for c in report["candidates"]:
        print(f"{report['knob']}={c['value']:<6} recall@{report['k']} {c['recall']:.4f} (95% low "
              f"{c['recall_low']:.4f})  QPS(c=1) {c['qps']:.0f}")
    if args.json:
        Path(args.json).write_text(json.dumps(answer, indent=1))
    chosen = answer.get("search_defaults")
    print(f"chosen {chosen} — " + ("applied on every replica" if answer["applied"] else answer.get("reason", "")
                                    or f"not applied everywhere: {answer.get('replicas')}"))
    return 0 if answer["applied"] or args.dry_run or report["knob"] is None else 1


def add_tune_command(commands: Any) -> None:
    tune = commands.add_parser(
        "tune", help="pick nprobe / ef_search for a recall target and make it the version's default",
        description="Measure recall@k (against exact search over the stored vectors) and QPS of every candidate "
                    "nprobe (IVF) or ef_search (HNSW) over the version's shards, merged as the gateway merges, and "
                    "write the cheapest value whose recall meets --recall with 95 %% confidence into "
                    "<version>/search.json. A third of the queries is held out to check the choice.")
    tune.add_argument("--collection", required=True, help="collection name")
    tune.add_argument("--live", action="store_true",
                      help="measure the running replicas through the gateway (POST /v1/collections/NAME/tune; any "
                           "collection, the created ones too) and apply the choice to every replica at once, "
                           "instead of the version's files")
    tune.add_argument("--url", help="gateway URL for --live [env SHARDRAG_URL]")
    tune.add_argument("--api-key", default=None, help="an admin API key for --live [env SHARDRAG_API_KEY]")
    tune.add_argument("--version", default=None, help="embedding version id (default: the newest built)")
    tune.add_argument("--root", help="where collections live [env SHARDRAG_ROOT, default ./shardrag-data]")
    tune.add_argument("--recall", type=float, default=0.95, help="recall@k target (default 0.95)")
    tune.add_argument("--k", type=int, default=10, help="k of recall@k (default 10)")
    tune.add_argument("--queries", default=None,
                      help="tuning queries: BEIR queries.jsonl or one text per line, embedded with --model "
                           "(default: --sample stored documents as pseudo-queries)")
    tune.add_argument("--model", default=None, help="encoder for --queries (default all-MiniLM-L6-v2)")
    tune.add_argument("--max-value", type=int, default=None,
                      help="never choose nprobe / ef_search above this (a latency budget; default: no cap)")
    tune.add_argument("--sample", type=int, default=600, help="pseudo-queries drawn from the shards (default 600)")
    tune.add_argument("--holdout", type=float, default=1 / 3, help="fraction of queries held out (default 1/3)")
    tune.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    tune.add_argument("--backend", choices=("local", "ray"), default="local",
                      help="where shards are evaluated: local worker processes or Ray tasks (default local)")
    tune.add_argument("--workers", type=int, default=0, help="local worker processes (default: one per core)")
    tune.add_argument("--ray-address", default=None, help="Ray cluster address for --backend ray (default: local)")
    tune.add_argument("--plot", default=None, help="write the recall-vs-QPS frontier as a PNG here")
    tune.add_argument("--json", default=None, help="write the full report as JSON here")
    tune.add_argument("--dry-run", action="store_true", help="measure and report, write nothing")
    tune.add_argument("--rebuild", action="store_true",
                      help="also search the structure: rebuild each shard (in the workers, from its stored "
                           "vectors) at other nlist / M / PQ sizes — for Flat, as HNSW and IVF; an HNSW graph also "
                           "linked wider (ef_construction 100, or twice the published) — tune each, and "
                           "report the cheapest structure that meets --recall (PQ/SQ versions: refused, their "
                           "vectors cannot be decoded exactly)")
    tune.add_argument("--ef-construction", type=breadths, default=None, metavar="N[,N...]",
                      help="with --rebuild: the build breadths to link every HNSW candidate with, e.g. 40 "
                           "(FAISS's default only: compare M alone) or 40,100,200 (default: the published "
                           "version's breadth and a wider one, 100 or twice the published)")
    tune.set_defaults(func=cmd_tune)
