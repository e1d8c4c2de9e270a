"""TLS for every shardrag server and internal client.

Servers (gateway, shard servers, kv-nodes, generators) serve HTTPS when ``SHARDRAG_TLS_CERT``
and ``SHARDRAG_TLS_KEY`` name a PEM certificate (chain) and key. Clients of internal hops verify
servers against ``SHARDRAG_TLS_CA`` (a PEM bundle; default: the system's trust store).
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from functools import lru_cache

from retrieval import env as environment
from retrieval.errors import ConfigError


def server_tls(env: Mapping[str, str] | None = None) -> tuple[str, str] | None:
    """(certificate, key) when this server speaks HTTPS."""
    return environment.tls_files(env)


@lru_cache(maxsize=4)
def _context(ca: str | None) -> ssl.SSLContext:
    try:
        return ssl.create_default_context(cafile=ca) if ca else ssl.create_default_context()
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"cannot load the TLS CA bundle {ca}: {exc}", field="tls_ca") from exc


def client_ssl_context(env: Mapping[str, str] | None = None) -> ssl.SSLContext:
    """The context internal clients verify HTTPS servers with."""
    return _context(environment.tls_ca(env))
