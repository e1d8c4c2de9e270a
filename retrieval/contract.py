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
from urllib.parse import parse_qsl, urlencode

from retrieval.bm25 import CorpusStats
from retrieval.errors import InvalidRequest
from retrieval.filters import filter_from_canonical
from retrieval.types import EmbeddingVersion

LOADING, READY, FAILED = "loading", "ready", "failed"
WRITE_ACKS = ("one", "majority", "all")  # how many of a shard's replicas must hold a write before it is acknowledged
TIMEOUT_HEADER = "x-shardrag-timeout-ms"  # the caller's remaining budget; shards drop expired work


class HitColumns(TypedDict):
    """One query's hits, best first, as parallel columns (cheaper to encode than a list of objects)."""

    doc_ids: list[str]
    scores: list[float]
    titles: list[str]
    texts: list[str]
    metadata: NotRequired[list[dict[str, Any]]]  # only when the search asked with_metadata
    # a weighted hybrid's fused list (scores are fused): per leg, each hit's own score in it (None:
    # the leg does not find it) and the shard's best ``depth`` scores of the leg (for leg ranks)
    legs: NotRequired[dict[str, list[float | None]]]
    leg_tops: NotRequired[dict[str, list[float]]]


@dataclass(slots=True, frozen=True)
class SessionFloor:
    """What a session read needs of one shard's replica: the client's write there, by the seq and
    the primary term its reply named. A replica answers when it applied ``seq`` and its record at
    its applied seq is of ``term`` or newer: a replica whose log diverged during a failover (records
    of an old primary that were never acknowledged) can reach the seq without holding the write."""

    seq: int
    term: int | None = None  # None: a client that sent min_seq alone (no protection against a diverged log)


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
    min_seq: int | None = None  # session reads: only a replica that applied this write may answer ...
    min_term: int | None = None  # ... and holds the log it was made in (not a diverged one of an older term)
    # the body holds lexical queries (retrieval.bm25): BM25 top k of each (and with one vector per
    # query after them, a hybrid call: each vector's top k too)
    lexical: bool = False

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
        if self.min_term is not None:
            params["min_term"] = self.min_term
        if self.lexical:
            params["lexical"] = "true"
        return urlencode(params)

    @classmethod
    def from_query_string(cls, query_string: bytes | str, max_k: int) -> SearchParams:
        """The parameters :meth:`query_string` encodes, validated; an error names the parameter.
        (The shard server decodes with this, so encoder and decoder are one piece of code.)"""
        text = query_string.decode("latin-1") if isinstance(query_string, bytes) else query_string
        params: dict[str, Any] = {"k": 10, "version": None}
        for name, value in parse_qsl(text, keep_blank_values=True):
            if name not in _SEARCH_PARAMS:
                raise InvalidRequest(f"unknown query parameter {name!r}", field=name)
            if name in _INT_PARAMS:
                try:
                    number = int(value)
                except ValueError:
                    raise InvalidRequest(f"{name} must be an integer, got {value!r}", field=name) from None
                low, high = _INT_PARAMS[name]
                high = max_k if name == "k" else high
                if number < low or (high is not None and number > high):
                    raise InvalidRequest(f"{name} must be between {low} and {high}, got {number}", field=name)
                params[name] = number
            elif name in ("with_text", "with_metadata", "lexical"):
                if value.lower() not in ("true", "false", "1", "0"):
                    raise InvalidRequest(f"{name} must be true or false, got {value!r}", field=name)
                params[name] = value.lower() in ("true", "1")
            elif name == "filter":
                filter_from_canonical(value)  # refused here, naming the clause, if it does not parse
                params[name] = value
            else:
                params[name] = value
        return cls(**params)


_SEARCH_PARAMS = ("k", "version", "nprobe", "ef_search", "with_text", "with_metadata", "filter", "min_seq",
                  "min_term", "lexical")
_INT_PARAMS: dict[str, tuple[int, int | None]] = {"k": (1, None), "nprobe": (1, 65536), "ef_search": (1, 65536),
                                                  "min_seq": (0, None), "min_term": (0, None)}


