"""One process for one box: the gateway holds every shard of the collection itself.

``shardrag serve --backend embedded`` runs no shard server processes: each shard's version store
(:class:`~index_shards.versions.ShardVersions`) is loaded into the gateway, and the fan-out calls
it through :class:`~serving.transport.inprocess.InProcessShardClient` — no gateway→shard HTTP
hop, no process wake-ups. On a small host that is where a query's time went (a 4-shard query is
five processes and five HTTP requests otherwise; ``docs/benchmarks.md``, "Where a single query's
time goes"), so this is the low-latency choice for a single machine.

What it gives up: one replica per shard (no balancing, hedging, ejection or failover — a crash
takes the whole process down), no fault injection (a feature of shard server processes), and a
search runs on the gateway's event loop (it is short: microseconds to a few milliseconds per
shard call; concurrent queries are still batched per shard). Handing batched calls to a thread
pool (FAISS releases the GIL) was measured and did not pay on 2 cores: HNSW32 × 4 at c=32 1,355
QPS against 1,626 inline, Flat 1,370 against 1,393 — the records and the reply are Python work
that holds the GIL either way. Everything else is the same code:
text queries, rollouts (versions staged into the same stores), writes (each shard's write-ahead
log where replica 0 of the process backend keeps it, so either backend can serve the collection
later), the status page and the metrics. Collections created at run time live on one node inside
this process (``index_shards.node``, reached through the same in-process client), with the files
the process backend's ``node-0`` keeps.

This module is one of the places ``serving`` imports ``index_shards`` (to embed shards).
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from clusterstate import open_coordinator
from index_shards.layout import nodes_dir, replica_data_dir, shard_dir
from index_shards.node import Node
from index_shards.role import ShardRole
from index_shards.server import ShardServerConfig
from index_shards.shard import Shard
from index_shards.versions import ShardVersions
from retrieval.dirlock import DirLock
from serving.gateway.config import GatewayConfig
from serving.local.state import claim_collection, launch_version, with_collection_state
from serving.transport.inprocess import SCHEME, InProcessShardClient

logger = logging.getLogger(__name__)

NODE_ID = "node-0"  # the id (and files) of the process backend's first node
NODE_URL = f"{SCHEME}{NODE_ID}"
NODE_LEASE_S = 3.0


class EmbeddedCluster:
    """Every shard of one version of ``collection``, loaded in this process, behind one client.

        cluster = EmbeddedCluster(root, "docs").start()
        setup = GatewaySetup(cluster.gateway_config, cluster.replica_names, shard_client=cluster.client())
    """

    def __init__(self, root: str | Path, collection: str, *, version: str | None = None,
                 gateway: GatewayConfig | None = None, device: str = "auto", writable: bool = True) -> None:
        """``version``: None starts on the version the rollout state says is active, else the
        newest complete one (as the process backend does). ``writable``: give each shard its
        write-ahead log (else the collection is served read-only)."""
        self.root = Path(root)
        self.collection = collection
        self.gateway_config = with_collection_state(gateway or GatewayConfig(), root, collection)
        self.version_dir, self.manifest = launch_version(root, collection, version, self.gateway_config)
        self.device = device
        self.writable = writable
        self.replicas = 1
        self._client: InProcessShardClient | None = None
        self._lock: DirLock | None = None
        self._node: Node | None = None

    @property
    def replica_names(self) -> tuple[tuple[str, ...], ...]:
        return tuple((f"{SCHEME}shard-{i}",) for i in range(self.manifest.num_shards))

    def start(self, *, progress: bool = True) -> EmbeddedCluster:
        """Load (checksums verified) every shard; raises the first shard's load error, naming it.
        Takes the collection's lock first: a second server of it on this machine is refused."""
        self._lock = claim_collection(self.gateway_config, self.root, self.collection, self.manifest.num_shards,
                                      1 if self.writable else None)
        stores: dict[str, ShardVersions] = {}
        try:
            for shard_id, (name,) in enumerate(self.replica_names):
                if progress:
                    print(f"loading shard {shard_id + 1}/{self.manifest.num_shards} ...", file=sys.stderr, flush=True)
                shard = Shard.load(shard_dir(self.version_dir, shard_id), device=self.device)
                data_dir = replica_data_dir(self.root, self.collection, shard_id, 0) if self.writable else None
                stores[name] = ShardVersions(shard, device=self.device, data_dir=data_dir)
        except BaseException:
            for store in stores.values():
                store.close()
            self.stop()
            raise
        try:
            self._node = self._start_node()
        except BaseException:
            for store in stores.values():
                store.close()
            self.stop()
            raise
        self._client = InProcessShardClient(stores, resolve=self._node_replica)
        logger.info("%d shards of %s loaded in process", len(stores), self.manifest.embedding_version.id)
        return self

    def _start_node(self) -> Node:
        """One node in this process for the collections created at run time (their replicas are
        called in-process too), with the files the process backend's node-0 keeps: either backend
        can serve them later. One node: a created collection has one replica per shard here."""
        kv = open_coordinator(self.gateway_config.cluster.coordinator)
        config = ShardServerConfig(device=self.device, lease_s=NODE_LEASE_S)
        return Node(kv, NODE_ID, nodes_dir(self.root, self.collection) / NODE_ID, config).start(NODE_URL)

    def _node_replica(self, name: str) -> ShardRole | None:
        """``inproc://node-0/c/<collection>@<uid>/<shard>`` → that replica's role while the node hosts it
        (that incarnation of it: ``Node.slot_for``)."""
        node = self._node
        if node is None or not name.startswith(NODE_URL + "/c/"):
            return None
        collection, _, shard = name[len(NODE_URL) + 3:].partition("/")
        slot = node.slot_for(collection, int(shard)) if shard.isdigit() else None
        return slot.server.role if slot is not None else None

    def stop(self) -> None:
        """Close every shard's log and release the collection (the gateway closes the client)."""
        if self._node is not None:
            self._node.stop()
            self._node = None
        if self._client is not None:
            for store in self._client.replicas.values():
                store.close()
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def client(self) -> InProcessShardClient:
        if self._client is None:
            raise RuntimeError("EmbeddedCluster.start() first")
        return self._client
