"""What every shardrag command line shares: log format, and errors as one line + exit code."""

from __future__ import annotations

import argparse
import logging
import sys

from retrieval.errors import ShardragError

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def run_command(args: argparse.Namespace, *, verbose: bool = False) -> int:
    """Run ``args.func(args)``: a ShardragError is printed as ``error: ...`` (exit 2), Ctrl-C exits 130."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format=LOG_FORMAT)
    try:
        return int(args.func(args) or 0)
    except ShardragError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
