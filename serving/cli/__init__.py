"""The ``shardrag`` command line: the argument parser and its help (``parser``), building
collections (``build``), the local cluster — demo and serve, processes or Ray (``cluster``), calls
to a running gateway — query and rollout (``remote``), answers streamed (``ask``), writes
(``writes``; files and folders into passages, idempotent by content: ``ingest_files``), backup and
restore (``backup``), collections (``collections``), tuning search knobs and structures (``tune``; what it prints:
``tune_report``; its workers: ``task_runners``), the cluster's status (``operate``), the single
server processes the launcher and Helm run (``processes``). ``train`` and ``eval`` belong to the
training package and run as ``python -m training``.

May import every other room of ``serving``, ``httpkit``, ``retrieval`` and ``index_shards``
(to build and launch shards); never ``training`` (delegated by exec). Heavy libraries are
imported inside the subcommand that needs them, so ``shardrag --help`` starts fast.
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

