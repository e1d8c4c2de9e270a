"""The cluster state: what every gateway and replica must agree on, in etcd or, on one machine, in
the local coordinator behind the same interface.

    kv          the key-value seam (compare-and-swap on revisions, leases)
    etcd        EtcdKV: a real etcd cluster through its gRPC-JSON gateway (httpx)
    local       LocalKV: one file, flock-guarded, crash-safe writes (the embedded default)
    lease       LeaseKeeper: a lease renewed in the background, and how long it can be trusted
    state       ClusterState: rollout state, per shard its primary, term and in-sync set, live
                replicas and gateways, all changed by compare-and-swap
    collections Collections: the collections created at run time (definition, placement, uid)
                and the live nodes that host them

``open_coordinator("etcd://h1:2379,h2:2379")`` or ``open_coordinator(None, local_path=...)``.

May import ``retrieval`` and httpx; imported by ``index_shards`` and ``serving``.
"""

from __future__ import annotations

from pathlib import Path

from clusterstate.kv import KV
from retrieval.errors import ConfigError

SCHEMES = ("etcd://", "file://")


def open_coordinator(spec: str | None, *, local_path: str | Path | None = None) -> KV:
    """The KV a ``--coordinator`` value names: ``etcd://HOST:PORT[,HOST:PORT...]`` (``etcds://`` for
    TLS), ``file:///path/state.json``, or None for the local coordinator at ``local_path``."""
    if spec is None or spec == "":
        if local_path is None:
            raise ConfigError("no coordinator: give --coordinator etcd://HOST:PORT or a local state path",
                              field="coordinator")
        from clusterstate.local import LocalKV

        return LocalKV(local_path)
    if spec.startswith("file://"):
        from clusterstate.local import LocalKV

        return LocalKV(spec[len("file://"):])
    for scheme, http in (("etcd://", "http://"), ("etcds://", "https://")):
        if spec.startswith(scheme):
            hosts = [h.strip() for h in spec[len(scheme):].split(",") if h.strip()]
            if not hosts or any("/" in h or ":" not in h for h in hosts):
                raise ConfigError(f"--coordinator {spec!r}: give etcd://HOST:PORT[,HOST:PORT...]", field="coordinator")
            from clusterstate.etcd import EtcdKV

            return EtcdKV([http + h for h in hosts])
    raise ConfigError(f"--coordinator {spec!r}: use etcd://HOST:PORT[,HOST:PORT...] or file:///PATH",
                      field="coordinator")
