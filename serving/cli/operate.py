"""What an operator runs against a live gateway: ``shardrag status [--watch]`` (the cluster as a
table; exit 1 when a shard has no healthy replica) and ``shardrag faults show|set|clear``
(game-day fault injection, proxied by the gateway to the replica with the internal token)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from serving.cli.common import DEFAULT_URL, auth_headers, gateway_url


def _get_json(args: argparse.Namespace, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
    import httpx

    from retrieval.errors import error_for_status

    response = httpx.request(method, f"{gateway_url(args)}{path}", json=body, timeout=args.timeout,
                             headers=auth_headers(args))
    if response.status_code != 200:
        raise error_for_status(response.status_code, response.content)
    return response.json()


def render_status(cluster: dict[str, Any]) -> tuple[str, bool]:
    """(the table, whether every shard has a healthy replica)."""
    rollout = cluster.get("rollout") or {}
    lines = [f"collection {cluster['collection']} · {cluster['num_shards']} shards · {cluster['factory']} · "
             f"active {rollout.get('active')}" + (f" · staged {rollout['staged']}" if rollout.get("staged") else "")
             + (f" · previous {rollout['previous']}" if rollout.get("previous") else "")]
    width = max([28, *(len(r["url"]) for shard in cluster["shards"] for r in shard["replicas"])])  # nodes: /c/NAME/i
    lines.append(f"{'shard':>5} {'replica':<{width}} {'health':<8} {'ejected':<8} {'probe ms':>8} {'restarts':>8} "
                 f"{'exit':>5}  versions")
    all_served = True
    for shard in cluster["shards"]:
        if shard["healthy_replicas"] == 0:
            all_served = False
        for replica in shard["replicas"]:
            versions = ", ".join(f"{v['id']}:{v['state']}" for v in replica.get("versions", [])) or \
                replica.get("error", "")
            # a replica building a BM25 index makes its next lexical query wait: say so past the cut
            building = [v["id"] for v in replica.get("versions", []) if v.get("lexical_index") == "building"]
            ejected = "yes" if (replica.get("ejection") or {}).get("ejected") else "no"
            latency = f"{replica['latency_ms']:.1f}" if "latency_ms" in replica else "-"
            exit_code = replica.get("last_exit_code")
            lines.append(f"{shard['shard']:>5} {replica['url']:<{width}} {'up' if replica['healthy'] else 'DOWN':<8} "
                         f"{ejected:<8} {latency:>8} {replica.get('restarts', 0):>8} "
                         f"{'-' if exit_code is None else exit_code:>5}  {versions[:60]}"
                         + (f"  (lexical index building: {', '.join(building)})" if building else ""))
        if shard["healthy_replicas"] == 0:
            lines.append(f"{'':>5} ! shard {shard['shard']} has no healthy replica: its documents are not served")
    hedging = cluster.get("hedging") or {}
    lines.append(f"hedging {'on' if hedging.get('enabled') else 'off'}: {hedging.get('calls', 0)} calls, "
                 f"{hedging.get('hedges_fired', 0)} hedges ({hedging.get('hedges_won', 0)} won), "
                 f"{hedging.get('retries', 0)} retries, budget exhausted {hedging.get('budget_exhausted', 0)}×")
    encoders = cluster.get("encoders") or {}
    if encoders:
        lines.append("encoders: " + ", ".join(f"{v}: {e.get('state', '?')}" for v, e in encoders.items()))
    generators = cluster.get("generators")
    if generators:
        lines.append(f"generators: {len(generators['in_flight'])} ({len(generators['down'])} down), "
                     f"{generators['routed']} answers routed, {generators['spilled']} spilled, "
                     f"{generators['failed_over']} failed over")
    supervision = cluster.get("supervision")
    if supervision:
        lines.append(f"supervised processes restarted {supervision['total_restarts']}×")
    return "\n".join(lines), all_served


def cmd_status(args: argparse.Namespace) -> int:
    while True:
        cluster = _get_json(args, "GET", "/v1/cluster")
        if args.json:
            print(json.dumps(cluster, indent=1))
            return 0
        table, all_served = render_status(cluster)
        if args.watch:
            sys.stdout.write("\x1b[2J\x1b[H")  # clear the terminal, like watch(1)
        print(f"{time.strftime('%H:%M:%S')} {gateway_url(args)}\n{table}", flush=True)
        if not args.watch:
            return 0 if all_served else 1
        try:
            time.sleep(args.interval)
        except KeyboardInterrupt:
            return 0 if all_served else 1


def cmd_faults(args: argparse.Namespace) -> int:
    if args.action == "set":
        answer = _get_json(args, "PUT", f"/admin/faults/{args.shard}/{args.replica}", {"spec": args.spec})
        print(f"shard {answer['shard']} replica {answer['replica']} ({answer['url']}): "
              f"{'active' if answer['active'] else 'off'} {json.dumps(answer['faults'], sort_keys=True)}")
        return 0
    if args.action == "clear":
        if args.shard is not None and args.replica is not None:
            answer = _get_json(args, "PUT", f"/admin/faults/{args.shard}/{args.replica}", {})
            print(f"shard {answer['shard']} replica {answer['replica']}: faults off")
            return 0
        rows = _get_json(args, "DELETE", "/admin/faults")["replicas"]
    else:
        rows = _get_json(args, "GET", "/admin/faults")["replicas"]
    failed = 0
    for row in rows:
        where = f"shard {row['shard']} replica {row['replica']} ({row['url']})"
        if "error" in row:
            failed += 1
            print(f"{where}: unreachable — {row['error']}")
        elif args.action == "clear":
            print(f"{where}: faults off")
        else:
            active = {k: v for k, v in row["faults"].items() if v not in (None, 0, 0.0, 1.0, "none", 503)}
            print(f"{where}: {'active ' + json.dumps(active, sort_keys=True) if row['active'] else 'off'}"
                  f"{'  injected ' + json.dumps(row['injected'], sort_keys=True) if row.get('injected') else ''}")
    return 1 if failed else 0


def add_operate_commands(commands: Any) -> None:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--url", help=f"gateway URL [env SHARDRAG_URL, default {DEFAULT_URL}]")
    common.add_argument("--api-key", default=None, help="API key [env SHARDRAG_API_KEY] (faults: an admin key)")
    common.add_argument("--timeout", type=float, default=30.0, help="seconds (default 30)")

    status = commands.add_parser(
        "status", parents=[common], help="the cluster at a glance: shards × replicas, rollout, hedging, encoders",
        description="Shards × replicas (health, ejection, probe latency, restarts, last exit code, versions), "
                    "the rollout, hedging counters, encoders and generators, from the gateway's /v1/cluster. "
                    "Exit code 1 when a shard has no healthy replica.")
    status.add_argument("--watch", action="store_true", help="refresh until Ctrl-C")
    status.add_argument("--interval", type=float, default=2.0, help="--watch refresh period, seconds (default 2)")
    status.add_argument("--json", action="store_true", help="print /v1/cluster as JSON")
    status.set_defaults(func=cmd_status)

    faults = commands.add_parser(
        "faults", help="game-day fault injection on a replica, through the gateway (admin key)",
        description="show: every replica's faults; set SPEC --shard N --replica R: e.g. 'stall=0.05:100', "
                    "'latency=fixed:50', 'errors=0.1:503', 'slowdown=5', 'hang=0.01' (comma-separated; see "
                    "README, Fault injection); clear: all replicas (or one with --shard/--replica). The gateway "
                    "forwards to the replica with the internal token.")
    actions = faults.add_subparsers(dest="action", required=True, metavar="ACTION")
    actions.add_parser("show", parents=[common], help="every replica's fault settings and injected counts")
    setter = actions.add_parser("set", parents=[common], help="set one replica's faults")
    setter.add_argument("spec", help="the fault spec, e.g. 'stall=0.05:100,latency=lognormal:1:0.5'")
    clear = actions.add_parser("clear", parents=[common], help="faults off everywhere (or on one replica)")
    for parser, required in ((setter, True), (clear, False)):
        parser.add_argument("--shard", type=int, required=required, default=None)
        parser.add_argument("--replica", type=int, required=required, default=None)
    faults.set_defaults(func=cmd_faults)
