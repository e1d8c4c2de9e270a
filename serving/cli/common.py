"""What the ``shardrag`` subcommands share: the collections root, the gateway URL and API key."""

from __future__ import annotations

import argparse
from pathlib import Path

from index_shards.layout import collections_root
from retrieval import env
from retrieval.errors import ConfigError

DEFAULT_URL = "http://127.0.0.1:8000"


def root_of(args: argparse.Namespace) -> Path:
    return collections_root(args.root)


def gateway_url(args: argparse.Namespace) -> str:
    return (args.url or env.read("SHARDRAG_URL", DEFAULT_URL) or DEFAULT_URL).rstrip("/")


def auth_headers(args: argparse.Namespace) -> dict[str, str]:
    key = args.api_key or env.read("SHARDRAG_API_KEY")
    return {"authorization": f"Bearer {key}"} if key else {}


def weights_argument(text: str | None) -> dict[str, float] | None:
    """--weights DENSE,LEXICAL as the API's {"dense", "lexical"}."""
    if text is None:
        return None
    parts = text.split(",")
    try:
        dense, lexical = (float(part) for part in parts)
    except ValueError:
        raise ConfigError(f"--weights takes two numbers, DENSE,LEXICAL (e.g. 0.7,0.3), got {text!r}",
                          field="weights") from None
    return {"dense": dense, "lexical": lexical}


def count_argument(text: str) -> int:
    """An argparse type: a whole number ≥ 0 (--retries)."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"a whole number ≥ 0, got {text!r}")
    return value
