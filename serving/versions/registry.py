"""The gateway's view of embedding versions: the rollout state (from the store), each loaded
version's topology and query encoder, and which replicas hold which version ready.

Everything a query needs is one immutable :class:`RegistryView` — the rollout state and, per
version, a :class:`VersionSnapshot` (topology, encoder, eligible replicas). A query reads
:attr:`VersionRegistry.view` once when it starts, so a switch of the active version is atomic
for it: a query started on V finishes on V, on the replicas that held V when it started.
Every change (state, replica infos, a 409 from a replica) builds a new view.

A background loop, every ``poll_interval_s``, reloads the state from the store (so several
gateways agree within one interval), re-reads every replica's ``/v1/info`` and reconciles the
replicas with the state: a replica missing a version it should hold (say, restarted by its
supervisor) is asked to load it, one holding a version no longer wanted is asked to unload it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass

from retrieval.contract import ReplicaInfo
from retrieval.errors import ConfigError, ShardragError, VersionConflict
from retrieval.rollout import RolloutState
from serving.encoding.query_encoder import QueryEncoder
from serving.encoding.service import EncoderService
from serving.shardcall.fanout import ShardRoute, trimming_blocker
from serving.transport.client import ShardClient
from serving.versions.store import RolloutStore
from serving.versions.topology import (
    Topology,
    build_topologies,
    check_slots,
    discover_infos,
    fetch_info,
    ready_versions,
)

logger = logging.getLogger(__name__)

DEFAULT_MODEL = "default"


@dataclass(slots=True, frozen=True)
class VersionSnapshot:
    """One version as a query sees it: where it lives, how to embed text for it, where to send."""

    topology: Topology
    encoder: QueryEncoder | None  # None when the state does not load this version
    route: ShardRoute

    @property
    def version(self) -> str:
        return self.route.version


@dataclass(slots=True, frozen=True)
class RegistryView:
    state: RolloutState
    versions: Mapping[str, VersionSnapshot]  # every version some replica of every shard holds ready

    def snapshot(self, version: str) -> VersionSnapshot:
        snapshot = self.versions.get(version)
        if snapshot is None:
            raise VersionConflict(f"version {version} is not held ready by a replica of every shard", field="version")
        return snapshot


class VersionRegistry:
    def __init__(self, shard_replicas: Sequence[Sequence[str]], client: ShardClient, store: RolloutStore, *,
                 encoders: EncoderService | None, default_model: str = DEFAULT_MODEL,
                 discovery_timeout_s: float = 60.0, probe_timeout_s: float = 1.0) -> None:
        self.shard_replicas = [tuple(r) for r in shard_replicas]
        self.client = client
        self.store = store
        self.encoder_service = encoders  # None: vector queries only
        self.default_model = default_model
        self.discovery_timeout_s = discovery_timeout_s
        self.probe_timeout_s = probe_timeout_s
        self.infos: dict[str, ReplicaInfo | None] = {}
        self.topologies: dict[str, Topology] = {}
        self.encoders: dict[str, QueryEncoder] = {}
        self._not_eligible: set[tuple[str, str]] = set()  # (replica, version) that answered 409
        self._view: RegistryView | None = None

    # -- start ---------------------------------------------------------------------------------
    async def start(self) -> None:
        self._absorb(await discover_infos(self.client, self.shard_replicas, self.discovery_timeout_s))
        initial = self._initial_version()
        state = self.store.update(lambda current: current or RolloutState(
            active=initial, models={initial: self.default_model}, activated_at=time.time()))
        self.apply(state)
        logger.info("serving %s (rollout generation %d)", state.active, state.generation)

    def _initial_version(self) -> str:
        if not self.topologies:
            raise ConfigError("no embedding version is held ready by a replica of every shard", field="shards")
        if len(self.topologies) > 1:
            # Several complete versions and no rollout state: take the one most replicas hold.
            counts = {v: sum(v in ready_versions(i) for i in self.infos.values()) for v in self.topologies}
            return max(sorted(counts), key=lambda v: counts[v])
        return next(iter(self.topologies))

    def _absorb(self, infos: Mapping[str, ReplicaInfo | None]) -> None:
        merged = dict(self.infos)
        for replica, info in infos.items():
            if info is not None or replica not in merged:
                merged[replica] = info  # an unreachable replica keeps what we knew of it
        check_slots(self.shard_replicas, merged)
        self.infos = merged
        self.topologies = build_topologies(self.shard_replicas, merged)
        self._not_eligible = {(r, v) for r, v in self._not_eligible if v not in ready_versions(infos.get(r))}
        self._rebuild()

    # -- the view queries read -------------------------------------------------------------------
    @property
    def view(self) -> RegistryView:
        if self._view is None:
            raise ConfigError("the version registry has not started", field="shards")
        return self._view

    @property
    def state(self) -> RolloutState | None:
        return self._view.state if self._view is not None else None

    def _rebuild(self, state: RolloutState | None = None) -> None:
        state = state or self.state
        if state is None:
            return
        snapshots = {}
        for version, topology in self.topologies.items():
            route = ShardRoute(version, tuple(self.eligible(s, version) for s in range(len(self.shard_replicas))),
                               topology.centroids, topology.partitioner, "HNSW" in topology.factory.upper(),
                               trimming_blocker(topology.factory), topology.lexical_language)
            snapshots[version] = VersionSnapshot(topology, self.encoders.get(version), route)
        self._view = RegistryView(state, snapshots)

    # -- state ---------------------------------------------------------------------------------
    def apply(self, state: RolloutState) -> None:
        """Adopt ``state``: encoders for every loaded version, the active one switched atomically."""
        for version in state.loaded():
            if version not in self.encoders:
                model = state.models.get(version, self.default_model)
                self.encoders[version] = (self.encoder_service.make(version, model) if self.encoder_service
                                          else QueryEncoder(None, version))
        for version in list(self.encoders):
            if version not in state.loaded():
                self.encoders.pop(version).close()
        previous = self.state
        if previous is not None and previous.active != state.active:
            logger.warning("active embedding version: %s → %s", previous.active, state.active)
        self._rebuild(state)

    def topology(self, version: str) -> Topology:
        return self.view.snapshot(version).topology

    def eligible(self, shard_id: int, version: str) -> tuple[str, ...]:
        """Replicas of ``shard_id`` that hold ``version`` ready."""
        return tuple(r for r in self.shard_replicas[shard_id]
                     if version in ready_versions(self.infos.get(r)) and (r, version) not in self._not_eligible)

    def mark_not_eligible(self, replica: str, version: str) -> None:
        """A replica answered 409 for ``version``: skip it for that version until its info says otherwise."""
        if (replica, version) not in self._not_eligible:
            self._not_eligible.add((replica, version))
            self._rebuild()

    def replica_report(self, version: str) -> dict[str, list[dict[str, object]]]:
        """Per shard, each replica's state for ``version`` (ready / loading / failed / absent / unreachable)."""
        report: dict[str, list[dict[str, object]]] = {}
        for shard_id, replicas in enumerate(self.shard_replicas):
            rows: list[dict[str, object]] = []
            for replica in replicas:
                info = self.infos.get(replica)
                entry = info.held().get(version) if info is not None else None
                rows.append({"replica": replica,
                             "state": "unreachable" if info is None else entry.state if entry else "absent",
                             **({"error": entry.error} if entry and entry.error else {})})
            report[str(shard_id)] = rows  # JSON object keys
        return report

    # -- background ----------------------------------------------------------------------------
    async def refresh(self) -> None:
        replicas = [r for group in self.shard_replicas for r in group]
        infos = await asyncio.gather(*(fetch_info(self.client, r, self.probe_timeout_s) for r in replicas))
        self._absorb(dict(zip(replicas, infos, strict=True)))

    async def sync(self) -> bool:
        """Adopt the store's state if another gateway (or a restart) changed it: read on a worker
        thread (the store may be etcd), adopted on the loop (encoders are made there)."""
        while True:
            before = self.state
            stored = await asyncio.to_thread(self.store.load)
            current = self.state
            if current is before:
                break
            # This gateway adopted a state (its own rollout step) while the store was read: the read
            # may predate that step, and adopting it would take the step back until the next poll
            # (a retired version served again, its replicas already told to unload it). Read again.
        if stored is not None and (current is None or stored.generation != current.generation):
            self.apply(stored)
            return True
        return False

    async def reconcile(self) -> None:
        """Ask replicas to load the versions the state wants and unload the others (idempotent)."""
        state = self.state
        if state is None:
            return
        wanted = set(state.loaded())
        timeout_s = max(self.probe_timeout_s, 5.0)
        for replica, info in self.infos.items():
            if info is None:
                continue
            held = {v.id: v.state for v in info.versions}
            for version in wanted - set(held):
                await self._admin(f"stage {version} on {replica}", self.client.stage(replica, version, timeout_s))
            ready = [v for v, s in held.items() if s == "ready" and v in wanted]
            for version in set(held) - wanted:
                if ready:  # never leave a replica with nothing to serve
                    await self._admin(f"unload {version} from {replica}",
                                      self.client.unload(replica, version, timeout_s))

    async def _admin(self, what: str, call: Awaitable[object]) -> None:
        try:
            await call
        except ShardragError as exc:
            logger.warning("%s: %s", what, exc.message)

    async def poll_forever(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            try:
                await self.sync()
                await self.refresh()
                await self.reconcile()
            except ShardragError as exc:
                logger.warning("version poll: %s", exc.message)

    def close(self) -> None:
        for encoder in self.encoders.values():
            encoder.close()
        if self.encoder_service is not None:
            self.encoder_service.close()
