"""The shard contract: what a shard replica and its callers (the gateway's transports, the
Python tools) exchange, typed once and shared.

    POST /v1/search?<SearchParams>   body: n × dim float32 LE   → SearchReply
    GET  /v1/info                                               → ReplicaInfo (VersionInfo per version)
    GET  /healthz                                               → HealthInfo
    POST /admin/versions {"version"}                            → StageReply
    DELETE /admin/versions/{id}                                 → UnloadReply

Every record converts to and from the JSON dict the HTTP API carries (``to_dict``/``from_dict``)
so the shard server, the pooled HTTP client, the in-process and the Ray transports agree on one
shape. Errors travel as ``{"error": {...}}`` and come back through
:func:`retrieval.errors.error_for_status`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NotRequired, TypedDict
from urllib.parse import urlencode

from retrieval.types import EmbeddingVersion

LOADING, READY, FAILED = "loading", "ready", "failed"
TIMEOUT_HEADER = "x-shardrag-timeout-ms"  # the caller's remaining budget; shards drop expired work


class HitColumns(TypedDict):
    """One query's hits, best first, as parallel columns (cheaper to encode than a list of objects)."""

    doc_ids: list[str]
    scores: list[float]
    titles: list[str]
    texts: list[str]
    metadata: NotRequired[list[dict[str, Any]]]  # only when the search asked with_metadata


@dataclass(slots=True, frozen=True)
class SearchParams:
    """Everything of a search but the vectors; queries with equal params can share one shard call."""

    k: int
    version: str | None  # embedding version of the vectors; None: the replica's only ready version
    nprobe: int | None = None  # IVF lists to visit
    ef_search: int | None = None  # HNSW search breadth
    with_text: bool = True  # return titles and texts
    with_metadata: bool = False  # return each hit's metadata
    filter: str | None = None  # a filter's canonical JSON (retrieval.filters): only documents it selects
    min_seq: int | None = None  # session reads: only a replica that applied this write may answer

    def query_string(self) -> str:
        params: dict[str, Any] = {"k": self.k}
        if self.version is not None:
            params["version"] = self.version
        if self.nprobe is not None:
            params["nprobe"] = self.nprobe
        if self.ef_search is not None:
            params["ef_search"] = self.ef_search
        if not self.with_text:
            params["with_text"] = "false"
        if self.with_metadata:
            params["with_metadata"] = "true"
        if self.filter is not None:
            params["filter"] = self.filter
        if self.min_seq is not None:
            params["min_seq"] = self.min_seq
        return urlencode(params)


@dataclass(slots=True, frozen=True)
class SearchReply:
    shard_id: int
    version: str
    took_ms: float
    results: list[HitColumns]  # one per query vector, in request order

    def to_dict(self) -> dict[str, Any]:
        return {"shard_id": self.shard_id, "version": self.version, "took_ms": self.took_ms,
                "results": self.results}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SearchReply:
        return cls(int(data["shard_id"]), str(data["version"]), float(data.get("took_ms", 0.0)),
                   list(data["results"]))


_DETAIL_KEYS = ("count", "embedding_version", "dim", "metric", "factory", "partitioner", "num_shards", "centroid",
                "on_gpu")
_PRIMARY_KEYS = ("embedding_version", "count", "dim", "metric", "factory", "partitioner", "centroid", "on_gpu")


