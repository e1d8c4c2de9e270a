"""The gateway's composition root: :meth:`GatewaySetup.build` wires every component and returns
a complete, started :class:`Gateway` — there is no half-built gateway to guard against.

    setup = GatewaySetup(GatewayConfig(), [["http://127.0.0.1:8001"], ["http://127.0.0.1:8002"]])
    gateway = await setup.build()        # discovers the replicas, loads encoders, starts probes
    await gateway.queries.query(QueryRequest(text="how do I open a file"))
    await gateway.close()

Each service gets what it needs and nothing more: the query service the registry and the
fan-out; the rollout service the registry, the shard client and a search function; the answer
service a retrieve function.
"""

from __future__ import annotations

import asyncio
import logging
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clusterstate import open_coordinator
from clusterstate.local import LOCAL_STATE_FILE, LocalKV
from clusterstate.state import ClusterState, RolloutStoreOnKV
from retrieval.errors import ConfigError
from retrieval.rollout import RolloutEvent
from serving.answer.service import AnswerService
from serving.encoding.service import EncoderLoader, EncoderService
from serving.gateway.cluster_view import ClusterView
from serving.gateway.collections import CollectionStacks
from serving.gateway.config import GatewayConfig
from serving.gateway.metrics import GatewayMetrics
from serving.gateway.query import QueryService
from serving.shardcall.call import ShardCaller
from serving.shardcall.ejection import OutlierDetector, probe_ejected
from serving.shardcall.fanout import FanOut, ShardCall
from serving.shardcall.policies import make_balancer
from serving.transport.client import ShardClient
from serving.transport.http import HttpShardClient
from serving.versions.presence import GatewayPresence
from serving.versions.registry import DEFAULT_MODEL, VersionRegistry
from serving.versions.rollout import RolloutService
from serving.versions.store import RolloutStore
from serving.versions.topology import discover_infos
from serving.writes.service import WriteService

logger = logging.getLogger(__name__)


@dataclass(slots=True, frozen=True)
class Gateway:
    """Every part of a running gateway. Made only by :meth:`GatewaySetup.build`."""

    config: GatewayConfig
    shard_replicas: tuple[tuple[str, ...], ...]
    client: ShardClient
    registry: VersionRegistry
    detector: OutlierDetector
    caller: ShardCaller
    fanout: FanOut
    queries: QueryService
    rollout: RolloutService
    answers: AnswerService
    writes: WriteService
    cluster: ClusterView
    metrics: GatewayMetrics
    presence: GatewayPresence
    collections: CollectionStacks
    tasks: tuple[asyncio.Future[None], ...]

    async def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        await self.collections.close()
        self.registry.close()
        await asyncio.to_thread(self.presence.stop)  # its registration goes at once, not after its lease
        await self.answers.close()
        await self.writes.close()
        await self.client.close()
        await asyncio.to_thread(self.cluster.state.kv.close)  # etcd's connection; a private local state's folder


