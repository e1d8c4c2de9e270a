"""Prometheus metrics of a shard server (one registry per app, so tests can run several)."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_LATENCY_BUCKETS_S = (0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


@dataclass(slots=True)
class ShardMetrics:
    registry: CollectorRegistry
    requests: Counter
    search_latency: Histogram
    batch_size: Histogram
    documents: Gauge
    expired: Counter

    @classmethod
    def create(cls, shard_id: int) -> ShardMetrics:
        registry = CollectorRegistry()
        labels = {"shard": str(shard_id)}
        metrics = cls(
            registry=registry,
            requests=Counter("shardrag_shard_requests_total", "Shard API requests by endpoint and status",
                             ["endpoint", "status"], registry=registry),
            search_latency=Histogram("shardrag_shard_search_latency_seconds", "Time in FAISS search + doc lookup",
                                     buckets=_LATENCY_BUCKETS_S, registry=registry),
            batch_size=Histogram("shardrag_shard_search_batch_size_queries", "Queries per search request",
                                 buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256), registry=registry),
            documents=Gauge("shardrag_shard_documents", "Documents held by this shard", list(labels),
                            registry=registry),
            expired=Counter("shardrag_shard_expired_requests_total",
                            "Searches dropped because the caller's deadline had passed", registry=registry),
        )
        return metrics
