"""What ``shardrag serve`` (every backend) and ``shardrag demo`` share: the gateway config from the
flags, fresh API keys, TLS files, the replica count and the banner."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from retrieval.errors import ConfigError


def gateway_config(args: argparse.Namespace) -> Any:
    from serving.encoding.settings import EncoderSettings
    from serving.gateway.config import GatewayConfig
    from serving.shardcall.call import HedgingSettings
    from serving.shardcall.fanout import FanOutSettings
    from serving.versions.presence import ClusterSettings

    return GatewayConfig(calls=FanOutSettings(transport=args.transport, balancer=args.balancer,
                                              coalesce=not args.no_coalesce),
                         hedging=HedgingSettings(enabled=not args.no_hedging),
                         cluster=ClusterSettings(coordinator=getattr(args, "coordinator", None)),
                         encoder=EncoderSettings(load=not args.no_encoder, backend=args.encoder_backend,
                                                 workers=args.encoder_workers,
                                                 runtime=args.encoder_runtime).validated())


def access(args: argparse.Namespace) -> tuple[list[str] | None, str]:
    """(API key entries or None when --open, the internal token). Fresh secrets every start."""
    import secrets

    token = secrets.token_urlsafe(32)
    if args.open:
        if args.host not in ("127.0.0.1", "localhost", "::1"):
            raise ConfigError(f"--open serves without API keys, which is only allowed on a loopback --host "
                              f"(not {args.host})", field="open")
        print("WARNING: --open: no API keys; anyone on this machine can query and administer the cluster",
              file=sys.stderr)
        return None, token
    return [f"read:{cli_safe_key()}", f"admin:{cli_safe_key()}"], token


def cli_safe_key() -> str:
    """A fresh API key that does not start with '-' (argparse would take `--api-key -x…` for a
    missing value: the key could not be passed to `shardrag query --api-key KEY`)."""
    import secrets

    while True:
        key = secrets.token_urlsafe(24)
        if not key.startswith("-"):
            return key


def tls_files(args: argparse.Namespace) -> tuple[str, str, str] | None:
    if not args.tls_cert and not args.tls_key:
        return None
    if not (args.tls_cert and args.tls_key):
        raise ConfigError("--tls-cert and --tls-key go together", field="tls_cert")
    for path in (args.tls_cert, args.tls_key, args.tls_ca):
        if path and not Path(path).is_file():
            raise ConfigError(f"TLS file {path} does not exist", field="tls_cert")
    return str(Path(args.tls_cert).resolve()), str(Path(args.tls_key).resolve()), \
        str(Path(args.tls_ca or args.tls_cert).resolve())


def replicas_of(args: argparse.Namespace) -> int:
    """--replicas, default 2 (None when not given, so --backend embedded can tell)."""
    return 2 if args.replicas is None else int(args.replicas)


def key_of(cluster: Any, scope: str) -> str | None:
    entries: list[str] = getattr(cluster, "api_keys", None) or []
    for entry in entries:
        if entry.startswith(scope + ":"):
            return entry.split(":", 1)[1]
    return None


def print_banner(cluster: Any, example_query: str) -> None:
    url = cluster.gateway_url
    body = json.dumps({"text": example_query, "k": 3})
    read_key, admin_key = key_of(cluster, "read"), key_of(cluster, "admin")
    auth = " -H \"authorization: Bearer $SHARDRAG_API_KEY\"" if read_key else ""
    answer_hint = ""
    if cluster.generators:
        answer_body = json.dumps({"question": example_query, "k": 3})
        answer_hint = (f"\n  curl -s {url}/v1/answer{auth} -H 'content-type: application/json' -d '{answer_body}'"
                       f"\n  shardrag ask --url {url} \"{example_query}\"")
    keys = (f"""
  API keys (new each start; also in {cluster.workdir}/api-keys):
    read  {read_key}
    admin {admin_key}
  export SHARDRAG_API_KEY={read_key}""" if read_key else "\n  no API keys (--open)")
    embedded = getattr(cluster, "embedded", False)
    topology = (f"{cluster.manifest.num_shards} shards loaded in this one process (--backend embedded)" if embedded
                else f"{cluster.manifest.num_shards} shards × {cluster.replicas} replicas, logs in {cluster.workdir}")
    game_day = "" if embedded else \
        f"\n  game day: shardrag faults set --url {url} --api-key ADMIN_KEY --shard 0 --replica 0 'latency=fixed:50'"
    print(f"""
shardrag is up: {url}
  collection {cluster.collection} @ {cluster.manifest.embedding_version.id}
  {topology}{keys}

  status page: {url}/  (paste the read key once)     shardrag status --url {url} [--watch]
  curl -s {url}/v1/query{auth} -H 'content-type: application/json' -d '{body}'
  curl -s {url}/v1/cluster{auth}
  shardrag query --url {url} "{example_query}"{answer_hint}{game_day}
  API docs: {url}/docs        metrics: {url}/metrics

Ctrl-C stops {"it" if embedded else "every process"}.""", flush=True)
