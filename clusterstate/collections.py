"""Collections created at run time and the nodes that host them, in the cluster state. Keys::

    /shardrag-meta/collections/<name>   CollectionSpec: what the collection is and where its
                                        replicas live (placement: shard → node ids)
    /shardrag-meta/nodes/<node id>      {"url"}, on the node's lease: a live node

Every gateway reads the same specs (one truth); every node hosts exactly the (collection, shard)
replicas the placements give it and drops the others, so dropping a collection is one delete
here and the nodes do the rest. A spec carries a ``uid``: a collection dropped and created again
under the same name is a different collection, and a node that slept through the drop throws
the old one's files away instead of serving them.

Placement spreads each shard's replicas over distinct nodes (the ones hosting fewest replicas
first), so no node holds two copies of a shard while enough nodes live.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from clusterstate.kv import KV
from retrieval.errors import Conflict, InvalidRequest, NotFound, ShardUnavailable
from retrieval.query_defaults import PLAIN, QueryDefaults
from retrieval.types import EmbeddingVersion

META_ROOT = "/shardrag-meta/"
COLLECTIONS = META_ROOT + "collections/"
NODES = META_ROOT + "nodes/"
NAME_PATTERN = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")
METRICS = ("ip", "l2")


def check_name(name: str) -> str:
    if not NAME_PATTERN.match(name or ""):
        raise InvalidRequest(f"collection name {name!r}: 1-63 characters of a-z, 0-9, '_' and '-', "
                             "starting with a letter or digit", field="name")
    return name


@dataclass(slots=True, frozen=True)
class Quotas:
    max_documents: int = 0  # live documents the collection may hold (0: no limit)
    max_rps: float = 0.0  # requests per second per gateway on the collection (0: no limit)

    def to_dict(self) -> dict[str, Any]:
        return {"max_documents": self.max_documents, "max_rps": self.max_rps}


@dataclass(slots=True, frozen=True)
class CollectionSpec:
    """A collection as its creator defined it, with its placement."""

    name: str
    dim: int
    metric: str = "ip"
    model: str | None = None  # the encoder that embeds text (None: a vector-only collection)
    version: dict[str, Any] | None = None  # the model's embedding version (None: vector-only)
    shards: int = 1
    replicas: int = 1
    factory: str = "Flat"
    partitioner: str = "hash"
    tenant_field: str | None = None  # the payload field a tenant-scoped key is confined to
    lexical_language: str = "english"  # how lexical and hybrid search analyse its texts (retrieval.analysis)
    ef_construction: int | None = None  # HNSW factories: the graph's build breadth (None: FAISS's 40)
    quotas: Quotas = field(default_factory=Quotas)
    query_defaults: QueryDefaults = PLAIN  # what a query naming no mode, fusion or weights gets
    placement: tuple[tuple[str, ...], ...] = ()  # shard → the node ids holding its replicas
    uid: str = ""
    created_at: float = 0.0
    # embedding versions staged by rollouts after the first (EmbeddingVersion dicts, oldest first):
    # every node hosting a replica keeps an empty base of each, the rollout fills it from the live one
    versions: tuple[dict[str, Any], ...] = ()
    retired: tuple[str, ...] = ()  # version ids a rollout retired or aborted: their files go from the nodes

    @property
    def state_name(self) -> str:
        """Where its shards' terms, primaries and rollout state live (clusterstate.state): per
        incarnation, so a collection created again under a dropped one's name starts afresh."""
        return f"{self.name}@{self.uid}"

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "dim": self.dim, "metric": self.metric, "model": self.model,
                "version": self.version, "shards": self.shards, "replicas": self.replicas,
                "factory": self.factory, "partitioner": self.partitioner,
                "tenant_field": self.tenant_field, "lexical_language": self.lexical_language,
                "ef_construction": self.ef_construction,
                "quotas": self.quotas.to_dict(), "query_defaults": self.query_defaults.to_dict(),
                "placement": [list(p) for p in self.placement],
                "uid": self.uid, "created_at": self.created_at, "versions": [dict(v) for v in self.versions],
                "retired": list(self.retired)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CollectionSpec:
        quotas = data.get("quotas") or {}
        return cls(name=str(data["name"]), dim=int(data["dim"]), metric=str(data.get("metric", "ip")),
                   model=data.get("model"), version=data.get("version"),
                   shards=int(data.get("shards", 1)), replicas=int(data.get("replicas", 1)),
                   factory=str(data.get("factory", "Flat")), partitioner=str(data.get("partitioner", "hash")),
                   tenant_field=data.get("tenant_field"),
                   lexical_language=str(data.get("lexical_language", "english")),
                   ef_construction=int(data["ef_construction"]) if data.get("ef_construction") is not None else None,
                   quotas=Quotas(int(quotas.get("max_documents", 0)), float(quotas.get("max_rps", 0.0))),
                   query_defaults=QueryDefaults.from_dict(data.get("query_defaults"), "query_defaults"),
                   placement=tuple(tuple(p) for p in data.get("placement", ())),
                   uid=str(data.get("uid", "")), created_at=float(data.get("created_at", 0.0)),
                   versions=tuple(dict(v) for v in data.get("versions", ())),
                   retired=tuple(str(v) for v in data.get("retired", ())))


