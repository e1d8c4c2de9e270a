"""``python -m index_shards serve --dir SHARD_DIR --host 127.0.0.1 --port 0``
``python -m index_shards node --data-dir DIR --coordinator file:///PATH`` (replicas of any collection)
``python -m index_shards pack --dir SHARD_DIR --out shard-0.tar.gz`` / ``fetch --url URL --dest DIR``

Loads one shard directory (refusing it if its checksums do not match) and serves it. With
``--port 0`` the server picks a free port and reports it: a ``SHARDRAG_READY {json}`` line on
stdout and, with ``--port-file``, a JSON file. Environment: ``SHARDRAG_SHARD_DIR``,
``SHARDRAG_HOST``, ``SHARDRAG_PORT``, ``SHARDRAG_DEVICE``; flags override.

Exit status (every shardrag command line): 0 done, 2 error (a bad flag, a damaged shard, a
failed download: one ``error: ...`` line on stderr), 130 interrupted.
"""

from __future__ import annotations

import argparse
import sys

from index_shards.server_flags import add_built_flags, add_server_flags, built_collection_from, server_config_from
from retrieval import env
from retrieval.cli_support import run_command
from retrieval.errors import ConfigError, ShardragError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m index_shards", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="serve one shard directory over HTTP")
    serve.add_argument("--dir", default=env.read("SHARDRAG_SHARD_DIR"),
                       help="shard directory (holds manifest.json) [env SHARDRAG_SHARD_DIR]")
    serve.add_argument("--host", default=env.read("SHARDRAG_HOST", "127.0.0.1"),
                       help="address to bind (default 127.0.0.1) [env SHARDRAG_HOST]")
    serve.add_argument("--port", type=int, default=int(env.read("SHARDRAG_PORT", "0") or 0),
                       help="port to bind; 0 picks a free one (default 0) [env SHARDRAG_PORT]")
    serve.add_argument("--port-file", help="write {url, port, pid} here once serving")
    add_server_flags(serve)
    serve.add_argument("--data-dir", default=None,
                       help="this replica's own folder for its write-ahead logs (one per version); without it "
                            "the replica is read-only")
    serve.add_argument("--coordinator", default=env.read("SHARDRAG_COORDINATOR"),
                       help="the cluster state this replica coordinates its shard's writes through: "
                            "etcd://HOST:PORT[,HOST:PORT...] or file:///PATH (the local coordinator of one machine); "
                            "without it the replica is its shard's only replica and its own primary "
                            "[env SHARDRAG_COORDINATOR]")
    serve.add_argument("--advertise-url", default=env.read("SHARDRAG_ADVERTISE_URL"),
                       help="the URL the gateways and the shard's other replicas reach this replica at (default: "
                            "the address it binds, e.g. http://127.0.0.1:PORT) [env SHARDRAG_ADVERTISE_URL]")
    serve.add_argument("--replica-id", default=env.read("SHARDRAG_REPLICA_ID"),
                       help="this replica's stable name in its shard's in-sync set, kept across restarts and "
                            "address changes (default: the name of --data-dir, e.g. shard-0-r1; a pod name in "
                            "Kubernetes) [env SHARDRAG_REPLICA_ID]")
    serve.add_argument("--replicas", type=int, default=0,
                       help="the shard's number of replicas, which write_ack one|majority|all counts against "
                            "(default 0: as many as have ever registered for the shard)")
    serve.add_argument("--log-level", default="warning", choices=("debug", "info", "warning", "error"))
    serve.set_defaults(func=cmd_serve)

    node = commands.add_parser("node", help="host replicas of any collection the cluster state places here "
                                "(created and dropped at run time through the gateway's collections API)")
    node.add_argument("--data-dir", required=True, help="the node's folder: every hosted replica's build, WAL "
                                                        "and compactions live under it")
    node.add_argument("--coordinator", default=env.read("SHARDRAG_COORDINATOR"),
                      help="the cluster state: etcd://HOST:PORT[,...] or file:///PATH (required) "
                           "[env SHARDRAG_COORDINATOR]")
    node.add_argument("--node-id", default=env.read("SHARDRAG_NODE_ID"),
                      help="this node's stable name in placements (default: the name of --data-dir) "
                           "[env SHARDRAG_NODE_ID]")
    node.add_argument("--host", default=env.read("SHARDRAG_HOST", "127.0.0.1"),
                      help="address to bind (default 127.0.0.1) [env SHARDRAG_HOST]")
    node.add_argument("--port", type=int, default=int(env.read("SHARDRAG_PORT", "0") or 0),
                      help="port to bind; 0 picks a free one (default 0) [env SHARDRAG_PORT]")
    node.add_argument("--port-file", help="write {url, port, pid} here once serving")
    node.add_argument("--advertise-url", default=env.read("SHARDRAG_ADVERTISE_URL"),
                      help="the URL gateways and peers reach this node at (default: the bound address) "
                           "[env SHARDRAG_ADVERTISE_URL]")
    add_server_flags(node)
    add_built_flags(node)
    node.add_argument("--log-level", default="warning", choices=("debug", "info", "warning", "error"))
    node.set_defaults(func=cmd_node)

    pack = commands.add_parser("pack", help="write a verified shard directory as one .tar.gz (to publish it)")
    pack.add_argument("--dir", required=True, help="shard directory (holds manifest.json)")
    pack.add_argument("--out", required=True, help="archive to write, e.g. shard-0.tar.gz")
    pack.set_defaults(func=cmd_pack)
    fetch = commands.add_parser("fetch", help="download a packed shard, verify it, move it into place atomically")
    fetch.add_argument("--url", required=True, help="http(s):// or file:// URL of a packed shard")
    fetch.add_argument("--dest", required=True, help="shard directory to create (left alone if it verifies)")
    fetch.add_argument("--timeout", type=float, default=600.0, help="download timeout, seconds (default 600)")
    fetch.set_defaults(func=cmd_fetch)
    return parser


