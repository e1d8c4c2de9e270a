"""Single server processes (what the launcher and Helm run): ``shardrag gateway``, ``kv-node``,
``generator``."""

from __future__ import annotations

import argparse


def cmd_gateway(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from httpkit.serve import serve_app
    from retrieval import env
    from serving.gateway.app import create_app
    from serving.gateway.config import ClusterSpec
    from serving.gateway.factory import GatewaySetup

    spec = ClusterSpec.load(args.cluster)
    config = spec.gateway
    coordinator = args.coordinator or env.read("SHARDRAG_COORDINATOR")
    if coordinator:
        config = replace(config, cluster=replace(config.cluster, coordinator=coordinator))
    setup = GatewaySetup(config.validate(), spec.shards, generators=spec.generators)
    serve_app(create_app(setup), host=args.host, port=args.port, port_file=args.port_file, name="gateway",
              log_level=args.log_level, fallback_to_any_port=args.port_fallback)
    return 0


def cmd_kv_node(args: argparse.Namespace) -> int:
    from httpkit.serve import serve_app
    from serving.kvcache.node import create_kv_node_app

    serve_app(create_kv_node_app(int(args.budget_mb * 2**20)), host=args.host, port=args.port,
              port_file=args.port_file, name="kv-node", log_level=args.log_level)
    return 0


def cmd_generator(args: argparse.Namespace) -> int:
    from httpkit.serve import serve_app
    from retrieval.errors import ConfigError
    from serving.answer.generator import load_generator
    from serving.answer.worker import create_generator_app
    from serving.kvcache.client import KVClient

    nodes = [n for n in (args.kv_nodes or "").split(",") if n]
    kv = None if args.no_cache else KVClient(nodes, local_budget_bytes=int(args.local_budget_mb * 2**20))
    generator = load_generator(args.model, kv=kv, block_size=args.block_size, threads=args.threads,
                               device=args.device)
    if not 0.0 <= args.recompute_fraction <= 1.0:
        raise ConfigError("--recompute-fraction must be in [0, 1]", field="recompute_fraction")
    app = create_generator_app(generator, kv_reuse=args.kv_reuse, recompute_fraction=args.recompute_fraction)
    serve_app(app, host=args.host, port=args.port, port_file=args.port_file,
              name="generator", log_level=args.log_level)
    return 0
