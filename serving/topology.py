"""What the gateway knows of the cluster: the shard slots and their replicas (fixed by the
cluster spec), and, per embedding version, the shards' sizes and kmeans centroids — read from
every replica's ``/v1/info`` and checked for consistency (a replica listed as shard 2 of a
4-shard collection must say exactly that)."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from retrieval.errors import ConfigError, ShardragError, ShardUnavailable
from retrieval.types import EmbeddingVersion

from serving.transport import ShardTransport

logger = logging.getLogger(__name__)

Info = dict[str, Any]


@dataclass(slots=True, frozen=True)
class ShardInfo:
    shard_id: int
    replicas: tuple[str, ...]  # every replica of the slot; which hold a version: VersionRegistry.eligible
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

    @property
    def dim(self) -> int:
        return self.version.dim

    @property
    def num_shards(self) -> int:
        return len(self.shards)


async def fetch_info(transport: ShardTransport, replica: str, timeout_s: float) -> Info | None:
    try:
        return await transport.get_json(replica, "/v1/info", timeout_s=timeout_s)
    except ShardragError:
        return None


async def _info_with_retry(transport: ShardTransport, replica: str, deadline: float) -> Info:
    delay_s = 0.05
    while True:
        try:
            return await transport.get_json(replica, "/v1/info", timeout_s=max(0.1, min(2.0, deadline - time.monotonic())))
        except ShardUnavailable:
            if time.monotonic() + delay_s > deadline:
                raise
            await asyncio.sleep(delay_s)
            delay_s = min(delay_s * 2, 1.0)


async def discover_infos(transport: ShardTransport, shard_replicas: Sequence[Sequence[str]],
                         timeout_s: float) -> dict[str, Info]:
    """Every replica's info, waiting up to ``timeout_s`` for each to answer (startup)."""
    deadline = time.monotonic() + timeout_s
    replicas = [r for group in shard_replicas for r in group]
    infos = await asyncio.gather(*(_info_with_retry(transport, r, deadline) for r in replicas))
    found = dict(zip(replicas, infos))
    check_slots(shard_replicas, found)
    return found


def check_slots(shard_replicas: Sequence[Sequence[str]], infos: dict[str, Info | None]) -> None:
    collection = None
    for shard_id, replicas in enumerate(shard_replicas):
        for replica in replicas:
            info = infos.get(replica)
            if info is None:
                continue
            if info["shard_id"] != shard_id:
                raise ConfigError(f"{replica} serves shard {info['shard_id']}, listed as shard {shard_id}", field="shards")
            if info["num_shards"] != len(shard_replicas):
                raise ConfigError(f"{replica} belongs to a {info['num_shards']}-shard collection, "
                                  f"the cluster lists {len(shard_replicas)} shards", field="shards")
            if collection is not None and info["collection"] != collection:
                raise ConfigError(f"{replica} serves collection {info['collection']!r}, not {collection!r}")
            collection = info["collection"]


def ready_versions(info: Info | None) -> dict[str, Info]:
    """version id → that version's description, for the versions a replica holds ready."""
    if info is None:
        return {}
    return {v["id"]: v for v in info.get("versions", []) if v.get("state") == "ready"}


def build_topologies(shard_replicas: Sequence[Sequence[str]], infos: dict[str, Info | None]) -> dict[str, Topology]:
    """A Topology for every version that every shard slot holds ready on at least one replica."""
    collection = next((i["collection"] for i in infos.values() if i), "")
    per_shard: list[dict[str, Info]] = []
    for replicas in shard_replicas:
        versions: dict[str, Info] = {}
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
        centroid_rows = [row.get("centroid") for row in rows]
        centroids = (np.asarray(centroid_rows, dtype=np.float32)
                     if all(c is not None for c in centroid_rows) else None)
        topologies[version_id] = Topology(
            collection=collection,
            version=EmbeddingVersion.from_dict(rows[0]["embedding_version"]),
            shards=tuple(ShardInfo(s, tuple(shard_replicas[s]), int(rows[s]["count"])) for s in range(len(rows))),
            centroids=centroids,
            metric=rows[0]["metric"], factory=rows[0]["factory"], partitioner=rows[0]["partitioner"],
        )
    return topologies
