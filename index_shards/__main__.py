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
    serve.add_argument("--device", choices=("auto", "cpu", "gpu"), default=env.read("SHARDRAG_DEVICE", "auto"),
                       help="where FAISS searches; auto = GPU when FAISS reports one (default auto)")
    serve.add_argument("--no-mmap", action="store_true",
                       help="read the index into this process's memory instead of mapping the file (by default "
                            "replicas of a shard on one host share the index's pages)")
    serve.add_argument("--faiss-threads", type=int, default=1, help="OpenMP threads for FAISS (default 1)")
    serve.add_argument("--max-k", type=int, default=1000, help="largest k accepted (default 1000)")
    serve.add_argument("--max-batch", type=int, default=1024, help="most vectors per search request (default 1024)")
    serve.add_argument("--max-versions", type=int, default=2,
                       help="embedding versions held at once during a rollout (default 2)")
    serve.add_argument("--data-dir", default=None,
                       help="this replica's own folder for its write-ahead logs (one per version); without it "
                            "the replica is read-only")
    serve.add_argument("--compact-after", type=int, default=20_000,
                       help="written documents + deletes held in memory before a background compaction folds "
                            "them into a new sealed base (default 20000; writes pause at 4x that while it runs)")
    serve.add_argument("--wal-retain", type=int, default=100_000,
                       help="WAL records kept behind a compaction's checkpoint for replicas that fall behind; a "
                            "replica further behind is restored from a peer's snapshot (default 100000)")
    serve.add_argument("--wal-file-mb", type=float, default=64.0,
                       help="size at which a WAL file is closed and the next begun; whole files are what "
                            "compaction removes (default 64)")
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
    serve.add_argument("--lease-s", type=float, default=3.0,
                       help="the primary's lease in the cluster state: how long after a primary stops renewing it a "
                            "replica takes over (default 3; etcd rounds up to whole seconds, at least 2)")
    serve.add_argument("--filter-exact-max", type=int, default=4096,
                       help="filtered searches matching at most this many documents are scored exactly; more "
                            "take the index's own filtered search (default 4096)")
    serve.add_argument("--faults", default=env.read("SHARDRAG_FAULTS", ""),
                       help="fault injection spec, e.g. 'stall=0.05:100,latency=lognormal:1:0.5' "
                            "(see index_shards/faults.py; default off) [env SHARDRAG_FAULTS]")
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
    node.add_argument("--device", choices=("auto", "cpu", "gpu"), default=env.read("SHARDRAG_DEVICE", "auto"),
                      help="where FAISS searches; auto = GPU when FAISS reports one (default auto)")
    node.add_argument("--faiss-threads", type=int, default=1, help="OpenMP threads for FAISS (default 1)")
    node.add_argument("--lease-s", type=float, default=3.0,
                      help="primary leases of the hosted replicas and the node's own (default 3)")
    node.add_argument("--compact-after", type=int, default=20_000,
                      help="documents + deletes in a replica's write segment that start a compaction (default 20000)")
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
    import faiss

    from httpkit.serve import serve_app
    from index_shards.faults import FaultConfig
    from index_shards.server import ShardServerConfig, create_server
    from index_shards.shard import Shard

    faiss.omp_set_num_threads(max(1, args.faiss_threads))
    try:
        faults = FaultConfig.parse(args.faults)
    except ShardragError as exc:
        raise ConfigError(f"--faults: {exc.message}", field="faults") from exc
    try:
        shard = Shard.load(args.dir, device=args.device, mmap=not args.no_mmap)
    except ShardragError as exc:
        exc.message = f"cannot serve {args.dir}: {exc.message}"
        raise
    if args.compact_after < 1:
        raise ConfigError("--compact-after must be ≥ 1", field="compact_after")
    if args.wal_file_mb <= 0:
        raise ConfigError("--wal-file-mb must be > 0", field="wal_file_mb")
    if args.wal_retain < 0:
        raise ConfigError("--wal-retain must be ≥ 0", field="wal_retain")
    if args.filter_exact_max < 0:
        raise ConfigError("--filter-exact-max must be ≥ 0", field="filter_exact_max")
    if args.lease_s <= 0:
        raise ConfigError("--lease-s must be > 0", field="lease_s")
    if args.coordinator and not args.data_dir:
        raise ConfigError("--coordinator orders writes between replicas: give --data-dir too", field="coordinator")
    state = None
    if args.coordinator:
        from clusterstate import open_coordinator
        from clusterstate.state import ClusterState

        state = ClusterState(open_coordinator(args.coordinator), shard.manifest.collection)
    config = ShardServerConfig(max_k=args.max_k, max_batch=args.max_batch, faiss_threads=args.faiss_threads,
                               faults=faults, max_versions=args.max_versions, device=args.device,
                               mmap=not args.no_mmap,
                               filter_exact_max=args.filter_exact_max, data_dir=args.data_dir,
                               compact_after=args.compact_after, wal_retain=args.wal_retain,
                               wal_file_bytes=int(args.wal_file_mb * 2**20), lease_s=args.lease_s,
                               replica_id=args.replica_id, replication=max(0, args.replicas))
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
    if args.lease_s <= 0:
        raise ConfigError("--lease-s must be > 0", field="lease_s")
    if args.compact_after < 1:
        raise ConfigError("--compact-after must be ≥ 1", field="compact_after")
    from pathlib import Path

    import faiss

    from clusterstate import open_coordinator
    from httpkit.serve import serve_app
    from index_shards.node import Node, create_node_app
    from index_shards.server import ShardServerConfig

    faiss.omp_set_num_threads(max(1, args.faiss_threads))
    node_id = args.node_id or Path(args.data_dir).resolve().name
    config = ShardServerConfig(faiss_threads=args.faiss_threads, device=args.device, lease_s=args.lease_s,
                               compact_after=args.compact_after)
    node = Node(open_coordinator(args.coordinator), node_id, args.data_dir, config)

    def start(url: str) -> None:
        node.start(args.advertise_url or url)

    try:
        serve_app(create_node_app(node), host=args.host, port=args.port, port_file=args.port_file,
                  name=f"node-{node_id}", log_level=args.log_level, extra_ready=lambda: {"node_id": node_id},
                  on_ready=start)
    finally:
        node.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run_command(args, log_level=getattr(args, "log_level", "info"))


if __name__ == "__main__":
    sys.exit(main())
