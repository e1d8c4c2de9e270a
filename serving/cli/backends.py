"""The backends of ``shardrag serve`` other than local processes: Ray actors, and every shard
embedded in the gateway's own process."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from retrieval.errors import ConfigError
from serving.cli.common import root_of
from serving.cli.serve_common import access, gateway_config, print_banner, replicas_of, tls_files


def serve_on_ray(args: argparse.Namespace) -> int:
    """Shard replicas as Ray actors; the gateway runs here, reaching them through RayShardClient."""

    from httpkit.serve import serve_app
    from serving.gateway.app import create_app
    from serving.gateway.factory import GatewaySetup
    from serving.local.state import active_version, claim_collection, with_collection_state
    from serving.transport.ray import RayShardCluster

    if args.generators or args.kv_nodes:
        raise ConfigError("--generators/--kv-nodes run with the process backend only (omit --backend ray)",
                          field="backend")
    keys, _ = access(args)  # actors are reached through Ray, not HTTP: no internal token needed
    if keys:
        os.environ["SHARDRAG_API_KEYS"] = ",".join(keys)  # read by the gateway's auth guard
        print("API keys (new each start):\n" + "\n".join(f"  {k.replace(':', '  ', 1)}" for k in keys),
              file=sys.stderr)
    root = root_of(args)
    config = with_collection_state(gateway_config(args), root, args.collection)
    # Ray on one machine shares the collection's local coordinator file; across hosts give etcd
    # the version the rollout state says is active (as the process backend starts on)
    version = args.version or active_version(args.collection, config)
    cluster = RayShardCluster(root, args.collection, version=version, replicas=replicas_of(args),
                              address=args.ray_address, faiss_threads=args.faiss_threads,
                              coordinator=config.cluster.coordinator, nodes=max(0, args.nodes))
    lock = claim_collection(config, root, args.collection, cluster.manifest.num_shards, replicas_of(args),
                            lock=args.ray_address is None)
    print(f"starting {cluster.manifest.num_shards} shards × {replicas_of(args)} replica actors + "
          f"{cluster.node_count} node actor(s) on Ray ({args.ray_address or 'local'}) ...", file=sys.stderr, flush=True)
    cluster.start()
    print("replica actors on Ray nodes: " + json.dumps({str(s): nodes for s, nodes in enumerate(cluster.nodes)}),
          file=sys.stderr, flush=True)
    setup = GatewaySetup(config, cluster.replica_names, shard_client=cluster.client())
    try:
        serve_app(create_app(setup), host=args.host, port=args.port, name="gateway", log_level="warning",
                  fallback_to_any_port=True)
    except KeyboardInterrupt:  # Ctrl-C reaches Ray's processes too; stop in order all the same
        pass
    finally:
        print("stopping the Ray shard actors ...", file=sys.stderr)
        cluster.stop()
        if lock is not None:
            lock.release()
    return 0


def serve_embedded(args: argparse.Namespace) -> int:
    """Every shard loaded into the gateway's own process (serving.local.embedded): one process,
    no shard hops; one replica per shard."""
    import tempfile
    from types import SimpleNamespace

    from httpkit.serve import serve_app
    from serving.gateway.app import create_app
    from serving.gateway.factory import GatewaySetup
    from serving.local.embedded import EmbeddedCluster
    from serving.local.state import write_api_keys

    if args.replicas not in (None, 1):
        raise ConfigError("--backend embedded serves one replica per shard, in the gateway's process; "
                          "for replicas use --backend process", field="replicas")
    if args.generators or args.kv_nodes:
        raise ConfigError("--generators/--kv-nodes run with the process backend only", field="backend")
    if args.faiss_threads < 1:
        raise ConfigError("--faiss-threads must be ≥ 1", field="faiss_threads")
    keys, _ = access(args)
    tls = tls_files(args)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="shardrag-embedded-"))
    workdir.mkdir(parents=True, exist_ok=True)
    for name in ("SHARDRAG_API_KEYS", "SHARDRAG_API_KEYS_FILE"):  # only this start's keys, never ambient ones
        os.environ.pop(name, None)
    if keys:
        keys_path = write_api_keys(workdir, keys)
        os.environ["SHARDRAG_API_KEYS_FILE"] = str(keys_path)  # read by the gateway's auth guard
    if tls:
        os.environ.update(SHARDRAG_TLS_CERT=tls[0], SHARDRAG_TLS_KEY=tls[1], SHARDRAG_TLS_CA=tls[2])
    import faiss

    faiss.omp_set_num_threads(args.faiss_threads)
    cluster = EmbeddedCluster(root_of(args), args.collection, version=args.version, gateway=gateway_config(args))
    print(f"loading {cluster.manifest.num_shards} shards of {cluster.manifest.embedding_version.id} into this "
          "process ...", file=sys.stderr, flush=True)
    cluster.start()
    setup = GatewaySetup(cluster.gateway_config, cluster.replica_names, shard_client=cluster.client())

    def on_ready(url: str) -> None:
        print_banner(SimpleNamespace(gateway_url=url, api_keys=keys, generators=(), workdir=workdir, embedded=True,
                                     collection=cluster.collection, manifest=cluster.manifest, replicas=1),
                     "how do I open a file")

    try:
        serve_app(create_app(setup), host=args.host, port=args.port, name="gateway", log_level="warning",
                  fallback_to_any_port=True, on_ready=on_ready)
    except KeyboardInterrupt:
        pass
    finally:
        cluster.stop()
    return 0
