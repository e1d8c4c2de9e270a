"""TLS settings from the environment, for every shardrag server and internal client.

Servers (gateway, shard servers, kv-nodes, generators) serve HTTPS when ``SHARDRAG_TLS_CERT``
and ``SHARDRAG_TLS_KEY`` name a PEM certificate (chain) and key. Clients of internal hops verify
servers against ``SHARDRAG_TLS_CA`` (a PEM bundle; default: the system's trust store).
"""

from __future__ import annotations

import os
import ssl
from functools import lru_cache
from pathlib import Path
from typing import Mapping

from retrieval.errors import ConfigError


def server_tls(env: Mapping[str, str] | None = None) -> tuple[str, str] | None:
    env = os.environ if env is None else env
    cert, key = env.get("SHARDRAG_TLS_CERT"), env.get("SHARDRAG_TLS_KEY")
    if not cert and not key:
        return None
    if not (cert and key):
        raise ConfigError("TLS needs both SHARDRAG_TLS_CERT and SHARDRAG_TLS_KEY", field="tls")
    for path in (cert, key):
        if not Path(path).is_file():
            raise ConfigError(f"TLS file {path} does not exist", field="tls")
    return cert, key


@lru_cache(maxsize=4)
def _context(ca: str | None) -> ssl.SSLContext:
    try:
        return ssl.create_default_context(cafile=ca) if ca else ssl.create_default_context()
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"cannot load the TLS CA bundle {ca}: {exc}", field="tls_ca") from exc


def client_ssl_context(env: Mapping[str, str] | None = None) -> ssl.SSLContext:
    """The context internal clients verify HTTPS servers with."""
    env = os.environ if env is None else env
    return _context(env.get("SHARDRAG_TLS_CA") or None)
