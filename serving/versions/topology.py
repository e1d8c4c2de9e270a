"""What the gateway knows of the cluster: the shard slots and their replicas (fixed by the
cluster spec), and, per embedding version, the shards' sizes and kmeans centroids — read from
every replica's ``/v1/info`` (:class:`~retrieval.contract.ReplicaInfo`) and checked for
consistency (a replica listed as shard 2 of a 4-shard collection must say exactly that)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from retrieval.analysis import DEFAULT_LANGUAGE
from retrieval.contract import ReplicaInfo, VersionInfo
from retrieval.errors import ConfigError, ShardragError, ShardUnavailable
from retrieval.types import EmbeddingVersion
from serving.transport.client import ShardClient

logger = logging.getLogger(__name__)

Infos = Mapping[str, ReplicaInfo | None]  # replica → what it last said (None: unreachable)


@dataclass(slots=True, frozen=True)
class ShardInfo:
    shard_id: int
    replicas: tuple[str, ...]  # every replica of the slot; which hold a version: the registry's snapshot
    count: int


@dataclass(slots=True, frozen=True)
class Topology:
    """One embedding version across the shard slots."""

    collection: str
    version: EmbeddingVersion
    shards: tuple[ShardInfo, ...]
    centroids: np.ndarray | None  # (num_shards, dim) when the version is kmeans-partitioned
    metric: str
    factory: str
    partitioner: str
    lexical_language: str = DEFAULT_LANGUAGE  # how its shards analyse texts (the gateway's statistics guess too)

    @property
    def dim(self) -> int:
        return self.version.dim

    @property
    def num_shards(self) -> int:
        return len(self.shards)


async def fetch_info(client: ShardClient, replica: str, timeout_s: float) -> ReplicaInfo | None:
    try:
        return await client.info(replica, timeout_s)
    except ShardragError:
        return None


async def _info_with_retry(client: ShardClient, replica: str, deadline: float) -> ReplicaInfo:
    delay_s = 0.05
    while True:
        try:
            return await client.info(replica, max(0.1, min(2.0, deadline - time.monotonic())))
        except ShardUnavailable:
            if time.monotonic() + delay_s > deadline:
                raise
            await asyncio.sleep(delay_s)
            delay_s = min(delay_s * 2, 1.0)


async def discover_infos(client: ShardClient, shard_replicas: Sequence[Sequence[str]],
                         timeout_s: float) -> dict[str, ReplicaInfo | None]:
    """Every replica's info, waiting up to ``timeout_s`` for each to answer (startup)."""
    deadline = time.monotonic() + timeout_s
    replicas = [r for group in shard_replicas for r in group]
    infos = await asyncio.gather(*(_info_with_retry(client, r, deadline) for r in replicas))
    found: dict[str, ReplicaInfo | None] = dict(zip(replicas, infos, strict=True))
    check_slots(shard_replicas, found)
    return found


def check_slots(shard_replicas: Sequence[Sequence[str]], infos: Infos) -> None:
    collection = None
    for shard_id, replicas in enumerate(shard_replicas):
        for replica in replicas:
            info = infos.get(replica)
            if info is None:
                continue
            if info.shard_id != shard_id:
                raise ConfigError(f"{replica} serves shard {info.shard_id}, listed as shard {shard_id}", field="shards")
            if info.num_shards != len(shard_replicas):
                raise ConfigError(f"{replica} belongs to a {info.num_shards}-shard collection, "
                                  f"the cluster lists {len(shard_replicas)} shards", field="shards")
            if collection is not None and info.collection != collection:
                raise ConfigError(f"{replica} serves collection {info.collection!r}, not {collection!r}")
            collection = info.collection


def ready_versions(info: ReplicaInfo | None) -> dict[str, VersionInfo]:
    """version id → that version's description, for the versions a replica holds ready."""
    return info.ready_versions() if info is not None else {}


def build_topologies(shard_replicas: Sequence[Sequence[str]], infos: Infos) -> dict[str, Topology]:
    """A Topology for every version that every shard slot holds ready on at least one replica."""
    collection = next((i.collection for i in infos.values() if i), "")
    per_shard: list[dict[str, VersionInfo]] = []
    for replicas in shard_replicas:
        versions: dict[str, VersionInfo] = {}
        for replica in replicas:
            for version_id, description in ready_versions(infos.get(replica)).items():
                versions.setdefault(version_id, description)
        per_shard.append(versions)
    complete = set(per_shard[0]) if per_shard else set()
    for versions in per_shard[1:]:
        complete &= set(versions)
    topologies = {}
    for version_id in complete:
        rows = [per_shard[s][version_id] for s in range(len(shard_replicas))]
        embedding = rows[0].embedding_version
        if embedding is None:  # a ready version always carries its details; skip one that does not
            continue
        centroid_rows = [row.centroid for row in rows]
        centroids = (np.asarray(centroid_rows, dtype=np.float32)
                     if all(c is not None for c in centroid_rows) else None)
        topologies[version_id] = Topology(
            collection=collection,
            version=embedding,
            shards=tuple(ShardInfo(s, tuple(shard_replicas[s]), int(rows[s].count or 0)) for s in range(len(rows))),
            centroids=centroids,
            metric=rows[0].metric or "", factory=rows[0].factory or "", partitioner=rows[0].partitioner or "",
            lexical_language=rows[0].lexical_language or DEFAULT_LANGUAGE,
        )
    return topologies
