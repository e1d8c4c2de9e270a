"""Prometheus metrics of a generator worker: TTFT, prompt tokens, KV-cache hits per tier, and the
KV client's counters read at scrape time (one registry per app)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from serving.kvcache.client import KVClient


@dataclass(slots=True)
class GeneratorMetrics:
    registry: CollectorRegistry
    ttft: Histogram
    prompt_tokens: Counter
    hit_tokens: Counter

    @classmethod
    def create(cls, kv: KVClient | None) -> GeneratorMetrics:
        registry = CollectorRegistry()
        metrics = cls(
            registry=registry,
            ttft=Histogram("shardrag_generator_ttft_seconds", "Time to first token",
                           buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 16), registry=registry),
            prompt_tokens=Counter("shardrag_generator_prompt_tokens_total", "Prompt tokens", registry=registry),
            hit_tokens=Counter("shardrag_generator_hit_tokens_total", "Prompt tokens served from the KV cache",
                               ["tier"], registry=registry),
        )
        if kv is not None:
            registry.register(_KVCollector(kv))
        return metrics


class _KVCollector(Collector):
    def __init__(self, kv: KVClient) -> None:
        self.kv = kv

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        kv = self.kv
        for name, help_text, value in (
            ("shardrag_generator_kv_bytes_fetched", "KV bytes fetched from kv-nodes", kv.stats.bytes_fetched),
            ("shardrag_generator_kv_bytes_written", "KV bytes written back to kv-nodes", kv.stats.bytes_written),
            ("shardrag_generator_kv_node_errors", "kv-node calls that failed (treated as misses)",
             kv.stats.node_errors),
            ("shardrag_generator_local_pool_evictions", "Blocks evicted from the local pool", kv.local.evictions),
        ):
            family = CounterMetricFamily(name, help_text)
            family.add_metric([], value)
            yield family
        used = GaugeMetricFamily("shardrag_generator_local_pool_bytes", "Bytes held by the local pool")
        used.add_metric([], kv.local.used_bytes)
        yield used