def place(shards: int, replicas: int, nodes: Sequence[str], load: Mapping[str, int]) -> tuple[tuple[str, ...], ...]:
    """Per shard ``replicas`` distinct nodes, least loaded first (ties by id, so every caller
    places alike); 422 when fewer nodes live than a shard needs copies, 503 when none does."""
    if not nodes:
        raise ShardUnavailable("no node is live to host a collection (start some: shardrag serve --nodes N, or "
                               "python -m index_shards node)", field="replicas")
    if len(nodes) < replicas:  # a request this cluster cannot place, as asked
        raise InvalidRequest(f"{replicas} replicas per shard need {replicas} live nodes; {len(nodes)} live",
                             field="replicas")
    counts = Counter({node: load.get(node, 0) for node in nodes})
    placement = []
    for _ in range(shards):
        chosen = sorted(nodes, key=lambda n: (counts[n], n))[:replicas]
        for node in chosen:
            counts[node] += 1
        placement.append(tuple(chosen))
    return tuple(placement)


def node_replica_url(node_url: str, collection: str, shard_id: int, uid: str = "") -> str:
    """The URL of a replica a node hosts: the node's URL plus ``/c/<collection>@<uid>/<shard>`` (HTTP,
    or a Ray node actor's ``ray://<actor>``); gateways, peers and the node itself spell it so. The
    incarnation (``uid``) is part of it: a collection dropped and created again under its name is
    another replica, and a node that still hosts the dropped one refuses its requests instead of
    answering them (``@`` is not in a collection name). The launched collection has no uid:
    ``/c/<collection>/<shard>``."""
    return f"{node_url.rstrip('/')}/c/{collection}{'@' + uid if uid else ''}/{shard_id}"


def replica_target(part: str) -> tuple[str, str]:
    """(collection, uid) of the collection part of a replica URL (``name@uid`` or ``name``)."""
    name, _, uid = part.partition("@")
    return name, uid


def vector_version(dim: int, metric: str) -> EmbeddingVersion:
    """The embedding version of a vector-only collection: its vectors come from the client, so
    the space is named by its dimension and metric (two such collections compare alike)."""
    digest = hashlib.sha256(f"client-vectors:{dim}:{metric}".encode()).hexdigest()
    return EmbeddingVersion(encoder_name="vectors", weights_sha256=digest, dim=dim)


def spec_version(spec: CollectionSpec) -> EmbeddingVersion:
    """The embedding version of a collection's vectors: its encoder's, or :func:`vector_version`."""
    if spec.version:
        return EmbeddingVersion.from_dict(spec.version)
    return vector_version(spec.dim, spec.metric)


def spec_versions(spec: CollectionSpec) -> list[EmbeddingVersion]:
    """Every embedding version the collection's replicas may hold: its first, then those its
    rollouts staged — less those retired (or aborted) since."""
    every = [spec_version(spec), *(EmbeddingVersion.from_dict(v) for v in spec.versions)]
    return [v for v in every if v.id not in spec.retired]


