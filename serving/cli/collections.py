"""``shardrag collections create|list|show|defaults|drop``: collections created at run time,
through a running gateway (the nodes of its cluster host them); ``defaults`` sets what a query
naming no mode, fusion or weights gets (retrieval.query_defaults)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from serving.cli.common import DEFAULT_URL, gateway_url, weights_argument


def add_collections_command(commands: Any) -> None:
    collections = commands.add_parser(
        "collections",
        help="create, list, show and drop collections of a running cluster, and set their query defaults",
        description="Collections created at run time: placed on the cluster's nodes (shardrag serve --nodes N), "
                    "empty and writable at once, kept in the cluster state so every gateway serves them. Data "
                    "goes to /v1/collections/NAME/query and /v1/collections/NAME/documents. Creating and "
                    "dropping need an admin key.")
    common = argparse.ArgumentParser(add_help=False)  # every action takes these, after its own arguments
    common.add_argument("--url", help=f"gateway URL [env SHARDRAG_URL, default {DEFAULT_URL}]")
    common.add_argument("--api-key", default=None, help="API key [env SHARDRAG_API_KEY]")
    common.add_argument("--timeout", type=float, default=60.0, help="seconds (default 60)")
    common.add_argument("--json", action="store_true", help="print the raw JSON answer")
    actions = collections.add_subparsers(dest="action", required=True)
    create = actions.add_parser("create", help="create an empty collection", parents=[common])
    create.add_argument("name", help="1-63 characters: a-z, 0-9, '_', '-'")
    space = create.add_mutually_exclusive_group(required=True)
    space.add_argument("--dim", type=int, help="vector dimension: a vector-only collection (clients send vectors)")
    space.add_argument("--model", help="an encoder the gateway serves: text is embedded by it")
    create.add_argument("--metric", choices=("ip", "l2"), default="ip", help="ip (cosine, normalised) or l2")
    create.add_argument("--shards", type=int, default=1, help="slices of the index (default 1)")
    create.add_argument("--replicas", type=int, default=1, help="copies of each slice, on distinct nodes (default 1)")
    create.add_argument("--factory", default="Flat", help="Flat (exact, default) or HNSW<M>, e.g. HNSW32")
    create.add_argument("--ef-construction", type=int, default=None, metavar="N",
                        help="HNSW only: candidates kept while linking each vector when a compaction builds the "
                             "graph, 4-4096 (default FAISS's 40; 100 recalled 0.938 against 0.895 at 1M vectors "
                             "and ef_search 256, building ~1.4x slower)")
    create.add_argument("--tenant-field", default=None,
                        help="payload field holding each document's tenant: keys with tenant=T see only T's")
    create.add_argument("--lexical-language", default=None, metavar="LANGUAGE",
                        help="how lexical and hybrid search analyse the texts: english (default), german, french, "
                             "... (a Snowball stemmer), cjk (character bigrams) or none (words as they are)")
    create.add_argument("--max-documents", type=int, default=0, help="document quota (default 0: none)")
    create.add_argument("--max-rps", type=float, default=0.0, help="requests/s quota per gateway (default 0: none)")
    _query_default_arguments(create)
    actions.add_parser("list", help="every collection (a scoped key sees its own)", parents=[common])
    show = actions.add_parser("show", help="definition, placement, replicas and live documents", parents=[common])
    show.add_argument("name")
    defaults = actions.add_parser(
        "defaults", parents=[common], help="set what a query naming no mode, fusion or weights gets",
        description="A collection's query defaults: the mode, fusion, weights and rrf_k of every query and answer "
                    "that names none (a query's own fields win; a query with a vector and no text stays dense). "
                    "Measure the best for your corpus first: shardrag eval --url URL --dataset DIR --collection "
                    "NAME. The whole set is replaced: what is left out returns to its default. Needs an admin key; "
                    "every gateway applies it within its refresh (a few seconds).")
    defaults.add_argument("name")
    _query_default_arguments(defaults)
    drop = actions.add_parser("drop", help="drop a collection: its replicas and files go from every node",
                              parents=[common])
    drop.add_argument("name")
    drop.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    collections.set_defaults(func=cmd_collections)


def cmd_collections(args: argparse.Namespace) -> int:
    from retrieval.client import ShardragClient

    with ShardragClient(gateway_url(args), timeout_s=args.timeout, api_key=args.api_key) as client:
        if args.action == "create":
            answer: Any = client.create_collection(
                args.name, dim=args.dim, model=args.model, metric=args.metric, shards=args.shards,
                replicas=args.replicas, factory=args.factory, tenant_field=args.tenant_field,
                max_documents=args.max_documents, max_rps=args.max_rps, lexical_language=args.lexical_language,
                ef_construction=args.ef_construction, query_defaults=_query_defaults(args))
            summary = (f"created {answer['name']}: {answer['dim']} dims, {answer['shards']} shard(s) × "
                       f"{answer['replicas']} replica(s) on {sorted({n for g in answer['placement'] for n in g})}")
        elif args.action == "defaults":
            answer = client.set_query_defaults(args.name, **_query_defaults(args))
            summary = f"{args.name}: a query naming none gets {_describe_defaults(answer['query_defaults'])}"
        elif args.action == "list":
            answer = client.list_collections()
            summary = "\n".join(_row(row) for row in answer) or "(no collections)"
        elif args.action == "show":
            answer = client.get_collection(args.name)
            summary = _row(answer) + "".join(f"\n  shard {s['shard']}: {s['documents']} documents on "
                                             f"{', '.join(s['replicas'])}" for s in answer.get("shard_replicas", []))
        else:
            if not args.yes and sys.stdin.isatty():
                typed = input(f"drop collection {args.name!r} and all its documents? type its name: ")
                if typed.strip() != args.name:
                    print("not dropped", file=sys.stderr)
                    return 1
            answer = client.drop_collection(args.name)
            summary = f"dropped {args.name}"
    print(json.dumps(answer, indent=1) if args.json else summary)
    return 0


def _query_default_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--mode", choices=("dense", "lexical", "hybrid"), default="dense",
                        help="query defaults: a text query's mode (default dense)")
    parser.add_argument("--fusion", choices=("rrf", "weighted"), default="weighted",
                        help="query defaults: a hybrid query's fusion (default weighted)")
    parser.add_argument("--weights", default=None, metavar="DENSE,LEXICAL",
                        help="query defaults: a weighted hybrid's weights, e.g. 0.95,0.05 (default: the ones chosen "
                             "on msmarco, 0.8,0.2)")
    parser.add_argument("--rrf-k", type=int, default=60, help="query defaults: rrf's rank offset (default 60)")


def _query_defaults(args: argparse.Namespace) -> dict[str, Any]:
    return {"mode": args.mode, "fusion": args.fusion, "weights": weights_argument(args.weights),
            "rrf_k": args.rrf_k}


def _describe_defaults(defaults: dict[str, Any]) -> str:
    if defaults["mode"] != "hybrid":
        return f"mode {defaults['mode']}"
    if defaults["fusion"] == "rrf":
        return f"mode hybrid, fusion rrf k={defaults['rrf_k']}"
    weights = defaults.get("weights")
    chosen = f"dense={weights['dense']:g} lexical={weights['lexical']:g}" if weights else "msmarco's weights"
    return f"mode hybrid, fusion weighted {chosen}"


def _row(row: dict[str, Any]) -> str:
    if row.get("default"):
        return f"{row['name']:24s} (the collection the cluster was started with)"
    tenant = f", tenant field {row['tenant_field']!r}" if row.get("tenant_field") else ""
    documents = f", {row['documents']} documents" if "documents" in row else ""
    space = row.get("model") or "vectors"
    defaults = row.get("query_defaults")
    queries = f", queries: {_describe_defaults(defaults)}" if defaults and defaults["mode"] != "dense" else ""
    return (f"{row['name']:24s} {row['dim']} dims ({space}, {row['metric']}), {row['shards']} shard(s) × "
            f"{row['replicas']}{tenant}{documents}{queries}")
