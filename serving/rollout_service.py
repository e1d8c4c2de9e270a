"""The rollout commands as the gateway carries them out: the pure protocol of
``retrieval.rollout`` plus the side effects — replicas told to load or unload versions, the
readiness check, the quality gate, the store write, metrics and log events.

Each command reads the state, checks, then records its transition with one atomic store update
(so a gateway killed mid-command leaves either the old state or the new one), adopts it, and
answers with the current status. Repeating a command is a no-op that reports the state.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from retrieval import rollout as protocol
from retrieval.errors import InvalidRequest, NotFound, ResourceExhausted, ShardragError
from retrieval.ir_metrics import ndcg_at_k, overlap_at_k
from retrieval.rollout import RolloutRefused, RolloutState, Transition

from serving.transport import SearchParams

if TYPE_CHECKING:
    from serving.gateway import Gateway

logger = logging.getLogger(__name__)


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
    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.config = gateway.config
        assert gateway.registry is not None
        self.registry = gateway.registry

    # -- helpers -------------------------------------------------------------------------------
    def _replicas(self) -> list[str]:
        return [r for group in self.gateway.shard_replicas for r in group]

    def _record(self, change: Callable[[RolloutState], Transition]) -> protocol.RolloutEvent | None:
        """Apply a protocol transition atomically in the store, then adopt the result."""
        box: list[protocol.RolloutEvent | None] = [None]

        def update(current: RolloutState | None) -> RolloutState:
            assert current is not None, "the gateway initialised the rollout state at start"
            transition = change(current)
            box[0] = transition.event
            return transition.state

        state = self.registry.store.update(update)
        self.registry.apply(state)
        event = box[0]
        if event is not None:
            logger.warning("rollout: %s %s %s", event.kind, event.version, event.detail)
            self.gateway.metrics.rollout_events.labels(kind=event.kind).inc()
        return event

    async def _on_every_replica(self, method: str, path: str, body: dict[str, Any] | None) -> dict[str, Any]:
        """Send one admin request to every replica; per replica: the answer or the error."""
        async def one(replica: str) -> Any:
            try:
                return await self.gateway.transport.request_json(replica, method, path, body, timeout_s=10.0)
            except ShardragError as exc:
                return exc

        replicas = self._replicas()
        return dict(zip(replicas, await asyncio.gather(*(one(r) for r in replicas))))

    async def status(self, event: protocol.RolloutEvent | None = None, **extra: Any) -> dict[str, Any]:
        await self.registry.refresh()
        state = self.registry.state
        assert state is not None
        return {
            "changed": event is not None,
            "event": event.to_dict() if event else None,
            "state": state.to_dict(),
            "replicas": {version: self.registry.replica_report(version) for version in state.loaded()},
            "encoders": {v: {"state": e.state, "error": e.error} for v, e in self.registry.encoders.items()},
            **extra,
        }

    # -- commands ------------------------------------------------------------------------------
    async def stage(self, version: str, model: str) -> dict[str, Any]:
        state = self.registry.state
        assert state is not None
        protocol.stage(state, version, model, time.time())  # refuse early, before touching replicas
        if version not in (state.active, state.staged):
            answers = await self._on_every_replica("POST", "/admin/versions", {"version": version})
            refusals = {r: a for r, a in answers.items()
                        if isinstance(a, (NotFound, ResourceExhausted, InvalidRequest, RolloutRefused))}
            if refusals:
                await self._on_every_replica("DELETE", f"/admin/versions/{version}", None)
                reasons = "; ".join(f"{r}: {a.message}" for r, a in refusals.items())
                raise RolloutRefused(f"stage of {version} refused: {reasons}", field="version")
        event = self._record(lambda s: protocol.stage(s, version, model, time.time()))
        return await self.status(event)

    def readiness(self, version: str) -> list[str]:
        """Why ``version`` cannot be activated yet (empty when it can)."""
        reasons = []
        for shard_id, replicas in enumerate(self.gateway.shard_replicas):
            ready = self.registry.eligible(shard_id, version)
            needed = self.config.rollout_min_ready_replicas or len(replicas)
            if len(ready) < needed:
                states = ", ".join(f"{row['replica']} {row['state']}" + (f" ({row['error']})" if "error" in row else "")
                                   for row in self.registry.replica_report(version)[str(shard_id)])
                reasons.append(f"shard {shard_id}: {len(ready)}/{needed} replicas ready [{states}]")
        if self.config.load_encoder:
            encoder = self.registry.encoders.get(version)
            if encoder is None or encoder.state != "ready":
                state = encoder.state if encoder else "absent"
                reasons.append(f"query encoder for {version} is {state}"
                               + (f": {encoder.error}" if encoder and encoder.error else ""))
        return reasons

    async def activate(self, version: str, *, force: bool = False,
                       queries: Sequence[str] | Mapping[str, str] | None = None,
                       qrels: Mapping[str, Mapping[str, int]] | None = None) -> dict[str, Any]:
        state = self.registry.state
        assert state is not None
        if version == state.active:
            return await self.status(None)
        protocol.activate(state, version, time.time())  # "not staged" refusals come first
        await self.registry.refresh()
        reasons = self.readiness(version)
        if reasons:
            raise RolloutRefused(f"activation of {version} refused: " + "; ".join(reasons), field="version")
        gate = await self.quality_gate(state.active, version, queries, qrels)
        if not gate["passed"]:
            if not force:
                raise GateRefused(f"activation of {version} refused by the quality gate: {gate['reason']}", gate)
            logger.warning("quality gate failed for %s but activation is forced: %s", version, gate["reason"])
        summary = f"gate overlap@10={gate.get('overlap_at_10')} passed={gate['passed']} forced={force}"
        event = self._record(lambda s: protocol.activate(s, version, time.time(), detail=summary))
        return await self.status(event, gate=gate)

    async def retire(self, version: str, *, force: bool = False) -> dict[str, Any]:
        event = self._record(lambda s: protocol.retire(s, version, time.time(), drain_s=self.config.drain_s,
                                                       force=force))
        if event is not None:
            await self._on_every_replica("DELETE", f"/admin/versions/{version}", None)
        return await self.status(event)

    async def abort(self, version: str) -> dict[str, Any]:
        event = self._record(lambda s: protocol.abort(s, version, time.time()))
        if event is not None:
            await self._on_every_replica("DELETE", f"/admin/versions/{version}", None)
        return await self.status(event)

    async def rollback(self, version: str) -> dict[str, Any]:
        event = self._record(lambda s: protocol.rollback(s, version, time.time()))
        return await self.status(event)

    # -- quality gate --------------------------------------------------------------------------
    async def quality_gate(self, old: str, new: str, queries: Sequence[str] | Mapping[str, str] | None,
                           qrels: Mapping[str, Mapping[str, int]] | None) -> dict[str, Any]:
        """Run the sample on both versions: overlap@10 of their top 10s, nDCG@10 of each with qrels."""
        config = self.config
        if isinstance(queries, Mapping):
            sample = dict(list(queries.items())[: config.gate_sample])
        else:
            texts = list(queries) if queries is not None else list(dict.fromkeys(reversed(self.gateway.recent_queries)))
            sample = {f"q{i}": t for i, t in enumerate(texts[: config.gate_sample])}
        result: dict[str, Any] = {"queries": len(sample), "min_overlap": config.gate_min_overlap,
                                  "max_ndcg_drop": config.gate_max_ndcg_drop}
        if not sample:
            return {**result, "passed": False, "reason": "no queries to compare: pass queries (or force)"}
        if not config.load_encoder:
            return {**result, "passed": False,
                    "reason": "the gate compares text queries and this gateway runs without encoders (force to skip)"}
        rankings = {old: {}, new: {}}

        async def run(query_id: str, text: str, version: str) -> None:
            assert self.gateway.fanout is not None
            vector = await self.gateway.encoder_for(version).encode(text)
            outcome = await self.gateway.fanout.search(
                vector, SearchParams(k=10, version=version, with_text=False), self.registry.topology(version),
                top_m=None, timeout_s=config.default_timeout_ms / 1000.0)
            rankings[version][query_id] = [hit.doc_id for hit in outcome.hits]

        # One gate query at a time: its texts join the live encoder batches one by one instead of
        # queueing a whole sample in front of the live traffic (measured: a 400 ms stall otherwise).
        for query_id, text in sample.items():
            await asyncio.gather(run(query_id, text, old), run(query_id, text, new))
        overlaps = [overlap_at_k(rankings[new][q], rankings[old][q], 10) for q in sample]
        result["overlap_at_10"] = round(sum(overlaps) / len(overlaps), 4)
        reasons = []
        if result["overlap_at_10"] < config.gate_min_overlap:
            reasons.append(f"overlap@10 {result['overlap_at_10']:.3f} < {config.gate_min_overlap}")
        if qrels:
            judged = {q: dict(qrels[q]) for q in sample if q in qrels}
            if judged:
                result["ndcg_at_10"] = {"old": round(ndcg_at_k(rankings[old], judged, 10), 4),
                                        "new": round(ndcg_at_k(rankings[new], judged, 10), 4)}
                drop = result["ndcg_at_10"]["old"] - result["ndcg_at_10"]["new"]
                if drop > config.gate_max_ndcg_drop:
                    reasons.append(f"nDCG@10 drops by {drop:.3f} > {config.gate_max_ndcg_drop}")
        result["passed"] = not reasons
        result["reason"] = "; ".join(reasons) if reasons else "passed"
        return result