@dataclass(slots=True, frozen=True)
class SearchReply:
    shard_id: int
    version: str
    took_ms: float
    results: list[HitColumns]  # one per query vector (a lexical search: per lexical query), in request order
    # a lexical search: per query, this replica's statistics for its terms (what the caller sums)
    stats: list[CorpusStats] | None = None
    dense: list[HitColumns] | None = None  # a hybrid call: per query, its vector's top k too

    def to_dict(self) -> dict[str, Any]:
        data = {"shard_id": self.shard_id, "version": self.version, "took_ms": self.took_ms, "results": self.results}
        if self.stats is not None:
            data["stats"] = [stats.to_dict() for stats in self.stats]
        if self.dense is not None:
            data["dense"] = self.dense
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SearchReply:
        stats = data.get("stats")
        return cls(int(data["shard_id"]), str(data["version"]), float(data.get("took_ms", 0.0)),
                   list(data["results"]),
                   [CorpusStats.from_dict(s, field_name="stats") for s in stats] if stats is not None else None,
                   data.get("dense"))


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
    last_term: int | None = None  # term and checksum of the record at applied_seq (a primary compares
    last_checksum: int | None = None  # them with its own to tell a lagging replica from a diverged one)
    source_version: str | None = None  # built from a live collection: that version, and per shard of it
    source_seqs: tuple[int, ...] | None = None  # the seq the build read (a rollout replays what came after)
    lexical_index: str | None = None  # the base's lexical index: built | building | none
    lexical_index_bytes: int | None = None  # built: its arrays' size
    lexical_index_build_s: float | None = None  # built: how long building it took
    lexical_language: str | None = None  # how the lexical leg analyses its texts (None: english)
    ef_construction: int | None = None  # an HNSW factory's build breadth where its build set one (None: FAISS's 40)

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
        for name in ("applied_seq", "segment", "tombstones", "search_defaults", "last_term", "last_checksum",
                     "source_version", "lexical_index", "lexical_index_bytes", "lexical_index_build_s",
                     "lexical_language", "ef_construction"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        if self.source_seqs is not None:
            out["source_seqs"] = list(self.source_seqs)
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
            last_term=_int_or_none(data.get("last_term")), last_checksum=_int_or_none(data.get("last_checksum")),
            source_version=data.get("source_version"),
            source_seqs=tuple(int(x) for x in data["source_seqs"]) if data.get("source_seqs") is not None else None,
            lexical_index=data.get("lexical_index"),
            lexical_index_bytes=_int_or_none(data.get("lexical_index_bytes")),
            lexical_index_build_s=_float_or_none(data.get("lexical_index_build_s")),
            lexical_language=data.get("lexical_language"),
            ef_construction=_int_or_none(data.get("ef_construction")),
        )


@dataclass(slots=True, frozen=True)
class RoleInfo:
    """A replica's place in its shard's write ordering, as it sees it."""

    replica: str  # its stable id (kept across restarts: the in-sync set holds ids)
    term: int  # the highest primary term it knows
    primary: str | None  # the id of who orders the shard's writes in that term (None: nobody yet)
    is_primary: bool
    in_sync: tuple[str, ...] = ()  # the ids of the replicas that hold every acknowledged write (as last read)
    lease_valid_s: float | None = None  # a primary: how long its claim is still safe to act on
    url: str | None = None  # where peers and gateways reach it

    def to_dict(self) -> dict[str, Any]:
        return {"replica": self.replica, "term": self.term, "primary": self.primary, "is_primary": self.is_primary,
                "in_sync": list(self.in_sync), "lease_valid_s": self.lease_valid_s, "url": self.url}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RoleInfo:
        return cls(str(data["replica"]), int(data["term"]), data.get("primary"), bool(data["is_primary"]),
                   tuple(str(r) for r in data.get("in_sync", ())), data.get("lease_valid_s"), data.get("url"))


def needed_copies(ack: str, replicas: int) -> int:
    """Durable copies a write needs before it is acknowledged: ``one``, ``majority`` or ``all`` of a
    shard's ``replicas``."""
    return {"one": 1, "majority": replicas // 2 + 1, "all": replicas}[ack]


@dataclass(slots=True, frozen=True)
class WriteReply:
    """A primary's answer to a write: the seqs it gave the batch under its term, and on how many
    replicas (itself included) the batch is durable. ``duplicate``: the request's idempotency key
    was applied before — nothing was written, and the seqs are the first time's."""

    shard_id: int
    version: str
    first_seq: int
    last_seq: int
    term: int
    copies: int
    duplicate: bool = False
    doc_ids: tuple[str, ...] = ()  # duplicate: the ids the first request wrote on this shard

    def to_dict(self) -> dict[str, Any]:
        return {"shard_id": self.shard_id, "version": self.version, "first_seq": self.first_seq,
                "last_seq": self.last_seq, "term": self.term, "copies": self.copies, "duplicate": self.duplicate,
                "doc_ids": list(self.doc_ids)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> WriteReply:
        return cls(int(data["shard_id"]), str(data["version"]), int(data["first_seq"]), int(data["last_seq"]),
                   int(data["term"]), int(data["copies"]), bool(data.get("duplicate", False)),
                   tuple(str(i) for i in data.get("doc_ids", ())))


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
    role: RoleInfo | None = None  # None: the replica takes part in no write ordering (read-only)

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
        if self.role is not None:
            out["role"] = self.role.to_dict()
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ReplicaInfo:
        return cls(collection=str(data["collection"]), shard_id=int(data["shard_id"]),
                   num_shards=int(data["num_shards"]),
                   versions=tuple(VersionInfo.from_dict(v) for v in data.get("versions", [])),
                   pid=data.get("pid"), started_at=data.get("started_at"), uptime_s=data.get("uptime_s"),
                   role=RoleInfo.from_dict(data["role"]) if isinstance(data.get("role"), Mapping) else None)


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


def _float_or_none(value: Any) -> float | None:
    return None if value is None else float(value)