def cmd_pack(args: argparse.Namespace) -> int:
    from index_shards.fetch import pack_shard

    print(pack_shard(args.dir, args.out))
    return 0


def cmd_fetch(args: argparse.Namespace) -> int:
    from index_shards.fetch import fetch_shard

    manifest = fetch_shard(args.url, args.dest, timeout_s=args.timeout)
    print(f"{args.dest}: shard {manifest.shard_id} of {manifest.num_shards}, verified")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    if not args.dir:
        raise ConfigError("--dir is required (or set SHARDRAG_SHARD_DIR)", field="dir")
    from dataclasses import replace

    import faiss

    from httpkit.serve import serve_app
    from index_shards.server import create_server
    from index_shards.shard import Shard

    config = server_config_from(args)
    faiss.omp_set_num_threads(max(1, args.faiss_threads))
    try:
        shard = Shard.load(args.dir, device=args.device, mmap=not args.no_mmap)
    except ShardragError as exc:
        exc.message = f"cannot serve {args.dir}: {exc.message}"
        raise
    if args.coordinator and not args.data_dir:
        raise ConfigError("--coordinator orders writes between replicas: give --data-dir too", field="coordinator")
    state = None
    if args.coordinator:
        from clusterstate import open_coordinator
        from clusterstate.state import ClusterState

        state = ClusterState(open_coordinator(args.coordinator), shard.manifest.collection)
    config = replace(config, data_dir=args.data_dir, replica_id=args.replica_id, replication=max(0, args.replicas))
    server = create_server(shard, config, state=state)  # takes the data dir's lock: a second server is refused

    def start_role(url: str) -> None:
        server.role.start(args.advertise_url or url)

    serve_app(
        server.app, host=args.host, port=args.port, port_file=args.port_file,
        name=f"shard-{shard.manifest.shard_id}", log_level=args.log_level,
        extra_ready=lambda: {"shard_id": shard.manifest.shard_id, "version": shard.version_id},
        on_ready=start_role,
    )
    return 0


def cmd_node(args: argparse.Namespace) -> int:
    if not args.coordinator:
        raise ConfigError("--coordinator is required: the node hosts what the cluster state places on it",
                          field="coordinator")
    from pathlib import Path

    import faiss

    from clusterstate import open_coordinator
    from httpkit.serve import serve_app
    from index_shards.node import Node, create_node_app

    config = server_config_from(args)
    faiss.omp_set_num_threads(max(1, args.faiss_threads))
    node_id = args.node_id or Path(args.data_dir).resolve().name
    built = built_collection_from(args, node_id)
    node = Node(open_coordinator(args.coordinator), node_id, args.data_dir, config, built=built)

    def start(url: str) -> None:
        node.start(args.advertise_url or url)

    try:
        serve_app(create_node_app(node), host=args.host, port=args.port, port_file=args.port_file,
                  name=f"node-{node_id}", log_level=args.log_level,
                  extra_ready=lambda: {"node_id": node_id, "built": [list(key) for key in node.built_slots]},
                  on_ready=start)
    finally:
        node.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run_command(args, log_level=getattr(args, "log_level", "info"))


if __name__ == "__main__":
    sys.exit(main())