@dataclass(slots=True, frozen=True)
class VersionInfo:
    """One embedding version a replica holds: its state and, once loaded, what it is."""

    id: str
    state: str  # loading | ready | failed
    error: str | None = None
    embedding_version: EmbeddingVersion | None = None  # the details below are set once it is loaded
    count: int | None = None
    dim: int | None = None
    metric: str | None = None
    factory: str | None = None
    partitioner: str | None = None
    num_shards: int | None = None
    centroid: tuple[float, ...] | None = None  # kmeans partitions: this shard's centroid
    on_gpu: bool | None = None
    load_s: float | None = None
    applied_seq: int | None = None  # the last write this replica applied to the version (None: takes no writes)
    segment: int | None = None  # documents written since the base was sealed
    tombstones: int | None = None  # base documents hidden by later writes
    search_defaults: dict[str, int] | None = None  # nprobe / ef_search a query without them runs with

    @property
    def ready(self) -> bool:
        return self.state == READY

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "state": self.state}
        if self.error:
            out["error"] = self.error
        if self.embedding_version is not None:
            out.update({"count": self.count, "embedding_version": self.embedding_version.to_dict(), "dim": self.dim,
                        "metric": self.metric, "factory": self.factory, "partitioner": self.partitioner,
                        "num_shards": self.num_shards,
                        "centroid": list(self.centroid) if self.centroid is not None else None,
                        "on_gpu": self.on_gpu})
        if self.load_s is not None:
            out["load_s"] = self.load_s
        for name in ("applied_seq", "segment", "tombstones", "search_defaults"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> VersionInfo:
        embedding = data.get("embedding_version")
        centroid = data.get("centroid")
        return cls(
            id=str(data["id"]), state=str(data["state"]), error=data.get("error"),
            embedding_version=EmbeddingVersion.from_dict(embedding) if embedding else None,
            count=_int_or_none(data.get("count")), dim=_int_or_none(data.get("dim")), metric=data.get("metric"),
            factory=data.get("factory"), partitioner=data.get("partitioner"),
            num_shards=_int_or_none(data.get("num_shards")),
            centroid=tuple(float(x) for x in centroid) if centroid is not None else None,
            on_gpu=data.get("on_gpu"), load_s=data.get("load_s"), applied_seq=_int_or_none(data.get("applied_seq")),
            segment=_int_or_none(data.get("segment")), tombstones=_int_or_none(data.get("tombstones")),
            search_defaults={str(k): int(v) for k, v in data["search_defaults"].items()}
            if isinstance(data.get("search_defaults"), dict) else None,
        )


@dataclass(slots=True, frozen=True)
class ReplicaInfo:
    """What ``GET /v1/info`` reports: the shard slot, every version held with its state, and the
    first ready version's details at the top level (for single-version callers)."""

    collection: str
    shard_id: int
    num_shards: int
    versions: tuple[VersionInfo, ...]
    pid: int | None = None
    started_at: float | None = None
    uptime_s: float | None = None

    @property
    def primary(self) -> VersionInfo | None:
        return next((v for v in self.versions if v.ready), None)

    def ready_versions(self) -> dict[str, VersionInfo]:
        """version id → its description, for the versions held ready."""
        return {v.id: v for v in self.versions if v.ready}

    def held(self) -> dict[str, VersionInfo]:
        """version id → its description, whatever its state."""
        return {v.id: v for v in self.versions}

    def to_dict(self) -> dict[str, Any]:
        primary = self.primary.to_dict() if self.primary is not None else {}
        out: dict[str, Any] = {"collection": self.collection, "shard_id": self.shard_id,
                               "num_shards": self.num_shards, "versions": [v.to_dict() for v in self.versions],
                               **{key: primary.get(key) for key in _PRIMARY_KEYS}}
        for key in ("pid", "started_at", "uptime_s"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ReplicaInfo:
        return cls(collection=str(data["collection"]), shard_id=int(data["shard_id"]),
                   num_shards=int(data["num_shards"]),
                   versions=tuple(VersionInfo.from_dict(v) for v in data.get("versions", [])),
                   pid=data.get("pid"), started_at=data.get("started_at"), uptime_s=data.get("uptime_s"))


@dataclass(slots=True, frozen=True)
class HealthInfo:
    shard_id: int
    versions: tuple[str, ...]  # ready version ids
    status: str = "ok"

    def to_dict(self) -> dict[str, Any]:
        return {"status": self.status, "shard_id": self.shard_id, "versions": list(self.versions)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> HealthInfo:
        return cls(int(data["shard_id"]), tuple(str(v) for v in data.get("versions", [])), str(data["status"]))


@dataclass(slots=True, frozen=True)
class StageReply:
    """``POST /admin/versions``: the version asked for (loading or ready) and everything held."""

    version: VersionInfo
    versions: tuple[VersionInfo, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"version": self.version.to_dict(), "versions": [v.to_dict() for v in self.versions]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StageReply:
        return cls(VersionInfo.from_dict(data["version"]), _versions(data.get("versions", [])))


@dataclass(slots=True, frozen=True)
class UnloadReply:
    """``DELETE /admin/versions/{id}``: whether it was held (idempotent), and what is held now."""

    unloaded: bool
    versions: tuple[VersionInfo, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"unloaded": self.unloaded, "versions": [v.to_dict() for v in self.versions]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> UnloadReply:
        return cls(bool(data["unloaded"]), _versions(data.get("versions", [])))


def _versions(rows: Sequence[Mapping[str, Any]]) -> tuple[VersionInfo, ...]:
    return tuple(VersionInfo.from_dict(row) for row in rows)


def _int_or_none(value: Any) -> int | None:
    return None if value is None else int(value)
