"""The collections created at run time, as this gateway serves them: per collection a
:class:`CollectionStack` (version registry, fan-out, query and write services) over the parts
every collection shares (the shard client and its balancer, the encoder service, metrics).

The specs and the live nodes are read from the cluster state (clusterstate.collections); a
stack is built on the first request for its collection and rebuilt when its spec (uid) or its
replicas' URLs change, so a collection created or dropped through another gateway is seen here
within one ``refresh_s``, and a restarted node's new address within the same; so are its query
defaults set through another gateway (adopted in place). Nothing here is
state that correctness depends on: every stack can be thrown away and built again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from clusterstate.collections import Collections, CollectionSpec, node_replica_url
from clusterstate.kv import KV
from clusterstate.state import ClusterState, RolloutStoreOnKV
from httpkit.auth import QuotaShare, RateLimiter
from retrieval.contract import ReplicaInfo
from retrieval.errors import NotFound, QuotaExceeded, ShardragError, ShardUnavailable
from serving.encoding.service import EncoderService
from serving.gateway.config import GatewayConfig
from serving.gateway.metrics import GatewayMetrics
from serving.gateway.query import QueryService
from serving.shardcall.call import ShardCaller
from serving.shardcall.ejection import OutlierDetector
from serving.shardcall.fanout import FanOut
from serving.shardcall.policies import make_balancer
from serving.transport.client import ShardClient
from serving.versions.registry import VersionRegistry
from serving.versions.rollout import RolloutService
from serving.versions.topology import fetch_info
from serving.writes.service import WriteService

logger = logging.getLogger(__name__)

READY_TIMEOUT_S = 30.0  # how long a create waits for every shard's replicas to come up
COLLECTION_POLL_S = 5.0  # how often a created collection's replicas are re-read (eligibility, counts)


def replica_urls(spec: CollectionSpec, nodes: dict[str, str]) -> tuple[tuple[str, ...], ...]:
    """Per shard the URLs of its replicas on the live nodes (a node not live is left out)."""
    return tuple(tuple(node_replica_url(nodes[n], spec.name, shard, spec.uid) for n in group if n in nodes)
                 for shard, group in enumerate(spec.placement))


def live_count(info: ReplicaInfo | None, version: str) -> int:
    """A replica's live documents of ``version``: its base, plus its write segment, less tombstones."""
    held = info.held().get(version) if info is not None else None
    if held is None:
        return 0
    return max(0, (held.count or 0) + (held.segment or 0) - (held.tombstones or 0))


@dataclass(slots=True)
class CollectionStack:
    spec: CollectionSpec
    replicas: tuple[tuple[str, ...], ...]
    registry: VersionRegistry
    queries: QueryService
    writes: WriteService
    limiter: RateLimiter | None
    rollout: RolloutService
    poll: asyncio.Future[None] | None = None
    counted_at: float = 0.0
    live_documents: int = 0
    closed: bool = field(default=False)

    def adopt(self, spec: CollectionSpec) -> None:
        """A changed spec of the same incarnation on the same replicas: its query defaults take
        effect for the next query (nothing else of a spec changes without a rebuild)."""
        self.spec = spec
        self.queries.defaults = spec.query_defaults

    def admit(self) -> None:
        """The collection's requests-per-second quota (this gateway's share of it) → 429 naming it."""
        if self.limiter is not None:
            wait_s = self.limiter.take(self.spec.name)
            if wait_s > 0:
                raise QuotaExceeded(f"collection {self.spec.name!r} is limited to {self.spec.quotas.max_rps:g} "
                                    f"requests/s; retry in {wait_s:.2f} s", retry_after_s=wait_s, field="max_rps")

    async def check_room(self, new_documents: int) -> None:
        """The collection's document quota: live documents (read from the replicas, at most once a
        second) plus this write's must fit → 429 naming the limit."""
        limit = self.spec.quotas.max_documents
        if limit <= 0:
            return
        if time.monotonic() - self.counted_at > 1.0:
            await self.registry.refresh()
            active = self.registry.view.state.active
            counts = [max((live_count(self.registry.infos.get(r), active) for r in group), default=0)
                      for group in self.replicas]
            self.live_documents, self.counted_at = sum(counts), time.monotonic()
        if self.live_documents + new_documents > limit:
            raise QuotaExceeded(f"collection {self.spec.name!r} holds at most {limit} documents "
                                f"({self.live_documents} live, {new_documents} in this write)",
                                retry_after_s=60.0, field="max_documents")

    def note_written(self, documents: int) -> None:
        """A write went through: count its documents until the next read of the replicas (an id
        that replaced one counts twice until then: the quota errs on the side of its limit)."""
        self.live_documents += documents

    async def close(self) -> None:
        self.closed = True
        if self.poll is not None:
            self.poll.cancel()
        for encoder in self.registry.encoders.values():  # the shared encoder service stays
            encoder.close()
        await self.writes.close()


