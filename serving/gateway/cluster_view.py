"""What ``GET /v1/cluster`` and ``GET /healthz`` show: shards, replicas (probed live), versions,
encoders, ejection and hedging state, the answer router's generators, and the local launcher's
restart log."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import orjson

from retrieval.errors import ShardragError
from serving.gateway.config import GatewayConfig
from serving.shardcall.call import ShardCaller
from serving.shardcall.ejection import OutlierDetector
from serving.transport.client import ShardClient
from serving.versions.registry import VersionRegistry


class ClusterView:
    def __init__(self, config: GatewayConfig, registry: VersionRegistry, client: ShardClient,
                 detector: OutlierDetector, caller: ShardCaller, answers: Any = None, state: Any = None) -> None:
        self.config = config
        self.state = state  # the cluster state (clusterstate.state.ClusterState): terms, in-sync sets, gateways
        self.answers = answers  # the AnswerService: its router's view of the generators
        self.registry = registry
        self.client = client
        self.detector = detector
        self.caller = caller

    def healthz(self) -> dict[str, Any]:
        state = self.registry.state
        encoder = self.registry.encoders.get(state.active) if state else None
        return {
            "status": "ok" if state is not None else "starting",
            "version": state.active if state else None,
            "shards": len(self.registry.shard_replicas),
            "encoder": encoder.state if encoder else "disabled",
        }

    async def _probe(self, replica: str, ejection: dict[str, Any]) -> dict[str, Any]:
        started = time.perf_counter()
        state = ejection.get(replica, {"ejected": False})
        try:
            info = await self.client.info(replica, self.config.probe_timeout_s)
        except ShardragError as exc:
            return {"url": replica, "healthy": False, "error": exc.message, "ejection": state}
        role = info.role
        return {"url": replica, "healthy": True,
                "versions": [{k: v for k, v in row.to_dict().items()
                              if k in ("id", "state", "count", "error", "applied_seq", "segment", "tombstones",
                                       "lexical_index", "lexical_index_bytes")}
                             for row in info.versions],
                "role": ("primary" if role.is_primary else "replica") if role is not None else None,
                "term": role.term if role is not None else None,
                "on_gpu": info.primary.on_gpu if info.primary else None,
                "latency_ms": (time.perf_counter() - started) * 1000.0, "ejection": state}

    async def cluster(self) -> dict[str, Any]:
        view = self.registry.view
        ejection = self.detector.snapshot()
        active = view.snapshot(view.state.active).topology
        supervision = self._supervision()
        by_url = {c.get("url"): c for c in (supervision or {}).get("children", []) if c.get("url")}
        shards = []
        for shard in active.shards:
            replicas = await asyncio.gather(*(self._probe(r, ejection) for r in shard.replicas))
            balancer = self.caller.balancer
            for replica in replicas:
                replica["outstanding"] = balancer.outstanding.get(replica["url"], 0)
                expected = balancer.expected_latency_s(replica["url"])
                replica["ewma_ms"] = expected * 1000.0 if expected is not None else None
                # a replica process's own URL, or its node's (``<node>/c/<collection>/<shard>``)
                child = by_url.get(replica["url"]) or by_url.get(replica["url"].split("/c/", 1)[0])
                if child is not None:
                    replica["restarts"] = child.get("restarts", 0)
                    replica["last_exit_code"] = child.get("last_exit_code")
                    replica["process"] = child.get("name")
            shards.append({"shard": shard.shard_id, "count": shard.count, "replicas": replicas,
                           "healthy_replicas": sum(r["healthy"] for r in replicas)})
        return {
            "collection": active.collection,
            "embedding_version": active.version.to_dict(),
            "rollout": view.state.to_dict(),
            "partitioner": active.partitioner,
            "factory": active.factory,
            "metric": active.metric,
            "num_shards": active.num_shards,
            "shards": shards,
            "encoders": {v: e.describe() for v, e in self.registry.encoders.items()},
            "encoder_service": (self.registry.encoder_service.describe() if self.registry.encoder_service
                                else None),
            "balancer": self.config.calls.balancer,
            "hedging": self.hedging_state(),
            "supervision": supervision,
            "generators": (self.answers.router.snapshot() if self.answers is not None and self.answers.generators
                           else None),
            "cluster_state": await self._cluster_state(),
        }

    async def _cluster_state(self) -> dict[str, Any] | None:
        """Per shard its term, primary and in-sync set, and the live gateways, as the cluster state
        holds them (None when it cannot be read)."""
        if self.state is None:
            return None
        try:
            snapshot: dict[str, Any] = await asyncio.to_thread(self.state.snapshot)
        except ShardragError as exc:
            return {"error": exc.message}
        snapshot.pop("rollout", None)  # shown above
        return snapshot

    def _supervision(self) -> dict[str, Any] | None:
        """Restarts of every process the local launcher supervises (None when not launched by it)."""
        if not self.config.supervision_path:
            return None
        try:
            payload = orjson.loads(Path(self.config.supervision_path).read_bytes())
        except (OSError, orjson.JSONDecodeError):
            return None
        children = payload.get("children", [])
        return {"updated_at": payload.get("updated_at"), "total_restarts": sum(c.get("restarts", 0) for c in children),
                "children": children}

    def hedging_state(self) -> dict[str, Any]:
        stats = self.caller.stats
        return {"enabled": self.config.hedging.enabled, "calls": stats.calls, "hedges_fired": stats.hedges_fired,
                "hedges_won": stats.hedges_won, "budget_exhausted": stats.budget_exhausted,
                "hedges_not_worth": stats.hedges_not_worth, "retries": stats.retries,
                "retries_refused": stats.retries_refused,
                "delay_ms": {str(s): self.caller.hedge_delay(s).delay_s() * 1000.0
                             for s in range(len(self.registry.shard_replicas))}}
