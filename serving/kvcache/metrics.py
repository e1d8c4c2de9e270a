"""Prometheus metrics of a kv-node (one registry per app, so tests can run several)."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge


@dataclass(slots=True)
class KVNodeMetrics:
    registry: CollectorRegistry
    blocks_stored: Counter
    lookups: Counter
    bytes_sent: Counter
    used_bytes: Gauge
    evictions: Gauge

    @classmethod
    def create(cls) -> KVNodeMetrics:
        registry = CollectorRegistry()
        return cls(
            registry=registry,
            blocks_stored=Counter("shardrag_kvnode_blocks_stored_total", "Blocks written to this node",
                                  registry=registry),
            lookups=Counter("shardrag_kvnode_lookups_total", "Block lookups by result", ["result"], registry=registry),
            bytes_sent=Counter("shardrag_kvnode_bytes_sent_total", "Block bytes served", registry=registry),
            used_bytes=Gauge("shardrag_kvnode_used_bytes", "Bytes held", registry=registry),
            evictions=Gauge("shardrag_kvnode_evictions", "Blocks evicted so far", registry=registry),
        )
