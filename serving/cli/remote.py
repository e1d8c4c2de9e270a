"""Subcommands that talk to a running gateway: ``shardrag query`` and ``shardrag rollout``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any
from urllib.parse import quote

from retrieval.errors import ConfigError
from serving.cli.common import auth_headers, gateway_url, weights_argument


def cmd_query(args: argparse.Namespace) -> int:
    from retrieval.client import ShardragClient

    url = gateway_url(args)
    filter_ = _json_argument(args.filter, "--filter") if args.filter else None
    with ShardragClient(url, timeout_s=args.timeout, api_key=args.api_key) as client:
        target = client.collection(args.collection) if args.collection else client
        response = target.query(text=args.text, k=args.k, top_m=args.top_m, filter=filter_,
                                with_metadata=args.with_metadata, mode=args.mode, fusion=args.fusion,
                                rrf_k=args.rrf_k, weights=weights_argument(args.weights), candidates=args.candidates,
                                group_by=args.group_by, group_size=args.group_size)
    if args.json:
        print(json.dumps(response, indent=1))
        return 0
    diagnostics = response["diagnostics"]
    fusion = f", {diagnostics['fusion']}" if diagnostics.get("fusion") else ""
    terms = diagnostics.get("lexical_terms")
    searched = f", terms: {' '.join(terms) if terms else 'none'}" if terms is not None else ""
    defaulted = diagnostics.get("defaulted")
    searched += f"; {', '.join(defaulted)} from the collection's query defaults" if defaulted else ""
    print(f"{len(response['hits'])} hits in {diagnostics['took_ms']:.1f} ms "
          f"({diagnostics['shards_answered']}/{diagnostics['shards_total']} shards, {response['version']}, "
          f"{diagnostics.get('mode', 'dense')}{fusion}{searched})")
    groups = diagnostics.get("groups")
    if groups:
        print(f"{groups['groups']} groups by {groups['by']}, read {groups['read']} deep in {groups['rounds']} "
              f"round(s)" + ("" if groups["filled"] else " (not filled: as deep as a grouped query reads)"))
    group = None
    for rank, hit in enumerate(response["hits"], start=1):
        if groups and json.dumps(hit["group"]) != group:  # JSON: 1 and true are two groups
            group = json.dumps(hit["group"])
            print(f"{groups['by']} = {group}")
        snippet = " ".join(hit["text"].split())[:110]
        # a weighted leg's rank is null below its top `candidates`: the score alone, not "#None"
        legs = "".join(f"  {leg}{'' if where['rank'] is None else ' #' + str(where['rank'])} ({where['score']:.4g})"
                       for leg, where in (hit.get("legs") or {}).items())
        print(f"{rank:2d}. {hit['score']:.4f}  [{hit['doc_id']}] {hit['title']}{legs}\n      {snippet}")
        if "metadata" in hit:
            print(f"      {json.dumps(hit['metadata'], sort_keys=True)}")
    return 0


def _json_argument(text: str, flag: str) -> Any:
    """A JSON flag value, or the content of the file it names with @PATH."""
    if text.startswith("@"):
        try:
            text = Path(text[1:]).read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"{flag}: cannot read {text[1:]}: {exc.strerror}", field=flag.lstrip("-")) from exc
    try:
        return json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"{flag} is not valid JSON: {exc}", field=flag.lstrip("-")) from exc


def cmd_rollout(args: argparse.Namespace) -> int:
    import httpx

    url = gateway_url(args)
    base = f"{url}/v1/collections/{quote(args.collection, safe='')}/rollout" if args.collection else \
        f"{url}/admin/rollout"
    if args.action == "status":
        response = httpx.get(base, timeout=args.timeout, headers=auth_headers(args))
    else:
        # a created collection's stage names its version by the model
        if not args.version and not (args.collection and args.action == "stage"):
            print(f"error: rollout {args.action} needs a VERSION", file=sys.stderr)
            return 2
        body: dict[str, Any] = {"version": args.version} if args.version else {}
        if args.action == "stage":
            body["model"] = args.model
        if args.action in ("activate", "retire") and args.force:
            body["force"] = True
        if args.action == "activate" and args.queries:
            from retrieval.datasets import load_qrels, load_queries

            body["queries"] = load_queries(args.queries)
            if args.qrels:
                body["qrels"] = load_qrels(args.qrels)
        response = httpx.post(f"{base}/{args.action}", json=body, timeout=args.timeout,
                              headers=auth_headers(args))
    payload = response.json()
    if response.status_code != 200:
        error = payload.get("error", {})
        print(f"error: {error.get('message', response.text)}", file=sys.stderr)
        if "gate" in error:
            print(json.dumps({"gate": error["gate"]}, indent=1), file=sys.stderr)
        return 2
    state = payload["state"]
    event = payload.get("event")
    print(f"{event['kind']} {event['version']}" if event else "no change (already in that state)")
    print(f"active {state['active']}  staged {state['staged'] or '-'}  previous {state['previous'] or '-'}  "
          f"(generation {state['generation']})")
    for version, shards in payload.get("replicas", {}).items():
        ready = sum(row["state"] == "ready" for rows in shards.values() for row in rows)
        total = sum(len(rows) for rows in shards.values())
        print(f"  {version}: {ready}/{total} replicas ready")
    if payload.get("gate"):
        print(f"quality gate: {json.dumps(payload['gate'])}")
    if args.json:
        print(json.dumps(payload, indent=1))
    return 0