class Collections:
    """The collection specs and live nodes, over the KV seam (calls are short and synchronous)."""

    def __init__(self, kv: KV) -> None:
        self.kv = kv

    # -- nodes ---------------------------------------------------------------------------------
    def register_node(self, node_id: str, url: str, lease: int) -> None:
        self.kv.put(NODES + node_id, json.dumps({"url": url}).encode(), lease=lease)

    def nodes(self) -> dict[str, str]:
        """Live nodes → their URL."""
        return {e.key[len(NODES):]: str(json.loads(e.value)["url"]) for e in self.kv.prefix(NODES)}

    # -- collections ---------------------------------------------------------------------------
    def get(self, name: str) -> CollectionSpec | None:
        entry = self.kv.get(COLLECTIONS + name)
        return CollectionSpec.from_dict(json.loads(entry.value)) if entry is not None else None

    def require(self, name: str) -> CollectionSpec:
        spec = self.get(check_name(name))
        if spec is None:
            raise NotFound(f"no collection {name!r}", field="collection")
        return spec

    def list(self) -> list[CollectionSpec]:
        return [CollectionSpec.from_dict(json.loads(e.value)) for e in self.kv.prefix(COLLECTIONS)]

    def create(self, spec: CollectionSpec) -> CollectionSpec:
        """Place and record a new collection (409 when the name is taken, with the same
        definition or not: a create is not an update)."""
        check_name(spec.name)
        nodes = self.nodes()
        load: Counter[str] = Counter()
        for other in self.list():
            for group in other.placement:
                load.update(group)
        placed = replace(spec, placement=place(spec.shards, spec.replicas, sorted(nodes), load),
                         uid=spec.uid or uuid.uuid4().hex[:12], created_at=spec.created_at or time.time())
        body = json.dumps(placed.to_dict(), indent=1).encode()
        if self.kv.put(COLLECTIONS + spec.name, body, expect_revision=0) is None:
            raise Conflict(f"collection {spec.name!r} already exists", field="name")
        return placed

    def add_version(self, name: str, uid: str, version: EmbeddingVersion) -> CollectionSpec:
        """Record another embedding version of the collection (its nodes build an empty base of it
        for a rollout to stage; a retired one comes back); idempotent. 404 when the collection
        (this incarnation) is gone."""
        def change(spec: CollectionSpec) -> CollectionSpec:
            known = {v.get("id") or EmbeddingVersion.from_dict(v).id for v in spec.versions} | {spec_version(spec).id}
            versions = spec.versions if version.id in known else (*spec.versions, version.to_dict())
            return replace(spec, versions=versions, retired=tuple(v for v in spec.retired if v != version.id))
        return self._change(name, uid, change)

    def retire_version(self, name: str, uid: str, version_id: str) -> CollectionSpec:
        """Mark a version retired (or aborted): its nodes remove its files once no replica holds it."""
        def change(spec: CollectionSpec) -> CollectionSpec:
            return spec if version_id in spec.retired else replace(spec, retired=(*spec.retired, version_id))
        return self._change(name, uid, change)

    def set_query_defaults(self, name: str, uid: str, defaults: QueryDefaults) -> CollectionSpec:
        """Record the collection's query defaults (every gateway reads them with the spec)."""
        return self._change(name, uid, lambda spec: replace(spec, query_defaults=defaults))

    def _change(self, name: str, uid: str, change: Callable[[CollectionSpec], CollectionSpec]) -> CollectionSpec:
        for _ in range(20):  # compare-and-set: another gateway may change the spec meanwhile
            entry = self.kv.get(COLLECTIONS + check_name(name))
            spec = CollectionSpec.from_dict(json.loads(entry.value)) if entry is not None else None
            if entry is None or spec is None or spec.uid != uid:
                raise NotFound(f"no collection {name!r}", field="collection")
            changed = change(spec)
            if changed == spec:
                return spec
            body = json.dumps(changed.to_dict(), indent=1).encode()
            if self.kv.put(COLLECTIONS + name, body, expect_revision=entry.mod_revision) is not None:
                return changed
        raise Conflict(f"collection {name!r} kept changing meanwhile; try again", field="name")

    def drop(self, name: str) -> bool:
        """Remove the collection's spec (its nodes then drop its replicas and files) and its shards'
        state; whether it existed."""
        spec = self.get(check_name(name))
        if spec is None or not self.kv.delete(COLLECTIONS + name):
            return False
        for entry in self.kv.prefix(f"/shardrag/{spec.state_name}/"):  # tidiness: a new incarnation has its own
            self.kv.delete(entry.key)
        return True
