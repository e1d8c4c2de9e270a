"""``python -m index_shards serve --dir SHARD_DIR --host 127.0.0.1 --port 0``
``python -m index_shards pack --dir SHARD_DIR --out shard-0.tar.gz`` / ``fetch --url URL --dest DIR``

Loads one shard directory (refusing it if its checksums do not match) and serves it. With
``--port 0`` the server picks a free port and reports it: a ``SHARDRAG_READY {json}`` line on
stdout and, with ``--port-file``, a JSON file. Environment: ``SHARDRAG_SHARD_DIR``,
``SHARDRAG_HOST``, ``SHARDRAG_PORT``, ``SHARDRAG_DEVICE``; flags override.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from retrieval.errors import ShardragError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m index_shards", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="serve one shard directory over HTTP")
    serve.add_argument("--dir", default=os.environ.get("SHARDRAG_SHARD_DIR"),
                       help="shard directory (holds manifest.json) [env SHARDRAG_SHARD_DIR]")
    serve.add_argument("--host", default=os.environ.get("SHARDRAG_HOST", "127.0.0.1"),
                       help="address to bind (default 127.0.0.1) [env SHARDRAG_HOST]")
    serve.add_argument("--port", type=int, default=int(os.environ.get("SHARDRAG_PORT", "0")),
                       help="port to bind; 0 picks a free one (default 0) [env SHARDRAG_PORT]")
    serve.add_argument("--port-file", help="write {url, port, pid} here once serving")
    serve.add_argument("--device", choices=("auto", "cpu", "gpu"), default=os.environ.get("SHARDRAG_DEVICE", "auto"),
                       help="where FAISS searches; auto = GPU when FAISS reports one (default auto)")
    serve.add_argument("--faiss-threads", type=int, default=1, help="OpenMP threads for FAISS (default 1)")
    serve.add_argument("--max-k", type=int, default=1000, help="largest k accepted (default 1000)")
    serve.add_argument("--max-batch", type=int, default=1024, help="most vectors per search request (default 1024)")
    serve.add_argument("--max-versions", type=int, default=2,
                       help="embedding versions held at once during a rollout (default 2)")
    serve.add_argument("--faults", default=os.environ.get("SHARDRAG_FAULTS", ""),
                       help="fault injection spec, e.g. 'stall=0.05:100,latency=lognormal:1:0.5' "
                            "(see index_shards/faults.py; default off) [env SHARDRAG_FAULTS]")
    serve.add_argument("--log-level", default="warning", choices=("debug", "info", "warning", "error"))

    pack = commands.add_parser("pack", help="write a verified shard directory as one .tar.gz (to publish it)")
    pack.add_argument("--dir", required=True, help="shard directory (holds manifest.json)")
    pack.add_argument("--out", required=True, help="archive to write, e.g. shard-0.tar.gz")
    fetch = commands.add_parser("fetch", help="download a packed shard, verify it, move it into place atomically")
    fetch.add_argument("--url", required=True, help="http(s):// or file:// URL of a packed shard")
    fetch.add_argument("--dest", required=True, help="shard directory to create (left alone if it verifies)")
    fetch.add_argument("--timeout", type=float, default=600.0, help="download timeout, seconds (default 600)")
    return parser


def _pack_or_fetch(args: argparse.Namespace) -> int:
    from index_shards.fetch import fetch_shard, pack_shard

    try:
        if args.command == "pack":
            print(pack_shard(args.dir, args.out))
        else:
            manifest = fetch_shard(args.url, args.dest, timeout_s=args.timeout)
            print(f"{args.dest}: shard {manifest.shard_id} of {manifest.num_shards}, verified")
    except ShardragError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 3
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command in ("pack", "fetch"):
        logging.basicConfig(level="INFO", format="%(levelname)s %(message)s")
        return _pack_or_fetch(args)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not args.dir:
        print("error: --dir is required (or set SHARDRAG_SHARD_DIR)", file=sys.stderr)
        return 2
    import faiss

    from index_shards.server import ShardServerConfig, create_app
    from index_shards.shard import Shard
    from retrieval.serve import serve_app

    faiss.omp_set_num_threads(max(1, args.faiss_threads))
    try:
        shard = Shard.load(args.dir, device=args.device)
    except ShardragError as exc:
        print(f"error: cannot serve {args.dir}: {exc.message}", file=sys.stderr)
        return 3
    from index_shards.faults import FaultConfig

    try:
        faults = FaultConfig.parse(args.faults)
    except ShardragError as exc:
        print(f"error: --faults: {exc.message}", file=sys.stderr)
        return 2
    config = ShardServerConfig(max_k=args.max_k, max_batch=args.max_batch, faiss_threads=args.faiss_threads,
                               faults=faults, max_versions=args.max_versions, device=args.device)
    serve_app(
        create_app(shard, config), host=args.host, port=args.port, port_file=args.port_file,
        name=f"shard-{shard.manifest.shard_id}", log_level=args.log_level,
        extra_ready=lambda: {"shard_id": shard.manifest.shard_id, "version": shard.version_id},
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
