"""The gateway's view of embedding versions: the rollout state (from the store), each loaded
version's topology and query encoder, and which replicas hold which version ready.

Queries read :attr:`VersionRegistry.state` once when they start, so a switch of the active
version is atomic for them: a query started on V finishes on V. A background loop, every
``poll_interval_s``, reloads the state from the store (so several gateways agree within one
interval), re-reads every replica's ``/v1/info`` and reconciles the replicas with the state:
a replica missing a version it should hold (say, restarted by its supervisor) is asked to load
it, one holding a version no longer wanted is asked to unload it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable, Sequence

from retrieval.encoders import Encoder
from retrieval.errors import ConfigError, ShardragError, VersionConflict
from retrieval.rollout import RolloutState

from serving.query_encoder import QueryEncoder
from serving.rollout_store import RolloutStore
from serving.topology import (
    Info,
    Topology,
    build_topologies,
    check_slots,
    discover_infos,
    fetch_info,
    ready_versions,
)
from serving.transport import ShardTransport

logger = logging.getLogger(__name__)

DEFAULT_MODEL = "default"
EncoderLoader = Callable[[str], Encoder]  # model ("default" or a checkpoint dir) → encoder


class VersionRegistry:
    def __init__(self, shard_replicas: Sequence[Sequence[str]], transport: ShardTransport, store: RolloutStore, *,
                 encoder_loader: EncoderLoader | None, default_model: str = DEFAULT_MODEL,
                 discovery_timeout_s: float = 60.0, probe_timeout_s: float = 1.0) -> None:
        self.shard_replicas = [tuple(r) for r in shard_replicas]
        self.transport = transport
        self.store = store
        self.encoder_loader = encoder_loader
        self.default_model = default_model
        self.discovery_timeout_s = discovery_timeout_s
        self.probe_timeout_s = probe_timeout_s
        self.infos: dict[str, Info | None] = {}
        self.topologies: dict[str, Topology] = {}
        self.encoders: dict[str, QueryEncoder] = {}
        self._not_eligible: set[tuple[str, str]] = set()  # (replica, version) that answered 409
        self.state: RolloutState | None = None

    # -- start ---------------------------------------------------------------------------------
    async def start(self) -> None:
        self._absorb(await discover_infos(self.transport, self.shard_replicas, self.discovery_timeout_s))
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

    def _absorb(self, infos: dict[str, Info | None]) -> None:
        merged = dict(self.infos)
        for replica, info in infos.items():
            if info is not None or replica not in merged:
                merged[replica] = info  # an unreachable replica keeps what we knew of it
        check_slots(self.shard_replicas, merged)
        self.infos = merged
        self.topologies = build_topologies(self.shard_replicas, merged)
        self._not_eligible = {(r, v) for r, v in self._not_eligible if v not in ready_versions(infos.get(r))}

    # -- state ---------------------------------------------------------------------------------
    def apply(self, state: RolloutState) -> None:
        """Adopt ``state``: encoders for every loaded version, the active one switched atomically."""
        for version in state.loaded():
            if version not in self.encoders:
                loader = self._loader_for(state.models.get(version, self.default_model))
                encoder = QueryEncoder(loader, version)
                encoder.start()
                self.encoders[version] = encoder
        for version in list(self.encoders):
            if version not in state.loaded():
                self.encoders.pop(version).close()
        if self.state is not None and self.state.active != state.active:
            logger.warning("active embedding version: %s → %s", self.state.active, state.active)
        self.state = state

    def _loader_for(self, model: str) -> Callable[[], Encoder] | None:
        if self.encoder_loader is None:
            return None
        loader = self.encoder_loader
        return lambda: loader(model)

    def topology(self, version: str) -> Topology:
        topology = self.topologies.get(version)
        if topology is None:
            raise VersionConflict(f"version {version} is not held ready by a replica of every shard", field="version")
        return topology

    def eligible(self, shard_id: int, version: str) -> tuple[str, ...]:
        """Replicas of ``shard_id`` that hold ``version`` ready."""
        return tuple(r for r in self.shard_replicas[shard_id]
                     if version in ready_versions(self.infos.get(r)) and (r, version) not in self._not_eligible)

    def mark_not_eligible(self, replica: str, version: str) -> None:
        """A replica answered 409 for ``version``: skip it for that version until its info says otherwise."""
        self._not_eligible.add((replica, version))

    def replica_report(self, version: str) -> dict[str, list[dict[str, object]]]:
        """Per shard, each replica's state for ``version`` (ready / loading / failed / absent / unreachable)."""
        report: dict[str, list[dict[str, object]]] = {}
        for shard_id, replicas in enumerate(self.shard_replicas):
            rows = []
            for replica in replicas:
                info = self.infos.get(replica)
                held = {v["id"]: v for v in info.get("versions", [])} if info else {}
                entry = held.get(version)
                rows.append({"replica": replica,
                             "state": "unreachable" if info is None else entry["state"] if entry else "absent",
                             **({"error": entry["error"]} if entry and entry.get("error") else {})})
            report[str(shard_id)] = rows  # JSON object keys
        return report

    # -- background ----------------------------------------------------------------------------
    async def refresh(self) -> None:
        replicas = [r for group in self.shard_replicas for r in group]
        infos = await asyncio.gather(*(fetch_info(self.transport, r, self.probe_timeout_s) for r in replicas))
        self._absorb(dict(zip(replicas, infos)))

    def sync(self) -> bool:
        """Adopt the store's state if another gateway (or a restart) changed it."""
        stored = self.store.load()
        if stored is not None and (self.state is None or stored.generation != self.state.generation):
            self.apply(stored)
            return True
        return False

    async def reconcile(self) -> None:
        """Ask replicas to load the versions the state wants and unload the others (idempotent)."""
        state = self.state
        if state is None:
            return
        wanted = set(state.loaded())
        for replica, info in self.infos.items():
            if info is None:
                continue
            held = {v["id"]: v["state"] for v in info.get("versions", [])}
            for version in wanted - set(held):
                await self._admin(replica, "POST", "/admin/versions", {"version": version})
            ready = [v for v, s in held.items() if s == "ready" and v in wanted]
            for version in set(held) - wanted:
                if ready:  # never leave a replica with nothing to serve
                    await self._admin(replica, "DELETE", f"/admin/versions/{version}", None)

    async def _admin(self, replica: str, method: str, path: str, body: dict | None) -> dict | None:
        try:
            return await self.transport.request_json(replica, method, path, body, max(self.probe_timeout_s, 5.0))
        except ShardragError as exc:
            logger.warning("%s %s%s: %s", method, replica, path, exc.message)
            return None

    async def poll_forever(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            try:
                self.sync()
                await self.refresh()
                await self.reconcile()
            except ShardragError as exc:
                logger.warning("version poll: %s", exc.message)

    def close(self) -> None:
        for encoder in self.encoders.values():
            encoder.close()
