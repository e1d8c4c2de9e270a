"""Prometheus metrics of a shard server (one registry per app, so tests can run several)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from retrieval.contract import VersionInfo

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
    def create(cls, shard_id: int, versions: Callable[[], Iterable[VersionInfo]] | None = None) -> ShardMetrics:
        """``versions``: what the replica holds, read at each scrape (the lexical index gauges)."""
        registry = CollectorRegistry()
        if versions is not None:
            registry.register(LexicalIndexCollector(versions))
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


class LexicalIndexCollector(Collector):
    """Per version held, its base's lexical index — read from the versions at scrape time, so the
    gauges never disagree with ``GET /admin/versions``: whether it is being built (a replica
    building one is slow to answer its first lexical query), its arrays' bytes and how long the
    build took (0 while not built)."""

    def __init__(self, versions: Callable[[], Iterable[VersionInfo]]) -> None:
        self._versions = versions

    def collect(self) -> Iterator[GaugeMetricFamily]:
        building = GaugeMetricFamily("shardrag_shard_lexical_index_building",
                                     "1 while the version's lexical (BM25) index is being built", labels=["version"])
        size = GaugeMetricFamily("shardrag_shard_lexical_index_bytes",
                                 "Bytes of the version's built lexical index arrays (0: not built)", labels=["version"])
        took = GaugeMetricFamily("shardrag_shard_lexical_index_build_seconds",
                                 "How long building the version's lexical index took (0: not built)",
                                 labels=["version"])
        for info in self._versions():
            if info.lexical_index is None:
                continue
            building.add_metric([info.id], 1.0 if info.lexical_index == "building" else 0.0)
            size.add_metric([info.id], float(info.lexical_index_bytes or 0))
            took.add_metric([info.id], info.lexical_index_build_s or 0.0)
        yield from (building, size, took)
