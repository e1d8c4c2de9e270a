"""The one module that reads shardrag's ``SHARDRAG_*`` environment variables.

Every variable is named in :data:`VARIABLES` with what it means; reading one that is not listed
is a bug (``KeyError``), so this table is the complete list. It lives in the light core (stdlib
only) because the servers (through ``httpkit``), the command lines, the Python client and the
trainer all read it, and ``retrieval`` is the one package every one of them may import.
Functions take an optional ``env`` mapping so tests and launchers can pass their own.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from retrieval.errors import ConfigError

VARIABLES: dict[str, str] = {
    # where things live
    "SHARDRAG_ROOT": "collections root of the command lines (default ./shardrag-data)",
    "SHARDRAG_CACHE_DIR": "embedding cache (default ~/.cache/shardrag/embeddings)",
    "SHARDRAG_DATA_DIR": "test and benchmark corpora (default ../shared/data next to the checkout)",
    # clients
    "SHARDRAG_URL": "gateway URL of `shardrag query|rollout` (default http://127.0.0.1:8000)",
    "SHARDRAG_API_KEY": "API key the Python client and the CLI send as a Bearer token",
    # servers: credentials
    "SHARDRAG_API_KEYS": "gateway API keys, comma-separated 'scope:key' entries (scope read|admin)",
    "SHARDRAG_API_KEYS_FILE": "file of 'scope:key' lines ('#' comments), read with SHARDRAG_API_KEYS",
    "SHARDRAG_INTERNAL_TOKEN": "token every internal hop carries (x-shardrag-token)",
    "SHARDRAG_INTERNAL_TOKEN_FILE": "file holding the internal token",
    # servers: TLS
    "SHARDRAG_TLS_CERT": "PEM certificate (chain): every server speaks HTTPS with it",
    "SHARDRAG_TLS_KEY": "PEM private key of SHARDRAG_TLS_CERT",
    "SHARDRAG_TLS_CA": "CA bundle internal clients (and the Python client) verify servers with",
    # the shard server (`python -m index_shards serve`)
    "SHARDRAG_SHARD_DIR": "shard directory to serve",
    "SHARDRAG_HOST": "address the shard server binds",
    "SHARDRAG_PORT": "port the shard server binds (0 = any free port)",
    "SHARDRAG_DEVICE": "where FAISS searches: auto, cpu, gpu",
    "SHARDRAG_FAULTS": "fault injection spec of the shard server (index_shards.faults)",
    "SHARDRAG_LEXICAL_WARM": "when a replica builds a base's lexical index: auto, always, lazy (lexical_warm)",
    "SHARDRAG_COORDINATOR": "the cluster state of shard servers and gateways: etcd://HOST:PORT[,...] or file:///PATH",
    "SHARDRAG_ADVERTISE_URL": "the URL a shard server is reached at by gateways and its shard's other replicas",
    "SHARDRAG_REPLICA_ID": "a shard server's stable name in its shard's in-sync set (default: its data dir's name)",
    "SHARDRAG_NODE_ID": "a node's stable name in collection placements (default: its data dir's name)",
    # training (test hooks for restarts)
    "SHARDRAG_TRAIN_KILL_RANK": "rank that SIGKILLs itself once (restart tests)",
    "SHARDRAG_TRAIN_KILL_AT_STEP": "step at which that rank kills itself",
    "SHARDRAG_TRAIN_SLOW_RANK": "rank that sleeps in every micro-step's compute (a straggler, fault injection)",
    "SHARDRAG_TRAIN_SLOW_S": "how long that rank sleeps per micro-step, seconds (default 0.5)",
    "SHARDRAG_TRACING": "on: OpenTelemetry spans in every process, traceparent on every hop, exported over OTLP "
                        "when OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT is set (default off; docs/tracing.md)",
    "SHARDRAG_TRACING_SAMPLE": "with tracing on: the share of requests without a sampled traceparent that are "
                               "traced (default 0.01; a caller's sampled traceparent is always followed)",
    "SHARDRAG_CHAOS_S": "how long the many-gateway nemesis test runs, seconds (default 25; 600 for a long run)",
    "SHARDRAG_CHAOS_SEED": "seed of that test's nemesis schedule and clients (printed, to replay a failure)",
    "SHARDRAG_NEMESIS_S": "how long the across-hosts nemesis test runs, seconds (default 60)",
    "SHARDRAG_NEMESIS_SEED": "seed of the across-hosts nemesis schedule and clients (printed, to replay a failure)",
    "SHARDRAG_FLOW_KILL_AFTER": "train --rollout: SIGKILL the flow right after this step's work (resume tests)",
}


def read(name: str, default: str | None = None, env: Mapping[str, str] | None = None) -> str | None:
    """The variable's value (``default`` when unset or empty)."""
    if name not in VARIABLES:
        raise KeyError(f"{name} is not a shardrag environment variable (add it to retrieval.env.VARIABLES)")
    value = (os.environ if env is None else env).get(name)
    return value if value else default


def read_secret(name: str, env: Mapping[str, str] | None = None) -> str | None:
    """``NAME``, else the stripped content of the file ``NAME_FILE`` (None when neither is set)."""
    value = read(name, env=env)
    if value:
        return value
    path = read(f"{name}_FILE", env=env)
    if not path:
        return None
    try:
        return Path(path).read_text(encoding="utf-8").strip() or None
    except OSError as exc:
        raise ConfigError(f"cannot read {name}_FILE {path}: {exc.strerror}", field=name.lower()) from exc


def api_key_entries(env: Mapping[str, str] | None = None) -> list[str]:
    """Gateway API key entries ('scope:key') from SHARDRAG_API_KEYS and SHARDRAG_API_KEYS_FILE."""
    entries = [e for e in (read("SHARDRAG_API_KEYS", "", env) or "").split(",") if e.strip()]
    path = read("SHARDRAG_API_KEYS_FILE", env=env)
    if path:
        try:
            lines = Path(path).read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            raise ConfigError(f"cannot read SHARDRAG_API_KEYS_FILE {path}: {exc.strerror}", field="api_keys") from exc
        entries += [line for line in lines if line.strip() and not line.lstrip().startswith("#")]
    return entries


def internal_token(env: Mapping[str, str] | None = None) -> str | None:
    return read_secret("SHARDRAG_INTERNAL_TOKEN", env)


def tls_files(env: Mapping[str, str] | None = None) -> tuple[str, str] | None:
    """(certificate, key) when this process serves HTTPS, else None."""
    cert, key = read("SHARDRAG_TLS_CERT", env=env), read("SHARDRAG_TLS_KEY", env=env)
    if not cert and not key:
        return None
    if not (cert and key):
        raise ConfigError("TLS needs both SHARDRAG_TLS_CERT and SHARDRAG_TLS_KEY", field="tls")
    for path in (cert, key):
        if not Path(path).is_file():
            raise ConfigError(f"TLS file {path} does not exist", field="tls")
    return cert, key


def tls_ca(env: Mapping[str, str] | None = None) -> str | None:
    return read("SHARDRAG_TLS_CA", env=env)
