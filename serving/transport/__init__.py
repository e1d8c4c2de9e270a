"""Transports: the one seam between the gateway and the shards' wire.

    client     the typed ShardClient protocol (search, info, health, stage, unload) and ShardReply
    http       the production client: our lean pooled keep-alive HTTP/1.1 client (httptools)
    http_pool  that connection pool
    inprocess  calls loaded shards' version stores directly (tests, one box, the no-network baseline)
    ray        shard replicas as Ray actors, and the cluster of them
    ray_replica  a replica actor's body and the peer protocol between actors (``RayPeers``)
    ray_node   the node actor: a node hosting created collections, its replicas called through Ray

Everything above (balancer, hedging, fan-out, versions, rollout) sees only ShardClient.
May import: ``retrieval``, ``httpkit``; ``index_shards`` only in ``inprocess`` and the ``ray*``
modules (they hold shards). No other room of ``serving``.
"""
