"""The flags every process that serves replicas shares (``python -m index_shards serve`` for one
replica, ``… node`` for the replicas a node hosts), and the :class:`ShardServerConfig` they make:
one definition, so a node's replicas can be configured exactly as a one-replica process is."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from retrieval import env
from retrieval.errors import ConfigError, ShardragError

if TYPE_CHECKING:
    from index_shards.placement import BuiltCollection
    from index_shards.server import ShardServerConfig


def add_server_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", choices=("auto", "cpu", "gpu"), default=env.read("SHARDRAG_DEVICE", "auto"),
                        help="where FAISS searches; auto = GPU when FAISS reports one (default auto)")
    parser.add_argument("--no-mmap", action="store_true",
                        help="read the index into this process's memory instead of mapping the file (by default "
                             "replicas of a shard on one host share the index's pages)")
    parser.add_argument("--faiss-threads", type=int, default=1, help="OpenMP threads for FAISS (default 1)")
    parser.add_argument("--max-k", type=int, default=1000, help="largest k accepted (default 1000)")
    parser.add_argument("--max-batch", type=int, default=1024,
                        help="most vectors per search request (default 1024)")
    parser.add_argument("--max-versions", type=int, default=2,
                        help="embedding versions held at once during a rollout (default 2)")
    parser.add_argument("--compact-after", type=int, default=20_000,
                        help="written documents + deletes held in memory before a background compaction folds "
                             "them into a new sealed base (default 20000; writes pause at 4x that while it runs)")
    parser.add_argument("--wal-retain", type=int, default=100_000,
                        help="WAL records kept behind a compaction's checkpoint for replicas that fall behind; a "
                             "replica further behind is restored from a peer's snapshot (default 100000)")
    parser.add_argument("--wal-file-mb", type=float, default=64.0,
                        help="size at which a WAL file is closed and the next begun; whole files are what "
                             "compaction removes (default 64)")
    parser.add_argument("--lease-s", type=float, default=3.0,
                        help="the primary's lease in the cluster state: how long after a primary stops renewing it a "
                             "replica takes over (default 3; etcd rounds up to whole seconds, at least 2)")
    parser.add_argument("--filter-exact-max", type=int, default=4096,
                        help="filtered searches matching at most this many documents are scored exactly; more "
                             "take the index's own filtered search (default 4096)")
    parser.add_argument("--lexical-warm", choices=("auto", "always", "lazy"),
                        default=env.read("SHARDRAG_LEXICAL_WARM", "auto"),
                        help="when a base's lexical (BM25) index is built: auto = ahead of the queries once this "
                             "replica has served a lexical query (remembered in its data dir), so a restart, a "
                             "rollout or a snapshot restore does not make the next hybrid query wait for it (about a "
                             "minute per million documents); always = ahead of the queries from the start; lazy = on "
                             "the first lexical query (default auto) [env SHARDRAG_LEXICAL_WARM]")
    parser.add_argument("--faults", default=env.read("SHARDRAG_FAULTS", ""),
                        help="fault injection spec, e.g. 'stall=0.05:100,latency=lognormal:1:0.5' "
                             "(see index_shards/faults.py; default off) [env SHARDRAG_FAULTS]")


def server_config_from(args: argparse.Namespace) -> ShardServerConfig:
    """The replicas' configuration from :func:`add_server_flags`' flags; ConfigError naming the flag."""
    from index_shards.faults import FaultConfig
    from index_shards.server import ShardServerConfig  # FastAPI and FAISS: not for --help

    try:
        faults = FaultConfig.parse(args.faults)
    except ShardragError as exc:
        raise ConfigError(f"--faults: {exc.message}", field="faults") from exc
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
    return ShardServerConfig(max_k=args.max_k, max_batch=args.max_batch, faiss_threads=args.faiss_threads,
                             faults=faults, max_versions=args.max_versions, device=args.device,
                             mmap=not args.no_mmap, filter_exact_max=args.filter_exact_max,
                             compact_after=args.compact_after, wal_retain=args.wal_retain,
                             wal_file_bytes=int(args.wal_file_mb * 2**20), lease_s=args.lease_s,
                             lexical_warm=args.lexical_warm)


def add_built_flags(parser: argparse.ArgumentParser) -> None:
    """A node's flags for hosting its share of the collection the cluster is launched with."""
    group = parser.add_argument_group(
        "the launched collection", "host this node's share of a collection built by `shardrag build` (replica r of "
        "shard i on node (i + r) mod --nodes), beside the collections created at run time")
    group.add_argument("--collection", default=None, help="the built collection's name (default: none)")
    group.add_argument("--root", default=None,
                       help="the folder holding <collection>/<version>/shard-<i> (default: --data-dir)")
    group.add_argument("--replicas-dir", default=None,
                       help="where its replicas keep their write state, <dir>/<collection>/replicas/shard-<i>-r<r> "
                            "(default: --root; give one when --root is a read-only shared index)")
    group.add_argument("--version", default=None,
                       help="the version to start on when the rollout state names none (default: the newest built)")
    group.add_argument("--shards", type=int, default=0,
                       help="the collection's shard count (default: the version's manifest; required with "
                            "--index-url)")
    group.add_argument("--replicas", type=int, default=1, help="replicas of each shard (default 1)")
    group.add_argument("--nodes", type=int, default=0, help="nodes sharing the replicas (default: --replicas)")
    group.add_argument("--node-index", type=int, default=None,
                       help="this node's place among them (default: the number its node id ends in)")
    group.add_argument("--index-url", default=None,
                       help="fetch a shard this node lacks from <URL>/shard-<i>.tar.gz (verified, then moved "
                            "into place)")


def built_collection_from(args: argparse.Namespace, node_id: str) -> tuple[BuiltCollection, int] | None:
    """The launched collection and this node's index from :func:`add_built_flags`' flags (None:
    the node hosts created collections only)."""
    from pathlib import Path

    from index_shards.layout import resolve_version
    from index_shards.placement import BuiltCollection, node_index_of

    if not args.collection:
        return None
    root = Path(args.root or args.data_dir)
    shards = args.shards
    if shards < 1:
        if args.index_url:
            raise ConfigError("--index-url needs --shards (the index is not here yet to tell)", field="shards")
        shards = resolve_version(root, args.collection, args.version)[1].num_shards
    built = BuiltCollection(root, args.collection, shards, args.replicas, args.nodes or args.replicas,
                            version=args.version, index_url=args.index_url,
                            data_root=Path(args.replicas_dir) if args.replicas_dir else None)
    index = args.node_index if args.node_index is not None else node_index_of(node_id)
    built.slots_on(index)  # refuses an index outside the node set
    return built, index
