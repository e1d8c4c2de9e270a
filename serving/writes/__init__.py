"""The write path at the gateway: request models (``models``), routing and embedding (``plan``),
which replica is each shard's primary (``primaries``), the write service (``service``: validate a
batch, embed it with the encoder of every version it goes to, route each id to its shard and send
each shard's part to its primary, which orders, replicates and acknowledges it), and bringing a
staged version up to date before it takes writes (``staging``; a created collection's staged
version is first filled from the live one), and a shard's live documents at one seq from its
primary (``snapshots``: what staging fills from and a backup stores), and listing a collection's
documents in id order across its shards (``listing``: ``…/documents/scroll``). No ordering state
lives here.

May import ``versions`` (the registry: topology, encoders, rollout state), ``transport`` (the shard
client), ``httpkit`` and ``retrieval``; never ``gateway``, ``local`` or ``cli``.
"""