class CollectionStacks:
    def __init__(self, kv: KV, config: GatewayConfig, client: ShardClient, detector: OutlierDetector,
                 encoders: EncoderService | None, metrics: GatewayMetrics, writable: Callable[[], bool], *,
                 refresh_s: float = 1.0, quota_share: QuotaShare | None = None) -> None:
        """``quota_share``: this gateway's share of a collection's cluster-wide ``max_rps``."""
        self.kv = kv
        self.collections = Collections(kv)
        self.config = config
        self.client = client
        self.detector = detector  # shared: a replica URL names one replica of one collection
        self.encoders = encoders
        self.metrics = metrics
        self.writable = writable
        self.refresh_s = refresh_s
        self.quota_share = quota_share
        self.stacks: dict[str, CollectionStack] = {}
        self._building: dict[str, asyncio.Lock] = {}

    async def get(self, name: str) -> CollectionStack:
        """The collection's stack (built on first use); 404 when the cluster state has no such collection."""
        stack = self.stacks.get(name)
        if stack is not None and not stack.closed:
            return stack
        lock = self._building.setdefault(name, asyncio.Lock())
        async with lock:
            stack = self.stacks.get(name)
            if stack is not None and not stack.closed:
                return stack
            spec = await asyncio.to_thread(self.collections.get, name)
            if spec is None:
                raise NotFound(f"no collection {name!r}", field="collection")
            nodes = await asyncio.to_thread(self.collections.nodes)
            stack = await self._build(spec, replica_urls(spec, nodes))
            self.stacks[name] = stack
            return stack

    async def _build(self, spec: CollectionSpec, replicas: tuple[tuple[str, ...], ...]) -> CollectionStack:
        config = self.config
        missing = [shard for shard, group in enumerate(replicas) if not group]
        if missing:
            raise ShardUnavailable(f"collection {spec.name!r}: no live node hosts shard(s) {missing}",
                                   shard=missing[0])
        state = ClusterState(self.kv, spec.state_name)
        registry = VersionRegistry(replicas, self.client, RolloutStoreOnKV(state),
                                   encoders=self.encoders if spec.model else None,
                                   default_model=spec.model or "", discovery_timeout_s=config.discovery_timeout_s,
                                   probe_timeout_s=config.probe_timeout_s)
        await registry.start()
        caller = ShardCaller(self.client, make_balancer(config.calls.balancer), self.detector, config.hedging,
                             on_not_eligible=registry.mark_not_eligible)
        fanout = FanOut(replicas, caller, coalesce=config.calls.coalesce, max_batch=config.calls.max_batch,
                        max_inflight_per_replica=config.calls.max_inflight_per_replica,
                        topk_probability=config.calls.topk_probability)
        queries = QueryService(config.limits, registry, fanout, self.metrics, recent_queries=100,
                               defaults=spec.query_defaults)
        writes = WriteService(registry, self.client, config.writes, writable=self.writable)
        quota = spec.quotas.max_rps
        limiter = RateLimiter(quota, max(1.0, quota), share=self.quota_share) if quota > 0 else None

        async def after_step(generation: int) -> list[str]:
            # Every primary refuses writes of older views for a while: a gateway that has not
            # adopted the step (it re-reads the state at its next poll, within the hold) reloads
            # and sends its write again under the new one.
            await writes.fence_all(generation, config.cluster.fence_hold_s)
            return []

        rollout = RolloutService(registry, self.client, queries.search_text, settings=config.rollout,
                                 gate=config.gate, encoders_loaded=registry.encoder_service is not None,
                                 recent_queries=lambda: list(queries.recent_queries),
                                 # a version a rollout staged is an empty base: filled from the live one
                                 before_activate=lambda version: writes.staging.bring_up(version, from_live=True),
                                 after_step=after_step)
        stack = CollectionStack(spec, replicas, registry, queries, writes, limiter, rollout)
        # Slower than the launched collection's poll (a rollout step fences the primaries for
        # longer than this), and a moved replica (a restarted node) rebuilds the stack through
        # refresh_forever.
        stack.poll = asyncio.ensure_future(registry.poll_forever(max(config.rollout.poll_interval_s,
                                                                     COLLECTION_POLL_S)))
        return stack

    async def wait_ready(self, spec: CollectionSpec, timeout_s: float = READY_TIMEOUT_S) -> CollectionStack:
        """A new collection's stack once every replica it placed answers and each shard has its
        primary (503 naming the replicas still missing after ``timeout_s``)."""
        deadline = time.monotonic() + timeout_s
        waiting: list[str] = []
        while time.monotonic() < deadline:
            nodes = await asyncio.to_thread(self.collections.nodes)
            urls = [url for group in replica_urls(spec, nodes) for url in group]
            infos = await asyncio.gather(*(fetch_info(self.client, url, self.config.probe_timeout_s) for url in urls))
            by_url = dict(zip(urls, infos, strict=True))
            waiting = [url for url, info in by_url.items() if info is None]
            # ready: every replica answers and every shard has its primary (a first write goes straight through)
            primaries = {info.shard_id for info in by_url.values()
                         if info is not None and info.role is not None and info.role.is_primary}
            if len(urls) == spec.shards * spec.replicas and not waiting and len(primaries) == spec.shards:
                return await self.get(spec.name)
            await asyncio.sleep(0.1)
        raise ShardUnavailable(f"collection {spec.name!r} is recorded, but its replicas did not come up within "
                               f"{timeout_s:.0f} s: {waiting or 'nodes of its placement are not live'}",
                               field="collection")

    async def refresh_forever(self) -> None:
        """Follow the cluster state: stacks of dropped collections go, stacks whose spec or
        replica URLs changed are rebuilt on their next request."""
        revision = -1
        while True:
            await asyncio.sleep(self.refresh_s)
            try:
                current = await asyncio.to_thread(self.kv.revision)
                if current == revision:
                    continue
                revision = current
                specs = {s.name: s for s in await asyncio.to_thread(self.collections.list)}
                nodes = await asyncio.to_thread(self.collections.nodes)
            except ShardragError as exc:
                logger.warning("collections refresh: %s", exc.message)
                continue
            for name, stack in list(self.stacks.items()):
                spec = specs.get(name)
                if spec is None or spec.uid != stack.spec.uid or replica_urls(spec, nodes) != stack.replicas:
                    self.stacks.pop(name, None)
                    await stack.close()
                elif spec.query_defaults != stack.spec.query_defaults:
                    stack.adopt(spec)

    async def forget(self, name: str) -> None:
        stack = self.stacks.pop(name, None)
        if stack is not None:
            await stack.close()

    async def close(self) -> None:
        for name in list(self.stacks):
            await self.forget(name)

    def describe(self, spec: CollectionSpec) -> dict[str, Any]:
        stack = self.stacks.get(spec.name)
        return {**spec.to_dict(), "served_here": stack is not None and not stack.closed}
