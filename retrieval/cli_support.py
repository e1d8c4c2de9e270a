"""The one runner of every shardrag command line (``shardrag``, ``python -m index_shards``,
``python -m training``): log format, and one exit-status convention.

    0    done
    2    an error: a bad flag or value, a damaged shard, a refused request, a server that does not
         answer — printed as one ``error: ...`` line on stderr (argparse's own usage errors
         exit 2 as well)
    130  interrupted (Ctrl-C)
"""

from __future__ import annotations

import argparse
import logging
import sys

from retrieval.errors import ShardragError

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
EXIT_OK, EXIT_ERROR, EXIT_INTERRUPTED = 0, 2, 130


def run_command(args: argparse.Namespace, *, verbose: bool = False, log_level: str | None = None) -> int:
    """Run ``args.func(args)`` under the convention above. ``log_level`` (a name) wins over ``verbose``."""
    level = log_level.upper() if log_level else (logging.INFO if verbose else logging.WARNING)
    logging.basicConfig(level=level, format=LOG_FORMAT)
    try:
        return int(args.func(args) or EXIT_OK)
    except ShardragError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except Exception as exc:
        unreachable = _unreachable(exc)
        if unreachable is None:
            raise
        print(f"error: {unreachable}", file=sys.stderr)
        return EXIT_ERROR


def _unreachable(exc: Exception) -> str | None:
    """A command's HTTP call that never got an answer (refused, timed out, a name that does not
    resolve) as one line, or None for any other error. httpx is looked up, not imported: a command
    that never loaded it cannot have raised its errors."""
    httpx = sys.modules.get("httpx")
    if httpx is None or not isinstance(exc, httpx.TransportError):
        return None
    try:
        where = f" {exc.request.method} {exc.request.url}"
    except RuntimeError:  # an error raised without its request
        where = ""
    return f"no answer from{where}: {exc or type(exc).__name__} (is a server running at that URL?)"
