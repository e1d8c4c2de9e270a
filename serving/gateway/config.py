"""Configuration of the gateway and the cluster it fronts: one settings dataclass per component,
nested in :class:`GatewayConfig`, each living in its own room (hedging in ``shardcall``, the
rollout in ``versions``, ...). Only the CLI reads the environment (``SHARDRAG_*``) and flags
override it.

JSON (the cluster spec, Helm's ``gateway.config``) mirrors the nesting::

    {"limits": {"max_k": 100}, "hedging": {"enabled": true, "cap_ms": 250}, "rollout": {"drain_s": 30}}

The flat keys of earlier releases (``max_k``, ``hedge_cap_ms``, ``rollout_state_path``, ...) are
still read, each with a deprecation warning naming its new place (:data:`FLAT_KEYS`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from retrieval.errors import ConfigError
from retrieval.query_defaults import QueryDefaults
from serving.answer.service import AnswerSettings
from serving.encoding.settings import EncoderSettings
from serving.shardcall.call import HedgingSettings
from serving.shardcall.ejection import EjectionSettings
from serving.shardcall.fanout import FanOutSettings
from serving.versions.gate import GateSettings
from serving.versions.presence import ClusterSettings
from serving.versions.rollout import RolloutSettings
from serving.writes.plan import WriteSettings

logger = logging.getLogger(__name__)


@dataclass(slots=True, frozen=True)
class Limits:
    """What a query may ask for, and the defaults when it asks for nothing."""

    default_k: int = 10  # k when a query gives none
    max_k: int = 100  # largest k a query may ask for
    max_group_read: int = 1000  # deepest a group_by query reads to fill its groups (at most the shards' max_k)
    max_text_chars: int = 4096  # longest query text accepted
    max_body_bytes: int = 1 << 20  # larger request bodies get 413
    default_timeout_ms: int = 5000  # deadline of a query that gives no timeout_ms
    max_timeout_ms: int = 60000  # largest timeout_ms accepted
    min_timeout_ms: int = 1  # smallest timeout_ms accepted (a deadline no shard can meet is a 504)
    max_vector_abs: float = 1e6  # largest |component| of a query vector (scores must stay finite in float32)
    allow_partial: bool = True  # default for queries: answer 200 + partial when a shard is missing
    rate_limit_qps: float = 0.0  # per API key (per client address without keys); 0 = no limit
    rate_limit_burst: float = 50.0  # requests a key may send at once before the rate applies

    def validate(self) -> None:
        for name in ("default_k", "max_k", "max_group_read", "max_text_chars", "max_body_bytes", "default_timeout_ms",
                     "max_timeout_ms", "min_timeout_ms"):
            if getattr(self, name) < 1:
                raise ConfigError(f"limits.{name} must be ≥ 1", field=f"limits.{name}")
        if self.default_k > self.max_k:
            raise ConfigError("limits.default_k is above limits.max_k", field="limits.default_k")
        if not self.min_timeout_ms <= self.default_timeout_ms <= self.max_timeout_ms:
            raise ConfigError("limits.default_timeout_ms must be between min_timeout_ms and max_timeout_ms",
                              field="limits.default_timeout_ms")


@dataclass(slots=True, frozen=True)
class GatewayConfig:
    limits: Limits = field(default_factory=Limits)
    calls: FanOutSettings = field(default_factory=FanOutSettings)  # shard client, balancer, coalescing
    hedging: HedgingSettings = field(default_factory=HedgingSettings)
    ejection: EjectionSettings = field(default_factory=EjectionSettings)
    rollout: RolloutSettings = field(default_factory=RolloutSettings)
    gate: GateSettings = field(default_factory=GateSettings)  # the rollout's quality gate
    encoder: EncoderSettings = field(default_factory=EncoderSettings)  # the query encoders
    answer: AnswerSettings = field(default_factory=AnswerSettings)  # /v1/answer
    writes: WriteSettings = field(default_factory=WriteSettings)  # /v1/documents
    cluster: ClusterSettings = field(default_factory=ClusterSettings)  # the shared cluster state (etcd, local)
    # the started-with collection's query defaults (a created collection keeps its own in its spec)
    query_defaults: QueryDefaults = field(default_factory=QueryDefaults)
    discovery_timeout_s: float = 60.0  # how long startup waits for every replica's /v1/info
    probe_timeout_s: float = 1.0  # per-replica timeout of health probes and /v1/info polls
    supervision_path: str | None = None  # the local launcher's restart log (JSON), shown in /v1/cluster

    def validate(self) -> GatewayConfig:
        for section in SECTIONS:
            getattr(self, section).validate()
        for name in ("discovery_timeout_s", "probe_timeout_s"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be > 0", field=name)
        return self

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GatewayConfig:
        """From the nested JSON form; flat keys of earlier releases are read with a warning."""
        sections: dict[str, dict[str, Any]] = {name: {} for name in SECTIONS}
        top: dict[str, Any] = {}
        for key, value in data.items():
            if key in SECTIONS and isinstance(value, Mapping):
                known = {f.name for f in dataclasses.fields(SECTIONS[key])}
                value = {k: v for k, v in value.items() if not _removed(f"{key}.{k}")}
                unknown = sorted(set(value) - known)
                if unknown:
                    raise ConfigError(f"unknown gateway config keys: {[f'{key}.{u}' for u in unknown]}",
                                      field=f"{key}.{unknown[0]}")
                sections[key].update(value)
            elif key in FLAT_KEYS:
                section, name = FLAT_KEYS[key]
                _deprecated(key, f"{section}.{name}")
                sections[section][name] = value
            elif key in TOP_LEVEL:
                top[key] = value
            else:
                raise ConfigError(f"unknown gateway config keys: [{key!r}]", field=key)
        try:
            config = cls(**{name: SECTIONS[name](**values) for name, values in sections.items()}, **top)
        except TypeError as exc:
            raise ConfigError(f"bad gateway config: {exc}", field="gateway") from exc
        return config.validate()

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


SECTIONS: dict[str, type[Any]] = {
    "limits": Limits, "calls": FanOutSettings, "hedging": HedgingSettings, "ejection": EjectionSettings,
    "rollout": RolloutSettings, "gate": GateSettings, "encoder": EncoderSettings, "answer": AnswerSettings,
    "writes": WriteSettings, "cluster": ClusterSettings, "query_defaults": QueryDefaults,
}
TOP_LEVEL = ("discovery_timeout_s", "probe_timeout_s", "supervision_path")

FLAT_KEYS: dict[str, tuple[str, str]] = {
    **{name: ("limits", name) for name in ("default_k", "max_k", "max_text_chars", "max_body_bytes",
                                           "default_timeout_ms", "max_timeout_ms", "min_timeout_ms",
                                           "max_vector_abs", "allow_partial", "rate_limit_qps",
                                           "rate_limit_burst")},
    **{name: ("calls", name) for name in ("transport", "balancer", "coalesce", "max_batch",
                                          "max_inflight_per_replica")},
    "hedging": ("hedging", "enabled"), "hedge_percentile": ("hedging", "percentile"),
    "hedge_floor_ms": ("hedging", "floor_ms"), "hedge_cap_ms": ("hedging", "cap_ms"),
    "max_hedges": ("hedging", "max_hedges"), "hedge_budget_ratio": ("hedging", "budget_ratio"),
    "hedge_budget_burst": ("hedging", "budget_burst"),
    "eject_after_failures": ("ejection", "after_failures"), "eject_base_s": ("ejection", "base_s"),
    "eject_max_s": ("ejection", "max_s"), "probe_interval_s": ("ejection", "probe_interval_s"),
    "rollout_state_path": ("rollout", "state_path"), "poll_interval_s": ("rollout", "poll_interval_s"),
    "rollout_min_ready_replicas": ("rollout", "min_ready_replicas"), "drain_s": ("rollout", "drain_s"),
    "gate_min_overlap": ("gate", "min_overlap"), "gate_max_ndcg_drop": ("gate", "max_ndcg_drop"),
    "gate_sample": ("gate", "sample"),
    "answer_timeout_s": ("answer", "timeout_s"),
    "encoder_model": ("encoder", "model"), "encoder_device": ("encoder", "device"), "load_encoder": ("encoder", "load"),
}
"""Flat key of earlier releases → (section, field) where it lives now."""


REMOVED_KEYS: dict[str, str] = {
    "writes.state_path": "write order lives in each shard's primary now; gateways keep no write state",
    "writes.hole_fill_after_s": "seqs are the shard primary's own: there are no holes to fill",
}
"""Keys of earlier releases that no longer mean anything: read, warned about and ignored."""


def _removed(key: str) -> bool:
    if key not in REMOVED_KEYS:
        return False
    message = f"gateway config key {key!r} is ignored: {REMOVED_KEYS[key]}"
    warnings.warn(message, DeprecationWarning, stacklevel=4)
    logger.warning("%s", message)
    return True


def _deprecated(key: str, where: str) -> None:
    message = f"gateway config key {key!r} is deprecated: use {where}"
    warnings.warn(message, DeprecationWarning, stacklevel=3)
    logger.warning("%s", message)


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
