"""The gateway and everything around it, one sub-package (room) per subsystem.

    gateway/    the HTTP API, the query service, the composition root, config, API models, metrics
    shardcall/  fan-out + merge, one shard call (balancer policies, hedging, ejection), batching
    transport/  the typed ShardClient seam: pooled HTTP, in-process, Ray
    versions/   the version registry and snapshots, topology, query encoders, rollout + quality gate
    answer/     POST /v1/answer: the answer service, prompt, generator and its worker process
    kvcache/    KV-cache blocks, the local pool, the client of the kv-nodes, the kv-node server
    local/      the local cluster launcher and supervisor, chaos, the one-process embedded cluster, the demo corpus
    cli/        the ``shardrag`` command line

Rooms import downwards only (checked by import-linter, see pyproject.toml):
cli → local → gateway → {answer, versions} → shardcall → {transport, kvcache}.
May import: ``retrieval``, ``httpkit``; ``index_shards`` only in ``transport.inprocess``,
``transport.ray``, ``local`` and ``cli`` (to embed, launch or build shards). Never ``training``.
"""
