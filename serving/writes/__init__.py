"""The write path at the gateway: request models (``models``), sequence numbers and idempotency
replies kept on disk (``sequencer``), and the write service (``service``): validate a batch, embed
it with every loaded version's encoder, route each id to its shard, hand out sequence numbers,
replicate to the shard's replicas and answer once the requested number made it durable.

May import ``versions`` (the registry: topology, encoders), ``transport`` (the shard client),
``httpkit`` and ``retrieval``; never ``gateway``, ``local`` or ``cli``.
"""
