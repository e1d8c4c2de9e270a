"""Prometheus metrics of the gateway (one registry per app instance)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from serving.shardcall.call import CallStats

_LATENCY_BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


@dataclass(slots=True)
class GatewayMetrics:
    registry: CollectorRegistry
    requests: Counter
    query_latency: Histogram
    encode_latency: Histogram
    shard_call_latency: Histogram
    shard_batch_size: Histogram
    ejections: Counter
    partial_responses: Counter
    rollout_events: Counter
    lexical_rounds: Counter
    _call_children: dict[tuple[int, str], Any] = field(default_factory=dict)
    _query_children: dict[str, Any] = field(default_factory=dict)
    _round_children: dict[int, Any] = field(default_factory=dict)

    def observe_query(self, mode: str, latency_s: float) -> None:
        """One answered /v1/query (or /v1/answer's retrieval), by how it ranked: ``dense``,
        ``lexical``, ``hybrid_rrf`` or ``hybrid_weighted`` — so a dashboard shows what hybrid costs."""
        child = self._query_children.get(mode)
        if child is None:
            child = self._query_children[mode] = self.query_latency.labels(mode=mode)
        child.observe(latency_s)

    def count_lexical_rounds(self, rounds: int) -> None:
        """A lexical or hybrid query answered in ``rounds`` shard rounds: 1 when the statistics the
        gateway sent were the shards', 2 when it was asked again under their sums (a term the
        gateway had not seen, or a write since) — a share of 2s is a share of doubled latency."""
        child = self._round_children.get(rounds)
        if child is None:
            child = self._round_children[rounds] = self.lexical_rounds.labels(rounds=str(rounds))
        child.inc()

    def observe_shard_call(self, shard_id: int, replica: str, latency_s: float, batch_size: int) -> None:
        """One gateway→replica call (a coalesced batch counts once)."""
        child = self._call_children.get((shard_id, replica))
        if child is None:  # labels() costs a lock and a dict build: resolve each pair once
            child = self._call_children[(shard_id, replica)] = self.shard_call_latency.labels(
                shard=str(shard_id), replica=replica)
        child.observe(latency_s)
        self.shard_batch_size.observe(batch_size)

    @classmethod
    def create(cls) -> GatewayMetrics:
        registry = CollectorRegistry()
        return cls(
            registry=registry,
            requests=Counter("shardrag_gateway_requests_total", "Gateway requests by endpoint and status",
                             ["endpoint", "status"], registry=registry),
            query_latency=Histogram("shardrag_gateway_query_latency_seconds",
                                    "End-to-end /v1/query latency by mode: dense, lexical, hybrid_rrf, hybrid_weighted",
                                    ["mode"], buckets=_LATENCY_BUCKETS_S, registry=registry),
            encode_latency=Histogram("shardrag_gateway_encode_latency_seconds", "Query text embedding time",
                                     buckets=_LATENCY_BUCKETS_S, registry=registry),
            shard_call_latency=Histogram("shardrag_gateway_shard_call_latency_seconds",
                                         "Gateway→replica search call latency", ["shard", "replica"],
                                         buckets=_LATENCY_BUCKETS_S, registry=registry),
            shard_batch_size=Histogram("shardrag_gateway_shard_batch_size_queries",
                                       "Queries coalesced into one shard call",
                                       buckets=(1, 2, 4, 8, 16, 32, 64, 128), registry=registry),
            ejections=Counter("shardrag_gateway_ejections_total", "Replicas ejected after repeated failures",
                              ["replica"], registry=registry),
            partial_responses=Counter("shardrag_gateway_partial_responses_total",
                                      "Query answers missing at least one shard", registry=registry),
            rollout_events=Counter("shardrag_gateway_rollout_events_total",
                                   "Rollout transitions recorded by this gateway (VersionStaged, ...)", ["kind"],
                                   registry=registry),
            lexical_rounds=Counter("shardrag_gateway_lexical_rounds_total",
                                   "Lexical and hybrid queries by shard rounds: 1 (the gateway's statistics were "
                                   "the shards'), 2 (asked again under the shards' sums)", ["rounds"],
                                   registry=registry),
        )

    def watch_calls(self, stats: CallStats) -> None:
        """Export the shard caller's counters (hedges, budget, retries) at scrape time."""
        self.registry.register(_CallCollector(stats))


class _CallCollector(Collector):
    def __init__(self, stats: CallStats) -> None:
        self.stats = stats

    def collect(self) -> Iterator[CounterMetricFamily]:
        stats = self.stats
        for name, help_text, value in (
            ("shardrag_gateway_shard_calls", "Shard calls (a coalesced batch counts once)", stats.calls),
            ("shardrag_gateway_hedges_fired", "Hedge requests sent", stats.hedges_fired),
            ("shardrag_gateway_hedges_won", "Shard calls answered by the hedge", stats.hedges_won),
            ("shardrag_gateway_hedge_budget_exhausted", "Hedges not sent for lack of budget", stats.budget_exhausted),
            ("shardrag_gateway_shard_retries", "Calls re-sent to another replica after a failure", stats.retries),
            ("shardrag_gateway_shard_retries_refused", "Failures not retried: the retry budget was empty",
             stats.retries_refused),
            ("shardrag_gateway_hedges_not_worth", "Hedge points where no replica was expected to answer sooner",
             stats.hedges_not_worth),
        ):
            family = CounterMetricFamily(name, help_text)
            family.add_metric([], value)
            yield family
