"""What the gateway knows of the cluster: shards, their replicas, the embedding version they
serve, and the kmeans centroids for routing — discovered from every replica's ``/v1/info``
and checked for consistency before the first query is served."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from retrieval.errors import ConfigError, ShardUnavailable, VersionConflict
from retrieval.types import EmbeddingVersion

from serving.transport import ShardTransport

logger = logging.getLogger(__name__)


@dataclass(slots=True, frozen=True)
class ShardInfo:
    shard_id: int
    replicas: tuple[str, ...]
    count: int


@dataclass(slots=True, frozen=True)
class Topology:
    collection: str
    version: EmbeddingVersion
    shards: tuple[ShardInfo, ...]
    centroids: np.ndarray | None  # (num_shards, dim) when the collection is kmeans-partitioned
    metric: str
    factory: str
    partitioner: str

    @property
    def dim(self) -> int:
        return self.version.dim

    @property
    def num_shards(self) -> int:
        return len(self.shards)


async def _info_with_retry(transport: ShardTransport, replica: str, deadline: float) -> dict[str, Any]:
    delay_s = 0.05
    while True:
        try:
            return await transport.get_json(replica, "/v1/info", timeout_s=max(0.1, min(2.0, deadline - time.monotonic())))
        except ShardUnavailable:
            if time.monotonic() + delay_s > deadline:
                raise
            await asyncio.sleep(delay_s)
            delay_s = min(delay_s * 2, 1.0)


async def discover(transport: ShardTransport, shard_replicas: Sequence[Sequence[str]], timeout_s: float) -> Topology:
    deadline = time.monotonic() + timeout_s
    flat = [(shard_id, replica) for shard_id, replicas in enumerate(shard_replicas) for replica in replicas]
    infos = await asyncio.gather(*(_info_with_retry(transport, replica, deadline) for _, replica in flat))
    by_shard: dict[int, list[dict[str, Any]]] = {}
    for (shard_id, replica), info in zip(flat, infos):
        if info["shard_id"] != shard_id:
            raise ConfigError(f"{replica} serves shard {info['shard_id']}, listed as shard {shard_id}", field="shards")
        if info["num_shards"] != len(shard_replicas):
            raise ConfigError(f"{replica} belongs to a {info['num_shards']}-shard collection, "
                              f"the cluster lists {len(shard_replicas)} shards", field="shards")
        by_shard.setdefault(shard_id, []).append(info)
    first = infos[0]
    version = EmbeddingVersion.from_dict(first["embedding_version"])
    for (shard_id, replica), info in zip(flat, infos):
        if info["embedding_version"]["id"] != version.id:
            raise VersionConflict(f"{replica} (shard {shard_id}) serves {info['embedding_version']['id']}, "
                                  f"others serve {version.id}: refusing to mix embedding versions", shard=shard_id)
        if info["collection"] != first["collection"]:
            raise ConfigError(f"{replica} serves collection {info['collection']!r}, not {first['collection']!r}")
    centroid_rows = [by_shard[s][0].get("centroid") for s in range(len(shard_replicas))]
    centroids = (np.asarray(centroid_rows, dtype=np.float32)
                 if all(row is not None for row in centroid_rows) else None)
    shards = tuple(
        ShardInfo(shard_id, tuple(replicas), int(by_shard[shard_id][0]["count"]))
        for shard_id, replicas in enumerate(shard_replicas)
    )
    topology = Topology(first["collection"], version, shards, centroids, first["metric"], first["factory"],
                        first["partitioner"])
    logger.info("topology: %s @ %s, %d shards", topology.collection, version.id, topology.num_shards)
    return topology
