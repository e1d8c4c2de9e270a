"""The rollout commands as the gateway carries them out: the pure protocol of
``retrieval.rollout`` plus the side effects — replicas told to load or unload versions, the
readiness check, the quality gate, the store write, and the event callback (metrics, logs).

Each command reads the state, checks, then records its transition with one atomic store update
(so a gateway killed mid-command leaves either the old state or the new one), adopts it, and
answers with the current status. Repeating a command is a no-op that reports the state.

The service is given what it needs — the registry, a shard client, a search function for the
gate — never the gateway.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from retrieval import rollout as protocol
from retrieval.errors import ConfigError, InvalidRequest, NotFound, ResourceExhausted, ShardragError
from retrieval.rollout import RolloutRefused, RolloutState, Transition
from serving.transport.client import ShardClient
from serving.versions.gate import GateSettings, Qrels, Queries, SearchFn, quality_gate
from serving.versions.registry import VersionRegistry

logger = logging.getLogger(__name__)

ADMIN_TIMEOUT_S = 10.0  # a replica's answer to stage/unload (loading happens after it answers)


@dataclass(slots=True, frozen=True)
class RolloutSettings:
    state_path: str | None = None  # rollout state file shared by the gateways (None: in memory)
    poll_interval_s: float = 1.0  # how often the state and the replicas' versions are re-read
    min_ready_replicas: int = 0  # ready replicas per shard needed to activate (0 = all of them)
    drain_s: float = 30.0  # a version stays loaded this long after it stops being active

    def validate(self) -> None:
        if self.poll_interval_s <= 0:
            raise ConfigError("rollout.poll_interval_s must be > 0", field="rollout.poll_interval_s")
        if self.min_ready_replicas < 0 or self.drain_s < 0:
            raise ConfigError("rollout.min_ready_replicas and rollout.drain_s must be ≥ 0",
                              field="rollout.min_ready_replicas")


class GateRefused(RolloutRefused):
    """Activation refused by the quality gate; the body carries the numbers."""

    def __init__(self, message: str, gate: dict[str, Any]) -> None:
        super().__init__(message, field="version")
        self.gate = gate

    def to_dict(self) -> dict[str, Any]:
        body = super().to_dict()
        body["error"]["gate"] = self.gate
        return body


class RolloutService:
    def __init__(self, registry: VersionRegistry, client: ShardClient, search: SearchFn, *,
                 settings: RolloutSettings, gate: GateSettings, encoders_loaded: bool,
                 recent_queries: Callable[[], Sequence[str]],
                 on_event: Callable[[protocol.RolloutEvent], None] | None = None,
                 before_activate: Callable[[str], Awaitable[None]] | None = None,
                 after_step: Callable[[int], Awaitable[list[str]]] | None = None) -> None:
        """``before_activate``: awaited with the version once it is ready everywhere, before the gate
        (the write service brings it up to date and records its sync). ``after_step``: awaited
        with the generation of every recorded step before the command answers (primaries fenced,
        every live gateway has adopted it); returns the gateways still behind."""
        self.registry = registry
        self.before_activate = before_activate
        self.after_step = after_step
        self.client = client
        self.search = search
        self.settings = settings
        self.gate = gate
        self.encoders_loaded = encoders_loaded
        self.recent_queries = recent_queries
        self.on_event = on_event

    # -- helpers -------------------------------------------------------------------------------
    def _replicas(self) -> list[str]:
        return [r for group in self.registry.shard_replicas for r in group]

    def _record(self, change: Callable[[RolloutState], Transition]) -> protocol.RolloutEvent | None:
        """Apply a protocol transition atomically in the store, then adopt the result."""
        box: list[protocol.RolloutEvent | None] = [None]

        def update(current: RolloutState | None) -> RolloutState:
            if current is None:
                raise ConfigError("the rollout state was not initialised at start", field="rollout.state_path")
            transition = change(current)
            box[0] = transition.event
            return transition.state

        state = self.registry.store.update(update)
        self.registry.apply(state)
        event = box[0]
        if event is not None:
            logger.warning("rollout: %s %s %s", event.kind, event.version, event.detail)
            if self.on_event is not None:
                self.on_event(event)
        return event

    async def _on_every_replica(self, call: Callable[[str], Awaitable[object]]) -> dict[str, Any]:
        """Send one admin call to every replica; per replica: the answer or the error."""
        async def one(replica: str) -> Any:
            try:
                return await call(replica)
            except ShardragError as exc:
                return exc

        replicas = self._replicas()
        return dict(zip(replicas, await asyncio.gather(*(one(r) for r in replicas)), strict=True))

    async def _unload_everywhere(self, version: str) -> None:
        await self._on_every_replica(lambda r: self.client.unload(r, version, ADMIN_TIMEOUT_S))

    def _state(self) -> RolloutState:
        state = self.registry.state
        if state is None:
            raise ConfigError("the version registry has not started", field="shards")
        return state

    async def status(self, event: protocol.RolloutEvent | None = None, **extra: Any) -> dict[str, Any]:
        if event is not None and self.after_step is not None:
            behind = await self.after_step(self._state().generation)
            if behind:
                logger.warning("rollout step %s: gateways still behind after the wait: %s", event.kind, behind)
            extra["gateways_behind"] = behind
        await self.registry.refresh()
        state = self._state()
        return {
            "changed": event is not None,
            "event": event.to_dict() if event else None,
            "state": state.to_dict(),
            "replicas": {version: self.registry.replica_report(version) for version in state.loaded()},
            "encoders": {v: {"state": e.state, "error": e.error} for v, e in self.registry.encoders.items()},
            **extra,
        }

    # -- commands ------------------------------------------------------------------------------
    def check_stage(self, version: str, model: str) -> None:
        """Refuse (as :meth:`stage` would) before anything is touched: another version staged, the
        previous one still loaded."""
        protocol.stage(self._state(), version, model, time.time())

    async def stage(self, version: str, model: str) -> dict[str, Any]:
        state = self._state()
        protocol.stage(state, version, model, time.time())  # refuse early, before touching replicas
        if version not in (state.active, state.staged):
            answers = await self._on_every_replica(lambda r: self.client.stage(r, version, ADMIN_TIMEOUT_S))
            refusals = {r: a for r, a in answers.items()
                        if isinstance(a, (NotFound, ResourceExhausted, InvalidRequest, RolloutRefused))}
            if refusals:
                await self._unload_everywhere(version)
                reasons = "; ".join(f"{r}: {a.message}" for r, a in refusals.items())
                raise RolloutRefused(f"stage of {version} refused: {reasons}", field="version")
        event = self._record(lambda s: protocol.stage(s, version, model, time.time()))
        return await self.status(event)

    def readiness(self, version: str) -> list[str]:
        """Why ``version`` cannot be activated yet (empty when it can)."""
        reasons = []
        for shard_id, replicas in enumerate(self.registry.shard_replicas):
            ready = self.registry.eligible(shard_id, version)
            needed = self.settings.min_ready_replicas or len(replicas)
            if len(ready) < needed:
                states = ", ".join(f"{row['replica']} {row['state']}" + (f" ({row['error']})" if "error" in row else "")
                                   for row in self.registry.replica_report(version)[str(shard_id)])
                reasons.append(f"shard {shard_id}: {len(ready)}/{needed} replicas ready [{states}]")
        if self.encoders_loaded:
            encoder = self.registry.encoders.get(version)
            if encoder is None or encoder.state != "ready":
                state = encoder.state if encoder else "absent"
                reasons.append(f"query encoder for {version} is {state}"
                               + (f": {encoder.error}" if encoder and encoder.error else ""))
        return reasons

    async def activate(self, version: str, *, force: bool = False, queries: Queries | None = None,
                       qrels: Qrels | None = None) -> dict[str, Any]:
        state = self._state()
        if version == state.active:
            return await self.status(None)
        # "not staged" refusals come first (it is synced below, before the gate)
        protocol.activate(replace(state, synced=True), version, time.time())
        await self.registry.refresh()
        reasons = self.readiness(version)
        if reasons:
            raise RolloutRefused(f"activation of {version} refused: " + "; ".join(reasons), field="version")
        if self.before_activate is not None:
            await self.before_activate(version)  # records the sync: from here every gateway writes to both
            if self.after_step is not None:
                await self.after_step(self._state().generation)
        gate = await quality_gate(state.active, version, queries, qrels, search=self.search, settings=self.gate,
                                  recent=self.recent_queries(), encoders_loaded=self.encoders_loaded)
        if not gate["passed"]:
            if not force:
                raise GateRefused(f"activation of {version} refused by the quality gate: {gate['reason']}", gate)
            logger.warning("quality gate failed for %s but activation is forced: %s", version, gate["reason"])
        summary = f"gate overlap@10={gate.get('overlap_at_10')} passed={gate['passed']} forced={force}"
        event = self._record(lambda s: protocol.activate(s, version, time.time(), detail=summary))
        return await self.status(event, gate=gate)

    async def retire(self, version: str, *, force: bool = False) -> dict[str, Any]:
        event = self._record(lambda s: protocol.retire(s, version, time.time(), drain_s=self.settings.drain_s,
                                                       force=force))
        if event is not None:
            await self._unload_everywhere(version)
        return await self.status(event)

    async def abort(self, version: str) -> dict[str, Any]:
        event = self._record(lambda s: protocol.abort(s, version, time.time()))
        if event is not None:
            await self._unload_everywhere(version)
        return await self.status(event)

    async def rollback(self, version: str) -> dict[str, Any]:
        event = self._record(lambda s: protocol.rollback(s, version, time.time()))
        return await self.status(event)