@dataclass(slots=True, frozen=True)
class GatewaySetup:
    """What a gateway is made of; :meth:`build` makes one (inside a running event loop)."""

    config: GatewayConfig
    shard_replicas: Sequence[Sequence[str]]
    shard_client: ShardClient | None = None  # default: the pooled HTTP client
    # model → encoder in this process, for encoder.backend "thread" (default: load by name); the
    # "process" backend loads models by name in its worker processes
    encoder_loader: EncoderLoader | None = None
    store: RolloutStore | None = None  # default: the rollout state in the cluster state (config.cluster)
    generators: Sequence[str] = field(default=())  # generator workers for /v1/answer
    url: str = ""  # where this gateway is reached (shown with its registration in the cluster state)

    async def build(self, metrics: GatewayMetrics | None = None) -> Gateway:
        config = self.config.validate()
        replicas = tuple(tuple(r) for r in self.shard_replicas)
        client = self.shard_client or HttpShardClient()
        metrics = metrics or GatewayMetrics.create()
        encoders = EncoderService(config.encoder, loader=self.encoder_loader) if config.encoder.load else None
        if encoders is not None:
            encoders.start()  # worker processes import torch while the replicas are discovered
        try:
            state = await self._cluster_state(config, client, replicas)
        except BaseException:
            if encoders is not None:
                encoders.close()
            await client.close()
            raise
        registry = VersionRegistry(
            replicas, client, self.store or RolloutStoreOnKV(state), encoders=encoders,
            default_model=config.encoder.model or DEFAULT_MODEL,
            discovery_timeout_s=config.discovery_timeout_s, probe_timeout_s=config.probe_timeout_s)
        try:
            await registry.start()
            presence = await asyncio.to_thread(GatewayPresence(
                state, config.cluster, url=self.url, current_generation=lambda: registry.view.state.generation,
                reload=registry.sync).start)
        except BaseException:
            registry.close()
            await client.close()
            raise

        def on_eject(replica: str, duration_s: float) -> None:
            logger.warning("replica %s ejected for %.1f s after repeated failures", replica, duration_s)
            metrics.ejections.labels(replica=replica).inc()

        detector = OutlierDetector(consecutive_failures=config.ejection.after_failures,
                                   base_ejection_s=config.ejection.base_s, max_ejection_s=config.ejection.max_s,
                                   on_eject=on_eject)
        caller = ShardCaller(client, make_balancer(config.calls.balancer), detector, config.hedging,
                             on_not_eligible=registry.mark_not_eligible)
        metrics.watch_calls(caller.stats)

        def on_call(call: ShardCall) -> None:
            metrics.observe_shard_call(call.shard_id, call.replica, call.latency_ms / 1000.0, call.batch_size)

        fanout = FanOut(replicas, caller, coalesce=config.calls.coalesce, max_batch=config.calls.max_batch,
                        max_inflight_per_replica=config.calls.max_inflight_per_replica,
                        topk_probability=config.calls.topk_probability, on_call=on_call)
        queries = QueryService(config.limits, registry, fanout, metrics,
                               recent_queries=max(config.gate.sample * 4, 100), defaults=config.query_defaults)

        def on_event(event: RolloutEvent) -> None:
            metrics.rollout_events.labels(kind=event.kind).inc()

        writes = WriteService(registry, client, config.writes, writable=presence.writable)

        async def after_step(generation: int) -> list[str]:
            """A recorded rollout step: every primary refuses writes of older views for a while,
            and every live gateway adopts the step before the command returns."""
            await writes.fence_all(generation, config.cluster.fence_hold_s)
            return await presence.wait_for_all(generation)

        rollout = RolloutService(registry, client, queries.search_text, settings=config.rollout, gate=config.gate,
                                 encoders_loaded=config.encoder.load,
                                 recent_queries=lambda: list(queries.recent_queries),
                                 on_event=on_event, before_activate=writes.prepare_activation,
                                 after_step=after_step)
        answers = AnswerService(self.generators, queries.retrieve, settings=config.answer)
        collections = CollectionStacks(state.kv, config, client, detector, encoders, metrics, presence.writable,
                                       quota_share=presence.quota_share)
        tasks: tuple[asyncio.Future[Any], ...] = (
            asyncio.ensure_future(collections.refresh_forever()),
            asyncio.ensure_future(presence.watch_forever()),
            asyncio.ensure_future(probe_ejected(detector, client, interval_s=config.ejection.probe_interval_s,
                                                timeout_s=config.probe_timeout_s)),
            asyncio.ensure_future(registry.poll_forever(config.rollout.poll_interval_s)),
        )
        return Gateway(config, replicas, client, registry, detector, caller, fanout, queries, rollout, answers,
                       writes, ClusterView(config, registry, client, detector, caller, answers, state), metrics,
                       presence, collections, tasks)

    async def _cluster_state(self, config: GatewayConfig, client: ShardClient,
                             replicas: tuple[tuple[str, ...], ...]) -> ClusterState:
        """The cluster state of the collection the replicas serve (its name comes from them)."""
        infos = await discover_infos(client, replicas, config.discovery_timeout_s)
        collection = next((i.collection for i in infos.values() if i is not None), None)
        if collection is None:
            raise ConfigError("no replica answered: the collection's name is unknown", field="shards")
        legacy = config.rollout.state_path
        if config.cluster.coordinator:
            kv = await asyncio.to_thread(open_coordinator, config.cluster.coordinator)
        elif legacy:  # (deprecated) gateways given one rollout.state_path share the local coordinator beside it
            kv = LocalKV(Path(legacy).with_name(LOCAL_STATE_FILE))
        else:  # a single gateway with nothing to share: a private local coordinator
            kv = LocalKV(Path(tempfile.mkdtemp(prefix="shardrag-gateway-")) / LOCAL_STATE_FILE, private=True)
        state = ClusterState(kv, collection)
        if legacy and Path(legacy).exists():
            await asyncio.to_thread(import_legacy_rollout, state, Path(legacy))
        return state


def import_legacy_rollout(state: ClusterState, path: Path) -> None:
    """The rollout state of a release that kept it in its own file (rollout.json): taken into the
    cluster state once, when the cluster state has none."""
    from serving.versions.store import read_legacy_rollout

    legacy = read_legacy_rollout(path)
    if legacy is not None and state.rollout() is None:
        state.update_rollout(lambda current: current or legacy)
        logger.warning("rollout state imported from %s into the cluster state", path)
