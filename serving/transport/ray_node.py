"""The Ray backend's node: an actor (``NodeReplicas``) that runs an ``index_shards`` Node, so the
collections created at run time (``PUT /v1/collections/{name}``) are hosted on Ray as on
processes. The node registers as ``ray://<actor>``; its replicas are reached at
``ray://<actor>/c/<collection>/<shard>`` (``ray_replica.actor_for``), by the gateway's
``RayShardClient`` and by their peers (``RayPeers``), with the calls a replica actor answers.

This module is one of the places ``serving`` imports ``index_shards`` (the actor hosts shards).
"""

from __future__ import annotations

from typing import Any

from retrieval.errors import NotFound
from serving.transport.ray_replica import RayPeers, ShardReplica


class NodeReplicas:
    """The actor's body: the node (its reconcile loop and lease run on the actor's threads) and one
    entry point, :meth:`call`, that runs a replica actor's method on one hosted replica. Ray
    restarts a dead node actor, which opens its replicas again from its data dir."""

    def __init__(self, coordinator: str, node_id: str, data_dir: str, name: str, namespace: str | None,
                 faiss_threads: int = 1, lease_s: float = 3.0, device: str = "auto") -> None:
        import faiss

        from clusterstate import open_coordinator
        from index_shards.node import Node
        from index_shards.server import ShardServerConfig

        faiss.omp_set_num_threads(max(1, faiss_threads))
        config = ShardServerConfig(faiss_threads=faiss_threads, lease_s=lease_s, device=device)
        self.node = Node(open_coordinator(coordinator), node_id, data_dir, config, peers=RayPeers(namespace))
        self.node.start(name)

    def ready(self) -> dict[str, Any]:
        import ray

        return {"node_id": self.node.node_id, "node_ip": ray.util.get_node_ip_address()}

    def describe(self) -> dict[str, Any]:
        return self.node.describe()

    def call(self, collection: str, shard_id: int, method: str, *args: Any) -> Any:
        slot = self.node.slot_for(collection, shard_id)
        if slot is None:
            raise NotFound(f"node {self.node.node_id} hosts no replica of {collection!r} shard {shard_id} (of this "
                           "incarnation)", field="collection")
        if method.startswith("_") or not callable(getattr(ShardReplica, method, None)):
            raise NotFound(f"no replica call {method!r}", field="method")
        return getattr(ShardReplica.over(slot.server.versions, slot.server.role), method)(*args)

    def stop(self) -> None:
        self.node.stop()
