"""Where the replicas of the collection a cluster is launched with (built offline by ``shardrag
build``) live when nodes host it instead of one process per replica.

Placement is a pure function of (shards, replicas, nodes): replica ``r`` of shard ``i`` lives on
node ``(i + r) mod N``. The local launcher, the Helm chart's gateway configuration and every node
compute it alike, so it needs no state, a shard's replicas are on distinct nodes (N ≥ R is
required) and the shards' primaries spread over the nodes. A node's replica keeps the same data
folder and replica id (``shard-<i>-r<r>``) as the one-process-per-replica layout, so a collection
can move between the two layouts without losing its writes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from clusterstate.collections import node_replica_url
from retrieval.errors import ConfigError


@dataclass(frozen=True, slots=True)
class BuiltCollection:
    """The launched collection as the nodes host it. ``version``: the one to start on when the
    rollout state names none (None: the newest built). ``index_url``: where a node fetches a shard
    it lacks (``<index_url>/shard-<i>.tar.gz``, as ``python -m index_shards pack`` writes them).
    ``data_root``: where the replicas keep their write state (``<data_root>/<name>/replicas/…``;
    default ``root``: a read-only shared index needs it elsewhere)."""

    root: Path
    name: str
    shards: int
    replicas: int
    nodes: int
    version: str | None = None
    index_url: str | None = None
    data_root: Path | None = None

    def __post_init__(self) -> None:
        if self.shards < 1:
            raise ConfigError("the collection needs at least one shard", field="shards")
        if self.replicas < 1:
            raise ConfigError("replicas must be ≥ 1", field="replicas")
        if self.nodes < self.replicas:
            raise ConfigError(f"{self.replicas} replicas of each shard need at least {self.replicas} nodes "
                              f"(a shard's replicas go to distinct nodes); got {self.nodes}", field="nodes")
        if self.index_url and not self.version:
            raise ConfigError("fetching the index (--index-url) needs the version to fetch (--version)",
                              field="version")

    def slots_on(self, node_index: int) -> list[tuple[int, int]]:
        """(shard, replica) pairs node ``node_index`` hosts."""
        if not 0 <= node_index < self.nodes:
            raise ConfigError(f"node index {node_index} is outside 0..{self.nodes - 1}", field="node_index")
        return [(shard, replica) for shard in range(self.shards) for replica in range(self.replicas)
                if node_for(shard, replica, self.nodes) == node_index]

    def replica_urls(self, node_urls: list[str]) -> list[list[str]]:
        """Each shard's replica URLs in replica order, given the nodes' URLs in index order."""
        if len(node_urls) != self.nodes:
            raise ConfigError(f"{len(node_urls)} node URLs for {self.nodes} nodes", field="nodes")
        return [[node_replica_url(node_urls[node_for(shard, replica, self.nodes)], self.name, shard)
                 for replica in range(self.replicas)] for shard in range(self.shards)]


def node_for(shard_id: int, replica: int, nodes: int) -> int:
    return (shard_id + replica) % nodes


def node_index_of(node_id: str) -> int:
    """A node's index from its id's trailing number (``node-2``, a StatefulSet's ``shardrag-node-2``)."""
    match = re.search(r"(\d+)$", node_id)
    if match is None:
        raise ConfigError(f"node id {node_id!r} ends in no number: give --node-index", field="node_index")
    return int(match.group(1))
