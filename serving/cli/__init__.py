"""``shardrag`` — build, serve and query sharded retrieval collections.

  shardrag demo                       build Python's docs into a collection, start 2 shards × 2
                                      replicas + gateway on 127.0.0.1, print the URL and a curl
  shardrag build --corpus PATH ...    corpus (JSONL or BEIR folder) → collection on disk
  shardrag serve --collection NAME    start the local cluster for a built collection
  shardrag query "text"               ask a running gateway
  shardrag rollout stage|activate|retire|abort|rollback|status [VERSION]
                                      roll a new embedding version out through the gateway
  shardrag train --collection NAME    fine-tune the retriever on the slices (DDP) → new version
  shardrag eval --collection NAME --dataset DIR --models default,CKPT
                                      nDCG@10 / recall / MRR through the sharded index
  shardrag gateway --cluster FILE     run only the gateway process (used by serve and Helm)
  shardrag kv-node / generator        run a KV-cache node / an answer generator worker

Environment (flags override): SHARDRAG_ROOT (collections, default ./shardrag-data),
SHARDRAG_CACHE_DIR (embedding cache, default ~/.cache/shardrag/embeddings), SHARDRAG_URL
(gateway for `query`, default http://127.0.0.1:8000). Heavy libraries are imported only by the
subcommand that needs them, so `shardrag --help` and `shardrag query` start fast.
"""

from __future__ import annotations

import os
import sys

from retrieval.cli_support import run_command
from serving.cli.parser import build_parser

__all__ = ["build_parser", "main"]

DELEGATED = ("train", "eval")  # subcommands that belong to the training package



def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in DELEGATED:
        os.execv(sys.executable, [sys.executable, "-m", "training", *argv])
    args = build_parser().parse_args(argv)
    return run_command(args, verbose=args.verbose)

